"""Exact and MinHash-LSH near-duplicate removal, global across the dataset and all workers.

A global stage: the runner hands it the whole dataset (`transform_dataset`). It
1. materializes the dataset once (upstream stages run once),
2. computes per live document, in parallel map tasks, a 64-bit hash of the normalized
   text (lower-cased, whitespace collapsed) and a MinHash signature over word
   `ngram_size`-shingles (`bands` x `rows` permutations of a 64-bit xxhash), kept as
   one 64-bit key per band,
3. pulls only (key, id, hashes) to the driver - 16 + id + 8 * (1 + bands) bytes a
   document, about 150 MB for 1M documents at 14 bands - and finds clusters there with
   numpy (by position in dataset order): documents
   sharing an exact hash, or any band key, are joined (union-find over the sorted keys),
4. maps the verdicts back: in each cluster the earliest document in dataset order
   survives; the others are rejected as dedup.exact_duplicate or dedup.near_duplicate.
   Every member of a cluster gets notes["dedup"] = {"cluster": survivor id, "size": n}.
Verdicts travel by a random 128-bit key per record (a column added before step 1 and
dropped with the verdicts), not by document id: ids come from a source's id_field when
it has one, and two rows with one id would otherwise share one verdict (a unique text
rejected as its namesake's duplicate). The keys are drawn once, in the materialized
dataset; on a cluster, a block lost with its node is rebuilt by re-running its task, which
draws new keys, and its documents then meet no verdict and are kept (duplicates pass, none
is lost). Deterministic keys (a hash of the row) would give identical rows one key and one
verdict, which rejects the survivor with its copies: worse.
Dataset order is deterministic (the runner preserves order), so the same input gives
the same survivors. 14 bands x 8 rows catch pairs of Jaccard similarity >= ~0.8 with
probability > 0.99 and pairs below ~0.5 rarely (the S-curve 1-(1-s^8)^14).
"""
from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np
from pydantic import Field

from datapipe.schema import Document, docs_from_table
from datapipe.stage import StageConfig
from datapipe.text.gopher import sorted_runs

MERSENNE = np.uint64((1 << 61) - 1)
KEY = "dedup_key"  # the per-record key column between the passes (16 random bytes)
WORD = re.compile(r"\w+")
SPACES = re.compile(r"\s+")


class Config(StageConfig):
    exact: bool = True  # drop documents whose normalized text repeats an earlier one
    near: bool = True  # MinHash-LSH near-duplicates
    ngram_size: int = Field(5, ge=1)  # words per shingle: 5 is datatrove's and FineWeb's choice
    bands: int = Field(14, ge=1)  # LSH bands; more bands catch lower similarity
    rows: int = Field(8, ge=1)  # permutations per band; more rows demand higher similarity
    seed: int = 1  # the hash permutations; changing it changes which borderline pairs match
    batch_size: int = 512


def make_stage(cfg: Config) -> Callable[[list[Document]], list[Document]]:
    """Per-batch dedup (within one batch only); the runner uses transform_dataset instead."""

    def dedup_batch(docs: list[Document]) -> list[Document]:
        rows = [signature_row(doc["text"], cfg) for doc in docs]
        exact = np.array([r[0] for r in rows], np.uint64)
        bands = np.array([r[1] for r in rows], np.uint64).reshape(len(rows), cfg.bands)
        for position, (reason, survivor, size) in find_clusters(np.arange(len(docs)), exact, bands, cfg).items():
            judge(docs[position], reason, docs[survivor]["id"], size)
        return docs

    return dedup_batch


def transform_dataset(dataset: Any, cfg: Config, map_documents: Callable) -> Any:
    """The global pass (see the module docstring); returns the dataset with verdicts applied."""
    reserved = cfg.reservation()  # every pass reserves what the recipe gives the stage (num_cpus, resources...)
    dataset = dataset.map_batches(with_keys, batch_size=cfg.batch_size, batch_format="pyarrow", **reserved).materialize()
    signatures = dataset.map_batches(signature_table, fn_kwargs={"cfg": cfg}, batch_size=cfg.batch_size,
                                     batch_format="pyarrow", **reserved)
    keys, ids, exact, bands = collect(signatures, cfg)
    verdicts = find_clusters(np.arange(len(keys)), exact, bands, cfg)
    by_key = {keys[p]: (reason, ids[survivor], size) for p, (reason, survivor, size) in verdicts.items()}
    return map_documents(dataset, Verdicts(by_key))


def with_keys(table):
    """A Ray task: the batch with a random 128-bit key per record (collisions: ~n^2 / 2^129)."""
    import pyarrow as pa

    return table.append_column(KEY, pa.array([os.urandom(16) for _ in range(len(table))], pa.binary(16)))


def signature_table(table, cfg: Config):
    """A Ray task: (key, id, exact hash, band keys) of each live document of a batch, in order.
    Rejected documents take no part in dedup, so they cost no MinHash (~1.6 ms a document)."""
    import pyarrow as pa

    live = [doc for doc in docs_from_table(table) if not doc["reject"]]
    rows = [signature_row(doc["text"], cfg) for doc in live]
    return pa.table({  # explicit types: a batch with no live document still has the schema
        KEY: pa.array([doc[KEY] for doc in live], pa.binary(16)),
        "id": pa.array([doc["id"] for doc in live], pa.string()),
        "exact": pa.array([r[0] for r in rows], pa.uint64()),
        "bands": pa.array([r[1] for r in rows], pa.list_(pa.uint64(), cfg.bands)),
    })


def collect(signatures: Any, cfg: Config) -> tuple[list[bytes], list[str], np.ndarray, np.ndarray]:
    """The live documents' keys, ids and hashes on the driver, in dataset order."""
    keys, ids, exact, bands = [], [], [], []
    for table in signatures.iter_batches(batch_format="pyarrow", batch_size=None):
        keys += table.column(KEY).to_pylist()
        ids += table.column("id").to_pylist()
        exact.append(table.column("exact").to_numpy())
        bands.append(table.column("bands").combine_chunks().flatten().to_numpy().reshape(-1, cfg.bands))
    if not ids:
        return [], [], np.zeros(0, np.uint64), np.zeros((0, cfg.bands), np.uint64)
    return keys, ids, np.concatenate(exact), np.concatenate(bands)


def signature_row(text: str, cfg: Config) -> tuple[int, list[int]]:
    import xxhash

    normalized = SPACES.sub(" ", unicodedata.normalize("NFKC", text).lower()).strip()
    exact = xxhash.xxh3_64_intdigest(normalized.encode("utf-8", "surrogatepass"))
    return exact, band_keys(minhash(normalized, cfg), cfg)


def minhash(normalized: str, cfg: Config) -> np.ndarray:
    """bands*rows minima of (a*h + b) mod (2^61 - 1) over the shingle hashes h. A shingle's hash
    combines the 64-bit xxhash of its words polynomially, vectorized over the document."""
    import xxhash

    words = WORD.findall(normalized) or [""]
    vocabulary = {word: xxhash.xxh64_intdigest(word.encode("utf-8", "surrogatepass")) for word in dict.fromkeys(words)}
    ids = np.fromiter(map(vocabulary.__getitem__, words), np.uint64, count=len(words))
    n = min(cfg.ngram_size, len(words))
    keys = ids[: len(ids) - n + 1].copy()
    for i in range(1, n):
        keys = keys * np.uint64(0x100000001B3) + ids[i : len(ids) - n + 1 + i]
    hashes = np.unique(keys) & np.uint64((1 << 61) - 1)
    a, b = permutations(cfg.bands * cfg.rows, cfg.seed)
    # (a*h + b) mod p with 64-bit wraparound is not exact modular arithmetic, but it is a
    # fixed random-looking function per permutation, which is all MinHash needs.
    return ((hashes[:, None] * a + b) % MERSENNE).min(axis=0)


@lru_cache(maxsize=8)
def permutations(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.integers(1, 1 << 61, count, dtype=np.uint64), rng.integers(0, 1 << 61, count, dtype=np.uint64))


def band_keys(signature: np.ndarray, cfg: Config) -> list[int]:
    import xxhash

    rows = signature.reshape(cfg.bands, cfg.rows)
    return [xxhash.xxh3_64_intdigest(band.tobytes() + bytes([i])) for i, band in enumerate(rows)]


def find_clusters(positions: np.ndarray, exact: np.ndarray, bands: np.ndarray,
                  cfg: Config) -> dict[int, tuple[str, int, int]]:
    """{position: (reject reason or "", survivor position, cluster size)} for every document in a
    cluster of two or more; survivors are the smallest position of their cluster."""
    n = len(positions)
    parent = np.arange(n)
    exact_root = join_equal(parent, exact) if cfg.exact else np.arange(n)
    if cfg.near:
        for band in range(bands.shape[1]):
            join_equal(parent, bands[:, band])
    roots = np.array([find(parent, i) for i in range(n)], dtype=np.int64)
    sizes = np.bincount(roots, minlength=n)
    verdicts = {}
    for i in np.flatnonzero(sizes[roots] > 1):
        root = roots[i]
        reason = "" if i == root else ("exact_duplicate" if exact_root[i] != i else "near_duplicate")
        verdicts[int(positions[i])] = (reason, int(positions[root]), int(sizes[root]))
    return verdicts


def join_equal(parent: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Union every run of equal keys into its earliest member; returns that member per row."""
    order, starts = sorted_runs(keys)  # stable: within a run, positions ascend
    first = order[np.maximum.accumulate(np.where(starts, np.arange(len(keys)), 0))]
    firsts = np.empty_like(first)
    firsts[order] = first
    for i in np.flatnonzero(firsts != np.arange(len(keys))):
        union(parent, int(firsts[i]), int(i))
    return firsts


def find(parent: np.ndarray, i: int) -> int:
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return int(i)


def union(parent: np.ndarray, a: int, b: int) -> None:
    root_a, root_b = find(parent, a), find(parent, b)
    if root_a != root_b:  # the smaller position becomes the root: it is the survivor
        parent[max(root_a, root_b)] = min(root_a, root_b)


class Verdicts:
    """The per-batch step: sets rejects and cluster ids from the global verdicts (picklable)."""

    def __init__(self, by_key: dict[bytes, tuple[str, str, int]]):
        self.by_key = by_key

    def __call__(self, docs: list[Document]) -> list[Document]:
        for doc in docs:
            verdict = self.by_key.get(doc.pop(KEY, None))
            if verdict is not None:
                judge(doc, *verdict)
        return docs


def judge(doc: Document, reason: str, survivor: str, size: int) -> None:
    doc["notes"]["dedup"] = {"cluster": survivor, "size": size}
    if reason:
        doc["reject"] = f"dedup.{reason}"
