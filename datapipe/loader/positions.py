"""Position ids for decoded samples, derived from doc_lens (datapipe.shardformat.derive_position_ids
defines them); the fast paths compute a whole span's at once in a prefetch thread."""
from __future__ import annotations

from typing import Any

import numpy as np

from datapipe.loader.decode import BadSample
from datapipe.loader.shardindex import ShardError
from datapipe.schema import PackedSample
from datapipe.shardformat import derive_position_ids, int32_range


def finish_sample(sample: dict[str, Any], with_positions: bool = True) -> PackedSample:
    """The fields a shard does not store: an images list (empty for text), media_spans, and the
    position ids that doc_lens imply. The decoder (datapipe.loader.decode) put images in span order."""
    sample.setdefault("images", [])
    sample.setdefault("media_spans", [])
    seq_len = sequence_length(sample) if with_positions and "doc_lens" in sample else None
    if seq_len is not None:
        sample["position_ids"] = derive_position_ids(sample["doc_lens"], seq_len)
    return sample

def finish_samples(samples: list, with_positions: bool = True, buffers: Any = None,
                   positions: np.ndarray | None = None, shard: str = "a shard") -> None:
    """finish_sample for a list of decoded samples (other items in it are left alone). Position
    ids: row i of `positions` (span_positions') for samples[i] when every sample's seq_len is its
    width, otherwise all derived here at once (add_position_ids), into memory from `buffers` (a
    datapipe.loader.fetch.BufferPool) when given. A sample whose doc_lens cannot be its pieces (damage:
    negative, or more than seq_len in all) becomes a BadSample of `shard`."""
    decoded = [finish_sample(sample, with_positions=False) for sample in samples if sample.__class__ is dict]
    if not with_positions or not decoded:
        return
    width = None if positions is None else positions.shape[1]  # a sample without its json header: the tokens'
    if width is not None and all(s.get("seq_len", width) == width and "doc_lens" in s for s in decoded):
        for sample, row in zip(samples, positions):
            if sample.__class__ is dict:
                sample["position_ids"] = row
        return
    kept, lengths = [], []
    for number, sample in enumerate(samples):
        seq_len = sequence_length(sample) if sample.__class__ is dict and "doc_lens" in sample else None
        if seq_len is None:
            continue
        if not pieces_fit(sample["doc_lens"], seq_len):
            samples[number] = BadSample(shard, ShardError(
                f"{shard}: sample {sample['key']}: doc_lens {np.asarray(sample['doc_lens']).tolist()} are not pieces "
                f"of seq_len {seq_len!r}; check it with verify=True, rewrite it, or read with on_error='skip'"))
        else:
            kept.append(sample)
            lengths.append(seq_len)
    add_position_ids(kept, lengths, buffers)

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

def add_position_ids(samples: list[dict[str, Any]], lengths: list[int], buffers: Any = None) -> None:
    """Each sample's position ids for its sequence length (lengths[i] for samples[i]), as rows of
    one array (positions_from_pieces); samples whose pieces do not tile it (mixed lengths, pieces
    longer than the sequence, none) take derive_position_ids one at a time."""
    if not samples:
        return
    seq_len, lens = lengths[0], [np.asarray(s["doc_lens"]) for s in samples]
    counts = np.fromiter(map(len, lens), dtype=np.int64, count=len(lens))
    pieces = None if any(n != seq_len for n in lengths) else tile_pieces(np.concatenate(lens), counts, seq_len)
    if pieces is None:
        for sample, length in zip(samples, lengths):
            sample["position_ids"] = derive_position_ids(sample["doc_lens"], length)
        return
    for sample, row in zip(samples, positions_from_pieces(pieces, len(samples), seq_len, buffers)):
        sample["position_ids"] = row

def span_positions(plan: Any, buffers: Any = None) -> np.ndarray | None:
    """The position ids of a planned span (datapipe.loader.decode.SpanPlan), row i for its sample i,
    before any sample is built: a prefetch thread runs it while the main thread decodes the
    previous span, and its big numpy passes release the GIL. The sequence length is the tokens'
    (finish_samples checks it against each sample's seq_len). None unless every sample has
    integer doc_lens and tokens of one length, and its pieces fit."""
    from datapipe.loader.decode import ArrayColumn

    lens, tokens, size = plan.columns.get("doc_lens.npy"), plan.columns.get("tokens.npy"), len(plan.keys)
    if not (isinstance(lens, ArrayColumn) and isinstance(tokens, ArrayColumn)) or lens.typed.dtype.kind not in "iu":
        return None
    if len(lens.numbers) != size or len(tokens.numbers) != size or (tokens.counts != tokens.counts[0]).any():
        return None
    firsts = np.cumsum(lens.counts) - lens.counts  # where each sample's pieces start in the gathered array
    flat = lens.typed[np.repeat(lens.starts - firsts, lens.counts) + np.arange(int(lens.counts.sum()))]
    pieces = tile_pieces(flat, lens.counts, int(tokens.counts[0]))
    return None if pieces is None else positions_from_pieces(pieces, size, int(tokens.counts[0]), buffers)

def tile_pieces(flat: np.ndarray, counts: np.ndarray, seq_len: int) -> np.ndarray | None:
    """Samples' document pieces (flat, counts[i] for sample i) with each sample's padding as one
    more piece, so they tile samples x seq_len; None if some sample has no piece, a negative
    one, or more than seq_len."""
    flat = flat.astype(np.int64)
    if not len(counts) or counts.min() == 0 or (len(flat) and flat.min() < 0):
        return None
    ends = np.cumsum(counts)
    padding = seq_len - np.add.reduceat(flat, ends - counts)
    return None if padding.min() < 0 else np.insert(flat, ends, padding)

def positions_from_pieces(pieces: np.ndarray, samples: int, seq_len: int, buffers: Any = None) -> np.ndarray:
    """Position ids (int32, samples x seq_len) of pieces that tile the rows: each piece's positions
    are the start of one cached 0..seq_len-1 ramp, all copied in one np.concatenate. 8 us a sample
    at 8K tokens, 64 at 64K (a fill and a running sum over the array took 9 and 85: the array is
    as large as the tokens, so memory traffic sets the cost); derive_position_ids one sample at a
    time costs 18 at 8K. Memory from `buffers` (reused) matters as much, as a fresh array costs the
    kernel a page fault and a zero-fill per 4 KiB."""
    size = samples * seq_len
    out = (buffers.take(4 * size) if buffers else np.empty(4 * size, dtype=np.uint8)).view(np.int32)
    ramp = int32_range(seq_len)
    return np.concatenate([ramp[:n] for n in pieces[pieces > 0].tolist()], out=out).reshape(samples, seq_len)
