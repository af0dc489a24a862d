"""Walk a tar shard held in memory and decode its samples, by member extension.

A shard is read whole (an mmap of a local file, or the bytes of a download), so the
walk is index arithmetic over one buffer: a 512-byte header, then the data padded to
512, the next header. Arrays come back as numpy views into that buffer (zero copy,
writable: mmaps are copy-on-write), which is what lets the loader keep up with `cat`.
This is about 6x faster per sample than `tarfile` plus `np.load(BytesIO(...))`.

Members sharing a key (the file name up to its first dot, as in WebDataset) form one
sample. Decoding is generic, so new members need no change here:
`.npy` -> an array named by the middle of the name (`k.loss_mask.npy` -> "loss_mask"),
`.json` -> its fields merged into the sample, images (`k.0.png`, `k.1.png`) -> their
bytes in index order under "media", anything else -> raw bytes under its suffix.
"""
from __future__ import annotations

import ast
import json
import math
from functools import lru_cache
from typing import Any, Iterator

import numpy as np

BLOCK = 512
IMAGE_SUFFIXES = ("png", "jpg", "jpeg", "webp", "gif", "bmp", "tif", "tiff")
NPY_MAGIC = b"\x93NUMPY"


class ShardError(ValueError):
    """A shard that cannot be read; the message names it and says what to do."""


def iter_members(buffer, shard: str) -> Iterator[tuple[str, int, int]]:
    """(name, data offset, size) of every regular file member, in archive order."""
    view, end, offset = memoryview(buffer), len(buffer), 0
    long_name = None  # from a GNU 'L' or pax 'x' header: the next member's real name
    while offset + BLOCK <= end:
        header = bytes(view[offset : offset + BLOCK])
        if header[0] == 0:  # an all-zero block: the end-of-archive marker
            return
        name, size, kind = parse_header(header, shard, offset)
        data = offset + BLOCK
        if data + size > end:
            raise ShardError(f"{shard}: truncated inside member {name!r} at byte {offset} ({end} bytes in all); "
                             "rewrite it, or read with on_error='skip'")
        if kind in b"0\x00":
            yield long_name or name, data, size
            long_name = None
        elif kind in b"Lx":
            long_name = extended_name(bytes(view[data : data + size]), kind)
        offset = data + (size + BLOCK - 1) // BLOCK * BLOCK
    raise ShardError(f"{shard}: ends at byte {end} without the end-of-archive marker: truncated; "
                     "rewrite it, or read with on_error='skip'")


def parse_header(header: bytes, shard: str, offset: int) -> tuple[str, int, bytes]:
    if header[257:262] != b"ustar":
        raise ShardError(f"{shard}: damaged tar header at byte {offset} (no ustar magic); "
                         "check it with verify=True, rewrite it, or read with on_error='skip'")
    name = header[:100].split(b"\0", 1)[0].decode("utf-8", "replace")
    prefix = header[345:500].split(b"\0", 1)[0]
    if prefix:
        name = prefix.decode("utf-8", "replace") + "/" + name
    try:
        size = int(header[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        raise ShardError(f"{shard}: damaged size field in the tar header at byte {offset}; rewrite the shard") from None
    return name, size, header[156:157]


def extended_name(data: bytes, kind: bytes) -> str | None:
    if kind == b"L":
        return data.split(b"\0", 1)[0].decode("utf-8", "replace")
    for record in data.decode("utf-8", "replace").splitlines():  # pax: "<len> path=<name>"
        _, _, field = record.partition(" ")
        if field.startswith("path="):
            return field[len("path="):]
    return None


def iter_samples(buffer, shard: str, start: int = 0, stop: int | None = None) -> Iterator[dict[str, Any]]:
    """Samples number start..stop-1 of a shard; the ones before `start` are skipped undecoded."""
    index, key, members = 0, None, []
    for name, offset, size in iter_members(buffer, shard):
        member_key, _, suffix = name.rpartition("/")[2].partition(".")
        if member_key != key and members:
            if index >= start:
                yield decode_sample(buffer, key, members, shard)
            index += 1
            members = []
            if stop is not None and index >= stop:
                return
        key = member_key
        members.append((suffix, offset, size))
    if members and index >= start and (stop is None or index < stop):
        yield decode_sample(buffer, key, members, shard)


def decode_sample(buffer, key: str, members: list[tuple[str, int, int]], shard: str) -> dict[str, Any]:
    sample: dict[str, Any] = {"key": key}
    for suffix, offset, size in members:
        try:
            decode_member(sample, suffix, buffer, offset, size)
        except (ValueError, UnicodeDecodeError) as err:
            raise ShardError(f"{shard}: member {key}.{suffix} does not decode ({err}); "
                             "check it with verify=True, rewrite it, or read with on_error='skip'") from None
    if "media" in sample:
        sample["media"] = [data for _, data in sorted(sample["media"])]
    return sample


def decode_member(sample: dict[str, Any], suffix: str, buffer, offset: int, size: int) -> None:
    stem, _, extension = suffix.rpartition(".")
    if extension == "npy":
        sample[stem] = npy_view(buffer, offset, size)
    elif extension == "json":
        sample.update(json.loads(bytes(memoryview(buffer)[offset : offset + size])))
    elif extension in IMAGE_SUFFIXES:
        order = int(stem) if stem.isdigit() else len(sample.get("media", []))
        sample.setdefault("media", []).append((order, bytes(memoryview(buffer)[offset : offset + size])))
    else:
        sample[suffix] = bytes(memoryview(buffer)[offset : offset + size])


def npy_view(buffer, offset: int, size: int) -> np.ndarray:
    """An .npy member as an array viewing the buffer; the header is parsed once per distinct header."""
    view = memoryview(buffer)
    if bytes(view[offset : offset + 6]) != NPY_MAGIC:
        raise ValueError("not an .npy member (bad magic)")
    major = view[offset + 6]
    width = 2 if major == 1 else 4
    header_len = int.from_bytes(view[offset + 8 : offset + 8 + width], "little")
    start = offset + 8 + width + header_len
    dtype, shape, fortran, count = npy_header(bytes(view[offset + 8 + width : start]))
    if start + count * dtype.itemsize > offset + size:
        raise ValueError(f"array of shape {shape} does not fit in {size} bytes")
    array = np.frombuffer(buffer, dtype=dtype, count=count, offset=start)
    return array if len(shape) == 1 else array.reshape(shape, order="F" if fortran else "C")


@lru_cache(maxsize=4096)
def npy_header(text: bytes) -> tuple[np.dtype, tuple[int, ...], bool, int]:
    """(dtype, shape, fortran order, element count) of an .npy header; a shard repeats a few headers."""
    fields = ast.literal_eval(text.decode("latin1"))
    dtype, shape = np.dtype(fields["descr"]), tuple(fields["shape"])
    if dtype.hasobject:
        raise ValueError("object arrays are not allowed")
    return dtype, shape, bool(fields["fortran_order"]), math.prod(shape)
