"""Quality filters: our quality stage against datatrove's on the same documents and 2 cores.

Input: ../shared/data/web_text/web_docs.jsonl.gz (2,664 docs, 12.9 MB) repeated to >= 100 MB.
Filter set, both sides: one published pipeline (--preset, our quality stage's presets),
with datatrove's filters set as that pipeline sets them: fineweb = Gopher repetition, Gopher
quality, C4 quality without the terminal-punctuation rule, FineWeb quality (datatrove's
FineWeb example); gopher = the two Gopher filters; c4 = C4 quality (the bad-words rule off on
both sides: datatrove's C4BadWordsFilter downloads its lists at run time).
Harness, both sides the same: a multiprocessing pool of 2 workers maps the filter chain
over the documents (no reading or writing). The machine is shared and loaded, so the
rate is documents per CPU-second of the workers (time.process_time in each task) times
2: documents/s on 2 dedicated cores; the wall-clock rate is printed beside it.
datatrove (spaCy word splitting, ~20 docs/s a core) runs on a uniform sample of the
base documents (SAMPLE); ours runs on the same sample and on the full >= 100 MB input.
Decisions (keep/drop) are compared on the sample; x_vs_datatrove compares the rates on
the sample (same documents).
Run: .venv/bin/python bench/filters.py   (make bench-deps first)
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from functools import partial
from multiprocessing import Pool
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "web_text" / "web_docs.jsonl.gz"
TARGET_BYTES = 100_000_000
SAMPLE = 600
WORKERS = 2


def ours(preset: str, texts: list[str]) -> tuple[list[bool], float]:
    from datapipe.text.quality import Config, first_failure

    options = {"c4": {"bad_words": False}} if preset == "c4" else {}
    cfg, started = Config(stage="quality", preset=preset, **options), time.process_time()
    return [not first_failure(text, cfg)[0] for text in texts], time.process_time() - started


def datatrove_chain(preset: str) -> list:
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
    )

    gopher = [GopherRepetitionFilter(), GopherQualityFilter()]
    chains = {"fineweb": lambda: [*gopher, C4QualityFilter(filter_no_terminal_punct=False), FineWebQualityFilter()],
              "gopher": lambda: gopher, "c4": lambda: [C4QualityFilter()]}
    return chains[preset]()


def theirs(preset: str, texts: list[str]) -> tuple[list[bool], float]:
    from datatrove.data import Document

    chain = datatrove_chain(preset)
    kept, started = [], time.process_time()
    for i, text in enumerate(texts):
        doc = Document(text=text, id=str(i))
        kept.append(all(verdict is True or (isinstance(verdict, tuple) and verdict[0])
                        for verdict in (f.filter(doc) for f in chain)))
    return kept, time.process_time() - started


def timed_map(function, texts: list[str], chunk: int = 64) -> tuple[list[bool], float, float]:
    """(decisions, documents/s on WORKERS dedicated cores from CPU time, wall-clock documents/s)."""
    chunks = [texts[i : i + chunk] for i in range(0, len(texts), chunk)]
    with Pool(WORKERS) as pool:
        pool.map(function, [texts[:8]] * WORKERS)  # warm-up: imports, spaCy model set-up
        started = time.perf_counter()
        results = pool.map(function, chunks)
        wall = time.perf_counter() - started
    cpu = sum(seconds for _, seconds in results)
    return [kept for part, _ in results for kept in part], len(texts) / (cpu / WORKERS), len(texts) / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=("fineweb", "c4", "gopher"), default="fineweb")
    preset = parser.parse_args().preset
    if not DATA.is_file():
        sys.exit(f"bench filters: needs {DATA}")
    base = [json.loads(line)["text"] for line in gzip.open(DATA)]
    repeats = -(-TARGET_BYTES // sum(len(t.encode()) for t in base))
    full = base * repeats
    sample = base[:: max(len(base) // SAMPLE, 1)][:SAMPLE]
    megabytes = sum(len(t.encode()) for t in full) / 1e6
    kept_full, full_rate, full_wall = timed_map(partial(ours, preset), full)
    kept_ours, ours_rate, ours_wall = timed_map(partial(ours, preset), sample, chunk=8)
    kept_theirs, theirs_rate, theirs_wall = timed_map(partial(theirs, preset), sample, chunk=8)
    agree = sum(a == b for a, b in zip(kept_ours, kept_theirs)) / len(sample)
    print(f"ours, full input: {len(full):,} docs ({megabytes:.0f} MB): {full_rate:.0f} docs/s on {WORKERS} cores "
          f"({full_wall:.0f} docs/s wall-clock on the shared machine), kept {sum(kept_full) / len(full):.1%}")
    print(f"sample of {len(sample)}: ours {ours_rate:.0f} docs/s ({ours_wall:.0f} wall), datatrove {theirs_rate:.1f} "
          f"docs/s ({theirs_wall:.1f} wall); decisions equal on {agree:.2%}")
    print(f"bench filters: preset={preset} docs={len(full)} mb={megabytes:.0f} workers={WORKERS} docs_per_s={full_rate:.0f} "
          f"mb_per_s={megabytes * full_rate / len(full):.2f} sample_docs={len(sample)} sample_docs_per_s={ours_rate:.0f} "
          f"datatrove_docs_per_s={theirs_rate:.1f} decisions_equal={agree:.4f} x_vs_datatrove={ours_rate / theirs_rate:.2f}")


if __name__ == "__main__":
    main()
