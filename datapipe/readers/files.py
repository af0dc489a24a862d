"""The `files` source: each file is one document (an SVG, a webpage, a script...).

A path is either a file (a folder or glob in the recipe expands to its files, one Ray task
each) or a JSONL manifest (`.jsonl`, `.jsonl.gz`, `.jsonl.zst`) whose rows name files
relative to the manifest's folder in the `file_field` column; one task reads the whole
manifest, which suits folders of thousands of small files, and the row's other columns land
in meta["manifest"]. The kind comes from the extension (`.svg` svg, `.html` html, ...), else the source's
`kind`. meta records the file (`path`, `bytes`, `encoding`); Document.asset_dir names the folder
its local assets live in (the file's own folder), which renderers serve and nothing outside it.
A manifest's columns never reach asset_dir: they stay in meta["manifest"].

A webpage whose assets sit beside its folder (`../css/site.css`, as admin templates keep
pages/ next to css/ and js/) renders unstyled from its own folder. With the source's
`asset_root` (a folder the recipe declares), an html page under it gets as asset_dir the
nearest folder that holds every `../` its markup climbs (one scan of the attributes, url() and
@import; never above asset_root), and meta["page_path"] its path inside that folder, where
the web renderer serves it so that `../` resolves as a browser resolves it from disk.

Files and manifests may be URLs (s3://, gs://, https://): the document's text is the file, its
meta path the URL, and its asset_dir "" (renderers read local folders only, so a remote page's
relative images are not served). A remote manifest's rows name files within its bucket: an
absolute name starts at the bucket's root and ".." stops there.

Text is decoded as UTF-8 (a BOM honoured); failing that, by the charset the file declares
(XML `encoding=`, HTML `<meta charset>`), then cp1252, which maps every byte. A missing or
unreadable file, one with NUL bytes (binary) or over MAX_FILE_BYTES is a reject with its path,
except a mesh (.stl .glb .ply ...: kind mesh), whose text is then "" (meta encoding "binary"):
the mesh renderer reads its file. A `.py`/`.js` file is kind code unless the source names a
kind (cad, scene3d).
"""
from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from datapipe.schema import Document, new_document, new_reject
from datapipe.storage import is_url, join_location, open_input, parent_of

MAX_FILE_BYTES = 16 << 20  # larger "source files" are data, not code a renderer should see
EXTENSION_KINDS = {
    ".svg": "svg", ".html": "html", ".htm": "html", ".xhtml": "html",
    ".py": "code", ".js": "code", ".css": "code", ".scad": "cad",
    **dict.fromkeys((".obj", ".ply", ".stl", ".off", ".gltf", ".glb", ".3mf"), "mesh"),
}
GENERIC_KINDS = {"code"}  # .py/.js may be a CAD script or a 3D scene program: the source's kind, when set, wins
DECLARED_CHARSET = re.compile(rb"""(?:encoding|charset)\s*=\s*["']?([A-Za-z0-9_.:-]+)""", re.IGNORECASE)
MANIFEST_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
# ../ at a reference's start; one \s* a side of the quote, so no run of spaces is split two ways (linear)
CLIMB = re.compile(r"""(?:=|url\(|@import)\s*(?:["']\s*)?((?:\.\./)+)""", re.IGNORECASE)


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
        yield read_file(cfg, path, path, {})


def read_manifest(cfg: Any, path: str) -> Iterator[Document]:
    from datapipe.readers.tabular import read_jsonl  # rows come back as documents: malformed lines are rejects already

    manifest_dir = parent_of(path)
    rows = read_jsonl(ManifestRows(cfg.name, cfg.file_field, cfg.kind), path)
    for row in rows:
        if row["reject"]:
            yield row
            continue
        extra = {"manifest": row["meta"]} if row["meta"] else {}
        yield read_file(cfg, join_location(manifest_dir, row["text"]), row["text"], extra)


def read_file(cfg: Any, path: str, source_id: str, extra: dict[str, Any]) -> Document:
    try:
        with open_input(path) as stream:
            data = stream.read(MAX_FILE_BYTES + 1)  # one byte more than allowed tells a file too large
    except FileNotFoundError as err:
        return new_reject(cfg.name, source_id, "read.missing_file", str(err))
    except OSError as err:
        return new_reject(cfg.name, source_id, "read.unreadable_file", f"{type(err).__name__}: {err}")
    if len(data) > MAX_FILE_BYTES:
        return new_reject(cfg.name, source_id, "read.too_large", f"{path}: over {MAX_FILE_BYTES} bytes")
    if is_url(path):  # no local folder a renderer could serve
        where, asset_dir, suffix = path, "", Path(urlsplit(path).path).suffix
    else:
        resolved = Path(path).resolve()
        where, asset_dir, suffix = str(resolved), str(resolved.parent), resolved.suffix
    kind = EXTENSION_KINDS.get(suffix.lower(), cfg.kind)
    kind = cfg.kind if kind in GENERIC_KINDS and cfg.kind != "text" else kind
    binary = b"\x00" in data[:8192]
    if binary and kind != "mesh":  # a binary mesh (STL, GLB, PLY) is rendered from its file, with no text
        return new_reject(cfg.name, source_id, "read.binary_file", str(path))
    text, encoding = ("", "binary") if binary else decode(data)
    meta = {"path": where, "bytes": len(data), "encoding": encoding, **extra}
    root = getattr(cfg, "asset_root", "")
    if kind == "html" and root and asset_dir:
        asset_dir = page_root(Path(where), text, Path(root))
        if asset_dir != str(Path(where).parent):
            meta["page_path"] = Path(where).relative_to(asset_dir).as_posix()
    return new_document(cfg.name, source_id, text, kind=kind, meta=meta, asset_dir=asset_dir)


def page_root(page: Path, html: str, bound: Path) -> str:
    """The nearest folder above `page` that holds every `../` its markup climbs, never above
    `bound` (resolved); the page's own folder when it climbs none or lies outside `bound`."""
    bound = bound.resolve()
    if not page.parent.is_relative_to(bound):
        return str(page.parent)
    climb = max((len(match.group(1)) // 3 for match in CLIMB.finditer(html)), default=0)
    levels_below_bound = len(page.parent.relative_to(bound).parts)
    return str(page.parents[min(climb, levels_below_bound)])


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

