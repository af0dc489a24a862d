"""Batches of consecutive samples: `datapipe.stream(path, batch_size=8)` yields dicts of B samples.

A batch is its samples collated (collate): a field whose every value is an array shaped like
the first sample's tokens (tokens, loss_mask, position_ids) is stacked into [B, seq_len]; any
other field is a list of B values (key, doc_lens, doc_ids, images...). The rule looks at the
batch's own samples, never at the rest of their shard.

Stacking copies every token, which costs about what `cat` spends reading them, and the
per-sample loader spends 8-16 us a sample at 8K tokens where `cat` spends 6. So
where it can the loader does neither: ShardWriter lays the samples of a shard at one stride
(it pads each json header to a block count the phase's samples share), so an array column
of a span is one 2-D strided view of the shard's memory (span_rows, in a prefetch thread)
and a batch inside a shard is a slice of it: no copy, and Python per batch, not per sample
(bench/stream.py). A batch across two shards, a shuffled batch, and one of a span laid out
otherwise (images, shards of other writers) are stacked.
"""
from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from itertools import chain
from typing import Any, NamedTuple

import numpy as np

from datapipe.loader.decode import DECODE_ERRORS, ArrayColumn, SpanLayout, json_headers, usual_columns
from datapipe.loader.shardindex import as_array

LISTED = ("doc_lens",)  # arrays never stacked, even if as long as the tokens: one entry per document


class Rows(NamedTuple):
    """The samples of consecutive epoch positions (a span, or a shuffle window in its permuted
    order) as the loader hands them on: decoded sample dicts, yielded one by one or collated
    batch by batch (what stacks depends on the batch's samples); or a span's columns (span_rows),
    which batches slice."""

    columns: dict[str, Any] | list[dict[str, Any]]  # field -> stacked rows or a list of n values; or n samples
    slots: list[int] | None  # each row's position counted from the first; None: row i is position i
    size: int  # positions covered: the rows, and samples left out (bad, or of a skipped shard)

    def position_after(self, row: int) -> int:
        return (row if self.slots is None else self.slots[row]) + 1

    def __len__(self) -> int:
        columns = self.columns
        return len(columns) if columns.__class__ is list else len(columns["key"])


def span_rows(buffer, layout: SpanLayout, with_positions: bool, positions: Any) -> Rows | None:
    """A span's rows straight from its layout (datapipe.loader.decode.locate_span), equal to
    collate() of the samples decode_samples would build: the per-token array columns laid at one
    stride as 2-D views, the json headers turned into a list per field. None unless the span is
    the usual one (decode.usual_columns), its headers have one set of fields, every seq_len is
    the tokens' length, and position ids came if asked for (positions.SpanPositions, made as
    batches slice them): the caller then decodes its samples, which finds what is odd about them."""
    usual, count = usual_columns(layout), len(layout.keys)
    if not count or usual is None or (with_positions and positions is None):
        return None
    arrays, json = usual
    rows: dict[str, Any] = {"key": layout.keys, "images": [[] for _ in layout.keys]}
    width = next((int(c.counts[0]) for c in arrays if c.name == "tokens" and (c.counts == c.counts[0]).all()), None)
    for column in arrays:
        per_token = width is not None and column.name not in LISTED and (column.counts == width).all()
        rows[column.name] = strided(column, width) if per_token else column.views()
    fields = json_fields(as_array(buffer), json, rows) if json is not None else {}
    if fields is None or fields.get("seq_len", [width] * count).count(width) != count:
        return None
    rows.update(fields)
    rows.setdefault("media_spans", [[] for _ in layout.keys])
    if positions is not None:
        rows["position_ids"] = positions
    return Rows(rows, None, count)


def strided(column: ArrayColumn, width: int) -> np.ndarray:
    """The column's arrays (each `width` long) as rows of one array: a view of the shard when
    they lie at one stride, as our writer lays them; stacked (a copy) otherwise."""
    starts = column.starts
    step = int(starts[1] - starts[0]) if len(starts) > 1 else width
    if step >= width and (len(starts) < 3 or (np.diff(starts) == step).all()):
        typed = column.typed
        return np.lib.stride_tricks.as_strided(typed[int(starts[0]):], shape=(len(starts), width),
                                               strides=(step * typed.itemsize, typed.itemsize))
    return np.stack(column.views())


def json_fields(array: np.ndarray, json: tuple, taken: dict[str, Any]) -> dict[str, list] | None:
    """The json headers of a span as a list per field; None when one does not parse, is not an
    object, or the headers differ in their fields or shadow a column."""
    try:
        headers = json_headers(array, json)
    except DECODE_ERRORS:
        return None
    names = headers[0].keys() if headers[0].__class__ is dict else None
    if names is None or names & taken.keys() or any(h.__class__ is not dict or h.keys() != names for h in headers):
        return None
    return {name: [header[name] for header in headers] for name in names}


def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Samples as one batch: arrays shaped like the tokens stacked, every other field a list (a
    field some samples lack is None in theirs)."""
    names = dict.fromkeys(chain.from_iterable(samples))
    shape = getattr(samples[0].get("tokens"), "shape", None) if samples else None
    batch = {}
    for name in names:
        values = [sample.get(name) for sample in samples]
        batch[name] = np.stack(values) if stacks(name, values, shape) else values
    return batch


def stacks(name: str, values: list, shape: tuple[int, ...] | None) -> bool:
    """Whether a batch's values of a field stack: arrays all shaped like the first row's tokens."""
    return name not in LISTED and shape is not None and bool(values) and \
        all(v.__class__ is np.ndarray and v.shape == shape for v in values)


def take(columns: dict[str, Any] | list, start: int, stop: int) -> dict[str, Any] | list:
    if columns.__class__ is list:
        return columns[start:stop]
    return {name: values[start:stop] for name, values in columns.items()}


def join(parts: list[dict[str, Any] | list]) -> dict[str, Any]:
    """Pieces of one batch from consecutive spans, in order, as collate() would make the batch of
    their samples: columns joined (stacked ones concatenated, a copy); decoded samples collated."""
    if any(part.__class__ is list for part in parts):
        return collate(list(chain.from_iterable(part if part.__class__ is list else unstack(part) for part in parts)))
    if len(parts) == 1:
        return settle(parts[0])
    batch = {}
    for name in dict.fromkeys(chain.from_iterable(parts)):
        values = [part.get(name) for part in parts]
        if all(v.__class__ is np.ndarray for v in values) and len({v.shape[1:] for v in values}) == 1:
            batch[name] = np.concatenate(values)
        else:
            batch[name] = list(chain.from_iterable(
                [None] * len(part["key"]) if v is None else v for part, v in zip(parts, values)))
    return settle(batch)


def settle(batch: dict[str, Any]) -> dict[str, Any]:
    """Columns of one batch stacked as collate stacks them: a list of arrays all shaped like the
    first row's tokens is stacked here (span_rows decides per span; a batch may hold only the
    rows that fit). Stacked columns come shaped like their span's tokens, so they stay."""
    shape = row_shape(batch.get("tokens"))
    for name, values in batch.items():
        if values.__class__ is list and stacks(name, values, shape):
            batch[name] = np.stack(values)
    return batch


def row_shape(tokens: np.ndarray | list | None) -> tuple[int, ...] | None:
    """The shape of the first row's tokens (stacked rows, or a list of arrays); None without them."""
    if tokens.__class__ is np.ndarray:
        return tokens.shape[1:]
    return getattr(tokens[0], "shape", None) if tokens else None


def unstack(columns: dict[str, Any]) -> list[dict[str, Any]]:
    """Columns back into sample dicts (rows of stacked arrays are views), to be collated with decoded samples."""
    return [dict(zip(columns, row)) for row in zip(*columns.values())]


def batched(spans: Iterator[Rows], batch_size: int, drop_last: bool, position: int,
            ends: list[int]) -> Iterator[tuple[dict, int]]:
    """Batches of `batch_size` rows of consecutive spans, each with the position after its last
    row (counted on from `position`, where the first span starts). A batch never mixes two
    curriculum phases (they end at the positions `ends`, datapipe.loader.schedule.phase_ends): a
    phase's last batch is shorter, or left out with drop_last. A span lies within one phase."""
    parts: list[dict[str, Any]] = []
    missing, phase = batch_size, None
    for rows in spans:
        here = bisect_right(ends, position)
        if parts and here != phase:
            if not drop_last:
                yield join(parts), position
            parts, missing = [], batch_size
        count, done, phase = len(rows), 0, here
        while done < count:
            step = min(missing, count - done)
            parts.append(take(rows.columns, done, done + step))
            done, missing = done + step, missing - step
            if not missing:
                yield join(parts), position + rows.position_after(done - 1)
                parts, missing = [], batch_size
        position += rows.size
    if parts and not drop_last:
        yield join(parts), position


def batch_count(samples: int, batch_size: int, drop_last: bool) -> int:
    return samples // batch_size if drop_last else -(-samples // batch_size)
