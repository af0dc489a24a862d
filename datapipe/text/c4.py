"""C4's rules (Raffel et al. 2020, section 2.2, and the tensorflow-datasets c4_utils code).

Line by line: drop lines with a word over 1000 characters, lines that do not end in
terminal punctuation (. ? ! " ') or end in "...", lines of fewer than 3 words, lines
that mention "javascript", and cookie/terms-of-use notices; Wikipedia citation marks
("[1]", "[edit]") are removed first. The whole page goes when any kept line holds
"lorem ipsum" or a curly bracket (code), or when fewer than 5 sentences are left.
The kept lines replace the text when `rewrite_text` is on (C4 did). C4's bad-words
rule (datapipe.text.badwords) runs on the kept text when `bad_words` is on; it is off by
default, as it drops many harmless pages (6.5% of our web sample, "anal" and "ass" among
its entries) and datatrove's C4QualityFilter leaves it out too.
"""
from __future__ import annotations

import re

from pydantic import Field, model_validator

from datapipe.stage import Strict
from datapipe.text import badwords
from datapipe.text.words import count_sentences, split_words

CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
END_PUNCTUATION = (".", "?", "!", '"', "'")
POLICY_PHRASES = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")


class C4(Strict):
    remove_citations: bool = True
    filter_no_terminal_punct: bool = True
    min_num_sentences: int = Field(5, ge=-1)  # -1 disables; counted on the kept lines
    min_words_per_line: int = Field(3, ge=-1)  # -1 disables
    max_word_length: int = Field(1000, ge=-1)  # -1 disables; longer "words" are base64 or minified code
    filter_lorem_ipsum: bool = True  # placeholder pages
    filter_javascript: bool = True  # "enable JavaScript" notices
    filter_curly_bracket: bool = True  # code and templates
    filter_policy: bool = True  # cookie banners, terms of use
    rewrite_text: bool = True  # keep only the lines that passed, as C4 did
    bad_words: bool = False  # C4's LDNOOBW rule; the lists come with `make install`
    bad_words_dir: str | None = None  # the lists' folder; None: the one `make install` fills
    bad_words_default_language: str = "en"  # the list for pages no langid stage has labelled

    @model_validator(mode="after")
    def _lists_present(self) -> C4:
        folder = badwords.lists_dir(self.bad_words_dir)
        if self.bad_words and not badwords.has_lists(folder):
            raise ValueError(badwords.missing_lists_error(folder))
        return self


def check_c4(text: str, cfg: C4, language: str | None = None) -> tuple[str, str]:
    """(failed rule or "", the text of the kept lines). `language` picks the bad-words list."""
    sentences, kept = 0, []
    for line in text.splitlines():
        line = line.strip()
        tokens = line.split()
        too_long = cfg.max_word_length != -1 and len(line) > cfg.max_word_length
        if too_long and any(len(token) > cfg.max_word_length for token in tokens):
            continue
        if cfg.remove_citations:
            line = CITATION.sub("", line)
        if cfg.filter_no_terminal_punct and (not line.endswith(END_PUNCTUATION) or line.endswith("...")):
            continue
        if len(tokens) < cfg.min_words_per_line:
            continue
        lowered = line.lower()
        if cfg.filter_lorem_ipsum and "lorem ipsum" in lowered:
            return "lorem_ipsum", text
        if cfg.filter_javascript and "javascript" in lowered:
            continue
        if cfg.filter_curly_bracket and "{" in line:
            return "curly_bracket", text
        if cfg.filter_policy and any(phrase in lowered for phrase in POLICY_PHRASES):
            continue
        if sentences < cfg.min_num_sentences:  # enough sentences seen: the count no longer matters
            sentences += count_sentences(split_words(line))
        kept.append(line)
    if sentences < cfg.min_num_sentences:
        return "too_few_sentences", text
    cleaned = "\n".join(kept).strip() if cfg.rewrite_text or cfg.bad_words else text
    if cfg.bad_words and has_bad_words(cleaned, cfg, language):
        return "bad_words", text
    return "", cleaned if cfg.rewrite_text else text


def has_bad_words(text: str, cfg: C4, language: str | None) -> bool:
    folder = str(badwords.lists_dir(cfg.bad_words_dir))
    entries = badwords.load(folder, language or cfg.bad_words_default_language)
    return entries is not None and entries.first_match(text) is not None
