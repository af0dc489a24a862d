"""Run accounting: every record counted once, per source, stage, reason, language and length.

Every record that leaves the plan is counted exactly once: as written (packed into a
sample) or rejected under its reason. Records made by a stage (a rewrite, a render)
carry Document.derived_from and count as created, so for every run
records_in + created == written + rejected; `balanced` in stats.json says it held.

Per stage, documents in = kept + rejected, with their UTF-8 bytes as the stage saw them
(Document.bytes_in, set by the runner); per reject reason (one per filter rule), the
documents and bytes it dropped; the languages of written documents (Document.language,
"unknown" where no langid stage ran); redactions by kind (Document.pii); histograms of text
length in characters, written and rejected, and in UTF-8 bytes before and after the stages; per stage the worker seconds spent in
it (Document.busy_us, summed over workers: stage_busy_s, the report's time per stage); and per
stage its first batch's start, its last batch's end, and the records and tokens through it
(Document.stage_ms: stage_times, four numbers a stage whatever the corpus; stage_wall_s, and the
runner's throughput over time, datapipe.pipeline.timeline); and a sample of the rewrites that
passed the rephrase stage's fidelity gate with their scores (rewrites: the run report's, since
the shards keep tokens, not notes).
"""
from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from datapipe.pipeline.timeline import add_times
from datapipe.schema import Document

LENGTH_BUCKETS = (64, 256, 1024, 4096, 16384, 65536, 262144)  # characters; x4 steps from a tweet to a book chapter
COUNTERS = ("records_in", "unopened", "created", "written", "rejected", "stage_passed", "stage_rejected", "stage_bytes_in",
            "stage_bytes_rejected", "rejected_bytes", "languages", "pii", "busy_us",
            "rewrite_styles")  # RunStats' Counter attributes
UNKNOWN_LANGUAGE = "unknown"  # the languages entry of documents no langid stage labelled
UNOPENED = ("read.missing_file", "read.unreadable_file")  # a reader could not open its input (or a file it names)
REWRITES_KEPT = 12  # passed rewrites kept with their fidelity scores (the first by id): the report's sample, ~12 KB
TEXT_HEAD = 600  # characters of a kept rewrite's text


class RunStats:
    def __init__(self, recipe_name: str):
        self.recipe_name = recipe_name
        self.started = time.monotonic()
        self.records_in: Counter[str] = Counter()  # by source
        self.unopened: Counter[str] = Counter()  # by source: UNOPENED rejects (check.check_read reads it)
        self.created: Counter[str] = Counter()  # by source
        self.written: Counter[str] = Counter()  # by source
        self.rejected: Counter[str] = Counter()  # by reason
        self.stage_passed: Counter[str] = Counter()  # by stage: records it kept
        self.stage_rejected: Counter[str] = Counter()  # by stage: records it rejected
        self.stage_bytes_in: Counter[str] = Counter()  # by stage: UTF-8 bytes of the records it saw
        self.stage_bytes_rejected: Counter[str] = Counter()  # by stage: bytes of the records it rejected
        self.rejected_bytes: Counter[str] = Counter()  # by reason
        self.languages: Counter[str] = Counter()  # written records by Document.language
        self.lengths = {"written": Counter(), "rejected": Counter(),  # by length_bucket(len(text)), characters
                        "before": Counter(), "after": Counter()}  # UTF-8 bytes as the first stage saw a record read,
        # and as the last one saw a record that passed them all (before packing's choice): what cleaning did
        self.pii: Counter[str] = Counter()  # redactions by kind (Document.pii, set by the pii stage)
        self.busy_us: Counter[str] = Counter()  # by stage: worker microseconds spent in it (Document.busy_us)
        self.stage_times: dict[str, list[int]] = {}  # by stage: [first start ms, last end ms, records, tokens]
        self.rewrites: list[dict[str, Any]] = []  # passed rewrites and their scores, REWRITES_KEPT at most
        self.rewrite_styles: Counter[str] = Counter()  # passed rewrites by style (all of them)
        self.tokens = 0
        self.phases: dict[str, Any] = {}  # by curriculum phase: what it packed (curriculum.phase_stats)
        self.wall_s = 0.0

    def count(self, doc: Document) -> None:
        origin = self.created if doc["derived_from"] else self.records_in
        origin[doc["source"]] += 1
        if doc["reject"] in UNOPENED:
            self.unopened[doc["source"]] += 1
        self.stage_passed.update(doc["transforms"])
        self.stage_bytes_in.update(doc["bytes_in"])
        self.pii.update(doc["pii"])
        self.busy_us.update(doc["busy_us"])
        self.count_times(doc)
        self.count_cleaning(doc)
        if doc["reject"]:
            stage = doc["reject"].split(".", 1)[0]
            size = doc["bytes_in"].get(stage) or len(doc["text"].encode("utf-8", "surrogatepass"))
            self.count_rejected(doc["reject"], size, len(doc["text"]))
        else:
            self.written[doc["source"]] += 1
            self.tokens += len(doc["tokens"])
            self.languages[doc["language"] or UNKNOWN_LANGUAGE] += 1
            self.lengths["written"][length_bucket(len(doc["text"]))] += 1
            self.keep_rewrite(doc)

    def count_cleaning(self, doc: Document) -> None:
        sizes = list(doc["bytes_in"].values())  # in stage order
        if sizes and not doc["derived_from"]:
            self.lengths["before"][length_bucket(sizes[0])] += 1
        if sizes and not doc["reject"]:
            self.lengths["after"][length_bucket(sizes[-1])] += 1

    def count_times(self, doc: Document) -> None:
        """The document in the time span of each stage it went through; its tokens count for the stages
        from the one that made them (tokenize) on."""
        transforms = doc["transforms"]
        tokenized = set(transforms[transforms.index("tokenize"):]) if "tokenize" in transforms else set()
        for stage, (start, end) in doc["stage_ms"].items():
            add_times(self.stage_times, stage, [start, end, 1, len(doc["tokens"]) if stage in tokenized else 0])

    def keep_rewrite(self, doc: Document) -> None:
        """A rewrite that passed the fidelity gate (notes["rephrase"] with scores), into the sample."""
        note = doc["notes"].get("rephrase", {})
        if note.get("fidelity"):
            self.rewrite_styles[note["style"]] += 1
            self.add_rewrites([{"id": doc["id"], "source_id": note["source_id"], "style": note["style"],
                                "chunks": note["chunks"], "scores": mean_scores(note["fidelity"]),
                                "source_head": note.get("source_head", ""), "text_head": doc["text"][:TEXT_HEAD]}])

    def add_rewrites(self, rewrites: list[dict[str, Any]]) -> None:
        """The first REWRITES_KEPT by id of those kept and `rewrites`: the same sample in any merge order."""
        merged = {rewrite["id"]: rewrite for rewrite in [*self.rewrites, *rewrites]}
        self.rewrites = [merged[key] for key in sorted(merged)[:REWRITES_KEPT]]

    def counters(self) -> dict[str, Any]:
        """Every figure count() and reject_late() change, as plain dicts: what a worker sends back for
        the records it handled, and add() merges on the driver (sums, and the stage times' spans widen)."""
        return {**{name: dict(getattr(self, name)) for name in COUNTERS},
                "lengths": {side: dict(counts) for side, counts in self.lengths.items()}, "tokens": self.tokens,
                "stage_times": {stage: list(times) for stage, times in self.stage_times.items()},
                "rewrites": list(self.rewrites)}

    def add(self, counters: dict[str, Any]) -> None:
        for name in COUNTERS:
            getattr(self, name).update(counters.get(name, {}))
        for side, counts in counters.get("lengths", {}).items():
            self.lengths[side].update(counts)
        self.tokens += counters.get("tokens", 0)
        for stage, times in counters.get("stage_times", {}).items():
            add_times(self.stage_times, stage, times)
        self.add_rewrites(counters.get("rewrites", []))

    def reject_late(self, record: dict[str, Any], reason: str, num_tokens: int) -> None:
        """A document counted as written that packing could not use after all (too long, over budget):
        every written figure count() gave it moves to the rejected side. `record` is the spill's
        description of it (datapipe.packing.corpus.Corpus.describe: source, language, text_chars, text_bytes)."""
        self.written[record["source"]] -= 1
        self.tokens -= num_tokens
        self.languages[record["language"] or UNKNOWN_LANGUAGE] -= 1
        self.lengths["written"][length_bucket(record["text_chars"])] -= 1
        self.count_rejected(reason, record["text_bytes"], record["text_chars"])

    def count_rejected(self, reason: str, size: int, chars: int) -> None:
        """One rejected document: under its reason and its stage (the reason's prefix), `size`
        UTF-8 bytes and `chars` characters of text."""
        stage = reason.split(".", 1)[0]
        self.rejected[reason] += 1
        self.rejected_bytes[reason] += size
        self.stage_rejected[stage] += 1
        self.stage_bytes_rejected[stage] += size
        self.lengths["rejected"][length_bucket(chars)] += 1

    @property
    def balanced(self) -> bool:
        return self.records_in.total() + self.created.total() == self.written.total() + self.rejected.total()

    def finish(self) -> None:
        self.wall_s = time.monotonic() - self.started

    def to_dict(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe_name,
            "records_in": dict(self.records_in),
            "created": dict(self.created),
            "written": dict(self.written),
            "rejected": dict(self.rejected.most_common()),
            "rejected_bytes": dict(self.rejected_bytes.most_common()),
            "stages": {s: self.stage_counts(s) for s in self.stage_names()},
            "rules": self.rule_counts(),
            "pii_redactions": dict(self.pii.most_common()),
            "languages": dict((+self.languages).most_common()),  # + drops languages whose documents all left late
            "length_histogram": {k: ordered_buckets(v) for k, v in self.lengths.items()},
            "tokens": self.tokens,
            "stage_busy_s": {stage: round(us / 1e6, 3) for stage, us in self.busy_us.items()},  # summed over workers
            "stage_wall_s": self.stage_wall_s(),
            "rewrite_styles": dict(self.rewrite_styles.most_common()),  # rewrites that passed the gate, by style
            "rewrites": self.rewrites,  # passed rewrites, the first REWRITES_KEPT by id, with their fidelity scores
            "phases": self.phases,
            "balanced": self.balanced,
            "wall_s": round(self.wall_s, 2),
        }

    def stage_wall_s(self) -> dict[str, float]:
        """Per stage, in pipeline order, seconds from its first batch's start to its last batch's end."""
        order = ["read", *self.stage_names()]  # read is in stage_names only when it rejected a record
        names = sorted(self.stage_times, key=lambda name: order.index(name) if name in order else len(order))
        return {name: round((self.stage_times[name][1] - self.stage_times[name][0]) / 1000, 3) for name in names}

    def stage_names(self) -> list[str]:
        """Stages in pipeline order: reading first, then as records list them."""
        names = dict.fromkeys([*self.stage_passed, *self.stage_rejected])
        return sorted(names, key=lambda name: name != "read")  # stable: the rest keep their order

    def stage_counts(self, stage: str) -> dict[str, int]:
        kept, rejected = self.stage_passed[stage], self.stage_rejected[stage]
        if stage == "read":  # not a recipe stage: every record in passed it, or was rejected by it
            kept = self.records_in.total() - rejected
        bytes_in, bytes_rejected = self.stage_bytes_in[stage], self.stage_bytes_rejected[stage]
        return {"in": kept + rejected, "kept": kept, "rejected": rejected, "bytes_in": bytes_in,
                "bytes_kept": max(bytes_in - bytes_rejected, 0), "bytes_rejected": bytes_rejected}

    def rule_counts(self) -> dict[str, dict[str, int]]:
        """Per filter rule group ("quality.c4"), documents and bytes in, kept and dropped.

        Groups run in the stage module's RULE_ORDER and the first failure rejects, so a group's
        input is the stage's input less what the groups before it dropped."""
        from datapipe.pipeline import registry

        rules = {}
        for stage in self.stage_names():
            order = getattr(registry.stage_module(stage), "RULE_ORDER", ()) if stage in registry.STAGES else ()
            docs_in, bytes_in = self.stage_counts(stage)["in"], self.stage_bytes_in[stage]
            for group in order:
                prefix = f"{stage}.{group}."
                dropped = sum(n for reason, n in self.rejected.items() if reason.startswith(prefix))
                dropped_bytes = sum(n for reason, n in self.rejected_bytes.items() if reason.startswith(prefix))
                rules[f"{stage}.{group}"] = {"in": docs_in, "kept": docs_in - dropped, "dropped": dropped,
                                             "bytes_in": bytes_in, "bytes_kept": max(bytes_in - dropped_bytes, 0),
                                             "bytes_dropped": dropped_bytes}
                docs_in, bytes_in = docs_in - dropped, max(bytes_in - dropped_bytes, 0)
        return rules

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2))


def mean_scores(chunks: list[dict[str, float]]) -> dict[str, float]:
    """Each fidelity check's score, averaged over a rewrite's chunks (every chunk passed the gate)."""
    checks = dict.fromkeys(check for scores in chunks for check in scores)
    return {check: round(sum(s.get(check, 0) for s in chunks) / len(chunks), 4) for check in checks}


def length_bucket(n_chars: int) -> str:
    """A histogram label: "<64", "64-256", ..., ">=262144" characters."""
    lower = 0
    for upper in LENGTH_BUCKETS:
        if n_chars < upper:
            return f"<{upper}" if lower == 0 else f"{lower}-{upper}"
        lower = upper
    return f">={lower}"


def length_labels() -> list[str]:
    """Every histogram label, shortest first."""
    return [length_bucket(0)] + [length_bucket(edge) for edge in LENGTH_BUCKETS]


def ordered_buckets(counts: Counter) -> dict[str, int]:
    return {label: counts[label] for label in length_labels() if counts[label]}
