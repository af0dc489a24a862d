"""Web archives (WARC, ARC, WET; plain or gzip) and saved pages (.html, .html.gz) as documents.

A small streaming parser of our own rather than warcio or fastwarc: both stop at the
first damaged record (warcio raises ArchiveLoadFailed, fastwarc "Invalid WARC header")
and neither reads ARC and WARC alike. Here a gzip file is read member by member; a
member that fails to inflate becomes one reject and reading resumes at the next gzip
magic. Records are cut by their Content-Length (ARC: the last header field); a header
that does not parse becomes one reject and the parser resynchronizes on the next line
that starts a record; a record cut short by the end of the file is one reject too. So
a broken archive yields its good records plus one reject per bad record or member.

HTML responses (and resource records) become `kind="html"` documents whose text is
the page decoded by `datapipe.text.charset` (declared charset, BOM, <meta>, else
detected); WET conversion records become `kind="text"`. URL, date, record id, HTTP
status and charset go to meta. Other record types (warcinfo, request, metadata,
revisit) are not documents and are skipped; non-HTML and non-2xx responses are
rejected with their content type or status, so they stay counted. A path may be a URL
(s3://, gs://, https://), streamed through fsspec (datapipe.storage.open_input).
"""
from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from datapipe.schema import Document, new_document, new_reject
from datapipe.storage import RemoteError, open_input
from datapipe.text.charset import decode_html

CHUNK = 1 << 20  # bytes read from disk at a time
MAX_RECORD_BYTES = 64 << 20  # Common Crawl truncates payloads at 1 MiB; 64 MiB is surely broken
GZIP_MAGIC = b"\x1f\x8b\x08"
LZ4_MAGIC = b"\x04\x22\x4d\x18"
# A line that starts a record: a WARC version line, or an ARC v1 header "URL IP DATE TYPE LENGTH"
# (URLs may hold spaces, so the four last fields are the anchor).
RECORD_START = re.compile(rb"(?:^|\n)(WARC/\d|filedesc://|[a-z][a-z0-9+.-]*:[^\n]*? \S+ \d{12,18} \S+ -?\d+\r?\n)")
LEADING_SPACE = re.compile(rb"[\r\n\x00 \t]*")  # between records; matched in place, not copied
HEX_SIZE = re.compile(rb"[0-9A-Fa-f]+")  # a chunk size line of chunked transfer encoding
HTML_TYPES = ("text/html", "application/xhtml+xml", "application/xml", "text/xml")
DOCUMENT_TYPES = {"response", "resource", "conversion", "arc"}


@dataclass
class Record:
    """One archive record: its headers (lower-cased names), its block and where it came from."""

    kind: str  # WARC-Type ("response", "conversion"...) or "arc"
    headers: dict[str, str]
    block: bytes
    position: int  # record index within the file
    error: str = ""  # "" for a good record, else the reject reason
    detail: str = ""  # what went wrong, for the rejects file


def read_warc(cfg: Any, path: str) -> Iterator[Document]:
    """The FILE_READERS entry: every document record of one archive, bad ones as rejects."""
    try:
        for record in iter_records(path):
            doc = record_to_document(cfg, path, record)
            if doc is not None:
                yield doc
    except FileNotFoundError as err:
        yield new_reject(cfg.name, path, "read.missing_file", str(err))
    except OSError as err:  # PermissionError, IsADirectoryError (a glob that matched a folder)...
        yield new_reject(cfg.name, path, "read.unreadable_file", f"{type(err).__name__}: {err}")


def iter_records(path: str) -> Iterator[Record]:
    parser = RecordParser()
    for chunk in iter_chunks(path):
        if isinstance(chunk, str):
            yield from parser.fail(chunk)
        else:
            yield from parser.feed(chunk)
    yield from parser.finish()


def iter_chunks(path: str) -> Iterator[bytes | str]:
    """Decompressed bytes; a str item reports a damaged gzip member (then bytes resume)."""
    with open_input(path) as raw:
        head = raw.read(4)
        raw.seek(0)
        if head[:2] == GZIP_MAGIC[:2]:
            yield from iter_gzip_members(raw)
        elif head == LZ4_MAGIC:
            yield from iter_lz4(raw)
        else:
            while block := raw.read(CHUNK):
                yield block


def iter_gzip_members(raw) -> Iterator[bytes | str]:
    """Inflate member after member; on damage report it and skip to the next gzip magic."""
    pending, inflater, fed = raw.read(CHUNK), zlib.decompressobj(31), False
    while pending:
        try:
            out = inflater.decompress(pending)
        except zlib.error as err:
            yield f"read.warc_bad_gzip: {err}"
            pending, inflater, fed = skip_to_magic(raw, pending[1:]), zlib.decompressobj(31), False
            continue
        fed = True
        yield out
        if inflater.eof:  # member done: what is left starts the next one
            pending, inflater, fed = inflater.unused_data or raw.read(CHUNK), zlib.decompressobj(31), False
        else:
            pending = raw.read(CHUNK)
    if fed and not inflater.eof:
        yield "read.warc_truncated_gzip: the last gzip member ends early"


def iter_lz4(raw) -> Iterator[bytes | str]:
    """LZ4 frames (resiliparse writes .warc.lz4); a damaged frame ends the file with one reject."""
    import lz4.frame

    inflater = lz4.frame.LZ4FrameDecompressor()
    try:
        while block := raw.read(CHUNK):
            while block:
                yield inflater.decompress(block)
                if not inflater.eof:
                    break
                block, inflater = inflater.unused_data, lz4.frame.LZ4FrameDecompressor()
    except RuntimeError as err:
        yield f"read.warc_bad_lz4: {err}"


def skip_to_magic(raw, data: bytes) -> bytes:
    """The input from the next gzip magic on (b"" at the end of the file)."""
    while True:
        found = data.find(GZIP_MAGIC)
        if found >= 0:
            return data[found:] + raw.read(CHUNK)
        more = raw.read(CHUNK)
        if not more:
            return b""
        data = data[-2:] + more


class RecordParser:
    """Cuts a byte stream into records; damage becomes Record(error=...) and parsing goes on."""

    def __init__(self):
        self.buffer = bytearray()
        self.position = 0

    def feed(self, data: bytes) -> Iterator[Record]:
        self.buffer += data
        yield from self.drain(final=False)

    def fail(self, message: str) -> Iterator[Record]:
        """A damaged gzip member: the partial record it held is lost, as one reject."""
        reason, _, detail = message.partition(": ")
        self.buffer.clear()
        yield self.bad(reason, detail)

    def finish(self) -> Iterator[Record]:
        yield from self.drain(final=True)

    def bad(self, reason: str, detail: str) -> Record:
        self.position += 1
        return Record("", {}, b"", self.position - 1, reason, detail[:500])

    def drain(self, final: bool) -> Iterator[Record]:
        while True:
            del self.buffer[: LEADING_SPACE.match(self.buffer).end()]
            if not self.buffer:
                return
            record = self.next_record(final)
            if record is None:
                return
            yield record

    def next_record(self, final: bool) -> Record | None:
        """One record cut from the buffer, or None when more input is needed."""
        if self.buffer.startswith(b"WARC/"):
            return self.warc_record(final)
        if RECORD_START.match(self.buffer):
            return self.arc_record(final)
        return self.junk(final)

    def warc_record(self, final: bool) -> Record | None:
        end = header_end(self.buffer)
        if end is None:
            return self.incomplete(final, "read.warc_truncated_record", "the file ends inside a WARC header")
        head_end, body_start = end
        headers = parse_header_lines(bytes(self.buffer[:head_end]).split(b"\n")[1:])
        length = parse_length(headers.get("content-length", ""))
        if length is None:
            return self.resync("read.warc_malformed_header", f"bad Content-Length {headers.get('content-length')!r}")
        if body_start + length > len(self.buffer):
            where = headers.get("warc-target-uri", "")
            return self.incomplete(final, "read.warc_truncated_record", f"the file ends inside the record {where}")
        block = bytes(self.buffer[body_start : body_start + length])
        del self.buffer[: body_start + length]
        self.position += 1
        return Record(headers.get("warc-type", "").lower(), headers, block, self.position - 1)

    def arc_record(self, final: bool) -> Record | None:
        line_end = self.buffer.find(b"\n")
        if line_end < 0:
            return self.incomplete(final, "read.warc_truncated_record", "the file ends inside an ARC header")
        fields = bytes(self.buffer[:line_end]).decode("latin-1").strip().rsplit(" ", 4)
        length = parse_length(fields[-1]) if len(fields) == 5 else None
        if length is None:
            return self.resync("read.warc_malformed_header", f"bad ARC header {' '.join(fields)[:200]!r}")
        if line_end + 1 + length > len(self.buffer):
            return self.incomplete(final, "read.warc_truncated_record", f"the file ends inside the record {fields[0]}")
        block = bytes(self.buffer[line_end + 1 : line_end + 1 + length])
        del self.buffer[: line_end + 1 + length]
        self.position += 1
        kind = "arcinfo" if fields[0].startswith("filedesc://") else "arc"
        headers = {"warc-target-uri": fields[0], "warc-date": fields[2], "content-type": fields[3]}
        return Record(kind, headers, block, self.position - 1)

    def junk(self, final: bool) -> Record | None:
        """Bytes that start no record: one reject for the whole run of them."""
        found = RECORD_START.search(self.buffer, 1)
        if found is None and not final and len(self.buffer) < MAX_RECORD_BYTES:
            return None
        cut = len(self.buffer) if found is None else found.start(1)
        detail = bytes(self.buffer[:200]).decode("utf-8", "replace")
        del self.buffer[:cut]
        return self.bad("read.warc_malformed_header", f"no record starts here: {detail!r}")

    def resync(self, reason: str, detail: str) -> Record:
        """A header that does not parse: reject it and skip to the next line that starts a record."""
        found = RECORD_START.search(self.buffer, 1)
        del self.buffer[: len(self.buffer) if found is None else found.start(1)]
        return self.bad(reason, detail)

    def incomplete(self, final: bool, reason: str, detail: str) -> Record | None:
        if not final and len(self.buffer) < MAX_RECORD_BYTES:
            return None
        if final:
            self.buffer.clear()
            return self.bad(reason, detail)
        return self.resync("read.warc_record_too_large", f"a record over {MAX_RECORD_BYTES >> 20} MiB: {detail}")


def header_end(buffer: bytearray) -> tuple[int, int] | None:
    """Where a header block ends and its body starts (CRLF or bare-LF files alike)."""
    ends = [(i, i + len(sep)) for sep in (b"\r\n\r\n", b"\n\n") if (i := buffer.find(sep)) >= 0]
    return min(ends) if ends else None


def parse_header_lines(lines: list[bytes]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.decode("utf-8", "replace").partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return headers


def parse_length(value: str) -> int | None:
    value = value.strip()
    return int(value) if value.isascii() and value.isdigit() else None  # "²".isdigit() is True


def record_to_document(cfg: Any, path: str, record: Record) -> Document | None:
    """A document, a reject, or None for records that are not documents (warcinfo, request...)."""
    source_id = f"{path}:{record.position}"
    if record.error:
        return new_reject(cfg.name, source_id, record.error, record.detail)
    if record.kind not in DOCUMENT_TYPES:
        return None
    meta = {"url": record.headers.get("warc-target-uri", ""), "date": record.headers.get("warc-date", ""),
            "record_id": record.headers.get("warc-record-id", "")}
    if record.kind == "conversion":  # WET: the text is already extracted
        text = record.block.decode("utf-8", "replace").strip()
        if not text:
            return new_reject(cfg.name, source_id, "read.empty_text", meta["url"])
        return new_document(cfg.name, source_id, text, kind="text", meta=meta)
    return page_document(cfg, source_id, record, meta)


def page_document(cfg: Any, source_id: str, record: Record, meta: dict[str, Any]) -> Document:
    block, content_type, status = record.block, record.headers.get("content-type", ""), 200
    if record.kind == "arc" or "application/http" in content_type:
        try:
            status, content_type, block = parse_http(block)
        except ValueError as err:
            return new_reject(cfg.name, source_id, "read.warc_bad_http", f"{meta['url']}: {err}")
    meta.update(http_status=status, content_type=content_type.split(";")[0].strip().lower())
    if not 200 <= status < 300:
        return reject_with(cfg, source_id, "read.warc_http_status", meta)
    if not is_html(meta["content_type"], block):
        return reject_with(cfg, source_id, "read.warc_not_html", meta)
    text, meta["charset"] = decode_html(block, content_type)
    if not text.strip():
        return reject_with(cfg, source_id, "read.empty_text", meta)
    return new_document(cfg.name, source_id, text, kind="html", meta=meta)


def reject_with(cfg: Any, source_id: str, reason: str, meta: dict[str, Any]) -> Document:
    return new_reject(cfg.name, source_id, reason, meta.get("url", ""), meta=meta)


def is_html(content_type: str, body: bytes) -> bool:
    if content_type:
        return content_type.startswith(HTML_TYPES)
    return b"<html" in body[:4096].lower()  # no declared type: sniff like a browser


def parse_http(block: bytes) -> tuple[int, str, bytes]:
    """(status, Content-Type, decoded body) of an HTTP response; ValueError when it is not one."""
    end = header_end(bytearray(block[:65536]))
    if end is None or not block.startswith(b"HTTP/"):
        raise ValueError("no HTTP status line and headers")
    lines = block[: end[0]].split(b"\n")
    parts = lines[0].split()
    if len(parts) < 2 or not parts[1].isdigit():
        raise ValueError(f"bad status line {lines[0][:100]!r}")
    headers = parse_header_lines(lines[1:])
    body = block[end[1] :]
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = dechunk(body)
    return int(parts[1]), headers.get("content-type", ""), decode_content(body, headers.get("content-encoding", ""))


def dechunk(body: bytes) -> bytes:
    out, pos = bytearray(), 0
    while True:
        line_end = body.find(b"\n", pos)
        size_text = body[pos:line_end].split(b";")[0].strip() if line_end >= 0 else b""
        if not HEX_SIZE.fullmatch(size_text):  # int(x, 16) takes "-5", "+5", "0x5", "5_0": a -5 loops forever
            raise ValueError(f"bad chunked transfer encoding at byte {pos}: {body[pos:pos + 40]!r}")
        size = int(size_text, 16)
        if size == 0:
            return bytes(out)
        if line_end + 1 + size > len(body):
            raise ValueError("a chunk runs past the end of the record")
        out += body[line_end + 1 : line_end + 1 + size]
        pos = line_end + 1 + size
        pos += 2 if body[pos : pos + 2] == b"\r\n" else 1


def decode_content(body: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity", "none"):
        return body
    if encoding in ("gzip", "x-gzip") and body[:2] != GZIP_MAGIC[:2]:
        return body  # ClueWeb and some crawlers store the decoded body but keep the header
    try:
        if encoding in ("gzip", "x-gzip"):
            return gzip.decompress(body)
        if encoding == "deflate":
            return zlib.decompress(body) if body[:1] == b"\x78" else zlib.decompress(body, -15)
    except (OSError, EOFError, zlib.error) as err:
        raise ValueError(f"Content-Encoding {encoding}: {err}") from None
    if encoding == "br":
        return decode_brotli(body)
    raise ValueError(f"unsupported Content-Encoding {encoding!r}")


def decode_brotli(body: bytes) -> bytes:
    try:
        import brotli
    except ImportError:
        raise ValueError("Content-Encoding br needs the brotli package: pip install brotli") from None
    try:
        return brotli.decompress(body)
    except brotli.error as err:
        raise ValueError(f"Content-Encoding br: {err}") from None


def read_html(cfg: Any, path: str) -> Iterator[Document]:
    """The FILE_READERS entry for saved pages: one `kind="html"` document per file (.html, .html.gz)."""
    try:
        with open_input(path) as stream:
            data = stream.read()
        if data[:2] == GZIP_MAGIC[:2]:
            data = gzip.decompress(data)
    except FileNotFoundError as err:
        yield new_reject(cfg.name, path, "read.missing_file", str(err))
        return
    except (PermissionError, IsADirectoryError, RemoteError) as err:
        yield new_reject(cfg.name, path, "read.unreadable_file", f"{type(err).__name__}: {err}")
        return
    except (OSError, EOFError, zlib.error) as err:
        yield new_reject(cfg.name, path, "read.corrupt_file", f"{type(err).__name__}: {err}")
        return
    text, charset = decode_html(data, "")
    if not text.strip():
        yield new_reject(cfg.name, path, "read.empty_text")
        return
    yield new_document(cfg.name, path, text, kind="html", meta={"charset": charset})
