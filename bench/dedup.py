"""Near-dedup: our dedup stage against datatrove's 4-step MinHash pipeline, same documents.

Input: ../shared/data/web_text/web_docs.jsonl.gz (2,664 docs) plus PLANTED near-copies of
documents of >= 100 words: 1% of the words (at least one) replaced, and two paragraphs
swapped where there are two or more. The median true word-5-gram Jaccard of the planted
pairs is printed; at 14 bands x 8 rows pairs above ~0.8 are found with probability > 0.95.
Larger --sizes add rewrites of the shared documents with 30% of their words replaced (true
5-gram Jaccard ~0.1 with their source: not duplicates), so the corpus grows, not its duplicates.
Both sides: 5-gram shingles, 14 bands x 8 rows, 2 workers, end to end (signatures,
buckets, clusters, verdicts), each a whole process as a user waits for it, from start to
exit, timed from here: imports and start-up count (Ray's ~3-5 s, datatrove's executor pools).
Both read the same two JSONL files (the corpus' halves, in order) and write the kept documents as
compressed JSON lines on local disk: datatrove through its LocalPipelineExecutor (.jsonl.gz), ours
as a user runs it, `datapipe run` on a recipe of the dedup stage and `phases: []` on a local
2-CPU Ray (.jsonl.zst, and a rejects file naming each removed document's survivor). For reference, the stage's functions alone in
this process: a pool of 2 (signatures) and find_clusters. Recall: planted copies removed (or
their original, one of the pair) / planted. Precision: removed documents that are planted
copies or whose true word-5-gram Jaccard with their cluster's survivor is >= 0.7 / removed.
Run: .venv/bin/python bench/dedup.py [--sizes 3264,13056] [--repeat 3]   (make bench-deps first)
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "web_text" / "web_docs.jsonl.gz"
PLANTED = 600
WORKERS = 2


def plant(texts: list[str], seed: int = 0) -> list[tuple[int, str]]:
    rng = random.Random(seed)
    candidates = [i for i, t in enumerate(texts) if len(t.split()) >= 100]
    copies = []
    for i in rng.sample(candidates, PLANTED):
        words = texts[i].split(" ")
        for j in rng.sample(range(len(words)), max(1, len(words) // 100)):
            words[j] = rng.choice(["alpha", "beta", "gamma", "delta"])
        paragraphs = " ".join(words).split("\n\n")
        if len(paragraphs) >= 2:
            a, b = rng.sample(range(len(paragraphs)), 2)
            paragraphs[a], paragraphs[b] = paragraphs[b], paragraphs[a]
        copies.append((i, "\n\n".join(paragraphs)))
    return copies


def grow(texts: list[str], size: int, seed: int = 1) -> list[str]:
    """`texts` and rewrites of them (30% of the words replaced) up to `size` documents."""
    rng, grown = random.Random(seed), list(texts)
    while len(grown) < size:
        words = texts[len(grown) % len(texts)].split(" ")
        for j in rng.sample(range(len(words)), len(words) * 3 // 10):
            words[j] = f"w{rng.randrange(10**6)}"
        grown.append(" ".join(words))
    return grown


def signatures(texts: list[str]) -> list[tuple[int, list[int]]]:
    from datapipe.text.dedup import Config, signature_row

    cfg = Config(stage="dedup")
    return [signature_row(text, cfg) for text in texts]


def run_ours(texts: list[str]) -> tuple[set[int], float]:
    from datapipe.text.dedup import Config, find_clusters

    started = time.perf_counter()
    with Pool(WORKERS) as pool:
        rows = [row for part in pool.map(signatures, [texts[i : i + 256] for i in range(0, len(texts), 256)])
                for row in part]
    exact = np.array([r[0] for r in rows], np.uint64)
    bands = np.array([r[1] for r in rows], np.uint64)
    verdicts = find_clusters(np.arange(len(texts)), exact, bands, Config(stage="dedup"))
    removed = {p: survivor for p, (reason, survivor, _) in verdicts.items() if reason}
    return removed, time.perf_counter() - started


def ours_with_the_cli(corpus: Path, work: Path) -> None:
    """The child process: `datapipe run` on a recipe of a JSONL source, the dedup stage and no phases
    (the kept documents written as JSONL, as datatrove writes them), on a local 2-CPU Ray."""
    import yaml

    from datapipe import cli

    recipe = {"name": "bench", "sources": [{"name": "b", "type": "jsonl", "paths": [str(corpus / "*.jsonl")],
                                            "id_field": "id"}],
              "stages": [{"stage": "dedup"}], "phases": [], "ray": {"num_cpus": WORKERS, "object_store_mb": 512}}
    (work / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    sys.exit(cli.main(["run", str(work / "recipe.yaml"), "--out", str(work / "out"), "--no-report"]))


def theirs_in_datatrove(corpus: Path, work: Path) -> None:
    """The child process: datatrove's 4-step MinHash pipeline; its kept documents land in work/out."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter

    config = MinhashConfig(n_grams=5, num_buckets=14, hashes_per_bucket=8)
    reader = JsonlReader(str(corpus))
    steps = [
        ([reader, MinhashDedupSignature(output_folder=str(work / "sigs"), config=config)], WORKERS),
        ([MinhashDedupBuckets(input_folder=str(work / "sigs"), output_folder=str(work / "buckets"), config=config)],
         config.num_buckets),
        ([MinhashDedupCluster(input_folder=str(work / "buckets"), output_folder=str(work / "remove"), config=config)], 1),
        ([reader, MinhashDedupFilter(input_folder=str(work / "remove")), JsonlWriter(str(work / "out"))], WORKERS),
    ]
    for index, (pipeline, tasks) in enumerate(steps):
        LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=WORKERS,
                              logging_dir=str(work / f"logs{index}")).run()


def whole_process(side: str, texts: list[str], work: Path) -> float:
    """Seconds from starting `bench/dedup.py --side SIDE` to its exit, on the corpus written to work/in:
    the same two files for both sides, halves of the corpus in order (so the run's order is the corpus')."""
    (work / "in").mkdir(parents=True)
    half = -(-len(texts) // WORKERS)
    for part in range(WORKERS):  # datatrove reads a folder, one file a task; ours, a partition a file
        with open(work / "in" / f"{part}.jsonl", "w") as out:
            out.writelines(json.dumps({"id": str(i), "text": texts[i]}) + "\n"
                           for i in range(part * half, min((part + 1) * half, len(texts))))
    started = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's datapipe, in the child and Ray's workers
    subprocess.run([sys.executable, __file__, "--side", side, "--work", str(work)], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def removed_by(side: str, work: Path, count: int) -> dict[int, int | None]:
    """{removed document: its survivor (ours) or None (datatrove does not say)}, from each side's output."""
    if side == "datatrove":
        kept = {int(json.loads(line)["id"]) for f in (work / "out").glob("*.jsonl.gz") for line in gzip.open(f)}
        return dict.fromkeys(set(range(count)) - kept)
    import zstandard

    removed = {}
    for path in (work / "out" / "rejects").glob("*.jsonl"):
        for record in map(json.loads, path.open()):
            if record["reject"].startswith("dedup."):  # a survivor's id: b/<id>@<place>
                removed[int(record["source_id"])] = int(record["notes"]["dedup"]["cluster"].split("/")[-1].split("@")[0])
    kept = sum(1 for f in (work / "out" / "documents").glob("*.jsonl.zst")
               for _ in zstandard.ZstdDecompressor().stream_reader(f.open("rb")).read().split(b"\n") if _)
    assert kept + len(removed) == count, "every document is kept or removed as a duplicate"
    return removed


def jaccard(a: str, b: str) -> float:
    def shingles(text):
        words = re.findall(r"\w+", text.lower())
        return {" ".join(words[i : i + 5]) for i in range(max(len(words) - 4, 1))}

    x, y = shingles(a), shingles(b)
    return len(x & y) / max(len(x | y), 1)


def score(removed, texts, base_count, copies, survivors=None) -> tuple[float, float]:
    planted = {base_count + k: original for k, (original, _) in enumerate(copies)}
    found = sum(copy in removed or original in removed for copy, original in planted.items())
    true = sum(is_true_duplicate(doc, texts, planted, survivors) for doc in removed)
    return found / len(planted), true / max(len(removed), 1)


def is_true_duplicate(doc: int, texts: list[str], planted: dict[int, int], survivors) -> bool:
    if doc in planted or doc in set(planted.values()):
        return True
    others = [survivors[doc]] if survivors is not None else near(doc, texts)
    return any(jaccard(texts[doc], texts[other]) >= 0.7 for other in others)


def near(doc: int, texts: list[str]) -> list[int]:
    """Candidates for datatrove's removals (it does not say which survivor): same first 200 chars."""
    return [i for i, t in enumerate(texts) if i != doc and t[:200] == texts[doc][:200]] or \
        [i for i, t in enumerate(texts) if i != doc and t[-200:] == texts[doc][-200:]]


def measure(texts: list[str], base_count: int, copies: list, repeat: int) -> dict:
    """One corpus: both sides as whole processes, `repeat` trials taken in turn (ours, datatrove,
    ours, ...) so a change in the shared machine's load falls on both; medians of the seconds and
    of the per-trial ratios. Then the stage functions alone, recall and precision."""
    removed_direct, direct_s = run_ours(texts)
    ours_times, their_times = [], []
    for trial in range(repeat):
        with tempfile.TemporaryDirectory() as work:
            ours_times.append(whole_process("ours", texts, Path(work) / "ours"))
            removed_ours = removed_by("ours", Path(work) / "ours", len(texts))
            their_times.append(whole_process("datatrove", texts, Path(work) / "datatrove"))
            removed_theirs = removed_by("datatrove", Path(work) / "datatrove", len(texts))
        print(f"  {len(texts)} docs, trial {trial + 1}: ours {ours_times[-1]:.1f} s, datatrove {their_times[-1]:.1f} s,"
              f" x{their_times[-1] / ours_times[-1]:.2f}", flush=True)
    assert removed_direct == removed_ours, "the runner and the stage functions disagree"
    ours_s, theirs_s = statistics.median(ours_times), statistics.median(their_times)
    ratio = statistics.median(t / o for o, t in zip(ours_times, their_times))
    recall, precision = score(set(removed_ours), texts, base_count, copies, removed_ours)
    their_recall, their_precision = score(set(removed_theirs), texts, base_count, copies)
    return {"docs": len(texts), "ours_s": ours_s, "datatrove_s": theirs_s, "ratio": ratio, "direct_s": direct_s,
            "removed": len(removed_ours), "datatrove_removed": len(removed_theirs), "recall": recall,
            "precision": precision, "datatrove_recall": their_recall, "datatrove_precision": their_precision}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="3264,13056", help="corpus sizes in documents, comma-separated")
    parser.add_argument("--repeat", type=int, default=1, help="trials per size, ours and datatrove in turn; medians")
    parser.add_argument("--side", choices=("ours", "datatrove"), help=argparse.SUPPRESS)  # a child process
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        (ours_with_the_cli if args.side == "ours" else theirs_in_datatrove)(args.work / "in", args.work)
        return
    if not DATA.is_file():
        sys.exit(f"bench dedup: needs {DATA}")
    base = [json.loads(line)["text"] for line in gzip.open(DATA)]
    copies = plant(base)
    planted = base + [text for _, text in copies]
    similarity = float(np.median([jaccard(base[i], text) for i, text in copies]))
    results = []
    for size in map(int, args.sizes.split(",")):
        result = measure(grow(planted, size), len(base), copies, args.repeat)
        results.append(result)
        print(f"{result['docs']} docs: ours {result['ours_s']:.1f} s whole process (stage functions alone "
              f"{result['direct_s']:.1f} s), removed {result['removed']}, recall {result['recall']:.3f}, precision "
              f"{result['precision']:.3f}; datatrove {result['datatrove_s']:.1f} s, removed "
              f"{result['datatrove_removed']}, recall {result['datatrove_recall']:.3f}, precision "
              f"{result['datatrove_precision']:.3f}; x_vs_datatrove={result['ratio']:.2f}",
              flush=True)
    speedups = {r["docs"]: r["ratio"] for r in results}
    print(f"bench dedup: sizes={args.sizes} planted={len(copies)} planted_median_jaccard={similarity:.2f} "
          f"workers={WORKERS} repeat={args.repeat} " + " ".join(f"x_vs_datatrove_{n}={x:.2f}" for n, x in speedups.items())
          + f" min_x_vs_datatrove={min(speedups.values()):.2f} recall={min(r['recall'] for r in results):.3f} "
          f"precision={min(r['precision'] for r in results):.3f}")


if __name__ == "__main__":
    main()
