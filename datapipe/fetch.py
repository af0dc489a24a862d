"""Get a shard's bytes into memory: a local file read whole, or a download through fsspec.

A local shard is read with one readinto() into a page-aligned buffer from a BufferPool:
one copy, like `cat`, into memory that is already mapped (a fresh buffer costs a page
fault and a kernel zero-fill per 4 KiB, which doubled the read time on our 2-core box;
a buffer 16 bytes off a page boundary, as malloc gives, tripled it). The loader
runs these reads in prefetch threads, which hold no GIL during the system call, so
reading the next shard overlaps decoding this one. Arrays the decoder returns are
writable views of that buffer; a buffer is reused only once no view of it is alive.
A URL (http(s)://, s3://, gs://... any fsspec protocol whose package is installed) is
downloaded whole; with a cache folder it is written there atomically
(temporary name, rename) and read like a local file next time, so a second epoch or a
restarted job reads it from disk. Every shard is checked against the manifest's size
(a truncated shard fails before decoding) and, with verify=True, its sha256.
"""
from __future__ import annotations

import hashlib
import os
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

from datapipe.tarsamples import ShardError

PAGE = 4096
PROTOCOL_PACKAGES = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs",
                     "http": "aiohttp", "https": "aiohttp"}


def is_url(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


def local_path(location: str) -> Path:
    return Path(location.removeprefix("file://"))


def join(location: str, name: str) -> str:
    return f"{location.rstrip('/')}/{name}"


def read_text(location: str) -> str | None:
    """A small file (a manifest) as text; None when it does not exist."""
    if not is_url(location):
        path = local_path(location)
        return path.read_text() if path.is_file() else None
    try:
        return open_filesystem(location).cat_file(location).decode()
    except FileNotFoundError:
        return None


def open_filesystem(url: str):
    import fsspec

    protocol = url.split("://", 1)[0]
    try:
        return fsspec.filesystem(protocol)
    except ImportError as err:
        package = PROTOCOL_PACKAGES.get(protocol, f"the fsspec package for {protocol}://")
        raise ImportError(f"reading {url} needs {package}: pip install {package}") from err


class BufferPool:
    """Shard-sized uint8 buffers, reused once nothing refers to them any more. Every sample array
    is a view whose numpy base is the buffer itself, so the buffer's reference count says whether
    any sample of it is still alive. Keeps at most `keep` buffers; beyond that, fresh ones."""

    def __init__(self, keep: int = 6):
        self.keep, self.buffers, self.lock = keep, [], threading.Lock()

    def take(self, size: int) -> np.ndarray:
        with self.lock:
            for buffer in self.buffers:
                if sys.getrefcount(buffer) == 3 and len(buffer) >= size + PAGE:  # the list, `buffer`, the call
                    return page_aligned(buffer, size)
            buffer = np.empty(size + PAGE, dtype=np.uint8)
            if len(self.buffers) < self.keep:
                self.buffers.append(buffer)
            return page_aligned(buffer, size)


def page_aligned(buffer: np.ndarray, size: int) -> np.ndarray:
    """`size` bytes of `buffer` from its first page boundary on. The kernel copied into a buffer 16
    bytes past a page boundary (where malloc puts large arrays) at a third of its speed on our AMD
    box (rep movsb with source and destination misaligned): 3x slower than `cat`; aligned, as fast."""
    start = -buffer.ctypes.data % PAGE
    return buffer[start : start + size]


def load_shard(location: str, shard: dict[str, Any], cache_dir: Path | None, verify: bool,
               pool: BufferPool | None = None):
    """The shard's bytes in memory, checked against the manifest entry."""
    if is_url(location):
        cached = cache_dir / cache_name(location) if cache_dir else None
        if cached is not None and cached.is_file() and cached.stat().st_size == shard["bytes"]:
            return checked(read_local(cached, pool), location, shard, verify)
        buffer = checked(download(location), location, shard, verify or cached is not None)
        if cached is not None:  # only a shard that passed its sha256 goes into the cache
            write_cache(cached, buffer)
        return buffer
    return checked(read_local(local_path(location), pool), location, shard, verify)


def read_local(path: Path, pool: BufferPool | None = None) -> np.ndarray:
    """The whole file in a uint8 buffer, from the pool when one is given."""
    try:
        with open(path, "rb", buffering=0) as stream:
            size = os.fstat(stream.fileno()).st_size
            buffer = (pool or BufferPool(keep=0)).take(size)
            view, done = memoryview(buffer), 0
            while done < len(buffer):
                got = stream.readinto(view[done:])
                if not got:
                    return buffer[:done]  # the file shrank while being read
                done += got
            return buffer
    except FileNotFoundError:
        raise ShardError(f"{path}: shard listed in the manifest is missing; copy the whole stage folder, "
                         "or read with on_error='skip'") from None


def download(url: str) -> bytearray:
    try:
        return bytearray(open_filesystem(url).cat_file(url))  # one plain GET: no range requests needed
    except FileNotFoundError:
        raise ShardError(f"{url}: shard listed in the manifest is missing on the server; "
                         "upload the whole stage folder, or read with on_error='skip'") from None
    except OSError as err:
        raise ShardError(f"{url}: download failed ({err}); retry, or read with on_error='skip'") from err


def checked(buffer, location: str, shard: dict[str, Any], verify: bool):
    if len(buffer) != shard["bytes"]:
        raise ShardError(f"{location}: {len(buffer)} bytes but the manifest says {shard['bytes']}: truncated or "
                         "replaced; rewrite it with `datapipe run`, or read with on_error='skip'")
    if verify and hashlib.sha256(buffer).hexdigest() != shard["sha256"]:
        raise ShardError(f"{location}: sha256 differs from the manifest: the shard is corrupt; rewrite it with "
                         "`datapipe run`, or read with on_error='skip'")
    return buffer


def cache_name(url: str) -> str:
    """One file per URL; the readable tail helps whoever looks into the cache folder."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return f"{digest}-{url.rstrip('/').rsplit('/', 1)[-1]}"


def write_cache(path: Path, buffer) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # several DataLoader workers may race
    temporary.write_bytes(buffer)
    os.replace(temporary, path)
