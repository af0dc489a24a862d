"""Get a shard's bytes into memory: a local file mapped or read whole, or a download through fsspec.

A local shard that the page cache holds (most of: MAP_RESIDENT) is memory-mapped copy-on-write,
its pages faulted in by the prefetch thread (no copy at all: the loader's cost at long sequences).
Any other local shard is read into a page-aligned buffer from a BufferPool (from the page
cache in one system call, from disk READ_CHUNK at a time): one copy, like `cat`, into
memory that is already mapped (a fresh buffer costs a page fault and a kernel zero-fill
per 4 KiB, which doubled the read time on our 2-core box; a buffer 16 bytes off a page
boundary, as malloc gives, tripled it). The loader runs these in prefetch threads, which
hold no GIL during the system calls and page faults, so the next shard arrives while this
one is decoded. Arrays the decoder returns are writable views of the mapping or buffer; a
buffer is reused only once no view of it is alive, a mapping is unmapped then.
A URL (http(s)://, s3://, gs://... any fsspec protocol whose package is installed) is
downloaded whole; with a cache folder it is written there atomically
(temporary name, rename) and read like a local file next time, so a second epoch or a
restarted job reads it from disk. Every shard is checked against the manifest's size
(a truncated shard fails before decoding) and, with verify=True, its sha256.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import mmap
import os
import sys
import threading
import weakref
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from datapipe.loader.shardindex import ShardError

log = logging.getLogger(__name__)

PAGE = 4096
# Bytes a read() asks for. From disk, the kernel's readahead runs ahead of sequential reads of
# this size, while one read() of a whole shard waits for each readahead window in turn: 2.2x
# `cat`'s time on our box with the page cache dropped (128 KiB: about as fast as `cat`).
READ_CHUNK = 128 << 10
NOWAIT = hasattr(os, "RWF_NOWAIT")  # Linux 4.14+: read only what the page cache holds
# A shard is mapped when the page cache holds this share of it, else read. Not 1: our VM's host takes
# page-cache pages back all the time (a shard read a minute before had 5-45% of its pages out, some
# within a second of a `cat`), so "all of it" sent most shards through a 44 MiB copy into fresh
# memory, and the per-sample loader at 8K ran at 200 or 900 M tokens/s by the luck of the page cache.
MAP_RESIDENT = 0.5
# Live shard mappings at most; beyond, shards are read. Python's mmap keeps a duplicate of the file
# descriptor while mapped, so a consumer holding samples of thousands of shards would otherwise run
# the process out of descriptors (1,024 by default) and fail the trainer's own opens (checkpoints).
MAX_MAPPED = 256
MAPPED: weakref.WeakSet = weakref.WeakSet()  # the live ones (an mmap leaves it when unmapped)
PROTOCOL_PACKAGES = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs",
                     "http": "aiohttp", "https": "aiohttp"}


def is_url(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


def local_path(location: str) -> Path:
    """A local path, or a file:// URL's: file:///data/x and file://localhost/data/x (RFC 8089) alike;
    the rest is taken as it stands (no %-decoding, '#' is part of the name), as fsspec does."""
    rest = location.removeprefix("file://")
    return Path(rest.removeprefix("localhost") if rest.startswith("localhost/") else rest)


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
        self.warm = False  # the last shard came whole from the page cache (read_local's hint for the next)

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
               pool: BufferPool | None = None, mapped: bool = False):
    """The shard's bytes in memory, checked against the manifest entry; `mapped`: see read_local."""
    if is_url(location):
        cached = cache_dir / cache_name(location, shard.get("sha256")) if cache_dir else None
        if cached is not None and cached.is_file() and cached.stat().st_size == shard["bytes"]:
            try:
                return checked(read_local(cached, pool, mapped), location, shard, verify)
            except ShardError as err:  # a damaged cache file: fetch the shard again, and replace it
                log.warning("cache file %s does not match (%s): downloading again", cached, err)
        cacheable = cached is not None and "sha256" in shard  # only a shard that passed its sha256 goes in
        buffer = checked(download(location), location, shard, verify or cacheable)
        if cacheable:
            write_cache(cached, buffer)
        return buffer
    return checked(read_local(local_path(location), pool, mapped), location, shard, verify)


def will_need(location: str) -> None:
    """Ask the kernel to start reading a local file into the page cache now, without waiting for
    it (a small index file read after its shard cost 2-3 ms of disk latency on the reading thread)."""
    if is_url(location) or not hasattr(os, "posix_fadvise"):  # macOS has no posix_fadvise
        return
    try:
        descriptor = os.open(local_path(location), os.O_RDONLY)
    except OSError:
        return  # a missing file fails where it is read, with a message that names it
    try:
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_WILLNEED)
    finally:
        os.close(descriptor)


def read_local(path: Path, pool: BufferPool | None = None, mapped: bool = False) -> np.ndarray:
    """The whole file in a uint8 array. `mapped`: a file the page cache holds whole is mapped
    (map_cached) instead of copied. Otherwise it is read into a buffer from the pool, when one is
    given: what the page cache holds without a disk wait (cached_part); the rest READ_CHUNK at a time."""
    pool = pool or BufferPool(keep=0)
    try:
        with open(path, "rb", buffering=0) as stream:
            size = os.fstat(stream.fileno()).st_size
            if mapped and (array := map_cached(stream.fileno(), size)) is not None:
                pool.warm = True
                return array
            buffer = pool.take(size)
            view = memoryview(buffer)
            done = cached_part(stream.fileno(), view, len(buffer) if pool.warm else READ_CHUNK)
            pool.warm = done == len(buffer)
            if not pool.warm:
                stream.seek(done)  # preadv leaves the file position where it was
            while done < len(buffer):
                got = stream.readinto(view[done : done + READ_CHUNK])
                if not got:
                    return buffer[:done]  # the file shrank while being read
                done += got
            return buffer
    except FileNotFoundError:
        raise ShardError(f"{path}: shard listed in the manifest is missing; copy the whole phase folder, "
                         "or read with on_error='skip'") from None


def map_cached(descriptor: int, size: int) -> np.ndarray | None:
    """The file mapped copy-on-write, every page faulted in by this (prefetch) thread, when the page
    cache holds most of it (MAP_RESIDENT); None otherwise, and the caller reads it. Mapping skips
    the copy that dominates reading at long sequences: at 64K the loader ran at 1.37 of `cat`
    mapped, 0.63 copying, on our 2-core box. A file mostly out of the page cache is read instead:
    faulting it in from disk ran at 0.67 of `cat`, chunked reads at 0.82-0.92. Arrays stay
    writable (a write copies its page, the file is never changed). The cost: a file truncated
    in place while mapped (`cp` over it; our writer renames, never truncates) kills the process
    with SIGBUS, where a read would fail cleanly."""
    if not size or load_mincore() is None or len(MAPPED) >= MAX_MAPPED:
        return None
    try:
        mapping = mmap.mmap(descriptor, size, access=mmap.ACCESS_COPY)
    except OSError:  # a file system that cannot map (some FUSE mounts): read it
        return None
    array = np.frombuffer(mapping, dtype=np.uint8)
    resident = resident_share(array)
    if resident < MAP_RESIDENT:
        del array
        mapping.close()
        return None
    if resident < 1 and hasattr(mapping, "madvise"):
        mapping.madvise(mmap.MADV_WILLNEED)  # the kernel reads the missing pages ahead of the faults below
    array[::PAGE].max()  # fault every page in here, not in the trainer's thread (numpy drops the GIL meanwhile)
    MAPPED.add(mapping)
    return array


def resident_share(array: np.ndarray) -> float:
    """The share of a mapped array's pages in memory (mincore; needs load_mincore()); 0 if it fails."""
    pages = np.empty(-(-len(array) // mmap.PAGESIZE), dtype=np.uint8)  # one byte a page of the system's size
    if load_mincore()(array.ctypes.data, len(array), pages.ctypes.data) != 0:
        return 0.0
    return float(np.count_nonzero(pages & 1)) / len(pages)


@cache
def load_mincore():
    """libc's mincore (which pages of a mapping are in memory), or None where ctypes cannot reach it."""
    try:
        function = ctypes.CDLL(None, use_errno=True).mincore
    except (OSError, AttributeError, TypeError):  # no libc by that name (Windows), or no mincore in it
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    function.restype = ctypes.c_int
    return function


def cached_part(descriptor: int, view: memoryview, first: int) -> int:
    """Bytes of the file's start read into `view` from the page cache alone (RWF_NOWAIT: never a
    disk wait): `first` bytes, then, if they all came, the rest. A warm shard so comes in one or
    two system calls (read in chunks, the loader's 8K bench from the page cache took 25% longer).
    After a cold shard `first` is one chunk, so that a cold file starts no readahead of its whole
    size (the slow case READ_CHUNK avoids); after a warm one it is the whole shard. 0 where the
    system has no RWF_NOWAIT."""
    done = 0
    if not NOWAIT:
        return done
    try:
        done = os.preadv(descriptor, [view[:first]], 0, os.RWF_NOWAIT)
        if done == min(first, len(view)) < len(view):  # all of `first` was cached: try the rest
            done += os.preadv(descriptor, [view[done:]], done, os.RWF_NOWAIT)
    except OSError:  # BlockingIOError: not cached; some file systems refuse the flag
        pass
    return done


def download(url: str) -> bytearray:
    try:
        return bytearray(open_filesystem(url).cat_file(url))  # one plain GET: no range requests needed
    except FileNotFoundError:
        raise ShardError(f"{url}: shard listed in the manifest is missing on the server; "
                         "upload the whole phase folder, or read with on_error='skip'") from None
    except Exception as err:  # noqa: BLE001 - fsspec back ends raise their own types (aiohttp's for HTTP 5xx)
        raise ShardError(f"{url}: download failed ({type(err).__name__}: {err}); retry, "
                         "or read with on_error='skip'") from err


def checked(buffer, location: str, shard: dict[str, Any], verify: bool):
    if len(buffer) != shard["bytes"]:
        raise ShardError(f"{location}: {len(buffer)} bytes but the manifest says {shard['bytes']}: truncated or "
                         "replaced; rewrite it with `datapipe run`, or read with on_error='skip'")
    if verify and hashlib.sha256(buffer).hexdigest() != shard["sha256"]:
        raise ShardError(f"{location}: sha256 differs from the manifest: the shard is corrupt; rewrite it with "
                         "`datapipe run`, or read with on_error='skip'")
    return buffer


def cache_name(url: str, sha256: str | None) -> str:
    """One file per URL and version of the shard (its sha256 from the manifest): a phase replaced
    at the same URL never meets the old version's file. The readable tail helps whoever looks
    into the cache folder."""
    digest = hashlib.sha256(f"{url}\n{sha256}".encode()).hexdigest()[:16]
    return f"{digest}-{url.rstrip('/').rsplit('/', 1)[-1]}"


def write_cache(path: Path, buffer) -> None:
    """The shard into the cache, atomically; a cache that cannot be written (read-only, full) is
    logged and the loader goes on without it."""
    # unique per process and thread: DataLoader workers, and two prefetch threads of one loader
    # fetching the same shard (a phase read twice in one epoch), may write it at once
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_bytes(buffer)
        os.replace(temporary, path)
    except OSError as err:
        warn_uncached(path.parent, err.strerror or type(err).__name__)  # once a folder and reason
        with contextlib.suppress(OSError):  # none was made, or the folder is not one
            temporary.unlink()


@cache
def warn_uncached(folder: Path, reason: str) -> None:
    log.warning("cache_dir %s cannot be written (%s): reading without the cache; pass a writable "
                "cache_dir, or None", folder, reason)
