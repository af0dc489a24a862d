"""The context-length curriculum: which documents each phase packs, and how many tokens.

A recipe's `phases:` lists them in training order (K3: 8K..64K in pre-training,
256K..1M in cooldown). Each phase draws from the whole spilled corpus independently:
  1. policy: a document longer than seq_len is split (default), truncated to seq_len,
     or dropped; one whose media span alone exceeds seq_len cannot be placed whole and
     is left out of the phase;
  2. upsampling: documents of at least `upsample_long.min_tokens` appear `factor` times
     (fractional factors by a seeded coin), so long phases see more long documents;
  3. mixture and budget: each source gets weight/sum(weights) of the phase budget
     (`tokens`, or `fraction` of the corpus tokens, or all there is). The mixture is
     exact: when a source cannot supply its share, the phase shrinks to what that
     source allows (`limited_by` in the stats) rather than drift from the weights;
  4. within a source, copies are taken in a seeded random order until its target.
A document may appear in several phases (and several times in one when upsampled);
the run's accounting counts it once: written if any phase used it, else rejected
with the reason of the phase that came closest to using it (Usage).
"""
from __future__ import annotations

import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from datapipe.packing.bfd import Sequences, SpecialIds, make_sample, media_safe_prefix, pack_pieces, split_pieces
from datapipe.packing.corpus import Corpus
from datapipe.schema import PackedSample

# A phase's outcome per document, from used to farthest from use. When no phase used a document, its
# reject reason is the outcome of the phase that came closest: "over budget" says more budget would use it.
USED, OVER_BUDGET, TOO_LONG, MEDIA_TOO_LONG, NOT_IN_MIXTURE = range(5)
MISS_REASONS = {OVER_BUDGET: "pack.over_budget", NOT_IN_MIXTURE: "pack.not_in_mixture",
                MEDIA_TOO_LONG: "pack.media_span_too_long", TOO_LONG: "pack.too_long"}
RESERVED_NAMES = {"spill", "rejects"}  # folders of out/<run>/ that are not phases
SUFFIXES = {"K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}  # token budgets count like money: 20B = 2e10


class Upsample(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    min_tokens: int = Field(ge=1)  # documents at least this long are repeated...
    factor: float = Field(ge=1.0)  # ...this many times in the phase; 2.5 = twice, a third copy for half of them


class CurriculumPhase(BaseModel):
    """One curriculum phase: its sequence length, budget, source mixture and long-document policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field("main", pattern=r"^[A-Za-z0-9_-]+$")  # shards go to out/<run>/<name>/; keys are <name>-<index>
    seq_len: int = Field(2048, ge=16, le=1 << 24)  # tokens per training sequence
    tokens: int | None = Field(None, ge=1)  # token budget: 20000000000 or "20B"; None = all the mixture allows
    fraction: float | None = Field(None, gt=0, le=1)  # or the budget as a fraction of the corpus tokens
    mixture: dict[str, float] = {}  # weight per source name; {} = every source in its natural proportion
    upsample_long: Upsample | None = None  # repeat long documents (long-context phases)
    long_docs: Literal["split", "truncate", "drop"] = "split"  # documents longer than seq_len
    window: int | None = Field(None, ge=1)  # pieces per best-fit window; None = the whole group (best fill)
    group_tokens: int | None = Field(None, ge=1)  # tokens a packing task packs; None: 2,048 sequences, at most 512M

    @field_validator("tokens", "group_tokens", mode="before")
    @classmethod
    def _parse_budget(cls, value: Any) -> Any:
        match = re.fullmatch(r"\s*([\d.]+(?:e\d+)?)\s*([KMBGT]?)\s*", value, re.I) if isinstance(value, str) else None
        if match:
            return int(float(match[1]) * SUFFIXES.get(match[2].upper(), 1))
        return int(value) if isinstance(value, float) and value.is_integer() else value

    @field_validator("mixture")
    @classmethod
    def _weights(cls, mixture: dict[str, float]) -> dict[str, float]:
        if any(w < 0 for w in mixture.values()) or (mixture and sum(mixture.values()) <= 0):
            raise ValueError("mixture weights must be >= 0 with a positive sum, e.g. {web: 0.7, code: 0.3}")
        return mixture

    @model_validator(mode="after")
    def _one_budget(self) -> CurriculumPhase:
        if self.tokens is not None and self.fraction is not None:
            raise ValueError("give `tokens` or `fraction` as the phase budget, not both")
        return self


def phase_problems(phases: list[CurriculumPhase], source_names: list[str]) -> list[str]:
    """What is wrong between the phases and the recipe's sources (empty when nothing is)."""
    problems, names = [], [phase.name for phase in phases]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"phases: phase name {name!r} is repeated; each phase needs its own name (and folder)")
    for name in sorted(set(names) & RESERVED_NAMES):
        problems.append(f"phases: phase name {name!r} is a folder the run uses; pick another name")
    for i, phase in enumerate(phases):
        for source in sorted(set(phase.mixture) - set(source_names)):
            problems.append(f"phases[{i}].mixture: unknown source {source!r}; sources: {', '.join(source_names)}")
    return problems


@dataclass(frozen=True)
class Targets:
    """A phase's budget over the whole corpus, from every partition's supply (what the policy and
    the upsampling let each source give): the driver computes it from the partitions' summaries."""

    weights: np.ndarray  # float per source: its share of the budget
    budget: float  # the phase's target tokens after the mixture's limits
    limited_by: str  # "" or the source whose supply capped the budget ("corpus" for natural proportions)
    supply: np.ndarray  # float per source: the whole corpus's supply

    def of_group(self, group_supply: np.ndarray) -> np.ndarray:
        """Target tokens per source for a group of partitions: the source's target, shared by supply.
        A single group gets budget x weight exactly (x / x is 1.0 in floating point)."""
        share = np.divide(group_supply, self.supply, out=np.zeros(len(self.supply)), where=self.supply > 0)
        return self.budget * self.weights * share


@dataclass
class Selection:
    """The document copies a phase packs from one group of partitions, and why it left out the others."""

    docs: np.ndarray  # corpus rows, one per copy, in packing order
    lengths: np.ndarray  # tokens each copy contributes (shorter than the document when truncated)
    outcome: np.ndarray  # int8 per corpus row: USED or why this phase left it out
    targets: Targets  # the phase's budget and weights, over the whole corpus
    wanted: np.ndarray  # float per source: this group's target tokens


def phase_targets(phase: CurriculumPhase, source_names: list[str], supply: np.ndarray, corpus_tokens: int) -> Targets:
    weights = mixture_weights(phase, source_names, supply)
    budget, limited_by = phase_budget(phase, source_names, corpus_tokens, supply, weights)
    return Targets(weights, budget, limited_by, np.asarray(supply, dtype=float))


def select_group(phase: CurriculumPhase, corpus: Corpus, seed: int, targets: Targets, group: int = 0) -> Selection:
    """A group's share of the phase: each source's documents in a seeded order up to its target."""
    rng = group_rng(seed, phase.name, group)
    taken, outcome, copies = eligible(phase, corpus, seed)
    wanted = targets.of_group(np.bincount(corpus.source, weights=taken * copies, minlength=len(targets.supply)))
    picked = [pick_copies(np.flatnonzero((corpus.source == s) & (copies > 0)), taken, copies, wanted[s], rng)
              for s, weight in enumerate(targets.weights) if weight > 0]
    docs = rng.permutation(np.concatenate([np.zeros(0, np.int64), *picked]))
    outcome[outcome == USED] = OVER_BUDGET  # eligible, until picked below
    outcome[left_out(phase, corpus.source_names)[corpus.source]] = NOT_IN_MIXTURE  # never a candidate
    outcome[docs] = USED
    return Selection(docs, taken[docs], outcome, targets, wanted)


def select_phase(phase: CurriculumPhase, corpus: Corpus, seed: int) -> Selection:
    """The whole corpus as one group (tests, small jobs)."""
    return select_group(phase, corpus, seed, whole_corpus_targets(phase, corpus, seed))


def whole_corpus_targets(phase: CurriculumPhase, corpus: Corpus, seed: int) -> Targets:
    return phase_targets(phase, corpus.source_names, supply_of(phase, corpus, seed), corpus.total_tokens)


def left_out(phase: CurriculumPhase, source_names: list[str]) -> np.ndarray:
    """bool per source: a mixture that names other sources only. A source of natural weight 0 (every
    document too long, say) keeps its documents' own reasons (pack.too_long...), not this one."""
    return np.array([bool(phase.mixture) and phase.mixture.get(name, 0.0) <= 0 for name in source_names], dtype=bool)


def eligible(phase: CurriculumPhase, corpus: Corpus, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per corpus row: tokens the long-document policy lets it give (0 = left out), why, and its copies."""
    taken, outcome = policy_lengths(phase, corpus)
    return taken, outcome, upsample_copies(phase, corpus, seed) * (taken > 0)


def supply_of(phase: CurriculumPhase, corpus: Corpus, seed: int) -> np.ndarray:
    """Tokens per source (the recipe's order) that this corpus can give the phase."""
    taken, _, copies = eligible(phase, corpus, seed)
    return np.bincount(corpus.source, weights=taken * copies, minlength=len(corpus.source_names))


def phase_rng(seed: int, name: str, stream: int = 0) -> np.random.Generator:
    """A phase's own random stream: adding or reordering phases leaves the others' choices alone."""
    return np.random.default_rng([seed, zlib.crc32(name.encode()), stream])


def group_rng(seed: int, name: str, group: int, stream: int = 0) -> np.random.Generator:
    """A group's own stream; group 0 draws the phase's, as the whole corpus did before groups."""
    if group == 0:
        return phase_rng(seed, name, stream)
    return np.random.default_rng([seed, zlib.crc32(name.encode()), stream, group])


def policy_lengths(phase: CurriculumPhase, corpus: Corpus) -> tuple[np.ndarray, np.ndarray]:
    """Tokens each document contributes under the long-document policy (0 = left out), and why."""
    taken, outcome = corpus.lengths.copy(), np.full(len(corpus.lengths), USED, dtype=np.int8)
    long = corpus.lengths > phase.seq_len
    if phase.long_docs == "drop":
        taken[long], outcome[long] = 0, TOO_LONG
    elif phase.long_docs == "truncate":
        taken[long] = phase.seq_len
    for row, spans in corpus.spans.items():
        if int((spans[:, 1] - spans[:, 0]).max()) > phase.seq_len and outcome[row] == USED:
            taken[row], outcome[row] = 0, MEDIA_TOO_LONG
        elif phase.long_docs == "truncate" and long[row]:
            taken[row] = media_safe_prefix(int(corpus.lengths[row]), phase.seq_len, spans)
    return taken, outcome


def upsample_copies(phase: CurriculumPhase, corpus: Corpus, seed: int) -> np.ndarray:
    """Copies of each row: `factor` for long documents, the fractional part by a coin that is a hash of
    the document's place in the run, so that no grouping of partitions can change it."""
    copies = np.ones(len(corpus.lengths), dtype=np.int64)
    if phase.upsample_long is not None:
        long = corpus.lengths >= phase.upsample_long.min_tokens
        whole, part = divmod(phase.upsample_long.factor, 1.0)
        copies[long] = int(whole) + (coin(seed, phase.name, corpus.partition[long], corpus.position[long]) < part)
    return copies


def coin(seed: int, name: str, partition: np.ndarray, position: np.ndarray) -> np.ndarray:
    """A uniform [0, 1) draw per (partition, position), fixed by (seed, phase name): splitmix64."""
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps, as splitmix64 intends
        z = np.uint64(seed & (2**64 - 1)) ^ (np.uint64(zlib.crc32(name.encode())) << np.uint64(32))
        z = z + partition.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + position.astype(np.uint64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def mixture_weights(phase: CurriculumPhase, names: list[str], supply: np.ndarray) -> np.ndarray:
    """Each source's share of the phase budget; the natural proportions when no mixture is given."""
    weights = np.array([phase.mixture.get(name, 0.0) for name in names]) if phase.mixture else supply.astype(float)
    return weights / weights.sum() if weights.sum() > 0 else weights


def phase_budget(phase: CurriculumPhase, names: list[str], corpus_tokens: int, supply: np.ndarray,
                 weights: np.ndarray) -> tuple[float, str]:
    """The phase's target tokens: what was asked, capped by the scarcest source at its weight."""
    requested = requested_tokens(phase, corpus_tokens)
    missing = [name for name, weight in phase.mixture.items() if weight > 0 and name not in names]
    if missing:
        return 0.0, missing[0]
    active = np.flatnonzero(weights > 0)
    if not len(active):
        return 0.0, ""
    allowed = supply[active] / weights[active]
    scarcest = int(np.argmin(allowed))
    if allowed[scarcest] >= requested:
        return requested, ""
    if not phase.mixture:  # natural proportions: every source runs out at once
        return float(allowed[scarcest]), "corpus" if np.isfinite(requested) else ""
    return float(allowed[scarcest]), names[active[scarcest]]


def requested_tokens(phase: CurriculumPhase, corpus_tokens: int) -> float:
    if phase.tokens is not None:
        return float(phase.tokens)
    return phase.fraction * corpus_tokens if phase.fraction is not None else np.inf


def pick_copies(rows: np.ndarray, taken: np.ndarray, copies: np.ndarray, target: float,
                rng: np.random.Generator) -> np.ndarray:
    """Copies of a source's documents in a seeded order, up to the count whose tokens come closest to target."""
    rows = rng.permutation(np.repeat(rows, copies[rows]))
    cumulative = np.cumsum(taken[rows])
    count = min(int(np.searchsorted(cumulative, target)) + 1, len(rows))
    before = cumulative[count - 2] if count >= 2 else 0
    if count and cumulative[count - 1] - target > target - before:
        count -= 1
    return rows[:count]


def pack_group(phase: CurriculumPhase, corpus: Corpus, seed: int, ids: SpecialIds, targets: Targets, group: int = 0
               ) -> tuple[Selection, Sequences, Iterator[PackedSample]]:
    """Select, split and pack a group's share of a phase; the samples come lazily, in a seeded
    shuffled order, keyed <phase>-<index> with the group in the index's leading digits."""
    selection = select_group(phase, corpus, seed, targets, group)
    pieces = split_pieces(selection.docs, selection.lengths, phase.seq_len, corpus.spans)
    sequences = pack_pieces(pieces, phase.seq_len, phase.window)
    order = group_rng(seed, phase.name, group, stream=1).permutation(sequences.num_sequences)
    samples = (make_sample(sample_key(phase.name, group, index), corpus, sequences, int(b), phase.seq_len, ids)
               for index, b in enumerate(order))
    return selection, sequences, samples


def sample_key(phase: str, group: int, index: int) -> str:
    """<phase>-<index>: group 0's indices are 000000000..., group g's g000000000... (a group packs fewer)."""
    return f"{phase}-{group * 10**9 + index:09d}"


def pack_phase(phase: CurriculumPhase, corpus: Corpus, seed: int, ids: SpecialIds
               ) -> tuple[Selection, Sequences, Iterator[PackedSample]]:
    """The whole corpus as one group (tests, small jobs)."""
    return pack_group(phase, corpus, seed, ids, whole_corpus_targets(phase, corpus, seed))


class Usage:
    """Per corpus document, across phases: copies packed, and the closest a phase came to using it."""

    def __init__(self, num_docs: int):
        self.uses = np.zeros(num_docs, dtype=np.int64)
        self.miss = np.full(num_docs, NOT_IN_MIXTURE, dtype=np.int8)

    def record(self, selection: Selection) -> None:
        self.uses += np.bincount(selection.docs, minlength=len(self.uses))
        self.miss = np.minimum(self.miss, np.where(selection.outcome == USED, NOT_IN_MIXTURE, selection.outcome))

    def unused(self) -> Iterator[tuple[int, str]]:
        """(row, reject reason) of every document that no phase packed."""
        for row in np.flatnonzero(self.uses == 0).tolist():
            yield row, MISS_REASONS[int(self.miss[row])]


ADDITIVE = ("samples", "shards", "tokens", "docs", "copies", "pieces", "split_docs", "truncated_docs",
            "truncated_tokens", "dropped_too_long", "left_out_media_span_too_long")  # summed over groups


def group_stats(phase: CurriculumPhase, corpus: Corpus, selection: Selection, sequences: Sequences,
                shards: list[dict[str, Any]]) -> dict[str, Any]:
    """What one group of a phase wrote: the additive figures of stats.json `phases.<name>` (a document
    lives in one group, so distinct documents add up too), and its tokens per source."""
    cut = corpus.lengths[selection.docs] - selection.lengths
    unique_docs = len(np.unique(selection.docs))
    source_tokens = np.bincount(corpus.source[selection.docs], weights=selection.lengths,
                                minlength=len(corpus.source_names))
    return {
        "samples": sum(shard["samples"] for shard in shards), "shards": len(shards),
        "tokens": sum(shard["tokens"] for shard in shards), "docs": unique_docs, "copies": len(selection.docs),
        "pieces": len(sequences.pieces.length), "split_docs": int((selection.lengths > phase.seq_len).sum()),
        "truncated_docs": int((cut > 0).sum()), "truncated_tokens": int(cut.sum()),
        "dropped_too_long": int((selection.outcome == TOO_LONG).sum()),
        "left_out_media_span_too_long": int((selection.outcome == MEDIA_TOO_LONG).sum()),
        "source_tokens": [int(tokens) for tokens in source_tokens],
    }


def phase_stats(phase: CurriculumPhase, targets: Targets, source_names: list[str], groups: list[dict[str, Any]],
                wall_s: float) -> dict[str, Any]:
    """What a phase wrote, against what it was asked for (stats.json `phases.<name>`), from its groups'."""
    totals = {key: sum(group[key] for group in groups) for key in ADDITIVE}
    tokens = np.sum([group["source_tokens"] for group in groups], axis=0) if groups else np.zeros(len(source_names))
    capacity = totals["samples"] * phase.seq_len
    return {
        "seq_len": phase.seq_len, **{key: totals[key] for key in ("samples", "shards", "tokens")},
        "fill": totals["tokens"] / capacity if capacity else 0.0, "docs": totals["docs"], "copies": totals["copies"],
        "upsampled_copies": totals["copies"] - totals["docs"],
        **{key: totals[key] for key in ADDITIVE[6:]}, "long_docs": phase.long_docs,
        "budget": {"requested": phase.tokens or (f"{phase.fraction:g} of corpus" if phase.fraction else None),
                   "target": round(targets.budget), "limited_by": targets.limited_by},
        "sources": source_entries(source_names, targets, tokens), "groups": len(groups), "wall_s": round(wall_s, 2),
    }


def source_stats(corpus: Corpus, selection: Selection) -> dict[str, dict[str, Any]]:
    """The `sources` part of a phase's stats for one selection (tests, single-group runs)."""
    tokens = np.bincount(corpus.source[selection.docs], weights=selection.lengths, minlength=len(corpus.source_names))
    return source_entries(corpus.source_names, selection.targets, tokens)


def source_entries(names: list[str], targets: Targets, tokens: np.ndarray) -> dict[str, dict[str, Any]]:
    """Per source: tokens packed, its target (budget x weight) and weight; sources with neither left out."""
    return {name: {"tokens": int(tokens[s]), "target": round(targets.budget * targets.weights[s]),
                   "weight": round(float(targets.weights[s]), 6)}
            for s, name in enumerate(names) if targets.weights[s] > 0 or tokens[s] > 0}
