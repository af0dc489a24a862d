"""Input files opened by extension, streaming: plain, gzip, or zstd read frame by frame; local
paths and URLs alike (datapipe.storage.open_input)."""
from __future__ import annotations

import gzip
import io
import zlib
from pathlib import Path
from typing import IO, Any, BinaryIO

import zstandard

from datapipe.storage import open_input

# Errors a decompressor raises on a damaged stream (gzip: BadGzipFile is an OSError, a
# truncated member is an EOFError); anything else is a bug and surfaces.
CORRUPT_STREAM_ERRORS = (EOFError, OSError, zlib.error, zstandard.ZstdError)


def open_binary(location: str | Path) -> BinaryIO:
    """Open plain, gzip or zstd files by extension, streaming."""
    name = str(location)
    raw = open_input(name)
    if name.endswith(".gz"):
        return GzipReader(raw)
    if name.endswith((".zst", ".zstd")):
        return io.BufferedReader(ZstdFrames(raw))
    return raw


class GzipReader(gzip.GzipFile):
    """gzip over a stream it owns: closing it closes the stream (a GzipFile leaves a given one open)."""

    def __init__(self, raw: IO[bytes]) -> None:
        super().__init__(fileobj=raw, mode="rb")
        self._raw = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


class ZstdFrames(io.RawIOBase):
    """Decompresses every zstd frame of a file in turn; a frame cut short raises ZstdError.

    zstandard's stream_reader reports a cut frame as a clean end of file, losing the rest silently.
    """

    CHUNK = 1 << 16

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._obj = zstandard.ZstdDecompressor().decompressobj()
        self._in_frame = False  # bytes fed to the current frame that did not complete it yet
        self._pending = bytearray()  # deleting from its front is cheap (CPython moves a start offset)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            chunk = self._raw.read(self.CHUNK)
            if not chunk:
                if self._in_frame:
                    raise zstandard.ZstdError("truncated zstd file: the last frame is incomplete")
                return 0
            while chunk:
                self._pending += self._obj.decompress(chunk)
                self._in_frame = not self._obj.eof
                chunk = b""
                if self._obj.eof:  # a frame ended: the bytes after it start the next one
                    chunk = self._obj.unused_data
                    self._obj = zstandard.ZstdDecompressor().decompressobj()
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        del self._pending[:size]
        return size

    def close(self) -> None:
        self._raw.close()
        super().close()
