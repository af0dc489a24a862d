"""The fidelity gate: does a rewritten chunk say what its source chunk said, no more, no less?

Each check has a name, a score and a bound from the recipe; a chunk that fails is rejected (after
the spare styles) with `rephrase.<the first failed check>`, and every score is kept in the notes.
In order, cheapest and most certain first:
- truncated: the answer stopped at its token cap (finish_reason "length"): its end is missing;
- loop: the share of the answer's word 4-grams that repeat an earlier one (prose ~0-0.05; a
  model stuck in a loop > 0.3);
- language_switch: fastText lid.176 says the answer is in another language than the source (or
  than the style's target language, for the translating styles);
- repeats_context: the share of the context's (the previous rewritten chunk's) word 5-grams that
  the answer repeats: an answer that re-says its context writes that text twice into the document;
- copied: the share of the source's 5-grams repeated verbatim (paraphrases keep ~0.0-0.5);
- numbers_dropped / numbers_invented: quantities, dates and months (datapipe.llm.facts: "3 km" =
  "three kilometres") in the source and not in the answer, and the reverse; invented sentences
  with new numbers and names are caught here and below;
- names_dropped (name recall: pronouns stand in for some names, so half must stay) and
  names_invented (whole words: "Henri" is not in "Henrietta");
- relations: source bindings (a fact or word and the name of its clause) that the answer keeps
  both ends of but binds to another name: swapped prizes, swapped birthplaces;
- negation: the count of negations changed ("lowered" -> "did not lower");
- length_ratio, cosine (all-MiniLM-L6-v2; 0.82-0.999 on subtly wrong pairs, so it is only a
  floor against unrelated text), and judge (an LLM with a rubric, when the recipe asks for one).
No packaged entailment model could be installed from the package index (no wheel ships NLI
weights; the NLI packages there fetch them from a hub at run time), so the relations check and
the judge stand in for one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from pydantic import Field

from datapipe.llm import facts
from datapipe.llm.base import BackendConfig
from datapipe.stage import Strict

# Reject reasons, in the order they are checked; the first failure names the reject.
CHECKS = ("truncated", "loop", "language_switch", "repeats_context", "copied", "numbers_dropped", "numbers_invented",
          "names_dropped", "names_invented", "relations", "negation", "length_ratio", "cosine", "judge")
JUDGE_RUBRIC = ("You check rewrites for a pre-training corpus. Compare the REWRITE with the SOURCE. Score 5 if every "
                "fact of the rewrite (numbers, dates, names, who did what, negations) agrees with the source and no "
                "fact was added or dropped; 3 if a minor detail was dropped; 1 if any fact is wrong, swapped or "
                "invented. Answer with the score alone.")


class JudgeConfig(Strict):
    backend: BackendConfig | None = None  # None: the stage's own backend; or another (a bigger model)
    rubric: str = JUDGE_RUBRIC  # the system message; the user message holds SOURCE and REWRITE
    min_score: int = Field(4, ge=1, le=5)  # 5-point scale; 4 lets a faithful rewrite that drops a minor detail pass
    max_new_tokens: int = Field(4, ge=1)  # the score, a digit


class FidelityConfig(Strict):
    min_cosine: float | None = Field(0.6, ge=-1, le=1)  # None skips the embedding check (and its model)
    max_dropped_numbers: int = Field(0, ge=0)  # quantities/dates of the source missing from the rewrite
    max_invented_numbers: int = Field(0, ge=0)  # quantities/dates of the rewrite missing from the source
    min_name_recall: float = Field(0.5, ge=0, le=1)  # names are often pronominalized; half must stay
    max_invented_names: int = Field(0, ge=0)  # a name the source never says is a hallucination
    max_broken_relations: int = Field(0, ge=0)  # a fact moved to another name
    check_negation: bool = True  # the count of negations must not change
    min_length_ratio: float = Field(0.3, gt=0)  # a key-facts list may keep a third of the characters
    max_length_ratio: float = Field(3.0, gt=0)  # Q&A and dialogue styles expand; beyond 3x is padding
    max_overlap: float = Field(0.8, gt=0, le=1)  # 1.0 = the source is copied whole; paraphrases score ~0.0-0.5
    max_context_overlap: float = Field(0.5, gt=0, le=1)  # of the previous rewritten chunk's 5-grams
    max_repetition: float = Field(0.3, gt=0, le=1)  # repeated 4-grams within the answer: a loop
    check_language: bool = True  # the answer's language must be the source's (or the style's target)
    reject_truncated: bool = True  # an answer cut at its token cap misses its end
    judge: JudgeConfig | None = None  # an LLM judge, one more request per chunk that passed the other checks


@dataclass
class Verdict:
    scores: dict[str, float] = field(default_factory=dict)
    evidence: dict[str, list[str]] = field(default_factory=dict)  # check -> the facts it found wrong
    failed: list[str] = field(default_factory=list)  # failed checks, in CHECKS order

    @property
    def reason(self) -> str:
        return self.failed[0] if self.failed else ""

    def detail(self) -> str:
        return "; ".join(f"{c} {self.scores.get(c, '')} {', '.join(self.evidence.get(c, []))}".strip()
                         for c in self.failed)


def ngrams(text: str, n: int) -> list[tuple[str, ...]]:
    words = text.lower().split()
    return [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]


def overlap(source: str, rewrite: str, n: int = 5) -> float:
    """Share of the source's word n-grams (case-folded) that the rewrite repeats verbatim."""
    n = min(n, len(source.split()))
    grams = set(ngrams(source, n)) if n else set()
    if not grams:
        return 0.0
    return round(len(grams & set(ngrams(rewrite, n))) / len(grams), 4)


def repetition(text: str, n: int = 4) -> float:
    """Share of the text's word n-grams that already occurred earlier in it."""
    grams = ngrams(text, n)
    return round(1 - len(set(grams)) / len(grams), 4) if len(grams) >= 8 else 0.0


@lru_cache(maxsize=1)
def language_model():
    from datapipe.text.langid import load_model

    return load_model()


def language(text: str) -> tuple[str, float]:
    (label,), (score,) = language_model().predict(" ".join(text[:2000].split()), k=1)
    return label.removeprefix("__label__"), float(score)


# A source chunk is checked once for each of its K rewrites and each retry: its side is cached
# (about half of the ~1.7 ms a check costs on a 64-token web chunk, measured on the shared machine).
source_language = lru_cache(maxsize=4096)(language)
source_facts = lru_cache(maxsize=4096)(facts.extract)  # read-only: the checks never change a Facts


def language_switch(source: str, rewrite: str, target: str | None) -> list[str]:
    """['de->en'] when the rewrite is confidently in another language; [] when it is not (or the
    texts are too short to tell: under 40 letters, fastText guesses)."""
    if sum(ch.isalpha() for ch in rewrite) < 40 or sum(ch.isalpha() for ch in source) < 40:
        return []
    (said, said_p), (wrote, wrote_p) = source_language(source), language(rewrite)
    wanted = target or said
    if wrote != wanted and wrote_p >= 0.6 and (target or said_p >= 0.6):
        return [f"{said}->{wrote}"]
    return []


def check(source: str, rewrite: str, cfg: FidelityConfig, context: str = "", finish_reason: str = "stop",
          target_language: str | None = None) -> Verdict:
    """Every check but cosine and judge (the rewriter adds those off the request path)."""
    verdict = Verdict()
    mark = verdict_marker(verdict)
    mark("truncated", float(finish_reason == "length"), cfg.reject_truncated and finish_reason == "length")
    loop = repetition(rewrite)
    mark("loop", loop, loop > cfg.max_repetition)
    switched = language_switch(source, rewrite, target_language) if cfg.check_language else []
    mark("language_switch", float(bool(switched)), bool(switched), switched)
    context_overlap = overlap(context, rewrite) if context else 0.0
    mark("repeats_context", context_overlap, context_overlap > cfg.max_context_overlap)
    copied = overlap(source, rewrite)
    mark("copied", copied, copied > cfg.max_overlap)
    # A translation keeps numbers but not capitalization (German capitalizes every noun): names
    # and relations are checked only within one language.
    check_facts(source_facts(source), facts.extract(rewrite), cfg, mark, names=target_language is None)
    ratio = round(len(rewrite) / max(1, len(source)), 4)
    mark("length_ratio", ratio, not cfg.min_length_ratio <= ratio <= cfg.max_length_ratio)
    return verdict


def check_many(cfg: FidelityConfig, items: list[tuple]) -> list[Verdict]:
    """check(source, rewrite, cfg, context, finish_reason, target_language) for each item: one call
    per batch, so the rewriter's worker process pays one round trip for many chunks."""
    return [check(source, rewrite, cfg, *rest) for source, rewrite, *rest in items]


def check_facts(said: facts.Facts, wrote: facts.Facts, cfg: FidelityConfig, mark, names: bool = True) -> None:
    dropped, invented = facts.unmatched(said.quantities, wrote.quantities), facts.unmatched(wrote.quantities,
                                                                                             said.quantities)
    mark("numbers_dropped", len(dropped), len(dropped) > cfg.max_dropped_numbers, dropped)
    mark("numbers_invented", len(invented), len(invented) > cfg.max_invented_numbers, invented)
    flipped = wrote.negations - said.negations
    mark("negation", flipped, cfg.check_negation and flipped != 0 and names)
    if not names:
        return
    kept = [name for name in said.names if facts.present(wrote, name)]
    recall = round(len(kept) / len(said.names), 4) if said.names else 1.0
    mark("names_dropped", recall, recall < cfg.min_name_recall, sorted(set(said.names) - set(kept)))
    new_names = sorted(name for name in wrote.names if not facts.present(said, name))
    mark("names_invented", len(new_names), len(new_names) > cfg.max_invented_names, new_names)
    broken = facts.broken_bindings(said, wrote)
    mark("relations", len(broken), len(broken) > cfg.max_broken_relations, broken)


def verdict_marker(verdict: Verdict):
    """mark(check, score, failed, evidence): records a score, and the check when it failed."""
    def mark(name: str, score: float, failed: bool, evidence: list[str] | None = None) -> None:
        verdict.scores[name] = score
        if evidence:
            verdict.evidence[name] = evidence[:10]
        if failed and name not in verdict.failed:
            verdict.failed.append(name)
            verdict.failed.sort(key=CHECKS.index)
    return mark


def add_cosine(verdict: Verdict, cosine: float, cfg: FidelityConfig) -> None:
    verdict_marker(verdict)("cosine", cosine, cfg.min_cosine is not None and cosine < cfg.min_cosine)


def add_judge(verdict: Verdict, answer: str, cfg: JudgeConfig) -> None:
    """The judge's score is the first digit 1-5 of its answer; no digit scores 0 (a failure)."""
    score = next((int(ch) for ch in answer if ch in "12345"), 0)
    verdict_marker(verdict)("judge", score, score < cfg.min_score, [answer[:80]] if score < cfg.min_score else None)


def judge_messages(source: str, rewrite: str, cfg: JudgeConfig) -> list[dict[str, str]]:
    return [{"role": "system", "content": cfg.rubric},
            {"role": "user", "content": f"SOURCE:\n{source}\n\nREWRITE:\n{rewrite}\n\nScore (1-5):"}]
