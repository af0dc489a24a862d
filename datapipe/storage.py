"""Where a run writes: a folder on any filesystem fsspec reaches (a local path, file://, s3://, gs://).

Workers write their own outputs (committed partitions, shards, markers) straight to the run's
folder, so every node needs it: a shared mount or an object store. A file appears whole or not
at all: on a local filesystem it is written under a temporary name, flushed to disk (fsync)
and renamed, then its folder is flushed (a power loss cannot leave a renamed but empty file);
on an object store one upload makes it (objects are visible only once complete). Readers that
meet a half-written temporary name ignore it: names that start with "." are never listed.

Inputs are read from the same places: open_input, input_exists, glob_inputs and folder_inputs
take a local path, a file:// URL or any fsspec URL (s3://, gs://, https:// for single files).
A local path goes straight to open() and os (no fsspec on the hot path); a URL goes through
its fsspec filesystem, whose own client errors (botocore's NoCredentialsError, an endpoint
that does not answer, gcsfs's HttpError) come out as RemoteError, an OSError, so a reader
handles a remote failure as it handles a local one: FileNotFoundError is a missing file,
any other OSError an unreadable one. Credentials and endpoints come from the environment
(AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, FSSPEC_S3_ENDPOINT_URL, GOOGLE_APPLICATION_CREDENTIALS...),
read by s3fs/gcsfs themselves.
"""
from __future__ import annotations

import contextlib
import errno
import glob
import io
import os
import posixpath
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

READ_BUFFER = 1 << 20  # bytes per read from a remote file; s3fs fetches 50 MiB blocks behind it
UNLISTABLE = ("http", "https")  # single files only: "listing" a URL would fetch the page and parse its links
BACKEND_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}


class RemoteError(OSError):
    """A remote filesystem's own failure (no credentials, an endpoint that does not answer, an HTTP
    error), as an OSError naming the URL; readers count it as an unreadable file."""


class DiskFull(OSError):
    """No space left (ENOSPC, or a quota: EDQUOT) where a run writes; the message names the path, the
    bytes the write needed and what is free there. The CLI exits 3 on it (datapipe.cli)."""


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def disk_full(err: OSError, path: str | Path, needed: int | None) -> DiskFull:
    """The DiskFull that an OSError of a full disk means, naming the path written and the bytes needed
    (None: not known, an error from a library's own write)."""
    folder = Path(local_path(str(path))).parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    usage = shutil.disk_usage(folder)
    writing = f"writing {needed:,} bytes, " if needed is not None else ""
    return DiskFull(f"{path}: no space left on the device ({writing}{usage.free:,} of {usage.total:,} bytes "
                    f"free on the filesystem of {folder}): free space there or give --out a larger disk, then "
                    f"run the same command again ({err.strerror})")


@contextlib.contextmanager
def space_named(path: str | Path, needed: int) -> Iterator[None]:
    """An OSError of a full disk inside becomes a DiskFull naming `path` and the `needed` bytes."""
    try:
        yield
    except OSError as err:
        if err.errno in NO_SPACE:
            raise disk_full(err, path, needed) from err
        raise


class MissingBackend(RemoteError):
    """No fsspec filesystem for a URL's scheme on this machine: the message names the package to install."""


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
        package = BACKEND_PACKAGES.get(protocol)
        hint = f"pip install {package}" if package else "install its fsspec back end"
        raise MissingBackend(f"{url}: no filesystem for {protocol}:// ({err}); {hint}") from None


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
        try:
            with space_named(final, len(data)), open(temporary, "wb") as stream:
                stream.write(data)
                stream.flush()
                os.fsync(stream.fileno())
        except OSError:  # the half-written temporary goes: a full disk is not left fuller
            temporary.unlink(missing_ok=True)
            raise
        commit_local(temporary, final)

    def write_table(self, name: str, table: Any) -> None:
        """An Arrow table as an Arrow IPC file, whole or not at all."""
        import pyarrow as pa

        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        self.write_bytes(name, sink.getvalue().to_pybytes())

    def read_table(self, name: str) -> Any:
        """The Arrow table of an Arrow IPC file that write_table wrote."""
        import pyarrow as pa

        return pa.ipc.open_file(pa.py_buffer(self.read_bytes(name))).read_all()

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


def remove_temporaries(location: str | Path) -> int:
    """Delete the hidden temporaries (.NAME.tmp, .NAME.XXXXXXXX.tmp) that writes under a local folder
    left behind when they failed; how many. Nothing for a remote folder (an upload is whole or absent)."""
    if is_url(str(location)) or not os.path.isdir(local_path(str(location))):
        return 0
    stale = [path for path in Path(local_path(str(location))).rglob(".*.tmp") if path.is_file()]
    for path in stale:
        path.unlink(missing_ok=True)
    return len(stale)


def commit_local(temporary: Path, final: Path) -> None:
    """Rename a flushed temporary file into place, then flush its folder so the rename survives a power loss."""
    os.replace(temporary, final)
    descriptor = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def remote_errors(url: str) -> Iterator[None]:
    """fsspec back ends raise their clients' exceptions (botocore, aiohttp, google-auth), which share no
    base class: every one but FileNotFoundError (a missing file, as locally) becomes a RemoteError.
    Both name the URL (s3fs names a missing object by its key alone)."""
    try:
        yield
    except RemoteError:
        raise
    except FileNotFoundError as err:
        raise FileNotFoundError(errno.ENOENT, f"No such file or directory ({err})", url) from err
    except Exception as err:  # noqa: BLE001 - see the docstring; the original error is chained
        raise RemoteError(f"{url}: {type(err).__name__}: {err}") from err


def open_input(location: str) -> IO[bytes]:
    """A file to read, streaming: open() for a local path or file:// URL, fsspec for any other URL."""
    if not is_url(location):
        return open(local_path(location), "rb")
    fs = filesystem(location)
    with remote_errors(location):
        return io.BufferedReader(RemoteFile(fs.open(location, "rb"), location), READ_BUFFER)


class RemoteFile(io.RawIOBase):
    """An fsspec file whose reads and seeks raise OSError only (remote_errors), so the decompressors
    and parsers above it tell a network failure (unreadable) from damaged bytes (corrupt)."""

    def __init__(self, file: Any, url: str) -> None:
        self._file, self._url = file, url

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        with remote_errors(self._url):
            data = self._file.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        with remote_errors(self._url):
            return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def close(self) -> None:
        self._file.close()
        super().close()


def input_exists(location: str) -> bool:
    if not is_url(location):
        return os.path.exists(local_path(location))
    fs = filesystem(location)
    with remote_errors(location):
        return fs.exists(location)


def is_pattern(location: str) -> bool:
    """A glob (* ? [); an http(s) URL is never one: "?" starts its query."""
    return urlsplit(location).scheme not in UNLISTABLE and any(ch in location for ch in "*?[")


def is_folder(location: str) -> bool:
    if not is_url(location):
        return os.path.isdir(local_path(location))
    if urlsplit(location).scheme in UNLISTABLE:
        return False
    fs = filesystem(location)
    with remote_errors(location):
        return fs.isdir(location)


def glob_inputs(pattern: str) -> list[str]:
    """What a glob matches (** spans folders; a folder too: a saved dataset), sorted; hidden names (".x") left out."""
    if not is_url(pattern):
        return sorted(glob.glob(local_path(pattern), recursive=True))
    fs = filesystem(pattern)
    with remote_errors(pattern):
        return sorted(fs.unstrip_protocol(name) for name in fs.glob(pattern) if not is_hidden(name))


def folder_inputs(folder: str) -> list[str]:
    """Every file under a folder, at any depth, sorted; hidden names (".x": temporaries) left out."""
    if not is_url(folder):
        files = (path for path in Path(local_path(folder)).rglob("*") if path.is_file())
        return sorted(str(path) for path in files if not path.name.startswith("."))
    fs = filesystem(folder)
    with remote_errors(folder):
        return sorted(fs.unstrip_protocol(name) for name in fs.find(folder) if not is_hidden(name))


def is_hidden(name: str) -> bool:
    return name.rstrip("/").rsplit("/", 1)[-1].startswith(".")


def probe(location: str) -> None:
    """Raise why a URL's bucket (its first path part) cannot be listed, if it cannot: a glob over a
    missing bucket matches nothing, silently, where listing the bucket says it does not exist.
    Nothing for local paths and single-file URLs (http)."""
    parts = urlsplit(location)
    if not is_url(location) or parts.scheme in UNLISTABLE:
        return
    fs = filesystem(location)
    with remote_errors(location):
        fs.ls(f"{parts.scheme}://{parts.netloc}", detail=False)


def parent_of(location: str) -> str:
    """The folder a file is in: a URL's prefix, or a local file's resolved folder."""
    if is_url(location):
        return location.rsplit("/", 1)[0]
    return str(Path(local_path(location)).resolve().parent)


def join_location(folder: str, name: str) -> str:
    """A name relative to a folder (a manifest's row); a URL stays itself, and within a remote folder
    an absolute name starts at the bucket and ".." never climbs out of it."""
    if is_url(name):
        return name
    if not is_url(folder):
        return str(Path(local_path(folder)) / local_path(name))
    parts = urlsplit(folder)
    key = posixpath.normpath(posixpath.join("/", parts.path, local_path(name)))
    return f"{parts.scheme}://{parts.netloc}{key}"


@contextlib.contextmanager
def local_folder(location: str) -> Iterator[str]:
    """A local folder with a location's files: the folder itself, or for a URL a temporary copy,
    deleted afterwards (a reader that needs local files, such as datasets' load_from_disk)."""
    if not is_url(location):
        yield local_path(location)
        return
    fs = filesystem(location)
    with tempfile.TemporaryDirectory(prefix="datapipe-input-") as folder:
        with remote_errors(location):
            fs.get(location.rstrip("/") + "/", folder + "/", recursive=True)
        yield folder


def fetch_pinned(url: str, sha256: str, remedy: str) -> bytes:
    """The bytes at url (a registry package fetched at install time), or SystemExit naming the remedy
    when it cannot be fetched or its sha256 is not the pinned one."""
    import hashlib
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=120) as response:
            data = response.read()
    except OSError as err:
        raise SystemExit(f"cannot fetch {url} ({err}); {remedy}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise SystemExit(f"{url}: sha256 {digest}, expected {sha256}; not installed")
    return data
