"""Decode the samples of a tar shard held in memory: the fast twin of datapipe.loader.reference.

A shard is read whole into one buffer (datapipe.loader.fetch); where each member's bytes lie
comes from its ShardIndex (datapipe.loader.shardindex: the index file beside the shard, or a walk
over its tar headers). The samples are those the plain reference decoder reads
(datapipe.loader.reference, the spec; tests/test_reference.py checks them equal), built faster:

Arrays come back as numpy views into the shard buffer (no copy; writable), sliced from
one view of the whole buffer per dtype. A column the index gives a layout for needs no
header read; otherwise its .npy headers are gathered in one numpy pass and parsed once
per distinct header (a phase repeats a few). The usual span (every sample has every
array and at most a json header) is built row by row with dict(zip(...)): about 3 us a
sample at 8K tokens, 2 of them orjson's, where `tarfile` plus `np.load(BytesIO(...))` per
member (the reference) costs 100+; any other span member by member, column by column.

Members sharing a key (the file name up to its first dot, as in WebDataset) form one
sample; each decodes by its extension (datapipe.shardformat.member_kind), so new members
need no change here. A member that does not decode makes its sample a BadSample, which
the loader raises or skips; the other samples of the shard are unaffected.
"""
from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

from datapipe.loader.shardindex import BLOCK, ShardError, ShardIndex, as_array, json_loads, tar_blocks
from datapipe.shardformat import member_kind

NPY_MAGIC = b"\x93NUMPY"
NPY_HEADER_LIMIT = 10_000  # bytes; numpy.lib.format's max_header_size
DECODE_ERRORS = (ValueError, SyntaxError, KeyError, TypeError, IndexError)  # what a damaged member raises


class BadSample(NamedTuple):
    """A sample with a member that does not decode: the loader raises `error` or skips the sample."""

    shard: str
    error: ShardError


@dataclass
class ArrayColumn:
    """The 1-D arrays of one .npy column as item ranges of one typed view of the shard buffer."""

    name: str  # the sample field ("tokens" for k.tokens.npy)
    numbers: list[int]  # the samples that have the member, counted from the span's first
    typed: np.ndarray  # the buffer from some byte on, as the column's dtype
    starts: np.ndarray  # where each array starts in `typed` (items)
    counts: np.ndarray  # and how many items it has

    def views(self) -> list[np.ndarray]:
        """Each member's array, in `numbers` order: a slice of `typed` (no copy)."""
        typed = self.typed
        return [typed[first:end] for first, end in zip(self.starts.tolist(), (self.starts + self.counts).tolist())]


@dataclass
class SpanLayout:
    """Where a span's members lie and how each column decodes, found without building a sample
    (numpy only, so a prefetch thread does it): .npy columns as a writer lays them out become
    ArrayColumns; the other columns stay (numbers, offsets, sizes) for a member-by-member decode."""

    keys: list[str]  # the span's sample keys
    columns: dict[str, ArrayColumn | tuple[np.ndarray, np.ndarray, np.ndarray]]  # by suffix, in archive order


def locate_span(buffer, index: ShardIndex, start: int = 0, stop: int | None = None) -> SpanLayout:
    """Where the members of samples start..stop-1 of the index lie (fewer if it has fewer)."""
    array = as_array(buffer)
    stop = len(index.keys) if stop is None else min(stop, len(index.keys))
    columns: dict[str, Any] = {}
    typed: dict[tuple[np.dtype, int], np.ndarray] = {}  # one typed view per (dtype, shift), shared
    for suffix, (numbers, offsets, sizes) in index.columns.items():
        lo, hi = numbers.searchsorted(start), numbers.searchsorted(stop)
        if lo < hi:
            numbers, offsets, sizes = numbers[lo:hi] - start, offsets[lo:hi], sizes[lo:hi]
            kind, name = member_kind(suffix)
            column = None
            if kind == "npy" and suffix in index.arrays:
                column = laid_out_column(array, name, numbers, offsets, sizes, index.arrays[suffix], typed)
            elif kind == "npy":
                column = array_column(array, name, numbers, offsets, sizes, typed)
            columns[suffix] = column or (numbers, offsets, sizes)
    return SpanLayout(index.keys[start:stop], columns)


def laid_out_column(array: np.ndarray, name: str, numbers: np.ndarray, offsets: np.ndarray, sizes: np.ndarray,
                    layout: tuple[np.dtype, int], typed: dict) -> ArrayColumn | None:
    """An .npy column whose layout the index gives (our writer's): no header is read, which saves
    the 100 us a column of array_column's gather. The index is bound to the shard by its size and
    sha256 and its members lie inside it; verify=True checks the bytes too. None where a member
    does not fit the layout: the column then goes member by member, which says what is wrong."""
    dtype, header = layout
    starts = offsets + header
    counts, rest = np.divmod(sizes - header, dtype.itemsize)
    shift = int(starts[0]) % dtype.itemsize
    if rest.any() or counts.min() < 0 or (dtype.itemsize > 1 and (starts % dtype.itemsize != shift).any()):
        return None
    return ArrayColumn(name, numbers.tolist(), typed_view(array, dtype, shift, typed),
                       (starts - shift) // dtype.itemsize, counts)


def typed_view(array: np.ndarray, dtype: np.dtype, shift: int, typed: dict) -> np.ndarray:
    """The buffer from byte `shift` on as `dtype` (an array starting at byte b is in the view of
    shift b mod itemsize): one view per (dtype, shift), shared by a span's columns."""
    view = typed.get((dtype, shift))
    if view is None:
        usable = (len(array) - shift) // dtype.itemsize * dtype.itemsize
        view = typed[dtype, shift] = array[shift : shift + usable].view(dtype)
    return view


def array_column(array: np.ndarray, name: str, numbers: np.ndarray, offsets: np.ndarray, sizes: np.ndarray,
                 typed: dict) -> ArrayColumn | None:
    """An .npy column as our writer lays it out: format 1.0 headers of one length, 1-D arrays of
    one dtype whose data all start at one shift (typed_view), each inside its member. Then a
    member costs one slice (0.3 us), against 1.7 with its own header parse. None for any other
    column, or one where something does not parse: those go member by member, which says what
    is wrong."""
    headers = npy_headers(array, offsets)
    try:
        parsed = {header: npy_header(header) for header in dict.fromkeys(headers)} if headers else {}
    except DECODE_ERRORS:
        return None
    kinds = {(dtype, len(shape)) for dtype, shape, *_ in parsed.values()}
    if len(kinds) != 1 or next(iter(kinds))[1] != 1:
        return None  # no headers, several dtypes, or an array that is not 1-D
    dtype, width = next(iter(parsed.values()))[0], len(headers[0])
    counts = np.array([parsed[header][3] for header in headers], dtype=np.int64)
    starts = offsets + width
    shift = int(starts[0]) % dtype.itemsize
    if (width + counts * dtype.itemsize > sizes).any() or (starts % dtype.itemsize != shift).any():
        return None
    return ArrayColumn(name, numbers.tolist(), typed_view(array, dtype, shift, typed),
                       (starts - shift) // dtype.itemsize, counts)


def npy_headers(array: np.ndarray, offsets: np.ndarray) -> list[bytes] | None:
    """The .npy headers of a column as bytes, gathered in one numpy pass; None unless they are all
    format 1.0 of one length (as our writer writes them) inside the buffer. A tar member's data starts
    on a block, so the gather takes the first bytes of rows of a (blocks, 512) view."""
    if (offsets % BLOCK).any() or offsets.max() + BLOCK > len(array):
        return None
    rows = offsets // BLOCK
    blocks = tar_blocks(array)
    starts = blocks[rows, :10]
    lengths = starts[:, 8].astype(np.int64) | starts[:, 9].astype(np.int64) << 8
    width = 10 + int(lengths[0])
    if (starts[:, 6] != 1).any() or (lengths != lengths[0]).any() or width > BLOCK:
        return None
    headers = blocks[rows, :width]
    if (headers[:, -1] == 0).any():  # numpy's S type would strip it (a header ends in "\n")
        return None
    return headers.view(f"S{width}").ravel().tolist()


def usual_columns(layout: SpanLayout) -> tuple[list[ArrayColumn], tuple | None] | None:
    """(array columns, json column) of the usual span, where every sample has each array as an
    ArrayColumn and at most a json header each, as our writer lays text and media samples out;
    None for any other span."""
    columns, count = layout.columns, len(layout.keys)
    arrays = [c for c in columns.values() if c.__class__ is ArrayColumn and len(c.numbers) == count]
    json = columns.get("json")
    if len(arrays) + (json is not None) != len(columns) or (json is not None and len(json[0]) != count):
        return None
    return arrays, json


def decode_samples(buffer, layout: SpanLayout, shard: str) -> list[dict[str, Any] | BadSample]:
    """The samples of a span, built from its layout (locate_span's): the usual span row by row
    (build_samples), any other column by column, member by member (MemberDecoder). A sample
    with a member that does not decode is a BadSample."""
    usual = usual_columns(layout)
    if usual is not None:
        try:
            return build_samples(layout.keys, *usual, as_array(buffer))
        except DECODE_ERRORS:
            pass  # a member that does not decode: member by member below, which finds it
    samples: list[Any] = [{"key": key, "images": []} for key in layout.keys]
    decoder = MemberDecoder(as_array(buffer), shard, samples)
    for suffix, column in layout.columns.items():
        if column.__class__ is ArrayColumn:
            decoder.place(column.name, column.numbers, column.views())
        else:
            decoder.decode(suffix, *(part.tolist() for part in column))
    decoder.order_images()
    for number, error in decoder.errors.items():
        samples[number] = BadSample(shard, error)
    return samples


def build_samples(keys: list[str], arrays: list[ArrayColumn], json: tuple | None,
                  buffer: np.ndarray) -> list[dict[str, Any]]:
    """A usual span's samples: key, an empty images list, a view per array column, the json
    header's fields; a member that does not decode raises. Built row-wise with dict(zip(...)):
    3.2 us a sample of three arrays and a json header on our 2-core box, 1.9 of them orjson's
    (a C twin of this function measured 2.3: too little for a compiled module)."""
    names = ("key", "images", *(c.name for c in arrays))
    samples = [dict(zip(names, row)) for row in zip(keys, ([] for _ in keys), *(c.views() for c in arrays))]
    if json is not None:
        for sample, fields in zip(samples, json_headers(buffer, json)):
            merge_header(sample, fields)
    return samples


def json_headers(buffer: np.ndarray, json: tuple) -> list[Any]:
    """A json column's members parsed, each on its own (the members joined into one JSON list and
    parsed in one call cost the same, and two damaged members can join into two objects that
    are neither of them); a member that does not parse raises."""
    view = memoryview(buffer)
    return [json_loads(view[at : at + size]) for at, size in zip(json[1].tolist(), json[2].tolist())]


def merge_header(sample: dict[str, Any], fields: Any) -> None:
    """A json header's fields into its sample; an error unless it is an object whose fields are
    new to the sample (a header naming "tokens", or another "key", would replace the decoded ones)."""
    if fields.__class__ is not dict:
        raise TypeError("a json member that is not an object")
    if not fields.keys().isdisjoint(sample):  # WebDataset writers repeat the key: the same string is fine
        clashes = sorted(k for k in fields.keys() & sample.keys() if k != "key" or fields[k] != sample[k])
        if clashes:
            raise ValueError(f"json fields {clashes} shadow the sample's own")
    sample.update(fields)


def put(sample: dict[str, Any], name: str, value: Any) -> None:
    """A decoded member into its sample, never over a field it already has (another member's)."""
    if name in sample:
        raise ValueError(f"a second {name!r} in the sample")
    sample[name] = value


class MemberDecoder:
    """Decodes members one at a time into their samples; collects errors per sample."""

    def __init__(self, array: np.ndarray, shard: str, samples: list[dict[str, Any]]):
        self.array, self.view, self.shard, self.samples = array, memoryview(array), shard, samples
        self.errors: dict[int, ShardError] = {}
        self.with_images: list[dict[str, Any]] = []

    def decode(self, suffix: str, numbers: list[int], offsets: list[int], sizes: list[int]) -> None:
        kind, name = member_kind(suffix)
        samples, view = self.samples, self.view
        for number, offset, size in zip(numbers, offsets, sizes):
            try:
                if kind == "json":
                    merge_header(samples[number], json_loads(view[offset : offset + size]))
                elif kind == "image":
                    self.add_image(samples[number], name, bytes(view[offset : offset + size]))
                elif kind == "npy":
                    put(samples[number], name, self.npy_array(offset, size))
                else:
                    put(samples[number], name, bytes(view[offset : offset + size]))
            except DECODE_ERRORS as err:
                self.fail(number, suffix, err)

    def place(self, name: str, numbers: list[int], arrays: list[np.ndarray]) -> None:
        """A column's arrays, already located (ArrayColumn.views), into their samples."""
        for number, array in zip(numbers, arrays):
            try:
                put(self.samples[number], name, array)
            except ValueError as err:
                self.fail(number, f"{name}.npy", err)

    def npy_array(self, offset: int, size: int) -> np.ndarray:
        """One .npy member as a view of the buffer, its header parsed on its own."""
        view = self.view
        if view[offset + 6] == 1:  # format 1.0: a 2-byte header length; 2.0 and 3.0 have four
            end = offset + 10 + (view[offset + 8] | view[offset + 9] << 8)
        else:
            end = offset + 12 + int.from_bytes(view[offset + 8 : offset + 12], "little")
        dtype, shape, fortran, count, data = npy_header(bytes(view[offset:end]))
        if data + count * dtype.itemsize > size:
            raise ValueError(f"array of shape {shape} does not fit in {size} bytes")
        values = np.frombuffer(self.array, dtype, count, offset + data)
        return values if len(shape) == 1 else values.reshape(shape, order="F" if fortran else "C")

    def add_image(self, sample: dict[str, Any], name: str, data: bytes) -> None:
        images = sample["images"]  # decode_samples starts every sample with an empty list
        if not images:
            self.with_images.append(sample)
        images.append((int(name) if name.isdigit() else len(images), data))

    def order_images(self) -> None:
        for sample in self.with_images:
            sample["images"] = [data for _, data in sorted(sample["images"], key=lambda image: image[0])]

    def fail(self, number: int, suffix: str, err: Exception) -> None:
        """`number` counts from the span's first sample."""
        key = self.samples[number]["key"]
        self.errors.setdefault(number, ShardError(
            f"{self.shard}: member {key}.{suffix} does not decode ({err}); "
            "check it with verify=True, rewrite it, or read with on_error='skip'"))


@lru_cache(maxsize=4096)
def npy_header(header: bytes) -> tuple[np.dtype, tuple[int, ...], bool, int, int]:
    """(dtype, shape, fortran order, element count, data offset) of a whole .npy header, magic
    included. Hostile headers are ValueErrors: longer than numpy's own limit (10,000 bytes: a
    deep literal costs ast its memory and recursion), an empty or object dtype, a shape entry
    that is not a non-negative integer, or more than 2^62 bytes of data."""
    if header[:6] != NPY_MAGIC:
        raise ValueError("not an .npy member (bad magic)")
    if len(header) > NPY_HEADER_LIMIT:
        raise ValueError(f"an .npy header of {len(header)} bytes (numpy's limit: {NPY_HEADER_LIMIT})")
    width = 2 if header[6] == 1 else 4
    try:
        fields = ast.literal_eval(header[8 + width :].decode("latin1"))
        dtype, shape = np.dtype(fields["descr"]), tuple(fields["shape"])
    except (MemoryError, RecursionError) as err:
        raise ValueError(f"an .npy header too deeply nested ({type(err).__name__})") from None
    if dtype.hasobject or dtype.itemsize == 0:
        raise ValueError(f"dtype {dtype}: object and empty arrays are not allowed")
    if not all(n.__class__ is int and n >= 0 for n in shape) or math.prod(shape) * dtype.itemsize >= 1 << 62:
        raise ValueError(f"shape {shape}: not non-negative integers, or over 2^62 bytes")
    return dtype, shape, bool(fields["fortran_order"]), math.prod(shape), len(header)
