"""Unicode and whitespace normalization.

NFC composes characters so that the same text always has the same code points (and
the same tokens); control characters other than newline and tab are removed; line
endings become "\\n"; trailing spaces go; runs of blank lines shrink to
`max_blank_lines`. Runs of spaces inside a line collapse only for prose kinds, since
indentation is meaning in code. With `fix_mojibake`, ftfy first repairs text that was
decoded with the wrong charset ("cafÃ©" -> "café"); only its encoding fix runs (no
quote or width changes), and only on text with a non-ASCII character, so ASCII pays
nothing. A document left empty is rejected.
"""
from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from typing import Literal

from pydantic import Field

from datapipe.schema import Document
from datapipe.stage import StageConfig

PROSE_KINDS = {"text"}
CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\u200b\ufeff]")
INNER_SPACES = re.compile(r"(?<=\S)[ \t\u00a0\u3000]{2,}")
TRAILING_SPACES = re.compile(r"[ \t\u00a0\u3000]+$", re.MULTILINE)


class Config(StageConfig):
    form: Literal["NFC", "NFKC", "none"] = "NFC"  # NFKC also folds compatibility forms (full-width digits)
    max_blank_lines: int = Field(2, ge=0)  # more consecutive blank lines are layout, not content
    fix_mojibake: bool = False  # ftfy.fix_encoding on prose; off by default to leave code byte-exact


def make_stage(cfg: Config) -> Callable[[list[Document]], list[Document]]:
    blank_run = re.compile(r"\n{%d,}" % (cfg.max_blank_lines + 2))
    blank_keep = "\n" * (cfg.max_blank_lines + 1)

    def normalize(docs: list[Document]) -> list[Document]:
        for doc in docs:
            if cfg.fix_mojibake and doc["kind"] in PROSE_KINDS and not doc["text"].isascii():
                doc["text"] = repair_mojibake(doc["text"])
            doc["text"] = normalize_text(doc["text"], cfg.form, doc["kind"] in PROSE_KINDS, blank_run, blank_keep)
            if not doc["text"]:
                doc["reject"] = "normalize.empty_text"
        return docs

    return normalize


def normalize_text(text: str, form: str, prose: bool, blank_run: re.Pattern, blank_keep: str) -> str:
    if form != "none":
        text = unicodedata.normalize(form, text)
    text = CONTROL_CHARS.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = TRAILING_SPACES.sub("", text)
    text = blank_run.sub(blank_keep, text)
    return INNER_SPACES.sub(" ", text).strip() if prose else text.strip("\n")


def repair_mojibake(text: str) -> str:
    import ftfy

    return ftfy.fix_encoding(text)
