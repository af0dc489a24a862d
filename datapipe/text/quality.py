"""The heuristic quality filters in one stage: Gopher repetition, Gopher quality, C4, FineWeb.

They run in FineWeb's order and share one word split (datapipe.text.words), which is
where datatrove spends most of its time (spaCy, once per filter). A page that fails a
rule is rejected as "quality.<group>.<rule>", e.g. quality.gopher_quality.word_count
or quality.c4.lorem_ipsum; the first failing rule names the reject. Set a group to
null in the recipe to skip it. Thresholds are the published ones (see each module).

`preset` picks the groups and settings of one published pipeline; options given in the
recipe are laid over it, group by group:
- fineweb (default): Gopher repetition + quality, C4 without its terminal-punctuation line
  rule, FineWeb's rules - datatrove's FineWeb pipeline, the most recent and best-measured
  of the three (FineWeb beat C4 and RefinedWeb in its ablations);
- c4: C4's rules alone, terminal-punctuation lines dropped and the bad-words rule on, as the
  C4 paper did (the bad-words lists come with `make install`);
- gopher: Gopher's repetition and quality rules alone (MassiveText).
DCLM's heuristics (RefinedWeb's line modifiers) and its fastText quality classifier are not
here, so there is no dclm preset.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import model_validator

from datapipe.schema import Document
from datapipe.stage import StageConfig
from datapipe.text.c4 import C4, check_c4
from datapipe.text.fineweb import FineWeb, check_fineweb
from datapipe.text.gopher import GopherQuality, GopherRepetition, check_quality, check_repetition
from datapipe.text.words import split_words

# The filter groups in evaluation order; a document meets a group only if it passed the ones
# before, which is how the stats derive each group's documents in and kept (datapipe.pipeline.stats).
RULE_ORDER = ("gopher_repetition", "gopher_quality", "c4", "fineweb")


# Each preset's groups: {} is the group at its defaults, None leaves it out.
PRESETS: dict[str, dict[str, dict[str, Any] | None]] = {
    "fineweb": {"gopher_repetition": {}, "gopher_quality": {}, "c4": {"filter_no_terminal_punct": False},
                "fineweb": {}},
    "c4": {"gopher_repetition": None, "gopher_quality": None, "c4": {"bad_words": True}, "fineweb": None},
    "gopher": {"gopher_repetition": {}, "gopher_quality": {}, "c4": None, "fineweb": None},
}


class Config(StageConfig):
    preset: Literal["fineweb", "c4", "gopher"] = "fineweb"  # the published pipeline the groups follow
    gopher_repetition: GopherRepetition | None = GopherRepetition()
    gopher_quality: GopherQuality | None = GopherQuality()
    c4: C4 | None = C4()
    fineweb: FineWeb | None = FineWeb()

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("preset", "fineweb") not in PRESETS:
            return data  # an unknown preset is reported by the field's own check, with the known ones
        return overlay(PRESETS[data.get("preset", "fineweb")], data)


def overlay(preset: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """The preset's groups with the recipe's options laid over them, one group at a time."""
    merged = dict(given)
    for group, options in preset.items():
        if group not in given:
            merged[group] = options
        elif isinstance(options, dict) and isinstance(given[group], dict):
            merged[group] = options | given[group]
    return merged


def make_stage(cfg: Config) -> Callable[[list[Document]], list[Document]]:
    def quality(docs: list[Document]) -> list[Document]:
        for doc in docs:
            failed, doc["text"] = first_failure(doc["text"], cfg, doc["language"])
            if failed:
                doc["reject"] = f"quality.{failed}"
        return docs

    return quality


def first_failure(text: str, cfg: Config, language: str | None = None) -> tuple[str, str]:
    """("group.rule", text) for the first rule that fails, ("", text as C4 left it) if none.
    `language` (Document.language, "" when no langid stage ran) picks C4's bad-words list."""
    words = split_words(text)
    if cfg.gopher_repetition and (rule := check_repetition(text, words, cfg.gopher_repetition)):
        return f"gopher_repetition.{rule}", text
    if cfg.gopher_quality and (rule := check_quality(text, words, cfg.gopher_quality)):
        return f"gopher_quality.{rule}", text
    if cfg.c4:
        rule, kept = check_c4(text, cfg.c4, language)
        if rule:
            return f"c4.{rule}", text
        if kept != text:
            text, words = kept, split_words(kept)
    if cfg.fineweb and (rule := check_fineweb(text, words, cfg.fineweb)):
        return f"fineweb.{rule}", text
    return "", text
