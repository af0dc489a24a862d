"""Near-dedup: our dedup stage against datatrove's 4-step MinHash pipeline, same documents.

Input: ../shared/data/web_text/web_docs.jsonl.gz (2,664 docs) plus PLANTED near-copies of
documents of >= 100 words: 1% of the words (at least one) replaced, and two paragraphs
swapped where there are two or more. The median true word-5-gram Jaccard of the planted
pairs is printed; at 14 bands x 8 rows pairs above ~0.8 are found with probability > 0.95.
Both sides: 5-gram shingles, 14 bands x 8 rows, 2 workers, end to end (signatures,
buckets, clusters, verdicts); datatrove through its LocalPipelineExecutor (JSONL in,
kept JSONL out, on local disk); ours through the datapipe runner on a local 2-CPU Ray
(JSONL source, the global dedup stage, every document consumed by the driver; Ray's
start-up is not counted), and, for reference, through the stage's functions alone in a
pool of 2 (signatures) and the driver (clusters). Recall: planted copies removed (or their
original, one of the pair) / planted. Precision: removed documents that are planted
copies or whose true word-5-gram Jaccard with their cluster's survivor is >= 0.7 /
removed. Run: .venv/bin/python bench/dedup.py   (make bench-deps first)
"""
from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "web_text" / "web_docs.jsonl.gz"
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


def run_ours_on_ray(texts: list[str], work: Path) -> tuple[dict[int, int], float]:
    from datapipe.pipeline.recipe import RayConfig, validate_recipe
    from datapipe.pipeline.runner import build_plan, connect
    from datapipe.schema import docs_from_table
    from datapipe.storage import Store
    from datapipe.text.dedup import Config

    path = work / "docs.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(texts)))
    raw = {"name": "bench", "sources": [{"name": "b", "type": "jsonl", "paths": [str(path)], "id_field": "id"}],
           "stages": [{"stage": "tokenize"}]}
    recipe = validate_recipe(raw).model_copy(update={"stages": [Config(stage="dedup")]})
    connect(RayConfig(num_cpus=WORKERS, object_store_mb=512), None)
    started = time.perf_counter()
    removed = {}
    for table in build_plan(recipe, work=Store(work / "work")).iter_batches(batch_format="pyarrow", batch_size=None):
        for doc in docs_from_table(table):
            if doc["reject"]:
                removed[int(doc["source_id"])] = int(doc["notes"]["dedup"]["cluster"].split("/")[-1])
    return removed, time.perf_counter() - started


def run_theirs(texts: list[str], work: Path) -> tuple[set[int], float]:
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

    (work / "in").mkdir(parents=True)
    for part in range(WORKERS):
        with open(work / "in" / f"{part}.jsonl", "w") as out:
            out.writelines(json.dumps({"id": str(i), "text": texts[i]}) + "\n" for i in range(part, len(texts), WORKERS))
    config = MinhashConfig(n_grams=5, num_buckets=14, hashes_per_bucket=8)
    reader = JsonlReader(str(work / "in"))
    steps = [
        ([reader, MinhashDedupSignature(output_folder=str(work / "sigs"), config=config)], WORKERS),
        ([MinhashDedupBuckets(input_folder=str(work / "sigs"), output_folder=str(work / "buckets"), config=config)],
         config.num_buckets),
        ([MinhashDedupCluster(input_folder=str(work / "buckets"), output_folder=str(work / "remove"), config=config)], 1),
        ([reader, MinhashDedupFilter(input_folder=str(work / "remove")), JsonlWriter(str(work / "out"))], WORKERS),
    ]
    started = time.perf_counter()
    for index, (pipeline, tasks) in enumerate(steps):
        LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=WORKERS,
                              logging_dir=str(work / f"logs{index}")).run()
    elapsed = time.perf_counter() - started
    kept = {int(json.loads(line)["id"]) for f in (work / "out").glob("*.jsonl.gz") for line in gzip.open(f)}
    return set(range(len(texts))) - kept, elapsed


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


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # no options: --help answers instead of starting the run
    if not DATA.is_file():
        sys.exit(f"bench dedup: needs {DATA}")
    base = [json.loads(line)["text"] for line in gzip.open(DATA)]
    copies = plant(base)
    texts = base + [text for _, text in copies]
    removed_direct, direct_s = run_ours(texts)
    with tempfile.TemporaryDirectory() as work:
        removed_ours, ours_s = run_ours_on_ray(texts, Path(work))
        removed_theirs, theirs_s = run_theirs(texts, Path(work) / "datatrove")
    recall, precision = score(set(removed_ours), texts, len(base), copies, removed_ours)
    their_recall, their_precision = score(removed_theirs, texts, len(base), copies)
    ours_rate, theirs_rate = len(texts) / ours_s, len(texts) / theirs_s
    similarity = float(np.median([jaccard(base[i], text) for i, text in copies]))
    assert removed_direct == removed_ours, "the runner and the stage functions disagree"
    print(f"ours on Ray: removed {len(removed_ours)} in {ours_s:.1f} s (stage functions alone: {direct_s:.1f} s); "
          f"datatrove: removed {len(removed_theirs)} in "
          f"{theirs_s:.1f} s (recall {their_recall:.3f}, precision {their_precision:.3f})")
    print(f"bench dedup: docs={len(texts)} planted={len(copies)} planted_median_jaccard={similarity:.2f} "
          f"workers={WORKERS} docs_per_s={ours_rate:.0f} "
          f"datatrove_docs_per_s={theirs_rate:.0f} x_vs_datatrove={ours_rate / theirs_rate:.2f} "
          f"recall={recall:.3f} precision={precision:.3f}")


if __name__ == "__main__":
    main()
