"""PII redaction: e-mail addresses, IP addresses and phone numbers become typed placeholders.

Regular expressions, as in Dolma and NeMo Curator's fast path: an e-mail is
local@domain.tld; an IPv4 address has four 0-255 parts (version strings such as
"1.2.3" have three); an IPv6 address has at least three ":"-separated hex groups
around a "::" or eight groups; a phone number is 9 to 15 digits with the usual
separators, an optional "+country" and "(area)", and is not a date or a number
range. The counts go to Document.pii (only kinds found); nothing is rejected.
"""
from __future__ import annotations

import re
from collections.abc import Callable

from datapipe.schema import Document
from datapipe.stage import StageConfig

EMAIL = re.compile(r"(?<![\w.+-])[\w.+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b")
OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
IPV4 = re.compile(rf"(?<![\w.]){OCTET}(?:\.{OCTET}){{3}}(?![\w.]*\d)")
IPV6 = re.compile(r"(?<![\w:])(?:(?:[0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}"
                  r"|(?:[0-9a-fA-F]{1,4}:){1,6}:(?:[0-9a-fA-F]{1,4}:){0,5}[0-9a-fA-F]{1,4})(?![\w:])")
PHONE = re.compile(r"(?<![\w+])(?:\+\d{1,3}[\s.-]?)?(?:\(\d{1,4}\)[\s.-]?)?\d{2,4}(?:[\s.-]\d{2,4}){1,4}(?![\w-])")
DATE_LIKE = re.compile(r"^\d{4}[-./]\d{1,2}[-./]\d{1,2}$|^\d{1,2}[-./]\d{1,2}[-./]\d{2,4}$")


class Config(StageConfig):
    emails: bool = True
    ip_addresses: bool = True
    phone_numbers: bool = True
    email_placeholder: str = "<EMAIL_ADDRESS>"  # typed, so a model learns where an address goes
    ip_placeholder: str = "<IP_ADDRESS>"
    phone_placeholder: str = "<PHONE_NUMBER>"


def make_stage(cfg: Config) -> Callable[[list[Document]], list[Document]]:
    def redact_docs(docs: list[Document]) -> list[Document]:
        for doc in docs:
            doc["text"], counts = redact(doc["text"], cfg)
            if counts:
                doc["pii"] = counts
        return docs

    return redact_docs


def redact(text: str, cfg: Config) -> tuple[str, dict[str, int]]:
    counts: dict[str, int] = {}
    if cfg.emails and "@" in text:
        text, counts["email"] = EMAIL.subn(cfg.email_placeholder, text)
    if cfg.ip_addresses:
        text, counts["ip_address"] = IPV4.subn(cfg.ip_placeholder, text)
        if "::" in text or text.count(":") >= 7:
            text, ipv6 = IPV6.subn(cfg.ip_placeholder, text)
            counts["ip_address"] += ipv6
    if cfg.phone_numbers:
        text, counts["phone_number"] = redact_phones(text, cfg.phone_placeholder)
    return text, {kind: n for kind, n in counts.items() if n}


def redact_phones(text: str, placeholder: str) -> tuple[str, int]:
    found = 0

    def replace(match: re.Match) -> str:
        nonlocal found
        digits = sum(ch.isdigit() for ch in match.group())
        if not 9 <= digits <= 15 or DATE_LIKE.match(match.group()):
            return match.group()
        found += 1
        return placeholder

    return PHONE.sub(replace, text), found
