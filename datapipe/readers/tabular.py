"""Tabular sources: JSONL (plain, gzip, zstd), Parquet and Hugging Face datasets saved to disk.

A reader never raises on bad input: a malformed line, invalid UTF-8, a missing or
empty text field becomes one reject record with its file, line and reason; an
unreadable or corrupt file becomes one reject at the position where reading
stopped, after the good records before it. Blank lines carry no record and are
skipped. A path may be a URL (s3://, gs://, https://): opened through fsspec, a file
that cannot be fetched (no credentials, no answer) is one read.unreadable_file reject.
"""
from __future__ import annotations

import codecs
import contextlib
import datetime
import json
import os
import re
from typing import Any, Iterator

from datapipe.readers.compressed import CORRUPT_STREAM_ERRORS, open_binary
from datapipe.schema import Document, new_document, new_reject
from datapipe.storage import RemoteError, input_exists, is_url, local_folder, open_input

SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # only such escapes can make a lone surrogate


def read_jsonl(cfg: Any, path: str) -> Iterator[Document]:
    lineno = 0
    try:
        with open_binary(path) as stream:
            for lineno, line in enumerate(stream, start=1):
                if lineno == 1 and line.startswith(codecs.BOM_UTF8):
                    line = line[len(codecs.BOM_UTF8):]  # a UTF-8 byte order mark is no part of the first record
                if line.strip():
                    yield parse_json_line(cfg, line, f"{path}:{lineno}")
    except FileNotFoundError as err:
        yield new_reject(cfg.name, path, "read.missing_file", str(err))
    except (PermissionError, IsADirectoryError, RemoteError) as err:
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
    """One row of any tabular source: checks the text field, keeps the other fields as meta, names
    unchanged (the pipeline's own fields live outside meta: datapipe.schema)."""
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
    columns = {k: jsonable(v) for k, v in row.items() if k != cfg.text_field}
    return new_document(cfg.name, source_id, text, kind=cfg.kind, meta=columns)


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
    if not is_url(path) and os.path.isdir(path):  # a glob that matched a folder: Arrow would call it corrupt
        yield new_reject(cfg.name, path, "read.unreadable_file", f"IsADirectoryError: {path} is a folder, not a file")
        return
    try:
        # A local file through Arrow's own reader; a URL through fsspec, seekable: Parquet reads its footer first
        with open_input(path) if is_url(path) else contextlib.nullcontext(path) as stream:
            for batch in pq.ParquetFile(stream).iter_batches(batch_size=1024):
                for row in batch.to_pylist():
                    yield document_from_row(cfg, row, f"{path}:{row_index}")
                    row_index += 1
    except FileNotFoundError as err:
        yield new_reject(cfg.name, path, "read.missing_file", str(err))
    except (PermissionError, RemoteError) as err:
        yield new_reject(cfg.name, f"{path}:{row_index}", "read.unreadable_file", str(err))
    except (OSError, pa.ArrowException) as err:
        yield new_reject(cfg.name, f"{path}:{row_index}", "read.corrupt_file", f"{type(err).__name__}: {err}")


def read_hf_disk(cfg: Any, path: str) -> Iterator[Document]:
    """A Hugging Face `datasets` Dataset or DatasetDict written with save_to_disk. On object storage
    the folder is copied to a temporary local one for the task (datasets memory-maps local Arrow
    files), deleted when the task has read it."""
    try:
        exists = input_exists(path)
    except OSError as err:
        yield new_reject(cfg.name, path, "read.unreadable_file", str(err))
        return
    if not exists:  # a typo, or a pattern that matched nothing: as the file readers say it
        yield new_reject(cfg.name, path, "read.missing_file", f"no such folder: {path}")
        return
    try:
        with local_folder(path) as folder:
            yield from read_saved_dataset(cfg, folder, path)
    except OSError as err:  # the copy failed (read_saved_dataset turns its own errors into rejects)
        yield new_reject(cfg.name, path, "read.unreadable_file", str(err))


def read_saved_dataset(cfg: Any, folder: str, path: str) -> Iterator[Document]:
    """The rows of a local save_to_disk folder; ids name `path`, where the folder came from."""
    import datasets

    try:
        loaded = datasets.load_from_disk(folder)
    except (FileNotFoundError, ValueError, OSError) as err:
        yield new_reject(cfg.name, path, "read.unreadable_dataset", f"{type(err).__name__}: {err}")
        return
    splits = loaded.items() if isinstance(loaded, datasets.DatasetDict) else [("", loaded)]
    for split, dataset in splits:
        prefix = f"{path}:{split}:" if split else f"{path}:"
        for index, row in enumerate(dataset):
            yield document_from_row(cfg, row, f"{prefix}{index}")
