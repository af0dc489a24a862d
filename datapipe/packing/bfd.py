"""Pack document pieces into sequences of exactly `seq_len` tokens.

Best-fit decreasing (BFD): pieces are sorted by length, longest first, and each goes
into the open sequence with the least room that still fits it. Open sequences are
indexed by their remaining room (0..seq_len) in a 64-ary bit tree, so finding the
tightest fit takes a few word operations (3 levels at 8K..64K, 4 at 256K..1M) whatever the
number of open sequences; the loop is compiled with numba (bfd_kernel.py). Measured by bench/pack.py
on 2 shared cores: 99.998% fill at 8K on a lognormal ~2K mix, 99.995% at 1M on a ~64K
cooldown mix, 1.3M documents/s at 8K (4.5M per CPU-second), splitting only the documents
that cannot fit (longer than seq_len) where concat-and-chunk splits one per sequence.

Only a document longer than `seq_len` is split, into pieces of at most `seq_len`;
a cut never falls inside a media span (`<|media_begin|> ... <|media_end|>`), it moves
back to the span's start. Padding is explicit, at the end of a sequence.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from datapipe.schema import PackedSample

if TYPE_CHECKING:
    from datapipe.packing.corpus import Corpus


@dataclass(frozen=True)
class SpecialIds:
    """The token ids packing needs, read from the tokenizer (never hard-coded)."""

    pad: int
    media_begin: int
    media_end: int

    @classmethod
    def from_tokenizer(cls, name_or_path: str) -> SpecialIds:
        from tokenizer.bpe import special_token_ids

        ids = special_token_ids(name_or_path)
        return cls(ids["<|pad|>"], ids["<|media_begin|>"], ids["<|media_end|>"])


@dataclass
class Pieces:
    """Document pieces in packing order: piece i is tokens [start, start+length) of corpus row doc."""

    doc: np.ndarray  # int64 corpus row
    start: np.ndarray  # int64 offset inside the document
    length: np.ndarray  # int64, 1..seq_len


@dataclass
class Sequences:
    """Which pieces make each sequence: sequence b holds pieces order[offsets[b]:offsets[b+1]]."""

    pieces: Pieces
    order: np.ndarray  # piece indices grouped by sequence, each group in placement order
    offsets: np.ndarray  # int64 [num_sequences + 1]

    @property
    def num_sequences(self) -> int:
        return len(self.offsets) - 1

    def sequence(self, b: int) -> np.ndarray:
        return self.order[self.offsets[b] : self.offsets[b + 1]]


def best_fit_decreasing(lengths: np.ndarray, seq_len: int) -> tuple[np.ndarray, int]:
    """The sequence index of each item (all <= seq_len) and the number of sequences."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) and (lengths.min() < 1 or lengths.max() > seq_len):
        raise ValueError(f"piece lengths must be within 1..{seq_len}; split longer documents first")
    from datapipe.packing.bfd_kernel import best_fit_decreasing_loop  # numba compiles once, then loads from its cache

    bins = np.empty(len(lengths), dtype=np.int64)
    num_bins = best_fit_decreasing_loop(lengths, seq_len, bins)
    return bins, int(num_bins)


def split_pieces(docs: np.ndarray, lengths: np.ndarray, seq_len: int,
                 spans: dict[int, np.ndarray] | None = None) -> Pieces:
    """Cut each (doc, length) into pieces of at most seq_len; the pieces of one copy stay adjacent."""
    from datapipe.packing.bfd_kernel import split_at

    docs, lengths = np.asarray(docs, dtype=np.int64), np.asarray(lengths, dtype=np.int64)
    pieces = Pieces(*split_at(docs, lengths, seq_len))
    long = lengths > seq_len
    if spans and long.any():
        recut = np.flatnonzero(long & np.isin(docs, np.fromiter(spans, dtype=np.int64)))
        return recut_around_media(pieces, docs[recut], lengths[recut], seq_len, spans) if len(recut) else pieces
    return pieces


def recut_around_media(pieces: Pieces, docs: np.ndarray, lengths: np.ndarray, seq_len: int,
                       spans: dict[int, np.ndarray]) -> Pieces:
    """Redo the pieces of these long documents with media so that no cut falls inside a span; they go last."""
    keep = ~np.isin(pieces.doc, docs)  # every copy of a document has the same length, so all copies are redone
    starts = [media_safe_cuts(length, seq_len, spans[doc]) for doc, length in zip(docs.tolist(), lengths.tolist())]
    stops = [np.append(cuts[1:], length) for cuts, length in zip(starts, lengths.tolist())]
    counts = [len(cuts) for cuts in starts]
    start, stop = np.concatenate(starts), np.concatenate(stops)
    return Pieces(np.concatenate([pieces.doc[keep], np.repeat(docs, counts)]),
                  np.concatenate([pieces.start[keep], start]),
                  np.concatenate([pieces.length[keep], stop - start]))


def media_safe_cuts(length: int, seq_len: int, spans: np.ndarray) -> np.ndarray:
    """Piece starts for one document: every seq_len tokens, moved back to a span's start if inside it."""
    cuts, pos = [0], 0
    while length - pos > seq_len:
        cut = cut_outside_spans(pos + seq_len, spans)
        if cut <= pos:
            width = int(np.ptp(spans[spans[:, 0] == cut][0]))
            raise ValueError(f"a media span of {width} tokens does not fit in {seq_len}")
        cuts.append(cut)
        pos = cut
    return np.array(cuts, dtype=np.int64)


def media_safe_prefix(length: int, seq_len: int, spans: np.ndarray | None) -> int:
    """How many tokens `truncate` keeps: seq_len, or less so as not to end inside a media span."""
    return length if length <= seq_len else cut_outside_spans(seq_len, spans)


def cut_outside_spans(cut: int, spans: np.ndarray | None) -> int:
    """`cut`, or the start of the media span it falls inside (a span is never split)."""
    if spans is None or not len(spans):
        return cut
    inside = (spans[:, 0] < cut) & (cut < spans[:, 1])
    return int(spans[inside, 0][0]) if inside.any() else cut


def pack_pieces(pieces: Pieces, seq_len: int, window: int | None = None) -> Sequences:
    """BFD over windows of `window` pieces (None: all at once); sequences numbered window by window.

    A piece of exactly seq_len fills a sequence alone, as BFD would place it; such pieces skip the
    search (at 8K on a ~64K cooldown mix they are nine pieces in ten).
    """
    from datapipe.packing.bfd_kernel import group_by_bin

    n = len(pieces.length)
    bins, base = np.empty(n, dtype=np.int64), 0
    full = pieces.length == seq_len
    bins[full] = np.arange(int(full.sum()))
    base = int(full.sum())
    rest = np.flatnonzero(~full)
    step = window or max(len(rest), 1)
    for lo in range(0, len(rest), step):
        chunk = rest[lo : lo + step]
        window_bins, count = best_fit_decreasing(pieces.length[chunk], seq_len)
        bins[chunk] = window_bins + base
        base += count
    order, offsets = group_by_bin(bins, base)  # within a sequence, pieces keep their input order
    return Sequences(pieces, order, offsets)


def make_sample(key: str, corpus: Corpus, sequences: Sequences, b: int, seq_len: int, ids: SpecialIds) -> PackedSample:
    """Sequence b as a PackedSample, with its images and loss mask."""
    from tokenizer.media import loss_mask

    tokens = np.full(seq_len, ids.pad, dtype=np.uint32)
    doc_lens, doc_ids, doc_offsets, spans, images, pos = [], [], [], [], [], 0
    pieces = sequences.pieces
    for i in sequences.sequence(b).tolist():
        doc, start, length = int(pieces.doc[i]), int(pieces.start[i]), int(pieces.length[i])
        tokens[pos : pos + length] = corpus.document_tokens(doc)[start : start + length]
        for k, (a, z) in enumerate(corpus.spans.get(doc, ())):
            if start <= a and z <= start + length:
                spans.append([pos + int(a) - start, pos + int(z) - start])
                images.append(corpus.image(doc, k))
        doc_lens.append(length)
        doc_ids.append(corpus.ids[doc])
        doc_offsets.append(start)
        pos += length
    num_pad = seq_len - pos
    return {
        "key": key,
        "tokens": tokens,
        "doc_lens": np.array(doc_lens, dtype=np.int32),
        "doc_ids": doc_ids,
        "doc_offsets": doc_offsets,
        "loss_mask": loss_mask(seq_len, spans, num_pad),  # the spans the loop placed: no re-scan of the tokens
        "media_spans": spans,
        "images": images,
        "seq_len": seq_len,
        "num_pad": num_pad,
    }
