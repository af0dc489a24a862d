"""A phase over many machines: partitions grouped, each group selected, packed and written by one task.

The driver knows, for every committed partition, what each source can give each phase (its
supply: datapipe.pipeline.partitions); from the sums it computes the phase's Targets over the
whole corpus as a single pass did (budget, mixture, limited_by). It then cuts the partitions, in
run order, into groups whose share of the budget reaches group_tokens (default 2,048 sequences of
seq_len, at most 512M tokens: a group's last sequence is its only partly filled one, so fill stays
above 99.9%, and a task holds at most ~2 GiB of tokens). Each group's task reads its partitions'
pieces, takes from each source the group's share of that source's target (the target times the
group's part of the source's supply) in a seeded order, packs best-fit, writes its shards
(shard-GGGGG-NNNNNN.tar), then, per partition, what the phase did with each document (outcomes),
then its marker, which commits it. Groups never share a document, so the figures add up; a
phase that fits in one group packs exactly as a global pass over the corpus did before groups.
"""
from __future__ import annotations

import io
import json
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from datapipe.packing.bfd import SpecialIds
from datapipe.packing.corpus import Corpus, corpus_from_tables, read_piece
from datapipe.packing.curriculum import (
    NOT_IN_MIXTURE,
    USED,
    CurriculumPhase,
    Selection,
    Targets,
    group_stats,
    pack_group,
)
from datapipe.packing.writer import ShardWriter
from datapipe.storage import Store

MAX_GROUP_TOKENS = 512 << 20  # ~2 GiB of uint32 tokens a pack task holds at the most
GROUP_SEQUENCES = 2048  # sequences a group packs by default: its last, partly filled one costs under 0.05%
MAX_READ_TOKENS = 1 << 30  # tokens a pack task reads at most (4 GiB), whatever share of them it takes


@dataclass(frozen=True)
class GroupJob:
    """One pack task: a phase's group of partitions (picklable: it rides into a Ray task)."""

    phase: CurriculumPhase
    group: int
    partitions: tuple[int, ...]
    pieces: tuple[str, ...]  # the partitions' pieces, under the work folder
    targets: Targets
    source_names: tuple[str, ...]
    seed: int
    tokenizer: str  # for the special ids packing needs
    samples_per_shard: int
    max_bytes: int | None

    @property
    def marker(self) -> str:
        return group_marker(self.phase.name, self.group)


def group_marker(phase: str, group: int) -> str:
    return f"phases/{phase}/g{group:05d}.json"


def outcome_name(phase: str, partition: int) -> str:
    return f"phases/{phase}/outcomes/p{partition:06d}.npy"


def group_tokens(phase: CurriculumPhase) -> int:
    return phase.group_tokens or min(GROUP_SEQUENCES * phase.seq_len, MAX_GROUP_TOKENS)


def plan_groups(phase: CurriculumPhase, supplies: list[np.ndarray], tokens: list[int], targets: Targets
                ) -> list[list[int]]:
    """Consecutive partitions (indices into `supplies`: each partition's supply per source; `tokens`:
    its live tokens) cut where a group's target tokens reach group_tokens, or where the tokens its
    task would read reach MAX_READ_TOKENS (a phase that takes a small fraction of a large corpus);
    a partition with nothing to give joins the group it falls in. Never empty: a phase with
    nothing to pack still has one (empty) group."""
    groups, current, wanted, read, size = [], [], 0.0, 0, group_tokens(phase)
    for index, (supply, count) in enumerate(zip(supplies, tokens)):
        current.append(index)
        wanted += float(targets.of_group(np.asarray(supply, dtype=float)).sum())
        read += count
        if wanted >= size or read >= MAX_READ_TOKENS:
            groups.append(current)
            current, wanted, read = [], 0.0, 0
    if current or not groups:
        groups.append(current)
    return groups


def run_group(job: GroupJob, work: Store, out: Store) -> dict[str, Any]:
    """A Ray task: select, pack and write one group of a phase; its marker, written last, is returned."""
    started, started_ms = time.monotonic(), time.time_ns() // 1_000_000
    corpus = corpus_from_tables([read_piece(work, name) for name in job.pieces], list(job.source_names))
    ids = SpecialIds.from_tokenizer(job.tokenizer)
    selection, sequences, samples = pack_group(job.phase, corpus, job.seed, ids, job.targets, job.group)
    writer = ShardWriter(out.child(job.phase.name), job.samples_per_shard, None, job.max_bytes,
                         prefix=f"shard-{job.group:05d}-")
    with writer:
        for sample in samples:
            writer.write(sample)
    shards = writer.close()
    write_outcomes(work, job, corpus, selection)
    marker = {"shards": shards, "stats": group_stats(job.phase, corpus, selection, sequences, shards),
              "wall_s": round(time.monotonic() - started, 2),
              "span_ms": [started_ms, time.time_ns() // 1_000_000]}  # the run's throughput over time
    work.write_bytes(job.marker, json.dumps(marker).encode())
    return marker


def write_outcomes(work: Store, job: GroupJob, corpus: Corpus, selection: Selection) -> None:
    """Per partition of the group: for each of its documents (in run order), the phase's outcome and
    how many copies it packed, as rows [outcome, uses] of an int64 array."""
    uses = np.bincount(selection.docs, minlength=len(corpus.lengths))
    for partition in job.partitions:
        rows = np.flatnonzero(corpus.partition == partition)
        table = np.stack([selection.outcome[rows].astype(np.int64), uses[rows]]) if len(rows) else np.zeros((2, 0))
        buffer = io.BytesIO()
        np.save(buffer, table.astype(np.int64), allow_pickle=False)
        work.write_bytes(outcome_name(job.phase.name, partition), buffer.getvalue())


def read_usage(work: Store, phases: list[str], partition: int) -> tuple[np.ndarray, np.ndarray]:
    """A partition's documents across phases: copies packed, and the closest a phase came to using
    each one (curriculum.Usage's rule: the smallest outcome of the phases that did not use it)."""
    uses, miss = None, None
    for phase in phases:
        outcome, used = np.load(io.BytesIO(work.read_bytes(outcome_name(phase, partition))), allow_pickle=False)
        closest = np.where(outcome == USED, NOT_IN_MIXTURE, outcome)
        uses = used if uses is None else uses + used
        miss = closest if miss is None else np.minimum(miss, closest)
    return uses, miss
