"""Get a shard's bytes: a local file mapped into memory, or a download through fsspec.

Local files are mmapped copy-on-write: no read up front, pages come straight from the
page cache as the decoder touches them, and arrays viewing them are writable without
touching the file. A URL (http(s)://, s3://, gs://... any fsspec protocol whose
package is installed) is downloaded whole; with a cache folder it is written there
atomically (temporary name, rename) and mapped like a local file, so a second epoch or
a restarted job reads it from disk. Every shard is checked against the manifest's size
(a truncated shard fails before decoding) and, with verify=True, its sha256.
"""
from __future__ import annotations

import hashlib
import mmap
import os
from pathlib import Path
from typing import Any

from datapipe.tarsamples import ShardError

PROTOCOL_PACKAGES = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs",
                     "http": "aiohttp", "https": "aiohttp"}


def is_url(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


def local_path(location: str) -> Path:
    return Path(location[len("file://"):] if location.startswith("file://") else location)


def join(location: str, name: str) -> str:
    return f"{location.rstrip('/')}/{name}"


def read_text(location: str) -> str | None:
    """A small file (a manifest) as text; None when it does not exist."""
    if not is_url(location):
        path = local_path(location)
        return path.read_text() if path.is_file() else None
    filesystem = open_filesystem(location)
    try:
        with filesystem.open(location, "rb") as stream:
            return stream.read().decode()
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


def load_shard(location: str, shard: dict[str, Any], cache_dir: Path | None, verify: bool):
    """The shard's bytes as a buffer (mmap or bytearray), checked against the manifest entry."""
    if is_url(location):
        cached = cache_dir / cache_name(location) if cache_dir else None
        if cached is not None and cached.is_file() and cached.stat().st_size == shard["bytes"]:
            return checked(map_local(cached), location, shard, verify)
        buffer = checked(download(location), location, shard, verify or cached is not None)
        if cached is None:
            return buffer
        write_cache(cached, buffer)
        return map_local(cached)
    return checked(map_local(local_path(location)), location, shard, verify)


def map_local(path: Path):
    try:
        with open(path, "rb") as stream:
            size = os.fstat(stream.fileno()).st_size
            if size == 0:
                return bytearray()
            buffer = mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_COPY)
    except FileNotFoundError:
        raise ShardError(f"{path}: shard listed in the manifest is missing; copy the whole stage folder, "
                         "or read with on_error='skip'") from None
    buffer.madvise(mmap.MADV_SEQUENTIAL)  # read ahead: the decoder walks it front to back
    return buffer


def download(url: str) -> bytearray:
    try:
        with open_filesystem(url).open(url, "rb") as stream:
            return bytearray(stream.read())
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
