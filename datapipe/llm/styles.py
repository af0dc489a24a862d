"""The style library: rewriting prompts with their sampling settings, defined in the recipe.

Kimi K2 rephrased knowledge text in many styles and perspectives (10 rephrasings x 1 epoch beat
1 rephrasing x 10 epochs: SimpleQA 28.94 vs 27.39) and rewrote math as step-by-step learning
notes (SwallowMath), translating non-English math into English. A style applies to one domain;
each document draws its K styles without repeats, in an order seeded by its id, so a rerun
picks the same styles and different documents spread over the whole library.
"""
from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, TypeAdapter, ValidationError

from datapipe.stage import Strict

LETTERS = re.compile(r"[^\W\d_]")
WORDS = re.compile(r"[^\W\d_]+")
ENGLISH_WORDS = frozenset(["the", "a", "an", "of", "and", "or", "to", "in", "on", "at", "is", "are", "was", "be", "by", "for", "from", "with", "as", "that", "this", "it", "then", "so", "if", "we", "let", "not", "which"])


class StyleConfig(Strict):
    name: str  # shown in provenance: notes["rephrase"]["style"]
    domain: Literal["knowledge", "math"] = "knowledge"  # which documents it may rewrite
    non_english_only: bool = False  # math translation: only for text that is mostly not English
    system: str  # the system message: who writes, for whom, what to keep
    prompt: str = "{text}"  # the user message; {text} is the source chunk
    temperature: float = Field(0.7, ge=0, le=2)  # K2-style diversity comes from styles, not from heat
    top_p: float = Field(0.9, gt=0, le=1)
    length_budget: float = Field(2.0, gt=0)  # max new tokens = budget x source-chunk tokens (capped by the stage)


def load_styles(inline: list[StyleConfig], path: str | None) -> list[StyleConfig]:
    """Inline styles, else the styles file (a YAML list of styles); names must be unique."""
    styles = list(inline)
    if not styles and path:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        try:
            styles = TypeAdapter(list[StyleConfig]).validate_python(raw.get("styles") if isinstance(raw, dict) else raw)
        except ValidationError as err:
            raise ValueError(f"{path}: invalid style library: {err}") from None
    names = [s.name for s in styles]
    if not styles or len(set(names)) != len(names):
        raise ValueError("rephrase needs `styles:` (or `styles_file:`) with at least one style and unique names; "
                         f"got {names}")
    return styles


def is_english(text: str) -> bool:
    """Mostly Latin letters (70%+ ASCII) and English function words: English prose has ~40% of
    them and English math ~15% ("then", "by", "the"); German or French math has almost none."""
    letters = LETTERS.findall(text)
    if letters and sum(1 for ch in letters if ch.isascii()) / len(letters) < 0.7:
        return False
    words = WORDS.findall(text.lower())
    return len(words) < 5 or sum(1 for w in words if w in ENGLISH_WORDS) / len(words) >= 0.08


def eligible_styles(styles: list[StyleConfig], domain: str, text: str) -> list[StyleConfig]:
    english = is_english(text)
    return [s for s in styles if s.domain == domain and not (s.non_english_only and english)]


def style_order(styles: list[StyleConfig], doc_id: str, seed: int) -> list[StyleConfig]:
    """The document's styles in a seeded order; the first K are its rewrites, the rest spares."""
    order = list(styles)
    random.Random(f"{seed}:{doc_id}").shuffle(order)
    non_english = [s for s in order if s.non_english_only]
    return non_english + [s for s in order if not s.non_english_only]  # translate first when it applies
