"""Gopher's quality and repetition rules (Rae et al. 2021, "Scaling Language Models", Table A1).

Quality: 50..100,000 words; mean word length 3..10 characters; at most 0.1 "#" and
0.1 ellipses per word; at most 90% of lines starting with a bullet and 30% ending
with an ellipsis; at least 80% of words holding a letter; at least 2 of the 8 stop
words ("the", "be", "to", "of", "and", "that", "have", "with").
Repetition: duplicate lines/paragraphs (30% of them, 20% of characters); the most
frequent 2/3/4-gram covering more than 20/18/16% of the characters; duplicated
5..10-grams covering more than 15..10%. Each check returns the name of the rule that
fails ("" when all pass); the quality stage prefixes it with the group name.
Word n-grams are hashed to integers with numpy, and the sequential duplicate count
runs only when an upper bound (every repeated position) could cross the threshold.
"""
from __future__ import annotations

import re
from collections import Counter
from itertools import compress
from operator import mul

import numpy as np
from pydantic import Field

from datapipe.stage import Strict
from datapipe.text.words import LETTER, REAL, word_flags

STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")
PARAGRAPH_BREAK = re.compile(r"\n{2,}")
LINE_BREAKS = re.compile(r"\n+")


class GopherQuality(Strict):
    min_doc_words: int | None = Field(50, ge=0)  # fewer words is a caption or a menu, not a document
    max_doc_words: int | None = Field(100_000, ge=1)  # more is a dump (logs, tables)
    min_avg_word_length: float | None = 3  # shorter: tag soup, numbers, code
    max_avg_word_length: float | None = 10  # longer: URLs, hashes, run-together words
    max_symbol_word_ratio: float | None = 0.1  # "#" or ellipses per word: hashtag spam, teasers
    max_bullet_lines_ratio: float | None = 0.9  # lists of links
    max_ellipsis_lines_ratio: float | None = 0.3  # truncated teasers
    min_alpha_words_ratio: float | None = 0.8  # words holding a letter
    min_stop_words: int | None = 2  # distinct stop words: real English sentences have them
    stop_words: tuple[str, ...] = STOP_WORDS


class GopherRepetition(Strict):
    dup_line_frac: float | None = 0.3
    dup_para_frac: float | None = 0.3
    dup_line_char_frac: float | None = 0.2
    dup_para_char_frac: float | None = 0.2
    top_n_grams: tuple[tuple[int, float], ...] = ((2, 0.2), (3, 0.18), (4, 0.16))
    dup_n_grams: tuple[tuple[int, float], ...] = ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10))


def check_quality(text: str, words: list[str], cfg: GopherQuality) -> str:
    n_words, counts = len(words), Counter(words)  # per distinct word (~40% of the tokens), in C loops
    distinct, times = list(counts), list(counts.values())
    flags = word_flags(distinct)
    real = [flag & REAL for flag in flags]
    n_real = sum(compress(times, real))
    total_length = sum(map(mul, map(len, compress(distinct, real)), compress(times, real)))
    n_alpha = sum(compress(times, [flag & LETTER for flag in flags]))
    if cfg.min_doc_words and n_real < cfg.min_doc_words:
        return "word_count"
    if cfg.max_doc_words and n_real > cfg.max_doc_words:
        return "word_count"
    if not n_real:
        return "word_count"
    mean_length = total_length / n_real
    if cfg.min_avg_word_length and mean_length < cfg.min_avg_word_length:
        return "mean_word_length"
    if cfg.max_avg_word_length and mean_length > cfg.max_avg_word_length:
        return "mean_word_length"
    if cfg.max_symbol_word_ratio and text.count("#") / n_words > cfg.max_symbol_word_ratio:
        return "hash_ratio"
    if cfg.max_symbol_word_ratio and (text.count("...") + text.count("…")) / n_words > cfg.max_symbol_word_ratio:
        return "ellipsis_ratio"
    return check_lines(text, cfg) or check_words(counts, n_alpha / n_words, cfg)


def check_lines(text: str, cfg: GopherQuality) -> str:
    lines = text.splitlines() or [""]
    if cfg.max_bullet_lines_ratio:
        bullets = sum(line.lstrip().startswith(("•", "-")) for line in lines)
        if bullets / len(lines) > cfg.max_bullet_lines_ratio:
            return "bullet_lines"
    if cfg.max_ellipsis_lines_ratio:
        ellipses = sum(line.rstrip().endswith(("...", "…")) for line in lines)
        if ellipses / len(lines) > cfg.max_ellipsis_lines_ratio:
            return "ellipsis_lines"
    return ""


def check_words(counts: Counter, alpha_ratio: float, cfg: GopherQuality) -> str:
    if cfg.min_alpha_words_ratio and alpha_ratio < cfg.min_alpha_words_ratio:
        return "alpha_words"
    if cfg.min_stop_words and sum(w in counts for w in cfg.stop_words) < cfg.min_stop_words:
        return "stop_words"
    return ""


def check_repetition(text: str, words: list[str], cfg: GopherRepetition) -> str:
    if not text:
        return "empty"
    paragraphs = PARAGRAPH_BREAK.split(text.strip())
    count, chars = count_duplicates(paragraphs)
    if cfg.dup_para_frac and count / len(paragraphs) > cfg.dup_para_frac:
        return "dup_para_frac"
    if cfg.dup_para_char_frac and chars / len(text) > cfg.dup_para_char_frac:
        return "dup_para_char_frac"
    lines = LINE_BREAKS.split(text)
    count, chars = count_duplicates(lines)
    if cfg.dup_line_frac and count / len(lines) > cfg.dup_line_frac:
        return "dup_line_frac"
    if cfg.dup_line_char_frac and chars / len(text) > cfg.dup_line_char_frac:
        return "dup_line_char_frac"
    return check_n_grams(words, len(text), cfg)


def count_duplicates(items: list[str]) -> tuple[int, int]:
    """How many items repeat an earlier one, and their characters."""
    seen: set[str] = set()
    count = chars = 0
    for item in items:
        if item in seen:
            count, chars = count + 1, chars + len(item)
        else:
            seen.add(item)
    return count, chars


def check_n_grams(words: list[str], n_chars: int, cfg: GopherRepetition) -> str:
    if len(words) < 2:
        return ""
    vocabulary = {w: i for i, w in enumerate(dict.fromkeys(words))}
    ids = np.fromiter(map(vocabulary.__getitem__, words), dtype=np.uint64, count=len(words))
    lengths = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
    keys = NGramKeys(ids)
    most = None  # the top count of the shortest n checked: no longer n-gram occurs more often
    for n, limit in sorted(cfg.top_n_grams):
        if len(words) < n:
            continue
        if most is not None and most * (n_gram_chars(lengths, n).max() + n - 1) <= limit * n_chars:
            continue
        chars, count = top_n_gram_chars(keys.of(n), lengths, n)
        most = count if most is None else most
        if chars / n_chars > limit:
            return f"top_{n}_gram"
    repeats = None  # positions whose shortest checked n-gram repeats: a superset for longer n
    for n, limit in sorted(cfg.dup_n_grams):
        if len(words) < n:
            continue
        if repeats is not None:
            candidates = repeats[repeats <= len(words) - n]
            if n_gram_chars(lengths, n)[candidates].sum() <= limit * n_chars:
                continue  # even if every earlier repeat still repeats at this n, the rule passes
        order, starts = sorted_runs(keys.of(n))
        repeats = np.sort(order[~starts]) if repeats is None else repeats
        if duplicate_n_gram_chars(keys.of(n), lengths, n, limit * n_chars, order, starts) / n_chars > limit:
            return f"duplicated_{n}_n_grams"
    return ""


class NGramKeys:
    """One 64-bit key per n-gram (polynomial hash of word ids; collisions ~len^2/2^64), built
    from the (n-1)-gram keys so that all n up to 10 cost one pass each."""

    def __init__(self, ids: np.ndarray):
        self.ids, self.keys, self.n = ids, ids + np.uint64(1), 1

    def of(self, n: int) -> np.ndarray:
        while self.n < n:
            self.keys = self.keys[:-1] * np.uint64(1_000_003) + self.ids[self.n :] + np.uint64(1)
            self.n += 1
        return self.keys


def n_gram_chars(lengths: np.ndarray, n: int) -> np.ndarray:
    cumulative = np.concatenate(([0], np.cumsum(lengths)))
    return cumulative[n:] - cumulative[:-n]


def sorted_runs(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One stable sort: positions ordered by key (ties by position) and where each run of equal keys starts."""
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    starts = np.empty(len(keys), dtype=bool)
    starts[:1] = True  # [:1]: no keys, no runs
    np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=starts[1:])
    return order, starts


def top_n_gram_chars(keys: np.ndarray, lengths: np.ndarray, n: int) -> tuple[int, int]:
    """(characters of the most frequent n-gram, words joined by spaces, times its count; that
    count); ties go to the n-gram seen first, as Counter.most_common does."""
    order, starts = sorted_runs(keys)
    firsts = order[starts]  # first position of each distinct n-gram
    counts = np.diff(np.append(np.flatnonzero(starts), len(keys)))
    best = np.flatnonzero(counts == counts.max())
    first = int(firsts[best].min())
    return int((n_gram_chars(lengths, n)[first] + n - 1) * counts.max()), int(counts.max())


def duplicate_n_gram_chars(keys: np.ndarray, lengths: np.ndarray, n: int, limit: float,
                           order: np.ndarray, starts: np.ndarray) -> int:
    """Characters in repeated n-grams, scanning left to right and jumping past each repeat."""
    chars = n_gram_chars(lengths, n)
    bound = int(chars[order[~starts]].sum())  # every repeat, counted: at least what the scan finds
    if bound <= limit:
        return bound
    seen: set[int] = set()
    total, idx, keys_list = 0, 0, keys.tolist()
    while idx < len(keys_list):
        if keys_list[idx] in seen:
            total += int(chars[idx])
            idx += n
        else:
            seen.add(keys_list[idx])
            idx += 1
    return total
