"""Fidelity checks: does a rewritten chunk still say what its source chunk said, in new words?

Five scores per chunk, each with a bound from the recipe:
- cosine: all-MiniLM-L6-v2 embedding similarity of source and rewrite (paraphrases of one
  passage score ~0.7-0.95; unrelated text ~0.0-0.3);
- numbers: the share of the source's numbers (thousands separators removed) found in the rewrite;
  K2's rephrasing must not invent or lose facts, and numbers are the facts easiest to check;
- entities: the share of the source's capitalized names (not sentence-initial) found in the
  rewrite, case-insensitively: a cheap stand-in for named-entity recall with no NER model;
- length_ratio: rewrite characters / source characters, inside [min, max];
- overlap: the share of the source's word 5-grams found verbatim in the rewrite; a copy (small
  models often echo their input, sometimes with chatter after it) is no rephrasing and teaches
  the trainer nothing new. A true paraphrase keeps a few names and phrases: ~0.0-0.5.
`failures` names every check below its bound; the stage retries with another style, then
rejects with `rephrase.fidelity_low` and the scores in notes["rephrase"].
"""
from __future__ import annotations

import re

from pydantic import Field

from datapipe.stage import Strict

THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
NUMBER = re.compile(r"\d+(?:\.\d+)?")
SENTENCE = re.compile(r"(?<=[.!?:])\s+|\n+")
WORD = re.compile(r"[^\W\d_][\w-]*")



class FidelityConfig(Strict):
    min_cosine: float | None = Field(0.6, ge=-1, le=1)  # None skips the embedding check (and its model)
    min_number_recall: float = Field(1.0, ge=0, le=1)  # 1.0: a rewrite that drops any number fails
    min_entity_recall: float = Field(0.5, ge=0, le=1)  # names are often pronominalized; half must stay
    min_length_ratio: float = Field(0.3, gt=0)  # a key-facts list may keep a third of the characters
    max_length_ratio: float = Field(3.0, gt=0)  # Q&A and dialogue styles expand; beyond 3x is padding
    max_overlap: float = Field(0.8, gt=0, le=1)  # 1.0 = the source is copied whole; paraphrases score ~0.0-0.5


def numbers(text: str) -> set[str]:
    return set(NUMBER.findall(THOUSANDS.sub("", text)))


def names(text: str) -> set[str]:
    """Capitalized words (2+ letters) that do not start a sentence: "Paris", "Eiffel", "NASA"."""
    found = set()
    for sentence in SENTENCE.split(text):
        found.update(word.lower() for word in WORD.findall(sentence)[1:] if len(word) > 1 and word[0].isupper())
    return found


def recall(wanted: set[str], found_in: str) -> float:
    if not wanted:
        return 1.0
    lowered = found_in.lower()
    return round(sum(1 for item in wanted if item.lower() in lowered) / len(wanted), 4)


def overlap(source: str, rewrite: str, n: int = 5) -> float:
    """Share of the source's word n-grams (case-folded) that the rewrite repeats verbatim."""
    words, echoed = source.lower().split(), rewrite.lower().split()
    n = min(n, len(words))
    if n == 0:
        return 0.0
    grams = {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}
    found = {tuple(echoed[i : i + n]) for i in range(len(echoed) - n + 1)}
    return round(len(grams & found) / len(grams), 4)


def score(source: str, rewrite: str, cosine: float | None) -> dict[str, float]:
    """The chunk's scores; cosine comes from the embedder (None when the check is off)."""
    scores = {
        "numbers": recall(numbers(source), THOUSANDS.sub("", rewrite)),
        "entities": recall(names(source), rewrite),
        "length_ratio": round(len(rewrite) / max(1, len(source)), 4),
        "overlap": overlap(source, rewrite),
    }
    if cosine is not None:
        scores["cosine"] = cosine
    return scores


def failures(scores: dict[str, float], cfg: FidelityConfig) -> list[str]:
    """The checks that failed, as 'name value < bound' strings; [] when the chunk passes."""
    failed = []
    if "cosine" in scores and cfg.min_cosine is not None and scores["cosine"] < cfg.min_cosine:
        failed.append(f"cosine {scores['cosine']} < {cfg.min_cosine}")
    if scores["numbers"] < cfg.min_number_recall:
        failed.append(f"numbers {scores['numbers']} < {cfg.min_number_recall}")
    if scores["entities"] < cfg.min_entity_recall:
        failed.append(f"entities {scores['entities']} < {cfg.min_entity_recall}")
    if not cfg.min_length_ratio <= scores["length_ratio"] <= cfg.max_length_ratio:
        failed.append(f"length_ratio {scores['length_ratio']} outside [{cfg.min_length_ratio}, {cfg.max_length_ratio}]")
    if scores["overlap"] > cfg.max_overlap:
        failed.append(f"overlap {scores['overlap']} > {cfg.max_overlap}")
    return failed
