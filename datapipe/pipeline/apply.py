"""A stage applied to a batch with the run's accounting rules, wherever it runs (a Ray task or actor).

Rejected records pass by untouched; the live ones go to the stage; a stage that raises is
retried one record at a time, so one bad record becomes `<stage>.error` and the batch goes on;
a stage that loses a record without a reject reason stops the run; every record the stage kept
gets its name in `transforms`, and `bytes_in[stage]` records the text size the stage saw and
`busy_us[stage]` its share of the batch's time in the stage (the batch's time split evenly over
the records that came out: stats' time per stage, summed over workers) and `stage_ms[stage]` the
batch's start and end on the wall clock (stats' throughput over time and wall time per stage).
"""
from __future__ import annotations

import json
import time
from functools import lru_cache
from typing import Any, Callable

from datapipe.pipeline import registry
from datapipe.schema import TIMING_FIELDS, Document, docs_from_table, docs_to_table, mark_transform

DERIVED_BITS = 12  # Document.position = record index << 12 | n for the n-th record a stage derives from it
LINE_BREAKS = {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}  # line ends json.dumps leaves raw


@lru_cache(maxsize=32)
def cached_stage(name: str, cfg_json: str) -> Callable:
    return build_stage(registry.stage_module(name).Config.model_validate_json(cfg_json))


def build_stage(cfg) -> Callable:
    """The stage's callable; with `sources`, it sees only their documents and the rest pass by."""
    stage = registry.stage_module(cfg.stage).make_stage(cfg)
    if not cfg.sources:
        return stage
    wanted = set(cfg.sources)

    def on_sources(docs: list[Document]) -> list[Document]:
        taken = [doc for doc in docs if doc["source"] in wanted]
        return (stage(taken) if taken else []) + [doc for doc in docs if doc["source"] not in wanted]

    return on_sources


def apply_stage(stage: Callable, name: str, table):
    """Run a stage on the live documents of an Arrow batch; rejected ones pass by untouched."""
    return docs_to_table(apply_to_documents(stage, name, docs_from_table(table), lambda: docs_from_table(table)))


def apply_to_documents(stage: Callable, name: str, docs: list[Document],
                       fresh: Callable[[], list[Document]]) -> list[Document]:
    """apply_stage on documents in memory. `fresh()` gives the batch again as the stage got it, for
    the one-by-one retry after a stage that failed half-way (and may have changed some records)."""
    dead = [doc for doc in docs if doc["reject"]]
    alive = [doc for doc in docs if not doc["reject"]]
    record_bytes_in(alive, name)
    started, wall_ms = time.perf_counter(), time.time_ns() // 1_000_000
    try:
        out = stage(alive) if alive else []
    except Exception:  # noqa: BLE001 - one bad record must not fail the batch: retry one by one
        again = record_bytes_in([doc for doc in fresh() if not doc["reject"]], name)
        out = [kept for doc in again for kept in run_one(stage, name, doc)]
    check_accounted(name, alive, out)
    record_busy(out, name, time.perf_counter() - started, wall_ms)
    place_derived(out)
    for doc in out:
        if not doc["reject"]:
            mark_transform(doc, name)
    return out + dead


def record_bytes_in(docs: list[Document], name: str) -> list[Document]:
    """bytes_in[stage]: the UTF-8 size a stage saw, for per-stage byte counts in stats.json."""
    for doc in docs:
        doc["bytes_in"][name] = len(doc["text"].encode("utf-8", "surrogatepass"))
    return docs


def record_busy(docs: list[Document], name: str, seconds: float, wall_ms: int) -> None:
    """The batch's `seconds` in stage `name`, begun at `wall_ms` (Unix ms), on each of its records."""
    share = round(seconds * 1e6 / max(len(docs), 1))
    span = [wall_ms, wall_ms + round(seconds * 1000)]
    for doc in docs:
        doc["busy_us"][name] = doc["busy_us"].get(name, 0) + share
        doc["stage_ms"][name] = span


def run_one(stage: Callable, name: str, doc: Document) -> list[Document]:
    try:
        return stage([doc])
    except Exception as err:  # noqa: BLE001 - the error becomes the record's reject reason
        doc["reject"] = f"{name}.error"
        doc["error"] = f"{type(err).__name__}: {err}"[:500]
        return [doc]


def check_accounted(name: str, alive: list[Document], out: list[Document]) -> None:
    missing = {doc["id"] for doc in alive} - {doc["id"] for doc in out}
    if missing:
        raise RuntimeError(f"stage {name!r} dropped {len(missing)} records without a reject reason "
                           f"(for example {sorted(missing)[0]}); a stage sets doc['reject'] instead of dropping")


def reject_line(doc: Document) -> str:
    """A rejects.jsonl line: who, why, the head of the text, then every other field but media, tokens and
    the timings (a rerun's rejects files are byte-identical)."""
    head = {k: doc[k] for k in ("id", "source", "source_id", "kind", "reject", "error")}
    rest = {k: v for k, v in doc.items() if k not in head and k not in ("text", "media", "tokens", *TIMING_FIELDS)}
    return json_line({**head, "text": doc["text"][:2000], **rest})


def json_line(value: Any) -> str:
    """One JSON line, UTF-8 kept readable, with U+0085, U+2028 and U+2029 escaped: raw, they end a line
    for str.splitlines and many JSONL readers, and a web text holding one split its record in two."""
    line = json.dumps(value, ensure_ascii=False)
    for char, escaped in LINE_BREAKS.items():  # str.replace scans in C; str.translate took 0.3 ms a 10 KB line
        line = line.replace(char, escaped)
    return line


def place_derived(docs: list[Document]) -> None:
    """Records a stage made from another (a rewrite) arrive with their parent's position: each gets the
    next free derived index of its record, so (partition, position) stays unique and ordered. Records
    read from a source keep theirs; derived ones keep theirs too while no other record holds it."""
    taken = {(doc["partition"], doc["position"]) for doc in docs if not doc["derived_from"]}
    for doc in docs:
        if not doc["derived_from"]:
            continue
        if (doc["partition"], doc["position"]) in taken:
            base = doc["position"] >> DERIVED_BITS << DERIVED_BITS
            free = next((base + n for n in range(1, 1 << DERIVED_BITS) if (doc["partition"], base + n) not in taken),
                        None)
            if free is None:
                raise RuntimeError(f"record {doc['derived_from']} has more than {(1 << DERIVED_BITS) - 1} derived "
                                   "records; a stage may derive at most that many from one record")
            doc["position"] = free
        taken.add((doc["partition"], doc["position"]))
