"""Pack tokenized documents into sequences of exactly `seq_len` tokens.

Best-fit decreasing over a window of documents: the window's pieces are sorted by
length, longest first, and each goes into the open sequence with the least room
that still fits it (a sorted list of remaining capacities, found by bisection).
Only a document longer than `seq_len` is split, into `seq_len` pieces and a
remainder. At the end of a window every sequence is closed and padded explicitly,
so no token is lost; a larger window leaves fewer partly filled sequences.
"""
from __future__ import annotations

import bisect
from typing import Iterator

import numpy as np

from datapipe.schema import PackedSample


class Packer:
    """Collects documents and yields PackedSamples, one window at a time."""

    def __init__(self, name: str, seq_len: int, window: int, pad_id: int):
        self.name, self.seq_len, self.window, self.pad_id = name, seq_len, window, pad_id
        self.pending: list[tuple[str, np.ndarray]] = []
        self.emitted = 0
        self.split_docs = 0

    def add(self, doc_id: str, tokens: np.ndarray) -> Iterator[PackedSample]:
        self.pending.append((doc_id, tokens))
        if len(self.pending) >= self.window:
            yield from self.flush()

    def flush(self) -> Iterator[PackedSample]:
        pieces = self.split_long(self.pending)
        self.pending = []
        for bin_pieces in best_fit_decreasing(pieces, self.seq_len):
            yield self.make_sample(bin_pieces)

    def split_long(self, docs: list[tuple[str, np.ndarray]]) -> list[tuple[str, np.ndarray]]:
        pieces = []
        for doc_id, tokens in docs:
            if len(tokens) > self.seq_len:
                self.split_docs += 1
            pieces.extend((doc_id, tokens[i : i + self.seq_len]) for i in range(0, len(tokens), self.seq_len))
        return pieces

    def make_sample(self, pieces: list[tuple[str, np.ndarray]]) -> PackedSample:
        used = sum(len(tokens) for _, tokens in pieces)
        num_pad = self.seq_len - used
        tokens = np.full(self.seq_len, self.pad_id, dtype=np.uint32)
        tokens[:used] = np.concatenate([t for _, t in pieces])
        sample: PackedSample = {
            "key": f"{self.name}-{self.emitted:09d}",
            "tokens": tokens,
            "doc_lens": np.array([len(t) for _, t in pieces], dtype=np.int32),
            "doc_ids": [doc_id for doc_id, _ in pieces],
            "seq_len": self.seq_len,
            "num_pad": num_pad,
        }
        self.emitted += 1
        return sample


def best_fit_decreasing(pieces: list[tuple[str, np.ndarray]], capacity: int) -> list[list[tuple[str, np.ndarray]]]:
    """Bins of pieces, each bin's total at most `capacity`; deterministic for equal lengths."""
    order = sorted(range(len(pieces)), key=lambda i: (-len(pieces[i][1]), i))
    bins: list[list[tuple[str, np.ndarray]]] = []
    room: list[tuple[int, int]] = []  # (remaining capacity, bin index), sorted
    for i in order:
        size = len(pieces[i][1])
        at = bisect.bisect_left(room, (size, -1))
        if at == len(room):
            bins.append([])
            remaining, index = capacity, len(bins) - 1
        else:
            remaining, index = room.pop(at)
        bins[index].append(pieces[i])
        if remaining - size > 0:
            bisect.insort(room, (remaining - size, index))
    return bins
