"""The `files` source: each file is one document (an SVG, a webpage, a script...).

A path is either a file (a folder or glob in the recipe expands to its files, one Ray task
each) or a JSONL manifest (`.jsonl`, `.jsonl.gz`, `.jsonl.zst`) whose rows name files
relative to the manifest's folder in the `file_field` column; one task reads the whole
manifest, which suits folders of thousands of small files, and the row's other columns land
in meta["manifest"]. The kind comes from the extension (`.svg` svg, `.html` html, ...), else the source's
`kind`. meta records the file (`path`, `bytes`, `encoding`); Document.asset_dir names the folder
its local assets live in (the file's own folder), which renderers serve and nothing outside it.
A manifest's columns never reach asset_dir: they stay in meta["manifest"].

Text is decoded as UTF-8 (a BOM honoured); failing that, by the charset the file declares
(XML `encoding=`, HTML `<meta charset>`), then cp1252, which maps every byte. A missing or
unreadable file, one with NUL bytes (binary) or over MAX_FILE_BYTES is a reject with its path.
"""
from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datapipe.schema import Document, new_document, new_reject

MAX_FILE_BYTES = 16 << 20  # larger "source files" are data, not code a renderer should see
EXTENSION_KINDS = {
    ".svg": "svg", ".html": "html", ".htm": "html", ".xhtml": "html",
    ".py": "code", ".js": "code", ".css": "code", ".scad": "cad",
}
DECLARED_CHARSET = re.compile(rb"""(?:encoding|charset)\s*=\s*["']?([A-Za-z0-9_.:-]+)""", re.IGNORECASE)
MANIFEST_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")


@dataclass(frozen=True)
class ManifestRows:
    """What read_jsonl needs to read a manifest: the column naming each file stands where text would."""

    name: str  # the source's name
    text_field: str  # the source's file_field
    kind: str
    id_field: None = None  # a row's file path is its id


def read_files(cfg: Any, path: str) -> Iterator[Document]:
    if path.endswith(MANIFEST_SUFFIXES):
        yield from read_manifest(cfg, path)
    else:
        yield read_file(cfg, Path(path), str(path), {})


def read_manifest(cfg: Any, path: str) -> Iterator[Document]:
    from datapipe.readers.tabular import read_jsonl  # rows come back as documents: malformed lines are rejects already

    manifest_dir = Path(path).resolve().parent
    rows = read_jsonl(ManifestRows(cfg.name, cfg.file_field, cfg.kind), path)
    for row in rows:
        if row["reject"]:
            yield row
            continue
        yield read_file(cfg, manifest_dir / row["text"], row["text"], {"manifest": row["meta"]} if row["meta"] else {})


def read_file(cfg: Any, path: Path, source_id: str, extra: dict[str, Any]) -> Document:
    try:
        data = path.read_bytes() if path.stat().st_size <= MAX_FILE_BYTES else None
    except FileNotFoundError as err:
        return new_reject(cfg.name, source_id, "read.missing_file", str(err))
    except OSError as err:
        return new_reject(cfg.name, source_id, "read.unreadable_file", f"{type(err).__name__}: {err}")
    if data is None:
        return new_reject(cfg.name, source_id, "read.too_large", f"{path}: over {MAX_FILE_BYTES} bytes")
    if b"\x00" in data[:8192]:
        return new_reject(cfg.name, source_id, "read.binary_file", str(path))
    text, encoding = decode(data)
    kind = EXTENSION_KINDS.get(path.suffix.lower(), cfg.kind)
    resolved = path.resolve()
    meta = {"path": str(resolved), "bytes": len(data), "encoding": encoding, **extra}
    return new_document(cfg.name, source_id, text, kind=kind, meta=meta, asset_dir=str(resolved.parent))


def decode(data: bytes) -> tuple[str, str]:
    """(text, encoding used): UTF-8, the declared charset, then cp1252."""
    if data.startswith(codecs.BOM_UTF8):
        return data[3:].decode("utf-8", "replace"), "utf-8-sig"
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        pass
    declared = DECLARED_CHARSET.search(data[:4096])
    if declared:
        try:
            name = codecs.lookup(declared.group(1).decode("ascii")).name
            return data.decode(name), name
        except (LookupError, UnicodeDecodeError):
            pass
    return data.decode("cp1252", "replace"), "cp1252"

