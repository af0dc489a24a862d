"""Locate and decode the samples of a tar shard held in memory, by member extension.

A shard is read whole into one buffer (datapipe.fetch). Where each member's bytes lie
comes from a ShardIndex: the one datapipe.shards writes beside each shard
(`shard-N.index.json`: every sample's key, each member's data offset and size, and the
dtype and header size of each .npy column that has one layout), or, for a shard from
another tool, a walk over its tar headers (a 512-byte header, then the data padded to 512,
the next header). The walk costs about 14 us of Python a sample of four members on our
2-core box; loading and checking an index, under 1 us.

Arrays come back as numpy views into the shard buffer (no copy; writable), sliced from
one view of the whole buffer per dtype. A column the index gives a layout for needs no
header read; otherwise its .npy headers are gathered in one numpy pass and parsed once
per distinct header (a stage repeats a few). The usual span (every sample has every
array and a json header) is built row by row with dict(zip(...)): about 3 us a sample at
8K tokens, 2 of them orjson's, where `tarfile` plus `np.load(BytesIO(...))` per member
costs 100+ (bench/stream.py); any other span member by member, column by column.

Members sharing a key (the file name up to its first dot, as in WebDataset) form one
sample. Decoding is generic, so new members need no change here:
`.npy` -> an array named by the middle of the name (`k.loss_mask.npy` -> "loss_mask"),
`.json` -> its fields merged into the sample, images (`k.0.png`, `k.1.png`) -> their
bytes in index order under "images", anything else -> raw bytes under its suffix.
A member that does not decode makes its sample a BadSample, which the loader raises or
skips; the other samples of the shard are unaffected.
"""
from __future__ import annotations

import ast
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain
from typing import Any, NamedTuple

import numpy as np

try:
    from orjson import loads as json_loads  # 3-5x faster than json on the small sample headers
except ImportError:  # pragma: no cover - orjson is a dependency; plain json gives the same fields
    from json import loads as json_loads

BLOCK = 512
IMAGE_SUFFIXES = ("png", "jpg", "jpeg", "webp", "gif", "bmp", "tif", "tiff")
NPY_MAGIC = b"\x93NUMPY"
INDEX_FORMAT = "datapipe-index/1"
REINDEX = "rewrite the stage, or delete the index files to read the shards by their tar headers"
DECODE_ERRORS = (ValueError, SyntaxError, KeyError, TypeError, IndexError)  # what a damaged member raises


class ShardError(ValueError):
    """A shard that cannot be read; the message names it and says what to do."""


class BadSample(NamedTuple):
    """A sample with a member that does not decode: the loader raises `error` or skips the sample."""

    shard: str
    error: ShardError


@dataclass
class ShardIndex:
    """Where the members of a shard's samples lie, column by column (int64 arrays, samples ascending)."""

    keys: list[str]  # sample keys in archive order
    columns: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]  # member suffix -> (sample numbers, offsets, sizes)
    error: ShardError | None = None  # the walk stopped here (damage): `keys` are the samples before it
    arrays: dict[str, tuple[np.dtype, int]] = field(default_factory=dict)  # .npy suffix -> (dtype, header bytes)


def walk_index(buffer, shard: str, stop: int | None = None) -> ShardIndex:
    """The index of a shard without one, from its tar headers, up to sample `stop`. Damage ends
    the walk: the samples completed before it stay readable and `error` says what happened."""
    keys: list[str] = []
    columns: dict[str, tuple[list[int], list[int], list[int]]] = {}
    error = None
    try:
        for name, offset, size in iter_members(buffer, shard):
            key, _, suffix = name.rpartition("/")[2].partition(".")
            if not keys or key != keys[-1]:
                if stop is not None and len(keys) >= stop:
                    break
                keys.append(key)
            numbers, offsets, sizes = columns.setdefault(suffix, ([], [], []))
            numbers.append(len(keys) - 1)
            offsets.append(offset)
            sizes.append(size)
    except ShardError as err:
        error = err
        if keys:  # the sample the damage cut into may miss members: it is not handed out
            drop_last_sample(keys, columns)
    return ShardIndex(keys, {suffix: as_columns(*lists) for suffix, lists in columns.items()}, error)


def as_columns(*lists: list[int]) -> tuple[np.ndarray, ...]:
    return tuple(np.array(values, dtype=np.int64) for values in lists)


def drop_last_sample(keys: list[str], columns: dict) -> None:
    last = len(keys) - 1
    keys.pop()
    for numbers, offsets, sizes in columns.values():
        while numbers and numbers[-1] == last:
            numbers.pop(), offsets.pop(), sizes.pop()


def parse_index(data: bytes | str, shard: str, entry: dict[str, Any]) -> ShardIndex:
    """A shard's index file, checked against its manifest entry (an index left beside another shard
    does not match its size and sha256) and against the shard's bounds."""
    try:
        index = json_loads(data)
        if index.get("format") != INDEX_FORMAT:
            raise ValueError(f"format {index.get('format')!r}, expected {INDEX_FORMAT!r}")
        if index["bytes"] != entry["bytes"] or index["sha256"] != entry.get("sha256", index["sha256"]):
            raise ValueError("it belongs to another version of the shard (size or sha256 differ)")
        keys, counts, table = index["keys"], *member_table(index)
        columns = checked_columns(counts, table, len(keys), entry["bytes"])
        arrays = {suffix: array_layout(layout) for suffix, layout in index.get("arrays", {}).items()}
    except (ValueError, KeyError, TypeError) as err:
        raise ShardError(f"{shard}: its index does not match it ({err}); {REINDEX}") from None
    return ShardIndex(keys, columns, arrays=arrays)


def member_table(index: dict[str, Any]) -> tuple[dict[str, int], np.ndarray]:
    """(members per suffix, in archive order; a 3 x members int64 table of their sample numbers,
    data offsets and sizes, column after column): one numpy array for the whole index."""
    members = index["members"]
    counts = {suffix: len(numbers) for suffix, (numbers, _, _) in members.items()}
    if any(len(offsets) != n or len(sizes) != n for n, (_, offsets, sizes) in zip(counts.values(), members.values())):
        raise ValueError("its columns have lists of different lengths")
    parts = [list(chain.from_iterable(part)) for part in zip(*members.values())] or [[], [], []]
    return counts, np.array(parts, dtype=np.int64).reshape(3, -1)


def checked_columns(counts: dict[str, int], table: np.ndarray, samples: int, length: int) -> dict[str, tuple]:
    """An index's columns, views of its member table, checked in one pass over all of them: every
    member inside the shard and on a tar block (numpy slices would quietly cut short), each
    column's sample numbers in order (plan_span bisects them). One pass for all columns: 0.2 ms
    an index of 256 samples with its parse, where a check per column took 0.4."""
    number, at, size = table
    ends = np.cumsum(np.array(list(counts.values()), dtype=np.int64))
    if len(at):
        steps, starts = np.diff(number), ends[:-1]
        steps[starts[(starts > 0) & (starts < len(number))] - 1] = 0  # where one column ends and the next begins
        if at.min() < BLOCK or (at % BLOCK).any() or (at + size).max() > length or size.min() < 0 or \
                number.min() < 0 or number.max() >= samples or steps.min(initial=0) < 0:
            raise ValueError("it points outside the shard, or lists a column out of order")
    return {suffix: (number[end - n : end], at[end - n : end], size[end - n : end])
            for suffix, n, end in zip(counts, counts.values(), ends.tolist())}


def array_layout(layout: dict[str, Any]) -> tuple[np.dtype, int]:
    """An index's layout of an .npy column: (dtype, header bytes), a plain numeric dtype."""
    dtype, header = np.dtype(layout["dtype"]), layout["header"]
    if dtype.hasobject or dtype.itemsize == 0 or not isinstance(header, int) or header < 10:
        raise ValueError(f"array layout {layout!r} is not a plain .npy column")
    return dtype, header


def iter_members(buffer, shard: str) -> Iterator[tuple[str, int, int]]:
    """(name, data offset, size) of every regular file member, in archive order."""
    view = buffer if isinstance(buffer, memoryview) else memoryview(buffer)
    end, offset = len(view), 0
    long_name = None  # from a GNU 'L' or pax 'x' header: the next member's real name
    while offset + BLOCK <= end:
        if view[offset] == 0:  # an all-zero block: the end-of-archive marker
            return
        name, size, kind = parse_header(bytes(view[offset : offset + BLOCK]), shard, offset)
        data = offset + BLOCK
        if data + size > end:
            raise ShardError(f"{shard}: truncated inside member {name!r} at byte {offset} ({end} bytes in all); "
                             "rewrite it, or read with on_error='skip'")
        if kind == 48 or kind == 0:  # b"0" or NUL: a regular file
            yield long_name or name, data, size
            long_name = None
        elif kind in b"Lx":
            long_name = extended_name(bytes(view[data : data + size]), kind)
        offset = data + (size + BLOCK - 1) // BLOCK * BLOCK
    raise ShardError(f"{shard}: ends at byte {end} without the end-of-archive marker: truncated; "
                     "rewrite it, or read with on_error='skip'")


def parse_header(header: bytes, shard: str, offset: int) -> tuple[str, int, int]:
    if header[257:262] != b"ustar":
        raise ShardError(f"{shard}: damaged tar header at byte {offset} (no ustar magic); "
                         "check it with verify=True, rewrite it, or read with on_error='skip'")
    name = header[:100].split(b"\0", 1)[0].decode("utf-8", "replace")
    if header[345]:  # a USTAR prefix: the name's leading folders
        name = header[345:500].split(b"\0", 1)[0].decode("utf-8", "replace") + "/" + name
    try:
        size = int(header[124:135], 8)  # 11 octal digits
    except ValueError:
        raise ShardError(f"{shard}: damaged size field in the tar header at byte {offset}; rewrite the shard") from None
    return name, size, header[156]


def extended_name(data: bytes, kind: int) -> str | None:
    if kind == ord("L"):
        return data.split(b"\0", 1)[0].decode("utf-8", "replace")
    for record in data.decode("utf-8", "replace").splitlines():  # pax: "<len> path=<name>"
        _, _, field_ = record.partition(" ")
        if field_.startswith("path="):
            return field_[len("path="):]
    return None


def iter_samples(buffer, shard: str) -> Iterator[dict[str, Any]]:
    """The samples of a shard, located by a header walk; a member that does not decode, or damage
    in the tar, raises ShardError."""
    array = as_array(buffer)
    index = walk_index(array, shard)
    for sample in decode_samples(array, plan_span(array, index), shard):
        if isinstance(sample, BadSample):
            raise sample.error
        yield sample
    if index.error is not None:
        raise index.error


def as_array(buffer) -> np.ndarray:
    return buffer if isinstance(buffer, np.ndarray) else np.frombuffer(buffer, dtype=np.uint8)


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
class SpanPlan:
    """Where a span's members are and how each column decodes, found without building a sample
    (numpy only, so a prefetch thread does it): .npy columns in the layout a stage writes become
    ArrayColumns; the other columns stay (numbers, offsets, sizes) for a member-by-member decode."""

    keys: list[str]  # the span's sample keys
    columns: dict[str, ArrayColumn | tuple[np.ndarray, np.ndarray, np.ndarray]]  # by suffix, in archive order


def plan_span(buffer, index: ShardIndex, start: int = 0, stop: int | None = None) -> SpanPlan:
    """The plan for samples start..stop-1 of the index (fewer if it has fewer)."""
    array = as_array(buffer)
    stop = len(index.keys) if stop is None else min(stop, len(index.keys))
    columns: dict[str, Any] = {}
    typed: dict[tuple[np.dtype, int], np.ndarray] = {}  # one typed view per (dtype, byte phase), shared
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
    return SpanPlan(index.keys[start:stop], columns)


def laid_out_column(array: np.ndarray, name: str, numbers: np.ndarray, offsets: np.ndarray, sizes: np.ndarray,
                    layout: tuple[np.dtype, int], typed: dict) -> ArrayColumn | None:
    """An .npy column whose layout the index gives (our writer's): no header is read, which saves
    the 100 us a column of array_column's gather. The index is bound to the shard by its size and
    sha256 and its members lie inside it; verify=True checks the bytes too. None where a member
    does not fit the layout: the column then goes member by member, which says what is wrong."""
    dtype, header = layout
    starts = offsets + header
    counts, rest = np.divmod(sizes - header, dtype.itemsize)
    phase = int(starts[0]) % dtype.itemsize
    if rest.any() or counts.min() < 0 or (dtype.itemsize > 1 and (starts % dtype.itemsize != phase).any()):
        return None
    return ArrayColumn(name, numbers.tolist(), typed_view(array, dtype, phase, typed),
                       (starts - phase) // dtype.itemsize, counts)


def typed_view(array: np.ndarray, dtype: np.dtype, phase: int, typed: dict) -> np.ndarray:
    """The buffer from byte `phase` on as `dtype`: one view per (dtype, phase), shared by a span's columns."""
    view = typed.get((dtype, phase))
    if view is None:
        usable = (len(array) - phase) // dtype.itemsize * dtype.itemsize
        view = typed[dtype, phase] = array[phase : phase + usable].view(dtype)
    return view


def array_column(array: np.ndarray, name: str, numbers: np.ndarray, offsets: np.ndarray, sizes: np.ndarray,
                 typed: dict) -> ArrayColumn | None:
    """An .npy column as a stage writes it: format 1.0 headers of one length, 1-D arrays of one
    dtype whose data all start at one phase of its size, each inside its member. Then a member
    costs one slice (0.3 us), against 1.7 with its own header parse. None for any other column,
    or one where something does not parse: those go member by member, which says what is wrong."""
    headers = npy_headers(array, offsets)
    try:
        parsed = {header: npy_header(header) for header in dict.fromkeys(headers)} if headers else {}
    except DECODE_ERRORS:
        return None
    if not parsed or len({(dtype, len(shape)) for dtype, shape, *_ in parsed.values()} | {(None, 1)}) != 2:
        return None  # no headers, several dtypes, or an array that is not 1-D
    dtype, width = next(iter(parsed.values()))[0], len(headers[0])
    counts = np.array([parsed[header][3] for header in headers], dtype=np.int64)
    starts = offsets + width
    phase = int(starts[0]) % dtype.itemsize
    if (width + counts * dtype.itemsize > sizes).any() or (starts % dtype.itemsize != phase).any():
        return None
    return ArrayColumn(name, numbers.tolist(), typed_view(array, dtype, phase, typed),
                       (starts - phase) // dtype.itemsize, counts)


def npy_headers(array: np.ndarray, offsets: np.ndarray) -> list[bytes] | None:
    """The .npy headers of a column as bytes, gathered in one numpy pass; None unless they are all
    format 1.0 of one length (as a stage writes them) inside the buffer. A tar member's data starts
    on a block, so the gather takes the first bytes of rows of a (blocks, 512) view."""
    if (offsets % BLOCK).any() or offsets.max() + BLOCK > len(array):
        return None
    rows = offsets // BLOCK
    blocks = array[: len(array) // BLOCK * BLOCK].reshape(-1, BLOCK)
    starts = blocks[rows, :10]
    lengths = starts[:, 8].astype(np.int64) | starts[:, 9].astype(np.int64) << 8
    width = 10 + int(lengths[0])
    if (starts[:, 6] != 1).any() or (lengths != lengths[0]).any() or width > BLOCK:
        return None
    headers = blocks[rows, :width]
    if (headers[:, -1] == 0).any():  # numpy's S type would strip it (a header ends in "\n")
        return None
    return headers.view(f"S{width}").ravel().tolist()


def decode_samples(buffer, plan: SpanPlan, shard: str) -> list[dict[str, Any] | BadSample]:
    """The samples of a span, built column by column from its plan (plan_span's). A sample with a
    member that does not decode is a BadSample."""
    columns, count = plan.columns, len(plan.keys)
    arrays = [c for c in columns.values() if c.__class__ is ArrayColumn and len(c.numbers) == count]
    json = columns.get("json")
    if len(arrays) + (json is not None) == len(columns) and (json is None or len(json[0]) == count):
        try:  # the usual span: arrays in every sample and at most a json header each
            return build_samples(plan.keys, arrays, as_array(buffer), json)
        except DECODE_ERRORS:
            pass  # a member that does not decode: member by member below, which finds it
    samples: list[Any] = [{"key": key, "images": []} for key in plan.keys]
    decoder = MemberDecoder(as_array(buffer), shard, samples)
    for suffix, column in columns.items():
        if column.__class__ is ArrayColumn:
            for number, view in zip(column.numbers, column.views()):
                samples[number][column.name] = view
        else:
            decoder.decode(suffix, *(part.tolist() for part in column))
    decoder.order_images()
    for number, error in decoder.errors.items():
        samples[number] = BadSample(shard, error)
    return samples


def build_samples(keys: list[str], arrays: list[ArrayColumn], buffer: np.ndarray,
                  json: tuple[np.ndarray, np.ndarray, np.ndarray] | None) -> list[dict[str, Any]]:
    """A span whose samples all have every column: key, an empty images list, a view per array
    column, the json header's fields; a member that does not decode raises. Built row-wise with
    dict(zip(...)): 3.2 us a sample of three arrays and a json header on our 2-core box, 1.9 of
    them orjson's (a C twin of this function measured 2.3: too little for a compiled module)."""
    names = ("key", "images", *(c.name for c in arrays))
    samples = [dict(zip(names, row)) for row in zip(keys, ([] for _ in keys), *(c.views() for c in arrays))]
    if json is not None:
        view = memoryview(buffer)
        for sample, at, size in zip(samples, json[1].tolist(), json[2].tolist()):
            fields = json_loads(view[at : at + size])
            if fields.__class__ is not dict:
                raise TypeError("a json member that is not an object")
            sample.update(fields)
    return samples


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
                    samples[number].update(json_loads(view[offset : offset + size]))
                elif kind == "npy":
                    samples[number][name] = self.npy_array(offset, size)
                elif kind == "image":
                    self.add_image(samples[number], name, bytes(view[offset : offset + size]))
                else:
                    samples[number][name] = bytes(view[offset : offset + size])
            except DECODE_ERRORS as err:
                self.fail(number, suffix, err)

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


@lru_cache(maxsize=1024)
def member_kind(suffix: str) -> tuple[str, str]:
    """("npy", array name) | ("json", "") | ("image", index) | ("bytes", suffix), by the last extension."""
    stem, _, extension = suffix.rpartition(".")
    if extension == "npy":
        return "npy", stem
    if extension == "json":
        return "json", ""
    if extension in IMAGE_SUFFIXES:
        return "image", stem
    return "bytes", suffix


@lru_cache(maxsize=4096)
def npy_header(header: bytes) -> tuple[np.dtype, tuple[int, ...], bool, int, int]:
    """(dtype, shape, fortran order, element count, data offset) of a whole .npy header, magic included."""
    if header[:6] != NPY_MAGIC:
        raise ValueError("not an .npy member (bad magic)")
    width = 2 if header[6] == 1 else 4
    fields = ast.literal_eval(header[8 + width :].decode("latin1"))
    dtype, shape = np.dtype(fields["descr"]), tuple(fields["shape"])
    if dtype.hasobject:
        raise ValueError("object arrays are not allowed")
    return dtype, shape, bool(fields["fortran_order"]), math.prod(shape), len(header)
