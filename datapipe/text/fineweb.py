"""FineWeb's own rules (Penedo et al. 2024, "The FineWeb Datasets", section 3.5).

Over non-empty lines: at most 12% ending in terminal punctuation drops the page
(lists, navigation); over 67% of lines of 30 characters or fewer drops it (menus);
duplicated lines holding 1% or more of the characters drops it (boilerplate repeated
on a page); more than 0.3 newlines per word drops it (one word a line).
"""
from __future__ import annotations

from pydantic import Field

from datapipe.stage import Strict
from datapipe.text.gopher import count_duplicates
from datapipe.text.words import SENTENCE_FINAL, terminal_punctuation

STOP_CHARS = tuple(SENTENCE_FINAL | terminal_punctuation())


class FineWeb(Strict):
    line_punct_thr: float = Field(0.12, ge=0, le=1)  # share of lines ending a sentence, below: dropped
    line_punct_exclude_zero: bool = False  # True keeps pages with no punctuation at all (poetry, code)
    short_line_thr: float = Field(0.67, ge=0, le=1)  # share of short lines, above: dropped
    short_line_length: int = Field(30, ge=1)  # characters; a short line is a menu item or a caption
    char_duplicates_ratio: float = Field(0.01, ge=0, le=1)  # characters in repeated lines, above: dropped
    new_line_ratio: float = Field(0.3, ge=0)  # newlines per word, above: dropped


def check_fineweb(text: str, words: list[str], cfg: FineWeb) -> str:
    lines = [line for line in text.split("\n") if line.strip()]
    if not lines:
        return "empty"
    ratio = sum(1 for line in lines if line.endswith(STOP_CHARS)) / len(lines)
    if ratio < cfg.line_punct_thr and not (ratio == 0 and cfg.line_punct_exclude_zero):
        return "line_punct_ratio"
    if sum(1 for line in lines if len(line) <= cfg.short_line_length) / len(lines) > cfg.short_line_thr:
        return "short_line_ratio"
    if count_duplicates(lines)[1] / max(len(text.replace("\n", "")), 1) > cfg.char_duplicates_ratio:
        return "char_dup_ratio"
    if text.count("\n") / max(len(words), 1) > cfg.new_line_ratio:
        return "list_ratio"
    return ""
