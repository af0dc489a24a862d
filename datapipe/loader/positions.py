"""Position ids of a span's samples, derived from their doc_lens as datapipe.shardformat's
derive_position_ids defines them (0, 1, ... restarting at each document piece, the padding
one more piece), many rows at once.

A prefetch thread tiles a located span's pieces (span_positions: numpy on doc_lens alone,
microseconds); the rows are made as the samples go out, CHUNK_BYTES of them at a time
(SpanPositions[a:b]): each piece is the start of one cached 0..seq_len-1 ramp, copied into
memory from a pool in one np.concatenate, 3-5 us a sample at 8K tokens, ~50 at 64K where
the rows are as large as the tokens (int32 a token). Made ahead for whole spans (32 MiB a
span of 1,024 samples at 8K, 3-4 spans in flight) they cost a fresh process 0.4-0.8 s of
page faults on our VM, and the per-sample loader ran at 0.13-0.14 of `cat` at 8K and 0.28 at
64K; a chunk at a time the same few pooled megabytes are reused, warm in the cache: 0.36-0.40
and 0.5 (bench/stream.py, fresh processes). A span that does not tile (another writer's:
tokens of several lengths, a seq_len other than the tokens') takes derive_position_ids
sample by sample (finish_samples).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from datapipe.loader.decode import ArrayColumn, BadSample, SpanLayout
from datapipe.loader.shardindex import ShardError
from datapipe.shardformat import derive_position_ids, int32_range

CHUNK_BYTES = 1 << 20  # position ids made at a time: a few such buffers stay in the L2/L3 cache and the pool


class SpanPositions:
    """A span's position ids, made when sliced: positions[a:b] are samples a..b-1's rows (int32,
    (b - a) x seq_len, in memory from `pool`)."""

    def __init__(self, pieces: np.ndarray, ends: np.ndarray, seq_len: int, pool: Any = None):
        self.pieces, self.ends, self.seq_len, self.pool = pieces, ends, seq_len, pool  # sample i: pieces[ends[i-1]:ends[i]]
        self.chunk = max(1, CHUNK_BYTES // (4 * seq_len))  # rows a slice should ask for at a time

    def __len__(self) -> int:
        return len(self.ends)

    def __getitem__(self, rows: slice) -> np.ndarray:
        start, stop, _ = rows.indices(len(self.ends))
        if stop <= start:
            return np.empty((0, self.seq_len), dtype=np.int32)
        first = int(self.ends[start - 1]) if start else 0
        return ramps(self.pieces[first : int(self.ends[stop - 1])], stop - start, self.seq_len, self.pool)


def span_positions(layout: SpanLayout, pool: Any = None) -> SpanPositions | None:
    """The position ids of a located span's samples, row i for its sample i, for its tokens'
    length. None unless every sample has integer doc_lens and tokens of one length, and the
    pieces fit (finish_samples checks each row against its sample's seq_len). Numpy only: a
    prefetch thread runs it."""
    lens, tokens, size = layout.columns.get("doc_lens.npy"), layout.columns.get("tokens.npy"), len(layout.keys)
    if not (isinstance(lens, ArrayColumn) and isinstance(tokens, ArrayColumn)) or lens.typed.dtype.kind not in "iu":
        return None
    if len(lens.numbers) != size or len(tokens.numbers) != size or (tokens.counts != tokens.counts[0]).any():
        return None
    firsts = np.cumsum(lens.counts) - lens.counts  # where each sample's pieces start in the gathered array
    flat = lens.typed[np.repeat(lens.starts - firsts, lens.counts) + np.arange(int(lens.counts.sum()))]
    pieces = tile_pieces(flat, lens.counts, int(tokens.counts[0]))
    return None if pieces is None else SpanPositions(pieces, np.cumsum(lens.counts + 1), int(tokens.counts[0]), pool)


def positions_of(flat: np.ndarray, counts: np.ndarray, seq_len: int, pool: Any = None) -> np.ndarray | None:
    """Position ids (int32, samples x seq_len) of samples whose document pieces are `flat`,
    counts[i] of them for sample i; None unless they tile (tile_pieces)."""
    pieces = tile_pieces(flat, counts, seq_len)
    return None if pieces is None else ramps(pieces, len(counts), seq_len, pool)


def ramps(pieces: np.ndarray, samples: int, seq_len: int, pool: Any = None) -> np.ndarray:
    """The rows of pieces that tile samples x seq_len: a ramp 0, 1, ... per piece, all copied in
    one np.concatenate into memory from `pool` (a datapipe.loader.fetch.BufferPool: reused
    memory, where a fresh array costs the kernel a page fault and a zero-fill per 4 KiB)."""
    size = samples * seq_len
    out = (pool.take(4 * size) if pool else np.empty(4 * size, dtype=np.uint8)).view(np.int32)
    ramp = int32_range(seq_len)
    return np.concatenate([ramp[:n] for n in pieces[pieces > 0].tolist()], out=out).reshape(samples, seq_len)


def tile_pieces(flat: np.ndarray, counts: np.ndarray, seq_len: int) -> np.ndarray | None:
    """The pieces with each sample's padding as one more, so that they tile samples x seq_len."""
    flat = flat.astype(np.int64)
    if not len(counts) or counts.min() == 0 or (len(flat) and flat.min() < 0):
        return None
    ends = np.cumsum(counts)
    padding = seq_len - np.add.reduceat(flat, ends - counts)
    return None if padding.min() < 0 else np.insert(flat, ends, padding)


def finish_samples(samples: list, positions: np.ndarray | None, with_positions: bool, shard: str) -> None:
    """The fields a shard does not store, into a span's decoded samples (other items are left
    alone): media_spans (empty for text) and, `with_positions`, position ids: row i of
    `positions` (span_positions') for samples[i] when every sample's seq_len is its width;
    otherwise derived sample by sample. A sample whose doc_lens cannot be its pieces (damage:
    negative, or more than seq_len in all) becomes a BadSample of `shard`."""
    decoded = [sample for sample in samples if sample.__class__ is dict]
    for sample in decoded:
        sample.setdefault("media_spans", [])
    if not with_positions or not decoded:
        return
    width = None if positions is None else positions.shape[1]  # a sample without its json header: the tokens'
    if width is not None and all(s.get("seq_len", width) == width and "doc_lens" in s for s in decoded):
        for sample, row in zip(samples, positions):
            if sample.__class__ is dict:
                sample["position_ids"] = row
        return
    for number, sample in enumerate(samples):
        seq_len = sequence_length(sample) if sample.__class__ is dict and "doc_lens" in sample else None
        if seq_len is not None and pieces_fit(sample["doc_lens"], seq_len):
            sample["position_ids"] = derive_position_ids(sample["doc_lens"], seq_len)
        elif seq_len is not None:
            samples[number] = BadSample(shard, ShardError(
                f"{shard}: sample {sample['key']}: doc_lens {np.asarray(sample['doc_lens']).tolist()} are not pieces "
                f"of seq_len {seq_len!r}; check it with verify=True, rewrite it, or read with on_error='skip'"))


def sequence_length(sample: dict[str, Any]) -> int | None:
    """The sample's seq_len (its json header); without the header (the loader's fields= left it
    out) its tokens' length, which the writer makes equal; None without either."""
    if "seq_len" in sample:
        return sample["seq_len"]
    tokens = sample.get("tokens")
    return None if tokens is None else len(tokens)


def pieces_fit(doc_lens: Any, seq_len: Any) -> bool:
    """doc_lens can be a sample's pieces: integers, none negative, seq_len (an int) at most in all."""
    if seq_len.__class__ is not int:  # a header of another writer may hold "16" or 16.0
        return False
    lens = np.asarray(doc_lens)
    return lens.ndim == 1 and lens.dtype.kind in "iu" and lens.min(initial=0) >= 0 and \
        int(lens.sum(dtype=np.int64)) <= seq_len
