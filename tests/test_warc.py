"""WARC/ARC/WET and saved-page readers on archives made here, broken ones included."""
import gzip
import json
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from datapipe.readers.warc import read_html, read_warc
from datapipe.text.charset import decode_html

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "web_text" / "warc"
SOURCE = SimpleNamespace(name="web")
PAGE = "<html><head><title>t</title></head><body><p>{}</p></body></html>"


def http_response(body: bytes, content_type: str = "text/html; charset=utf-8", status: int = 200) -> bytes:
    head = f"HTTP/1.1 {status} OK\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def warc_record(block: bytes, url: str, kind: str = "response") -> bytes:
    content_type = "application/http; msgtype=response" if kind == "response" else "text/plain"
    head = (f"WARC/1.0\r\nWARC-Type: {kind}\r\nWARC-Target-URI: {url}\r\nWARC-Date: 2024-05-01T00:00:00Z\r\n"
            f"WARC-Record-ID: <urn:uuid:{record_uuid(url)}>\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(block)}\r\n\r\n")
    return head.encode() + block + b"\r\n\r\n"


def record_uuid(url: str) -> uuid.UUID:
    """The same id for the same url in every run (hash() of a str changes per process)."""
    return uuid.uuid5(uuid.NAMESPACE_URL, url)


def pages(n: int) -> list[bytes]:
    return [warc_record(http_response(PAGE.format(f"page {i}").encode()), f"http://example.com/{i}") for i in range(n)]


def read(path: Path) -> list[dict]:
    return list(read_warc(SOURCE, str(path)))


def test_plain_and_gzip_archives_give_every_page(tmp_path):
    records = pages(3) + [warc_record(b"GET / HTTP/1.1\r\n\r\n", "http://example.com/", kind="request")]
    (tmp_path / "a.warc").write_bytes(b"".join(records))
    (tmp_path / "a.warc.gz").write_bytes(b"".join(gzip.compress(r) for r in records))
    for name in ("a.warc", "a.warc.gz"):
        docs = read(tmp_path / name)
        assert [d["reject"] for d in docs] == ["", "", ""]
        assert [d["meta"]["url"] for d in docs] == [f"http://example.com/{i}" for i in range(3)]
        assert [d["meta"]["record_id"] for d in docs] == [f"<urn:uuid:{record_uuid(d['meta']['url'])}>" for d in docs]
        assert all(d["kind"] == "html" and "page" in d["text"] and d["meta"]["date"] for d in docs)


def test_bad_gzip_member_costs_one_reject_and_reading_resumes(tmp_path):
    members = [gzip.compress(r) for r in pages(4)]
    broken = bytearray(members[1])
    broken[20:40] = b"\x00" * 20  # damage the deflate stream of the second record
    (tmp_path / "b.warc.gz").write_bytes(members[0] + bytes(broken) + members[2] + members[3])
    docs = read(tmp_path / "b.warc.gz")
    assert [d["reject"] for d in docs] == ["", "read.warc_bad_gzip", "", ""]
    assert [d["meta"].get("url") for d in docs if not d["reject"]] == [f"http://example.com/{i}" for i in (0, 2, 3)]


def test_truncated_archive_keeps_good_records_and_rejects_the_cut_one(tmp_path):
    data = b"".join(pages(3))
    (tmp_path / "t.warc").write_bytes(data[: len(data) - 60])
    (tmp_path / "t.warc.gz").write_bytes(gzip.compress(data)[:-30])  # one member, cut short
    docs = read(tmp_path / "t.warc")
    assert [d["reject"] for d in docs] == ["", "", "read.warc_truncated_record"]
    assert [d["reject"] for d in read(tmp_path / "t.warc.gz")][-1] == "read.warc_truncated_gzip"


def test_malformed_header_is_one_reject_then_parsing_resyncs(tmp_path):
    good = pages(2)
    bad = b"WARC/1.0\r\nWARC-Type: response\r\nContent-Length: twelve\r\n\r\n<html>junk</html>\r\n\r\n"
    (tmp_path / "m.warc").write_bytes(good[0] + bad + b"garbage line\n" + good[1])
    docs = read(tmp_path / "m.warc")
    assert [d["reject"] for d in docs] == ["", "read.warc_malformed_header", ""]


def test_non_html_and_error_status_are_rejected_with_their_reason(tmp_path):
    records = [warc_record(http_response(b"\x89PNG...", "image/png"), "http://e.com/x.png"),
               warc_record(http_response(b"<html>gone</html>", status=404), "http://e.com/gone")]
    (tmp_path / "n.warc").write_bytes(b"".join(records))
    docs = read(tmp_path / "n.warc")
    assert [d["reject"] for d in docs] == ["read.warc_not_html", "read.warc_http_status"]
    assert docs[0]["meta"]["content_type"] == "image/png" and docs[1]["meta"]["http_status"] == 404


def test_chunked_body_is_joined_and_bad_chunking_rejected(tmp_path):
    body = b"<html><body>chunked page</body></html>"
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked\r\n\r\n"
    bad = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n<html>"
    (tmp_path / "c.warc").write_bytes(warc_record(head + chunked, "http://e.com/1") + warc_record(bad, "http://e.com/2"))
    docs = read(tmp_path / "c.warc")
    assert docs[0]["text"] == body.decode() and docs[1]["reject"] == "read.warc_bad_http"


def test_chunk_sizes_other_than_hex_digits_are_rejected(tmp_path):
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked\r\n\r\n"
    sizes = [b"-0", b"+5", b"0x5", b"-5"]  # int(x, 16) takes them all; "-5" used to loop forever, so it comes last
    records = [warc_record(head + size + b"\r\n<html>page</html>\r\n0\r\n\r\n", f"http://e.com/{i}")
               for i, size in enumerate(sizes)]
    (tmp_path / "n.warc").write_bytes(b"".join(records[:3]))
    assert [d["reject"] for d in read(tmp_path / "n.warc")] == ["read.warc_bad_http"] * 3
    (tmp_path / "n.warc").write_bytes(records[3] + pages(1)[0])
    assert [d["reject"] for d in read(tmp_path / "n.warc")] == ["read.warc_bad_http", ""]


def test_non_ascii_digit_content_length_is_a_malformed_header(tmp_path):
    good = pages(2)
    bad = "WARC/1.0\r\nWARC-Type: response\r\nContent-Length: ²\r\n\r\n<html>x</html>\r\n\r\n".encode()
    (tmp_path / "u.warc").write_bytes(good[0] + bad + good[1])
    assert [d["reject"] for d in read(tmp_path / "u.warc")] == ["", "read.warc_malformed_header", ""]


def test_wet_and_arc_records(tmp_path):
    (tmp_path / "x.wet").write_bytes(warc_record(b"Plain extracted text.", "http://e.com/", kind="conversion"))
    wet = read(tmp_path / "x.wet")
    assert wet[0]["kind"] == "text" and wet[0]["text"] == "Plain extracted text."
    response = http_response(PAGE.format("arc page").encode())
    filedesc = b"1 0 Test\nURL IP-address Archive-date Content-type Archive-length\n"
    arc = (b"filedesc://x.arc 0.0.0.0 20140216050221 text/plain %d\n%s\n" % (len(filedesc), filedesc)
           + b"http://e.com/a b 1.2.3.4 20140216050221 text/html %d\n%s\n" % (len(response), response))
    (tmp_path / "x.arc").write_bytes(arc)
    docs = read(tmp_path / "x.arc")
    assert len(docs) == 1 and "arc page" in docs[0]["text"] and docs[0]["meta"]["url"] == "http://e.com/a b"


def test_missing_file_is_one_reject(tmp_path):
    assert [d["reject"] for d in read(tmp_path / "nope.warc.gz")] == ["read.missing_file"]


def test_folder_given_as_archive_is_one_reject(tmp_path):
    (tmp_path / "dir.warc").mkdir()  # what a glob like data/*.warc matches when a folder has that name
    assert [d["reject"] for d in read(tmp_path / "dir.warc")] == ["read.unreadable_file"]


@pytest.mark.parametrize("charset,text", [
    ("shift_jis", "日本語のページです。"), ("gb2312", "这是一个中文网页。"), ("iso-8859-1", "Ça coûte très cher."),
    ("utf-8", "Grüße aus Köln"),
])
def test_declared_charsets_decode(charset, text):
    html = f'<html><head><meta charset="{charset}"></head><body>{text}</body></html>'.encode(charset)
    decoded, how = decode_html(html)
    assert text in decoded and how == f"declared:{charset}"
    decoded, how = decode_html(html.replace(f'<meta charset="{charset}">'.encode(), b""), f"text/html; charset={charset}")
    assert text in decoded and how == f"declared:{charset}"  # the HTTP header's charset


@pytest.mark.parametrize("charset,text", [
    ("shift_jis", "これは日本語で書かれたウェブページの本文です。文字コードの宣言はありません。" * 3),
    ("gb18030", "这是一个没有声明字符编码的中文网页，我们需要自动检测它的编码。" * 3),
    ("cp1252", "Les élèves étudient à l'école française depuis très longtemps, déjà."),
])
def test_undeclared_charsets_are_detected(charset, text):
    decoded, how = decode_html(f"<html><body><p>{text}</p></body></html>".encode(charset))
    assert text in decoded, how


def test_wrong_declaration_falls_back_to_utf8():
    decoded, how = decode_html('<meta charset="iso-8859-1"><p>日本</p>'.encode().replace(b"iso-8859-1", b"shift_jis"))
    assert "日本" in decoded and how == "utf-8 (declared shift_jis)"


@pytest.mark.parametrize("charset", ["idna", "punycode"])
def test_declared_codec_that_refuses_replace_falls_back_to_utf8(charset):
    html = f'<html><head><meta charset="{charset}"></head><body>'.encode() + b"\x81\x8d\x90\x9d\xff text</body></html>"
    decoded, how = decode_html(html)
    assert "text" in decoded and how == "replaced:utf-8"


def test_read_html_reads_gzip_pages(tmp_path):
    (tmp_path / "p.html.gz").write_bytes(gzip.compress('<meta charset="shift_jis"><p>日本語</p>'.encode("shift_jis")))
    doc = next(read_html(SOURCE, str(tmp_path / "p.html.gz")))
    assert "日本語" in doc["text"] and doc["meta"]["charset"] == "declared:shift_jis"


@pytest.mark.skipif(not SHARED.is_dir(), reason="needs ../shared/data/web_text/warc (the shared data folder)")
def test_real_archives_never_crash_and_account_for_bad_records():
    results = {path.name: read(path) for path in sorted(SHARED.iterdir())}
    assert sum(not d["reject"] for docs in results.values() for d in docs) >= 100
    assert any(d["reject"] == "read.warc_truncated_gzip" for d in results["chatnoir-resiliparse__clipped.warc.gz"])
    assert [d["reject"] for d in results["warcio__example.arc"]] == [""]
    assert len([d for d in results["chatnoir-resiliparse__warcfile.warc.lz4"] if not d["reject"]]) >= 10
    json.dumps([d["meta"] for docs in results.values() for d in docs])  # meta stays JSON-safe


PAGES = SHARED.parent / "html_pages"


@pytest.mark.skipif(not PAGES.is_dir(), reason="needs ../shared/data/web_text/html_pages (the shared data folder)")
def test_real_pages_in_many_charsets_decode_without_replacement_characters():
    docs = [next(read_html(SOURCE, str(path))) for path in sorted(PAGES.rglob("*.html.gz"))]
    assert len(docs) >= 500 and not any(d["reject"] for d in docs)
    how = {d["meta"]["charset"].split(":")[0] for d in docs}
    assert {"declared", "utf-8"} <= how
    legacy = [d for d in docs if d["meta"]["charset"].startswith("declared:") and "utf" not in d["meta"]["charset"]]
    assert len(legacy) >= 5 and all("\ufffd" not in d["text"] for d in legacy)
