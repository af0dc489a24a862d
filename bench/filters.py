"""Quality filters: our quality stage against datatrove's on the same documents and 2 cores.

Input: ../shared/data/web_text/web_docs.jsonl.gz (2,664 docs, 12.9 MB) repeated to >= 100 MB.
Filter set, both sides, in FineWeb's order with the published default thresholds:
Gopher repetition, Gopher quality, C4 quality, FineWeb quality.
Harness, both sides the same: a multiprocessing pool of 2 workers maps the filter chain
over the documents (no reading or writing), wall time measured around the map.
datatrove (spaCy word splitting, ~20 docs/s a core here) runs on a uniform sample of
the base documents (SAMPLE, ~1-2 minutes); ours runs on the full >= 100 MB input.
Rates are documents/s; decisions (keep/drop) are compared on the sample.
Run: .venv/bin/python bench/filters.py   (make bench-deps first)
"""
from __future__ import annotations

import gzip
import json
import sys
import time
from multiprocessing import Pool
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "web_text" / "web_docs.jsonl.gz"
TARGET_BYTES = 100_000_000
SAMPLE = 1000
WORKERS = 2


def ours(texts: list[str]) -> list[bool]:
    from datapipe.text.quality import Config, first_failure

    cfg = Config(stage="quality")
    return [not first_failure(text, cfg)[0] for text in texts]


def theirs(texts: list[str]) -> list[bool]:
    from datatrove.data import Document
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
    )

    chain = [GopherRepetitionFilter(), GopherQualityFilter(), C4QualityFilter(), FineWebQualityFilter()]
    kept = []
    for i, text in enumerate(texts):
        doc = Document(text=text, id=str(i))
        kept.append(all(verdict is True or (isinstance(verdict, tuple) and verdict[0])
                        for verdict in (f.filter(doc) for f in chain)))
    return kept


def timed_map(function, texts: list[str], chunk: int = 64) -> tuple[list[bool], float]:
    chunks = [texts[i : i + chunk] for i in range(0, len(texts), chunk)]
    with Pool(WORKERS) as pool:
        pool.map(function, [texts[:8]] * WORKERS)  # warm-up: imports, spaCy model set-up
        started = time.perf_counter()
        results = pool.map(function, chunks)
        elapsed = time.perf_counter() - started
    return [kept for part in results for kept in part], elapsed


def main() -> None:
    if not DATA.is_file():
        sys.exit(f"bench filters: needs {DATA}")
    base = [json.loads(line)["text"] for line in gzip.open(DATA)]
    repeats = -(-TARGET_BYTES // sum(len(t.encode()) for t in base))
    full = base * repeats
    sample = base[:: max(len(base) // SAMPLE, 1)][:SAMPLE]
    megabytes = sum(len(t.encode()) for t in full) / 1e6
    kept_full, ours_s = timed_map(ours, full)
    kept_ours, _ = timed_map(ours, sample)
    kept_theirs, theirs_s = timed_map(theirs, sample, chunk=8)
    ours_rate, theirs_rate = len(full) / ours_s, len(sample) / theirs_s
    agree = sum(a == b for a, b in zip(kept_ours, kept_theirs)) / len(sample)
    print(f"ours: {len(full):,} docs ({megabytes:.0f} MB) in {ours_s:.1f} s, kept {sum(kept_full) / len(full):.1%}")
    print(f"datatrove: {len(sample):,} docs in {theirs_s:.1f} s; decisions equal on {agree:.2%} of them")
    print(f"bench filters: docs={len(full)} mb={megabytes:.0f} workers={WORKERS} docs_per_s={ours_rate:.0f} "
          f"mb_per_s={megabytes / ours_s:.2f} datatrove_docs={len(sample)} datatrove_docs_per_s={theirs_rate:.1f} "
          f"decisions_equal={agree:.4f} x_vs_datatrove={ours_rate / theirs_rate:.2f}")


if __name__ == "__main__":
    main()
