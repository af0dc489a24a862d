"""Bytes of a web page to text: the declared charset when it decodes, else UTF-8, else detected.

Order, as browsers do it: a byte-order mark; the HTTP Content-Type charset; a <meta
charset> or http-equiv in the first 4 KB. Labels map the WHATWG way (iso-8859-1 and
ascii decode as windows-1252, gb2312/gbk as gb18030, shift_jis as cp932, a bogus
"utf" as utf-8). Bytes that are valid UTF-8 and not plain ASCII are read as UTF-8
whatever the declaration says (pages that declare iso-8859-1 or shift_jis but hold
UTF-8 are common; legacy text that is valid UTF-8 by chance is rare); otherwise a
declared charset is used if it decodes strictly. With nothing declared (about 10%
of the pages in shared/data/web_text) strict UTF-8 is tried, then the detector of
resiliparse (uchardet-like, ~50 us a page). The last resort decodes with
replacement characters, so no page is lost for its bytes. Returns (text, "how"),
for example ("...", "declared:shift_jis") or ("...", "detected:gb18030").
"""
from __future__ import annotations

import codecs
import re

META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([a-zA-Z0-9_:.+-]+)""", re.IGNORECASE)
HEADER_CHARSET = re.compile(r"""charset\s*=\s*["']?([a-zA-Z0-9_:.+-]+)""", re.IGNORECASE)
BOMS = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))
# WHATWG Encoding Standard: labels whose bytes browsers decode with a superset codec.
SUPERSETS = {
    "iso-8859-1": "cp1252", "latin-1": "cp1252", "latin1": "cp1252", "ascii": "cp1252", "us-ascii": "cp1252",
    "iso8859-1": "cp1252", "gb2312": "gb18030", "gbk": "gb18030", "x-gbk": "gb18030", "shift_jis": "cp932",
    "shift-jis": "cp932", "sjis": "cp932", "x-sjis": "cp932", "ms_kanji": "cp932", "euc-kr": "cp949",
    "ks_c_5601-1987": "cp949", "utf": "utf-8", "utf8": "utf-8", "unicode": "utf-8", "big5": "big5hkscs",
    "tis-620": "cp874", "iso-8859-9": "cp1254", "iso-8859-11": "cp874",
}


def decode_html(data: bytes, content_type: str = "") -> tuple[str, str]:
    """(text, how it was decoded) for a page's bytes and its HTTP Content-Type (may be "")."""
    for bom, name in BOMS:
        if data.startswith(bom):
            return data[len(bom) :].decode(name, "replace"), f"bom:{name}"
    declared = declared_charset(data, content_type)
    text = try_decode(data, "utf-8")
    if text is not None and (not declared or codec_name(declared) == "utf-8" or not data.isascii()):
        # Non-ASCII bytes that form valid UTF-8 by chance are rare; wrong declarations are not.
        return text, f"declared:{declared}" if codec_name(declared) == "utf-8" else (
            f"utf-8 (declared {declared})" if declared else "utf-8")
    if declared:
        text = try_decode(data, codec_name(declared))
        if text is not None:
            return text, f"declared:{declared}"
    detected = detect_charset(data)
    text = try_decode(data, detected)
    if text is not None:
        return text, f"detected:{detected}"
    fallback = codec_name(declared) or detected or "utf-8"
    try:
        return data.decode(fallback, "replace"), f"replaced:{fallback}"
    except (UnicodeError, LookupError):  # idna, punycode...: text codecs that refuse "replace"
        return data.decode("utf-8", "replace"), "replaced:utf-8"


def declared_charset(data: bytes, content_type: str) -> str:
    """The charset the HTTP header or the page itself declares, lower-cased ("" for none)."""
    found = HEADER_CHARSET.search(content_type or "")
    if found and codec_name(found.group(1).lower()):
        return found.group(1).lower()
    found = META_CHARSET.search(data[:4096])
    if found:
        label = found.group(1).decode("ascii", "replace").lower()
        return label if codec_name(label) else ""
    return ""


def codec_name(label: str) -> str:
    """The Python codec for a charset label ("" when Python knows no such codec)."""
    if not label:
        return ""
    label = SUPERSETS.get(label, label)
    try:
        return codecs.lookup(label).name
    except LookupError:
        return ""


def try_decode(data: bytes, codec: str) -> str | None:
    if not codec:
        return None
    try:
        return data.decode(codec)
    except (UnicodeError, LookupError):
        return None


def detect_charset(data: bytes) -> str:
    from resiliparse.parse.encoding import detect_encoding

    return codec_name((detect_encoding(data) or "").lower()) or "cp1252"
