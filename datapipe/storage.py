"""Where a run writes: a folder on any filesystem fsspec reaches (a local path, file://, s3://, gs://).

Workers write their own outputs (committed partitions, shards, markers) straight to the run's
folder, so every node needs it: a shared mount or an object store. A file appears whole or not
at all: on a local filesystem it is written under a temporary name, flushed to disk (fsync)
and renamed, then its folder is flushed (a power loss cannot leave a renamed but empty file);
on an object store one upload makes it (objects are visible only once complete). Readers that
meet a half-written temporary name ignore it: names that start with "." are never listed.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit


def is_url(location: str) -> bool:
    """A location fsspec must open (s3://bucket/x, https://...), not a plain local path (file:// is local)."""
    scheme = urlsplit(str(location)).scheme
    return len(scheme) > 1 and scheme != "file"  # "C:" is a drive letter, not a scheme


def local_path(location: str) -> str:
    """A local path for a plain path or a file:// URL."""
    location = str(location)
    if location.startswith("file://"):
        return location.removeprefix("file://").removeprefix("localhost")
    return location


def filesystem(url: str) -> Any:
    """The fsspec filesystem of a URL; a missing back end (s3fs, gcsfs) is named with its install line."""
    import fsspec

    protocol = urlsplit(url).scheme
    try:
        return fsspec.filesystem(protocol)
    except (ImportError, ValueError) as err:
        package = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}
        hint = f"pip install {package[protocol]}" if protocol in package else "install its fsspec back end"
        raise OSError(f"{url}: no filesystem for {protocol}:// ({err}); {hint}") from None


class Store:
    """A folder: local (plain path or file://) or remote (any fsspec URL). Picklable: Ray tasks get one."""

    def __init__(self, location: str | Path):
        self.location = str(location).rstrip("/") or "/"
        self.remote = is_url(self.location)
        self.root = self.location if self.remote else local_path(self.location)

    def __repr__(self) -> str:
        return f"Store({self.location!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {"location": self.location}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["location"])

    @property
    def fs(self) -> Any:
        return filesystem(self.location) if self.remote else None

    def path(self, *parts: str) -> str:
        """A member's full path (or URL)."""
        return "/".join([self.root.rstrip("/"), *(str(part).strip("/") for part in parts if part)])

    def child(self, *parts: str) -> Store:
        return Store(self.path(*parts))

    def local(self) -> Path | None:
        """The folder as a local Path, or None for a remote store."""
        return None if self.remote else Path(self.root)

    def exists(self, name: str = "") -> bool:
        return self.fs.exists(self.path(name)) if self.remote else os.path.exists(self.path(name))

    def read_bytes(self, name: str) -> bytes:
        if self.remote:
            return self.fs.cat_file(self.path(name))
        return Path(self.path(name)).read_bytes()

    def read_text(self, name: str) -> str | None:
        """The file's text, or None when it does not exist."""
        try:
            return self.read_bytes(name).decode("utf-8")
        except FileNotFoundError:
            return None

    def open(self, name: str) -> IO[bytes]:
        return self.fs.open(self.path(name), "rb") if self.remote else open(self.path(name), "rb")

    def write_bytes(self, name: str, data: bytes) -> None:
        """The file, whole or not at all."""
        if self.remote:
            self.fs.pipe_file(self.path(name), data)
            return
        final = Path(self.path(name))
        final.parent.mkdir(parents=True, exist_ok=True)
        temporary = final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}.tmp")
        with open(temporary, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        commit_local(temporary, final)

    def put(self, source: Path, name: str) -> None:
        """A finished local file (written by the caller under a temporary name) into the store, then gone
        from where it was: renamed on a local store (same filesystem), uploaded to a remote one."""
        if self.remote:
            self.fs.put_file(str(source), self.path(name))
            source.unlink()
            return
        final = Path(self.path(name))
        final.parent.mkdir(parents=True, exist_ok=True)
        with open(source, "rb+") as stream:
            os.fsync(stream.fileno())
        commit_local(source, final)

    def list(self, folder: str = "") -> list[str]:
        """The names in a folder (not hidden ones: temporaries), sorted; [] when it does not exist."""
        try:
            if self.remote:
                names = [entry.rstrip("/").rsplit("/", 1)[-1] for entry in self.fs.ls(self.path(folder), detail=False)]
            else:
                names = os.listdir(self.path(folder))
        except FileNotFoundError:
            return []
        return sorted(name for name in names if not name.startswith("."))

    def remove(self, name: str) -> None:
        """A file or a whole folder; nothing when it does not exist."""
        target = self.path(name)
        if self.remote:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(target, recursive=True)
        elif os.path.isdir(target):
            shutil.rmtree(target, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(target)


def commit_local(temporary: Path, final: Path) -> None:
    """Rename a flushed temporary file into place, then flush its folder so the rename survives a power loss."""
    os.replace(temporary, final)
    descriptor = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
