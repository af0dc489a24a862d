"""Which samples one (rank, DataLoader worker) reads in an epoch, and in what order.

Index arithmetic only, so every rank computes every other rank's share without talking
to it, and a resume jumps to any position without replaying anything.

An epoch walks the curriculum's phases in order. A phase gives every rank the same
`quota` of samples: its token budget over its mean tokens per sample, divided by
world_size (no budget: one pass over its shards). A pass over a phase lays its shards end
to end in an order permuted from (seed, epoch, phase, pass), the same on every rank;
rank r takes the r-th of world_size equal contiguous slices (the remainder, fewer than
world_size samples, sits out this pass; the next pass's permutation leaves out others),
and worker w the w-th contiguous part of that slice. Contiguous slices keep reads
sequential: a rank opens about 1/world_size of the shards per pass, not all of them.

Within one (rank, worker) and pass, samples are shuffled in windows of `shuffle_window`
consecutive samples, each window by its own permutation from (seed, epoch, phase, pass,
rank, worker, window). The loader holds one window in memory, as WebDataset holds its
shuffle buffer, but the order depends on the position alone. Permutations are
sorts by a splitmix64 hash of (key, item), so they never change with a library version.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Phase:
    """One curriculum phase as the loader sees it: where its shards are and what it must deliver."""

    name: str
    location: str  # the phase folder: a local path or a URL
    shards: tuple[dict[str, Any], ...]  # manifest entries: name, samples, tokens, bytes, sha256
    token_budget: int | None  # tokens to train on before the next phase; None = one pass

    @property
    def samples(self) -> int:
        return sum(shard["samples"] for shard in self.shards)

    def budget_samples(self) -> int:
        tokens = sum(shard["tokens"] for shard in self.shards)
        if self.token_budget is None or tokens == 0:
            return self.samples
        return math.ceil(self.token_budget * self.samples / tokens)


@dataclass(frozen=True)
class Span:
    """Consecutive samples [start, stop) of one shard."""

    phase: int  # index into the run's phases
    shard: int
    start: int
    stop: int


@dataclass(frozen=True)
class Segment:
    """One pass over one phase, as one (rank, worker) reads it."""

    phase: int
    pass_index: int
    spans: tuple[Span, ...]
    length: int


@dataclass(frozen=True)
class Placement:
    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1


def epoch_schedule(phases: list[Phase], place: Placement, seed: int, epoch: int, shuffle: bool) -> list[Segment]:
    """Every segment this (rank, worker) reads in `epoch`, in order."""
    segments = []
    for index, phase in enumerate(phases):
        if not phase.samples or phase.token_budget == 0:
            continue  # a phase that packed nothing (every document too long, say), or one asked for no tokens
        per_pass = phase.samples // place.world_size
        if per_pass == 0:
            raise ValueError(f"phase {phase.name!r} ({phase.location}) has {phase.samples} samples for "
                             f"{place.world_size} ranks; every rank needs at least one: "
                             "write more data or use fewer ranks")
        quota = phase.budget_samples() // place.world_size
        for pass_index in range(math.ceil(quota / per_pass)):
            count = min(per_pass, quota - pass_index * per_pass)
            lo = place.rank * per_pass + place.worker * count // place.num_workers
            hi = place.rank * per_pass + (place.worker + 1) * count // place.num_workers
            order = shard_order(len(phase.shards), seed, epoch, index, pass_index, shuffle)
            spans = slice_spans(phase, index, order, lo, hi)
            segments.append(Segment(index, pass_index, spans, hi - lo))
    return segments


def shard_order(n_shards: int, seed: int, epoch: int, phase: int, pass_index: int, shuffle: bool) -> np.ndarray:
    if not shuffle:
        return np.arange(n_shards)
    return permutation(n_shards, [seed, epoch, phase, pass_index])


def slice_spans(phase: Phase, phase_index: int, order: np.ndarray, lo: int, hi: int) -> tuple[Span, ...]:
    """Samples lo..hi-1 of the shards laid end to end in `order`, as per-shard spans."""
    counts = np.array([phase.shards[i]["samples"] for i in order], dtype=np.int64)
    ends = np.cumsum(counts)
    spans, i = [], int(np.searchsorted(ends, lo, side="right"))
    while lo < hi:
        first = int(ends[i] - counts[i])
        stop = min(hi, int(ends[i]))
        spans.append(Span(phase_index, int(order[i]), lo - first, stop - first))
        lo, i = stop, i + 1
    return tuple(spans)


def windows(segments: list[Segment], place: Placement, seed: int, epoch: int,
            shuffle_window: int) -> Iterator[tuple[int, int, list[int]]]:
    """(first epoch position, size, permutation key) of every shuffle window of the epoch."""
    position = 0
    for segment in segments:
        for number, lo in enumerate(range(0, segment.length, shuffle_window)):
            key = [seed, epoch, segment.phase, segment.pass_index, place.rank, place.worker, number]
            yield position + lo, min(shuffle_window, segment.length - lo), key
        position += segment.length


def window_order(size: int, key: list[int], shuffle: bool) -> list[int]:
    if not shuffle or size == 1:
        return list(range(size))
    return permutation(size, key).tolist()


def permutation(n: int, key: list[int]) -> np.ndarray:
    """A permutation of range(n) fixed by `key` forever: items sorted by a splitmix64 hash of
    (key, item). NumPy's Generator promises no stream compatibility across releases, and a
    resumed run after an upgrade must still see the same order."""
    text = ",".join(str(int(k)) for k in key)  # the same for Python and NumPy integers
    base = np.uint64(int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little"))
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps, as splitmix64 intends
        z = np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + base
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return np.argsort(z, kind="stable")


def phase_ends(segments: list[Segment]) -> list[int]:
    """The epoch positions where each phase's samples end (its passes follow each other)."""
    ends, position = [], 0
    for segment, following in zip(segments, [*segments[1:], None]):
        position += segment.length
        if following is None or following.phase != segment.phase:
            ends.append(position)
    return ends


def spans_from(segments: list[Segment], position: int) -> Iterator[Span]:
    """The spans that hold epoch positions position, position+1, ... to the end of the epoch."""
    for segment in segments:
        if position >= segment.length:
            position -= segment.length
            continue
        for span in segment.spans:
            size = span.stop - span.start
            if position >= size:
                position -= size
                continue
            yield Span(span.phase, span.shard, span.start + position, span.stop)
            position = 0
