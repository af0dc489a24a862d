"""The fidelity gate on held-out pairs: does it catch wrong rewrites and pass faithful ones?

Pairs are built from real text: passages of 2-3 sentences from ../shared/data/web_text (English
web documents with numbers and names; else the recipe's sample facts), each turned into one
faithful rewrite and one wrong rewrite by rules whose truth is known:
- faithful: numbers re-written (3 -> three, 2500 -> 2,500, km -> kilometres, % -> percent), dates
  re-ordered (4 March -> March 4), sentences re-ordered, a year fronted ("X in 1889." -> "In
  1889, X."), common words swapped for synonyms;
- wrong, one kind each: number_changed (2500 -> 25000, 4 -> 24), unit_changed (km -> m),
  date_changed, name_replaced (a name from another passage), names_swapped (two names of the
  passage trade places), negation_flipped, fact_dropped (the sentence with a number left out),
  sentence_invented (a sentence from another passage, with its numbers and names, added),
  context_repeated (the previous passage, then this one), truncated (cut mid-sentence at the
  token cap), loop (a sentence said four times), language_switch (the UDHR preamble in English
  against a real translation).
Reported: for "wrong" as the positive class, the gate's precision and recall (= share of wrong
rewrites caught) at its defaults, the share of faithful rewrites passed, and the same for the
cosine-only gate (all-MiniLM-L6-v2 >= 0.6, the gate before issue 21), in the same run.

    .venv/bin/python bench/fidelity.py [--passages 150] [--seed 0]
"""
from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
SHARED = REPO.parent / "shared" / "data" / "web_text"
SAMPLE = REPO / "recipes" / "data" / "rephrase_facts.jsonl"

from datapipe.llm import facts  # noqa: E402

WORD_NUMBERS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten",
                12: "twelve", 20: "twenty", 30: "thirty", 50: "fifty"}
SYNONYMS = {"big": "large", "began": "started", "begin": "start", "about": "around", "built": "constructed",
            "important": "significant", "many": "numerous", "help": "assist", "show": "demonstrate", "buy": "purchase",
            "use": "employ", "shows": "demonstrates", "main": "principal", "often": "frequently", "quickly": "rapidly",
            "get": "obtain", "need": "require", "enough": "sufficient", "small": "little", "start": "begin"}
UNIT_WORDS = {"km": "kilometres", "m": "metres", "kg": "kilograms", "cm": "centimetres", "%": " percent", "mi": "miles"}
MONTH_BEFORE = re.compile(r"\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.?\s$")
AUXILIARIES = re.compile(r"\b(is|was|are|were|has|had|can|will|could|would|should)\b(?! not)")
NEGATED = re.compile(r"\b(is|was|are|were|has|had|can|will|could|would|should|did|does|do) not\b")
FAITHFUL = ("numbers_reworded", "date_reordered", "sentences_reordered", "year_fronted", "synonyms")
WRONG = ("number_changed", "unit_changed", "date_changed", "name_replaced", "names_swapped", "negation_flipped",
         "fact_dropped", "sentence_invented", "context_repeated", "truncated", "loop", "language_switch")


@dataclass
class Pair:
    source: str
    rewrite: str
    wrong: bool
    kind: str
    context: str = ""
    finish_reason: str = "stop"


def load_passages(count: int, seed: int) -> tuple[list[str], str]:
    """Passages of 2-3 sentences (25-110 words) with a number and two names, from real web text."""
    path = SHARED / "web_docs.jsonl.gz"
    if not path.is_file():
        return [json.loads(line)["text"] for line in SAMPLE.open()], "recipes/data/rephrase_facts"
    passages = []
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            row = json.loads(line)
            if row.get("lang_detected") == "en":
                passages.extend(passages_of(row["text"]))
    random.Random(seed).shuffle(passages)
    return passages[:count], "web_docs"


def passages_of(text: str) -> list[str]:
    found = []
    sentences = [s.strip() for s in facts.sentences(text) if 6 <= len(s.split()) <= 45 and "http" not in s]
    for i in range(0, len(sentences) - 1, 3):
        passage = " ".join(sentences[i : i + 3])
        if 25 <= len(passage.split()) <= 110 and re.search(r"\d", passage) and len(facts.names(passage)) >= 2:
            found.append(passage)
    return found


def faithful(passage: str, rng: random.Random) -> tuple[str, str]:
    """The passage with every faithful rule that applies (at least sentence order or synonyms)."""
    text, applied = passage, []
    for name, rule in (("numbers_reworded", reword_numbers), ("date_reordered", reorder_dates),
                       ("year_fronted", front_year), ("synonyms", use_synonyms), ("sentences_reordered", reorder)):
        changed = rule(text, rng)
        if changed != text:
            text, applied = changed, applied + [name]
    return text, "+".join(applied) or "unchanged"


def reword_numbers(text: str, rng: random.Random) -> str:
    def one(match: re.Match) -> str:
        value, unit = match[1], match[2] or ""
        if MONTH_BEFORE.search(match.string[max(0, match.start() - 12) : match.start()]):
            return match[0]  # a date's day stays in digits, as writers keep it
        number = int(value.replace(",", "")) if re.fullmatch(r"\d{1,3}(,\d{3})*|\d+", value) else None
        if number in WORD_NUMBERS and not unit.strip().startswith("%"):
            value = WORD_NUMBERS[number]
        elif number is not None and number >= 10000 and "," not in value:
            value = f"{number:,}"
        elif "," in value:
            value = value.replace(",", "")
        return f"{value}{' ' + UNIT_WORDS[unit.strip()] if unit.strip() in UNIT_WORDS else unit}"
    return re.sub(r"(?<![\w.,$])(\d[\d,]*\d|\d)(?![\d.,]\d)(\s?(?:km|kg|cm|mi|m|%)\b|%)?(?![\w/:-])", one, text)


def reorder_dates(text: str, rng: random.Random) -> str:
    return re.sub(r"\b([0-3]?\d) (January|February|March|April|June|July|August|September|October|November|December)\b",
                  r"\2 \1", text)


def front_year(text: str, rng: random.Random) -> str:
    def one(match: re.Match) -> str:
        head, year = match[1], match[2]
        first = head.split()[0]
        if first.lower() not in facts.STOPWORDS:  # a name stays capitalized; only "The ..." is lower-cased
            return f"In {year}, {head}."
        return f"In {year}, {head[0].lower()}{head[1:]}."
    return re.sub(r"(?:(?<=^)|(?<=[.!?] ))([A-Z][^.!?]{10,}?) in ((?:1[5-9]|20)\d\d)\.", one, text)


def use_synonyms(text: str, rng: random.Random) -> str:
    return re.sub(r"\b(" + "|".join(SYNONYMS) + r")\b", lambda m: SYNONYMS[m[1]], text)


def reorder(text: str, rng: random.Random) -> str:
    sentences = facts.sentences(text)
    if len(sentences) < 2:
        return text
    return " ".join([sentences[1], sentences[0], *sentences[2:]])


def wrong(kind: str, passage: str, other: str, rng: random.Random) -> Pair | None:
    """One wrong rewrite of the passage (`other` is another passage), or None where the kind does
    not apply (no date to change, one name only...)."""
    text = faithful(passage, rng)[0] if kind in ("number_changed", "name_replaced", "negation_flipped") else passage
    if kind == "context_repeated":
        return Pair(passage, f"{other} {text}", True, kind, context=other)
    if kind == "truncated":
        words = passage.split()
        return Pair(passage, " ".join(words[: max(3, len(words) * 2 // 3)]), True, kind, finish_reason="length")
    if kind == "loop":
        last = facts.sentences(passage)[-1]
        return Pair(passage, " ".join([passage] + [last] * 4), True, kind)
    changed = RULES[kind](text, other, rng)
    return Pair(passage, changed, True, kind) if changed and changed != text else None


def change_number(text: str, other: str, rng: random.Random) -> str:
    numbers = list(re.finditer(r"(?<![\w.,])\d[\d,]*(?![\d,]*\d)", text))
    if not numbers:
        return ""
    match = rng.choice(numbers)
    value = match[0]
    new = value + "0" if rng.random() < 0.5 else str(int(value.replace(",", "")) + rng.choice([1, 2, 20]))
    return text[: match.start()] + new + text[match.end() :]


def change_unit(text: str, other: str, rng: random.Random) -> str:
    swaps = {"km": "m", "kilometres": "metres", "kilometers": "meters", "kg": "g", "percent": "times", "%": " times",
             "miles": "feet", "metres": "kilometres", "meters": "kilometers", "hours": "minutes", "minutes": "hours"}
    match = re.search(r"(?<=\d)(\s?)(" + "|".join(map(re.escape, swaps)) + r")\b", text)
    if not match:
        return ""
    return text[: match.start(2)] + swaps[match[2]].strip() + text[match.end(2) :]


def change_date(text: str, other: str, rng: random.Random) -> str:
    match = re.search(r"\b([0-3]?\d)( (?:of )?(?:January|February|March|April|May|June|July|August|September|October|"
                      r"November|December))\b|\b((?:January|February|March|April|June|July|August|September|October|"
                      r"November|December) )([0-3]?\d)\b", text)
    if not match:
        return change_year(text, rng)
    day = int(match[1] or match[4])
    new = str(day + 20 if day < 10 else day - 9)
    if match[1]:
        return text[: match.start(1)] + new + text[match.end(1) :]
    return text[: match.start(4)] + new + text[match.end(4) :]


def change_year(text: str, rng: random.Random) -> str:
    match = re.search(r"\b(1[5-9]|20)(\d\d)\b", text)
    return text[: match.start()] + str(int(match[0]) + rng.choice([-3, -1, 1, 10])) + text[match.end() :] if match else ""


def replace_name(text: str, other: str, rng: random.Random) -> str:
    mine, theirs = sorted(facts.names(text)), sorted(facts.names(other) - facts.names(text))
    if not mine or not theirs:
        return ""
    old, new = rng.choice(mine), rng.choice(theirs)
    pattern = re.compile(r"\b" + r"\s+".join(map(re.escape, old.split())) + r"\b", re.IGNORECASE)
    return pattern.sub(new.title(), text, count=1)


def swap_names(text: str, other: str, rng: random.Random) -> str:
    """Two single-word names of one sentence trade places."""
    for sentence in facts.sentences(text):
        found = sorted({name for name, _ in facts.sentence_names(sentence) if " " not in name})
        if len(found) >= 2:
            a, b = rng.sample(found, 2)
            swapped = re.sub(rf"\b({re.escape(a)}|{re.escape(b)})\b",
                             lambda m, a=a, b=b: (b if m[1].lower() == a else a).title(), sentence, flags=re.IGNORECASE)
            return text.replace(sentence, swapped, 1)
    return ""


def flip_negation(text: str, other: str, rng: random.Random) -> str:
    if NEGATED.search(text):
        return NEGATED.sub(r"\1", text, count=1)
    return AUXILIARIES.sub(r"\1 not", text, count=1)


def drop_fact(text: str, other: str, rng: random.Random) -> str:
    sentences = facts.sentences(text)
    with_number = [s for s in sentences if re.search(r"\d", s)]
    if len(sentences) < 2 or not with_number:
        return ""
    return " ".join(s for s in sentences if s != with_number[0])


def invent_sentence(text: str, other: str, rng: random.Random) -> str:
    added = next((s for s in facts.sentences(other) if re.search(r"\d", s)), "")
    return f"{text} {added}" if added else ""


RULES = {"number_changed": change_number, "unit_changed": change_unit, "date_changed": change_date,
         "name_replaced": replace_name, "names_swapped": swap_names, "negation_flipped": flip_negation,
         "fact_dropped": drop_fact, "sentence_invented": invent_sentence}


def language_pairs() -> list[Pair]:
    """The UDHR in English against real translations (paragraph by paragraph, the first 3)."""
    path = SHARED / "udhr.jsonl.gz"
    if not path.is_file():
        return []
    rows = {}
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            row = json.loads(line)
            rows.setdefault(row["lang"], row["text"])
    english = paragraphs(rows.get("en", ""))
    pairs = []
    for lang in ("de-1996", "fr", "es", "it", "pt-PT", "nl", "sw"):
        for source, rewrite in list(zip(english, paragraphs(rows.get(lang, ""))))[:3]:
            pairs.append(Pair(source, rewrite, True, "language_switch"))
    return pairs


def paragraphs(text: str) -> list[str]:
    return [p.strip() for p in text.split("\n\n") if len(p.split()) >= 20]


def make_pairs(passages: list[str], seed: int) -> list[Pair]:
    """One faithful and one wrong pair per passage (wrong kinds in turn, skipping those that do not
    apply), plus the language pairs."""
    rng = random.Random(seed)
    pairs = []
    kinds = [k for k in WRONG if k != "language_switch"]
    for i, passage in enumerate(passages):
        pairs.append(Pair(passage, *faithful(passage, rng)[:1], False, faithful(passage, rng)[1]))
        other = passages[(i + 1) % len(passages)]
        for k in range(len(kinds)):
            pair = wrong(kinds[(i + k) % len(kinds)], passage, other, rng)
            if pair:
                pairs.append(pair)
                break
    return pairs + language_pairs()


def evaluate(pairs: list[Pair], cosines: list[float] | None) -> dict:
    """Verdicts of the gate (copy check off: the faithful pairs here are rule edits of their source,
    near-copies by construction) and of the cosine-only gate."""
    from datapipe.llm import fidelity

    cfg = fidelity.FidelityConfig(max_overlap=1.0)
    started = time.perf_counter()
    gate = [bool(fidelity.check(p.source, p.rewrite, cfg, p.context, p.finish_reason).failed) for p in pairs]
    result = {"pairs": len(pairs), "faithful": sum(not p.wrong for p in pairs), "wrong": sum(p.wrong for p in pairs),
              "gate_ms_per_pair": round(1000 * (time.perf_counter() - started) / len(pairs), 2),
              **rates("gate", pairs, gate)}
    if cosines is not None:
        result.update(rates("cosine", pairs, [c < cfg.min_cosine for c in cosines]))
        result.update(rates("gate_cosine", pairs, [g or c < cfg.min_cosine for g, c in zip(gate, cosines)]))
    result["caught_by_kind"] = {kind: f"{sum(r for p, r in zip(pairs, gate) if p.kind == kind)}/{n}"
                                for kind, n in Counter(p.kind for p in pairs if p.wrong).items()}
    result["faithful_rejected"] = [(p.kind, fidelity.check(p.source, p.rewrite, cfg).detail(), p.rewrite[:160])
                                   for p, r in zip(pairs, gate) if r and not p.wrong][:8]
    return result


def rates(name: str, pairs: list[Pair], rejected: list[bool]) -> dict:
    """'wrong' is the positive class: recall = wrong caught / wrong; passed = faithful passed / faithful."""
    caught = sum(r and p.wrong for p, r in zip(pairs, rejected))
    false = sum(r and not p.wrong for p, r in zip(pairs, rejected))
    wrong_total, faithful_total = sum(p.wrong for p in pairs), sum(not p.wrong for p in pairs)
    return {f"{name}_recall": round(caught / max(1, wrong_total), 4),
            f"{name}_precision": round(caught / max(1, caught + false), 4),
            f"{name}_faithful_passed": round(1 - false / max(1, faithful_total), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-cosine", action="store_true", help="skip the MiniLM baseline (no model load)")
    args = parser.parse_args()
    passages, origin = load_passages(args.passages, args.seed)
    pairs = make_pairs(passages, args.seed)
    cosines = None
    if not args.no_cosine:
        from datapipe.llm.embed import Embedder

        cosines = Embedder().cosine([p.source for p in pairs], [p.rewrite for p in pairs])
    result = {"data": origin, **evaluate(pairs, cosines)}
    print(json.dumps(result, indent=1))
    keys = [k for k in result if k.endswith(("_recall", "_precision", "_passed"))]
    line = {"pairs": result["pairs"], "wrong": result["wrong"], **{k: result[k] for k in keys}}
    if cosines is not None:
        line["x_vs_cosine_recall"] = round(result["gate_recall"] / max(1e-9, result["cosine_recall"]), 2)
    print("bench fidelity: " + " ".join(f"{k}={v}" for k, v in line.items()))


if __name__ == "__main__":
    main()
