"""Readers that turn files into Document records, one Ray task per file.

A reader never raises on bad input: a malformed line, invalid UTF-8, a missing or
empty text field becomes one reject record with its file, line and reason; an
unreadable or corrupt file becomes one reject at the position where reading
stopped, after the good records before it. Blank lines carry no record and are
skipped.
"""
from __future__ import annotations

import codecs
import datetime
import glob
import gzip
import io
import json
import re
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import zstandard

from datapipe import registry
from datapipe.config import RecipeError
from datapipe.schema import Document, new_document, new_reject

# Errors a decompressor raises on a damaged stream (gzip: BadGzipFile is an OSError, a
# truncated member is an EOFError); anything else is a bug and surfaces.
CORRUPT_STREAM_ERRORS = (EOFError, OSError, zlib.error, zstandard.ZstdError)
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # only such escapes can make a lone surrogate
# meta keys the runner and run stats read back: a row's own column of that name is kept as
# source_<name> (a "language" dict or a "bytes_in" number crashed the stats; "derived_from"
# made an input record count as created)
PIPELINE_META = ("transforms", "bytes_in", "language", "derived_from", "pii", "error")
GENERATOR_CHUNK = 500  # generator indices per work item (one Ray task each)


def work_items(recipe: Any, source: Any) -> list[dict[str, Any]]:
    """Files for readers (globs and folders expanded), index ranges for generators."""
    if source.type in registry.GENERATORS:
        return [{"path": "", "start": s, "stop": min(s + GENERATOR_CHUNK, source.count)}
                for s in range(0, source.count, GENERATOR_CHUNK)]
    if not source.paths:
        raise RecipeError(f"sources.{source.name}.paths: a {source.type} source needs at least one path")
    files = [f for pattern in source.paths for f in expand_path(recipe.resolve(pattern))]
    # One missing file among others is a reject (read.missing_file); a source with none is a wrong path.
    if not any(Path(f).exists() for f in files):
        raise RecipeError(f"sources.{source.name}.paths: {source.paths} matched no files "
                          f"(relative paths start at {recipe.base_dir})")
    return [{"path": f, "start": 0, "stop": 0} for f in files]


def expand_path(path: Path) -> list[str]:
    if any(ch in str(path) for ch in "*?["):
        # a pattern that matches nothing is read as a missing file: a reject that names it, not a silent skip
        return sorted(glob.glob(str(path), recursive=True)) or [str(path)]
    if path.is_dir() and not (path / "dataset_info.json").exists() and not (path / "dataset_dict.json").exists():
        return sorted(str(p) for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    return [str(path)]  # a missing file becomes a reject at read time, not a silent skip


def read_work_item(source: Any, seed: int, item: dict[str, Any]) -> Iterator[Document]:
    reader = registry.load(registry.SOURCES[source.type])
    if source.type in registry.GENERATORS:
        return reader(source, seed, item["start"], item["stop"])
    return reader(source, item["path"])


def iter_recipe_documents(recipe: Any) -> Iterator[Document]:
    """Every document of a recipe's sources, read in this process (no Ray), limits applied."""
    for source in recipe.sources:
        documents = (doc for item in work_items(recipe, source) for doc in read_work_item(source, recipe.seed, item))
        for count, doc in enumerate(documents, start=1):
            yield doc
            if source.limit and count >= source.limit:
                break


def open_binary(path: Path) -> BinaryIO:
    """Open plain, gzip or zstd files by extension, streaming."""
    if path.suffix == ".gz":
        return gzip.open(path, "rb")
    if path.suffix in (".zst", ".zstd"):
        return io.BufferedReader(ZstdFrames(open(path, "rb")))
    return open(path, "rb")


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


def read_jsonl(cfg: Any, path: str) -> Iterator[Document]:
    lineno = 0
    try:
        with open_binary(Path(path)) as stream:
            for lineno, line in enumerate(stream, start=1):
                if lineno == 1 and line.startswith(codecs.BOM_UTF8):
                    line = line[len(codecs.BOM_UTF8):]  # a UTF-8 byte order mark is no part of the first record
                if line.strip():
                    yield parse_json_line(cfg, line, f"{path}:{lineno}")
    except FileNotFoundError as err:
        yield new_reject(cfg.name, path, "read.missing_file", str(err))
    except PermissionError as err:
        yield new_reject(cfg.name, path, "read.unreadable_file", str(err))
    except CORRUPT_STREAM_ERRORS as err:
        yield new_reject(cfg.name, f"{path}:{lineno + 1}", "read.corrupt_file", f"{type(err).__name__}: {err}")


def parse_json_line(cfg: Any, line: bytes, source_id: str) -> Document:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return new_reject(cfg.name, source_id, "read.invalid_utf8", line.decode("utf-8", "replace"))
    try:
        row = json.loads(text)
    except (ValueError, RecursionError) as err:  # JSONDecodeError, an int over 4300 digits, deep nesting
        return new_reject(cfg.name, source_id, "read.bad_json", f"{err}: {text}")
    if not isinstance(row, dict):
        return new_reject(cfg.name, source_id, "read.not_an_object", text)
    try:  # a "\ud800" escape is valid JSON but no valid UTF-8: Arrow would fail on it later
        if SURROGATE_ESCAPE.search(text):
            json.dumps(row, default=str, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as err:
        return new_reject(cfg.name, source_id, "read.invalid_utf8",
                          f"lone surrogate escape in a string (not encodable as UTF-8): {err}: {text}")
    return document_from_row(cfg, row, source_id)


def document_from_row(cfg: Any, row: dict[str, Any], source_id: str) -> Document:
    """One row of any tabular source: checks the text field, keeps the other fields as meta."""
    text = row.get(cfg.text_field)
    raw = json.dumps(row, default=str, ensure_ascii=False)
    if text is None:
        return new_reject(cfg.name, source_id, "read.missing_text", raw)
    if not isinstance(text, str):
        return new_reject(cfg.name, source_id, "read.text_not_a_string", raw)
    if not text.strip():
        return new_reject(cfg.name, source_id, "read.empty_text", raw)
    if cfg.id_field and row.get(cfg.id_field) not in (None, ""):
        source_id = str(row[cfg.id_field])
    fields = {(f"source_{k}" if k in PIPELINE_META else k): jsonable(v) for k, v in row.items() if k != cfg.text_field}
    doc = new_document(cfg.name, source_id, text, kind=cfg.kind)
    doc["meta"].update(fields)  # not as keywords: a row may have a "source" or "kind" column of its own
    return doc


def jsonable(value: Any) -> Any:
    """Parquet and Arrow values (timestamps, bytes, decimals) as JSON-safe values."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, datetime.date | datetime.datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def read_parquet(cfg: Any, path: str) -> Iterator[Document]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    row_index = 0
    try:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            for row in batch.to_pylist():
                yield document_from_row(cfg, row, f"{path}:{row_index}")
                row_index += 1
    except FileNotFoundError as err:
        yield new_reject(cfg.name, path, "read.missing_file", str(err))
    except (OSError, pa.ArrowException) as err:
        yield new_reject(cfg.name, f"{path}:{row_index}", "read.corrupt_file", f"{type(err).__name__}: {err}")


def read_hf_disk(cfg: Any, path: str) -> Iterator[Document]:
    """A Hugging Face `datasets` Dataset or DatasetDict written with save_to_disk."""
    import datasets

    if not Path(path).exists():  # a typo, or a pattern that matched nothing: as the file readers say it
        yield new_reject(cfg.name, path, "read.missing_file", f"no such folder: {path}")
        return
    try:
        loaded = datasets.load_from_disk(path)
    except (FileNotFoundError, ValueError, OSError) as err:
        yield new_reject(cfg.name, path, "read.unreadable_dataset", f"{type(err).__name__}: {err}")
        return
    splits = loaded.items() if isinstance(loaded, datasets.DatasetDict) else [("", loaded)]
    for split, dataset in splits:
        prefix = f"{path}:{split}:" if split else f"{path}:"
        for index, row in enumerate(dataset):
            yield document_from_row(cfg, row, f"{prefix}{index}")
