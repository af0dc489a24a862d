"""Where the members of a tar shard lie: its ShardIndex, from the index file beside it or a walk.

datapipe.packing.writer writes `shard-N.index.json` beside each shard: every sample's key, each
member's data offset and size, and the dtype and header size of each .npy column that has
one layout. parse_index checks it against the manifest entry (size, sha256) and the shard's
bounds in one numpy pass: under 1 us a sample. A shard from another tool has no index: its
tar headers are walked (a 512-byte header, then the data padded to 512, the next header),
about 14 us of Python a sample of four members on our 2-core box, the headers' checksums then
checked in one numpy pass. Damage ends a walk: the samples before it stay readable and the
index says what happened. An index file is trusted as far as the manifest entry that pins
its size and sha256 (the loader checks both): it is checked for shape and bounds, not against
the tar headers. Its sample digests (damaged_samples) check each sample's bytes as it is read.
Decoding the members is datapipe.loader.decode's job.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from datapipe.shardformat import READABLE_FORMATS, digest_function

try:
    from orjson import loads as json_loads  # 3-5x faster than json on index files and sample headers
except ImportError:  # pragma: no cover - orjson is a dependency; plain json gives the same fields
    from json import loads as json_loads

BLOCK = 512
REINDEX = "rewrite the phase, or delete the index files to read the shards by their tar headers"


class ShardError(ValueError):
    """A shard that cannot be read; the message names it and says what to do."""


@dataclass
class ShardIndex:
    """Where the members of a shard's samples lie, column by column (int64 arrays, samples ascending)."""

    keys: list[str]  # sample keys in archive order
    columns: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]  # member suffix -> (sample numbers, offsets, sizes)
    error: ShardError | None = None  # the walk stopped here (damage): `keys` are the samples before it
    arrays: dict[str, tuple[np.dtype, int]] = field(default_factory=dict)  # .npy suffix -> (dtype, header bytes)
    more: bool = False  # a walk stopped at its `stop` with samples after it
    digests: tuple[np.ndarray, np.ndarray] | None = None  # each sample's byte bounds (n + 1) and xxh3; None: unknown


def walk_index(buffer, shard: str, stop: int | None = None) -> ShardIndex:
    """The index of a shard without one, from its tar headers, up to sample `stop`. Damage ends
    the walk: the samples completed before it stay readable and `error` says what happened."""
    keys: list[str] = []
    columns: dict[str, tuple[list[int], list[int], list[int]]] = {}
    error, more = None, False
    headers: list[int] = []  # offset, checksum field, ... of every header walked
    try:
        for name, offset, size in iter_members(buffer, shard, headers):
            key, _, suffix = name.rpartition("/")[2].partition(".")
            if not keys or key != keys[-1]:
                if stop is not None and len(keys) >= stop:
                    more = True
                    break
                keys.append(key)
            numbers, offsets, sizes = columns.setdefault(suffix, ([], [], []))
            if numbers and numbers[-1] == len(keys) - 1:
                raise ShardError(f"{shard}: sample {key} has two {suffix} members (at byte {offset}); "
                                 "rewrite it, or read with on_error='skip'")
            numbers.append(len(keys) - 1)
            offsets.append(offset)
            sizes.append(size)
    except ShardError as err:
        error = err
    bad = first_bad_checksum(buffer, headers)
    if bad is not None:
        error, more = ShardError(f"{shard}: the tar header at byte {bad} fails its checksum: damaged; check it "
                                 "with verify=True, rewrite it, or read with on_error='skip'"), False
        cut_members(keys, columns, bad)
    if error is not None and keys:  # the sample the damage cut into may miss members: it is not handed out
        drop_last_sample(keys, columns)
    return ShardIndex(keys, {suffix: as_columns(*lists) for suffix, lists in columns.items()}, error, more=more)


def as_columns(*lists: list[int]) -> tuple[np.ndarray, ...]:
    return tuple(np.array(values, dtype=np.int64) for values in lists)


def first_bad_checksum(buffer, headers: list[int]) -> int | None:
    """Where the first tar header whose checksum field does not match its bytes lies (the sum of
    the header's bytes, the field counted as spaces; unsigned or signed, as tarfile accepts), or
    None. `headers` holds offset, checksum field, offset, ... of every header walked. One numpy
    pass over all of them: 3-5 ms a shard of 4,096 members (a sixth of the walk), where summing
    each header in Python would cost 4 us of the walk's 6 a member."""
    if not headers:
        return None
    offsets, stored = np.array(headers, dtype=np.int64).reshape(-1, 2).T
    rows = tar_blocks(as_array(buffer))[offsets // BLOCK]  # a copy
    rows[:, 148:156] = ord(" ")
    unsigned = rows.sum(axis=1, dtype=np.int64)
    signed = rows.view(np.int8).sum(axis=1, dtype=np.int64)
    bad = np.flatnonzero((stored != unsigned) & (stored != signed))
    return int(offsets[bad[0]]) if len(bad) else None


def as_array(buffer) -> np.ndarray:
    return buffer if isinstance(buffer, np.ndarray) else np.frombuffer(buffer, dtype=np.uint8)


def tar_blocks(array: np.ndarray) -> np.ndarray:
    """The shard as rows of 512-byte tar blocks (a view): row n is the block at byte 512 n."""
    return array[: len(array) // BLOCK * BLOCK].reshape(-1, BLOCK)


def cut_members(keys: list[str], columns: dict, header: int) -> None:
    """Leave out the members from the tar header at byte `header` on, and the samples left without one."""
    for numbers, offsets, sizes in columns.values():
        while offsets and offsets[-1] > header:
            numbers.pop(), offsets.pop(), sizes.pop()
    del keys[max((numbers[-1] + 1 for numbers, _, _ in columns.values() if numbers), default=0):]


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
        if index.__class__ is not dict:
            raise ValueError(f"a JSON {type(index).__name__}, not an object")
        if index.get("format") not in READABLE_FORMATS:
            raise ValueError(f"format {index.get('format')!r}, expected one of {', '.join(READABLE_FORMATS)}")
        if index["bytes"] != entry["bytes"] or index["sha256"] != entry.get("sha256", index["sha256"]):
            raise ValueError("it belongs to another version of the shard (size or sha256 differ)")
        keys = index["keys"]
        if keys.__class__ is not list or not all(key.__class__ is str for key in keys):
            raise ValueError("its keys are not a list of strings")
        if len(keys) != entry["samples"]:
            raise ValueError(f"it lists {len(keys)} samples, the manifest {entry['samples']}")
        counts, table = member_table(index, len(keys))
        columns = checked_columns(counts, table, len(keys), entry["bytes"])
        arrays = {suffix: array_layout(layout) for suffix, layout in index.get("arrays", {}).items()}
        digests = digest_table(index, len(keys), entry["bytes"]) if "digests" in index else None
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError, MemoryError) as err:
        raise ShardError(f"{shard}: its index does not match it ({err}); {REINDEX}") from None
    return ShardIndex(keys, columns, arrays=arrays, digests=digests)


def digest_table(index: dict[str, Any], samples: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """An index's sample bounds (samples + 1 offsets, rising, inside the shard) and digests."""
    bounds = part_values(index["bounds"])
    digests = np.frombuffer(bytes.fromhex(index["digests"]), dtype=">u8")
    if len(bounds) != samples + 1 or len(digests) != samples or bounds.min() < 0 or bounds.max() > length or \
            (np.diff(bounds) < 0).any():
        raise ValueError("its sample bounds or digests do not fit the shard")
    return bounds, digests


def damaged_samples(buffer, index: ShardIndex, start: int, stop: int) -> list[int]:
    """The samples start..stop-1 whose bytes (tar headers, members, padding) differ from the digest
    the writer recorded: a flipped bit, a damaged disk. One pass over the bytes in a prefetch thread
    (xxh3 drops the GIL), bound by memory, not by Python: at 8K tokens (45 KB a sample) 1.8 us a
    sample from the CPU cache, 5-8 us from memory on our loaded 2-core box, where hashing the whole
    shard in one call saves only 0.3 us. [] for an index without digests."""
    if index.digests is None:
        return []
    hash_of, view = digest_function(), memoryview(as_array(buffer))
    bounds, digests = index.digests[0][start : stop + 1].tolist(), index.digests[1][start:stop].tolist()
    return [start + number for number, (lo, hi, digest) in enumerate(zip(bounds, bounds[1:], digests))
            if hash_of(view[lo:hi]) != digest]


def member_table(index: dict[str, Any], samples: int) -> tuple[dict[str, int], np.ndarray]:
    """(members per suffix, in archive order; a 3 x members int64 table of their sample numbers,
    data offsets and sizes, column after column): one numpy array for the whole index. A column
    has at most one member a sample, which bounds what a progression may expand to."""
    members = index["members"]
    if members.__class__ is not dict or any(column.__class__ is not list or len(column) != 3
                                            for column in members.values()):
        raise ValueError("its members are not three lists (numbers, offsets, sizes) per column")
    lengths = [[part_length(part) for part in column] for column in members.values()]
    if any(len(set(column)) > 1 or column[0] > samples for column in lengths):
        raise ValueError("its columns have lists of different lengths, or more members than samples")
    values = [part_values(part) for row in zip(*members.values()) for part in row]  # numbers of each column, ...
    table = np.concatenate(values).reshape(3, -1) if values else np.empty((3, 0), dtype=np.int64)
    return {suffix: column[0] for suffix, column in zip(members, lengths)}, table


def part_length(part: list[int] | dict[str, int]) -> int:
    return progression(part)[2] if part.__class__ is dict else len(part)


def progression(part: dict[str, int]) -> tuple[int, int, int]:
    start, step, count = part["start"], part["step"], part["count"]
    if not all(value.__class__ is int for value in (start, step, count)) or count < 0 or \
            max(abs(start), abs(start + step * count)) >= 1 << 62:
        raise ValueError(f"a progression {part!r} that is not three integers (of int64's range)")
    return start, step, count


def part_values(part: list[int] | dict[str, int]) -> np.ndarray:
    """index_part's output as int64 values."""
    if part.__class__ is not dict:
        values = np.array(part)
        if values.ndim != 1 or (len(values) and values.dtype.kind not in "iu"):
            raise ValueError("a list that is not of integers")
        return values.astype(np.int64)
    start, step, count = progression(part)
    return start + step * ramp(count)


@lru_cache(maxsize=16)
def ramp(count: int) -> np.ndarray:
    values = np.arange(count, dtype=np.int64)
    values.flags.writeable = False  # shared by every call
    return values


def checked_columns(counts: dict[str, int], table: np.ndarray, samples: int, length: int) -> dict[str, tuple]:
    """An index's columns, views of its member table, checked in one pass over all of them: every
    member inside the shard and on a tar block (numpy slices would quietly cut short), each
    column's sample numbers rising (locate_span bisects them; one member a sample). One pass for
    all columns: 0.2 ms an index of 256 samples with its parse, where a check per column took 0.4."""
    number, at, size = table
    ends = np.cumsum(np.array(list(counts.values()), dtype=np.int64))
    if len(at):
        steps, starts = np.diff(number), ends[:-1]
        steps[starts[(starts > 0) & (starts < len(number))] - 1] = 1  # where one column ends and the next begins
        if at.min() < BLOCK or (at % BLOCK).any() or (at + size).max() > length or size.min() < 0 or \
                number.min() < 0 or number.max() >= samples or steps.min(initial=1) < 1:
            raise ValueError("it points outside the shard, or lists a column out of order")
    return {suffix: (number[end - n : end], at[end - n : end], size[end - n : end])
            for suffix, n, end in zip(counts, counts.values(), ends.tolist())}


def array_layout(layout: dict[str, Any]) -> tuple[np.dtype, int]:
    """An index's layout of an .npy column: (dtype, header bytes), a plain numeric dtype."""
    dtype, header = np.dtype(layout["dtype"]), layout["header"]
    if dtype.hasobject or dtype.itemsize == 0 or not isinstance(header, int) or header < 10:
        raise ValueError(f"array layout {layout!r} is not a plain .npy column")
    return dtype, header


def iter_members(buffer, shard: str, headers: list | None = None) -> Iterator[tuple[str, int, int]]:
    """(name, data offset, size) of every regular file member, in archive order; `headers`, when
    given, gets each header's offset and checksum field for first_bad_checksum."""
    view = buffer if isinstance(buffer, memoryview) else memoryview(buffer)
    end, offset = len(view), 0
    long_name = None  # from a GNU 'L' or pax 'x' header: the next member's real name
    while offset + BLOCK <= end:
        if view[offset] == 0:  # an all-zero block: the end-of-archive marker
            return
        name, size, kind, checksum = parse_header(bytes(view[offset : offset + BLOCK]), shard, offset)
        if headers is not None:
            headers += offset, checksum
        data = offset + BLOCK
        if data + size > end:
            raise ShardError(f"{shard}: truncated inside member {name!r} at byte {offset} ({end} bytes in all); "
                             "rewrite it, or read with on_error='skip'")
        if kind == 48 or kind == 0:  # b"0" or NUL: a regular file
            yield long_name or name, data, size
            long_name = None
        elif kind in b"Lx":
            long_name = extended_name(bytes(view[data : data + size]), kind)
        else:  # a folder, a link...: a long name before it was its own
            long_name = None
        offset = data + (size + BLOCK - 1) // BLOCK * BLOCK
    raise ShardError(f"{shard}: ends at byte {end} without the end-of-archive marker: truncated; "
                     "rewrite it, or read with on_error='skip'")


def parse_header(header: bytes, shard: str, offset: int) -> tuple[str, int, int, int]:
    """(name, size, type flag, checksum field) of a ustar header."""
    if header[257:262] != b"ustar":
        raise ShardError(f"{shard}: damaged tar header at byte {offset} (no ustar magic); "
                         "check it with verify=True, rewrite it, or read with on_error='skip'")
    name = header[:100].split(b"\0", 1)[0].decode("utf-8", "replace")
    if header[345]:  # a USTAR prefix: the name's leading folders
        name = header[345:500].split(b"\0", 1)[0].decode("utf-8", "replace") + "/" + name
    try:
        size = int(header[124:135], 8)  # 11 octal digits
        checksum = int(header[148:156].strip(b" \0"), 8)
        if size < 0 or checksum < 0:  # int() takes a sign; a negative size would walk onto the same header forever
            raise ValueError
    except ValueError:
        raise ShardError(f"{shard}: damaged size or checksum field in the tar header at byte {offset}; "
                         "rewrite the shard") from None
    return name, size, header[156], checksum


def extended_name(data: bytes, kind: int) -> str | None:
    if kind == ord("L"):
        return data.split(b"\0", 1)[0].decode("utf-8", "replace")
    for record in data.decode("utf-8", "replace").splitlines():  # pax: "<len> path=<name>"
        _, _, field_ = record.partition(" ")
        if field_.startswith("path="):
            return field_[len("path="):]
    return None
