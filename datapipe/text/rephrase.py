"""The rephrase stage: Kimi K2's recipe for stretching scarce knowledge and math text.

Each document gets K rewrites (default 2), each in a distinct style from the recipe's style
library; a long document is rewritten chunk by chunk (~256 tokens each), every chunk with the
previous rewritten chunk as context, and stitched back. Every rewritten chunk passes a fidelity
gate (datapipe.llm.fidelity: facts both ways, relations, negation, repeats, token cap, language,
loops, cosine, an optional LLM judge); a failure retries with a spare style, then the rewrite is
rejected under the failed check's name. The stage runs in a Ray actor pool that keeps the model
(or the HTTP client) warm; within a batch every rewrite is its own coroutine (datapipe.llm.rewriter),
so the backend stays busy: keep batch_size x rewrites above the backend's concurrency.

Accounting, nothing dropped quietly: with keep_originals=false the original record becomes its
first passing rewrite (same id, text replaced, provenance in notes["rephrase"]) and the other
passing rewrites are new records whose derived_from names the original. When no rewrite passes
(or the document is over max_chunks), the original is written unchanged (on_failure:
keep_original) unless the recipe says on_failure: reject. Every failed rewrite is a created
record rejected under its reason, its text the rewrite as far as it got, with every attempt's
scores and answer in notes["rephrase"], so rejects.jsonl shows what the gate refused; a passing
rewrite keeps its chunks' scores there too; every rewrite keeps its source's head (the original's
text is gone where a rewrite replaced it), and stats.json keeps a sample of the passed ones with
their scores for the run report (RunStats.rewrites).
With keep_originals=true the original passes unchanged and all K rewrites are created.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from datapipe.llm import make_backend
from datapipe.llm.base import BackendConfig
from datapipe.llm.chunking import count_many, split_many, stitch
from datapipe.llm.fidelity import FidelityConfig
from datapipe.llm.rewriter import Rewriter, RewriteSettings, Slot
from datapipe.llm.styles import StyleConfig, eligible_styles, load_styles, style_order
from datapipe.schema import Document
from datapipe.stage import StageConfig

SOURCE_HEAD = 600  # characters of the source kept in each rewrite's notes (the run report shows them beside it)
CONTEXT_TEMPLATE = ("Here is the previous part of your rewrite, for continuity. Do not repeat it:\n{context}\n\n"
                    "Now rewrite the next part in the same way.\n{text}")


class Config(StageConfig):
    actor: ClassVar[bool] = True
    path_fields: ClassVar[tuple[str, ...]] = ("styles_file",)

    backend: BackendConfig = BackendConfig()
    styles: list[StyleConfig] = Field(default_factory=list)  # the style library, inline; or:
    styles_file: str | None = None  # a YAML file with `styles:` (relative to the recipe)
    rewrites: int = Field(2, ge=1)  # K; K2 found 10 rephrasings x 1 epoch beat 1 x 10 epochs
    keep_originals: bool = False  # true: the original is written too, beside its K rewrites
    chunk_tokens: int = Field(256, ge=16)  # the K2 chunk size: short enough for a small model to keep every fact
    context_chunks: int = Field(1, ge=0)  # previous rewritten chunks shown with each chunk; 0 = independent chunks
    context_template: str = CONTEXT_TEMPLATE  # {context}, then {text}: the style's prompt for this chunk
    max_new_tokens: int = Field(512, ge=1)  # cap per chunk (styles ask budget x chunk tokens)
    max_chunks: int = Field(512, ge=1)  # 512 x 256 = 128K tokens: long documents are rewritten whole; longer ones follow on_failure
    on_failure: Literal["keep_original", "reject"] = "keep_original"  # no rewrite passed: write the original, or reject it
    style_retries: int = Field(1, ge=0)  # spare styles tried after a fidelity failure or an empty answer
    fidelity: FidelityConfig = FidelityConfig()
    # The gate's text checks (~1.5 ms of CPU a chunk) in worker processes, off the event loop that
    # keeps the server full; None = 1 for an HTTP backend (at 200 requests/s they would take 30% of
    # the loop's core), 0 (on the loop) for an in-process model, whose generation dwarfs them.
    gate_processes: int | None = Field(None, ge=0)
    math_sources: list[str] = Field(default_factory=list)  # sources whose documents take the math styles (so do meta.domain == "math")
    kinds: list[str] = Field(default_factory=lambda: ["text"])  # other kinds (code, svg...) and documents with media pass untouched
    batch_size: int = 64  # documents per batch: 64 x 2 rewrites keep a concurrency of 64 busy until the batch's tail

    @model_validator(mode="after")
    def _needs_styles(self) -> Config:
        if not self.styles and not self.styles_file:
            raise ValueError("rephrase needs a style library: `styles:` (a list) or `styles_file:` (a YAML file)")
        for style in self.styles:
            if "{text}" not in style.prompt:
                raise ValueError(f"style {style.name!r}: prompt must contain {{text}}, where the chunk goes")
        return self


@dataclass
class Plan:
    """What the stage does with one document."""

    slots: list[Slot] = field(default_factory=list)
    skip: str = ""  # a document-level reason: empty_text, too_long, no_style
    untouched: bool = False  # not ours to rewrite (code, media)


def make_stage(cfg: Config, backend=None, embedder=None) -> Callable[[list[Document]], list[Document]]:
    """The runner passes only cfg; a caller holding a warm backend or embedder (a benchmark, a test
    that runs several configs) passes them to skip loading the models again."""
    styles = load_styles(cfg.styles, cfg.styles_file)
    backend = backend or make_backend(cfg.backend)
    if cfg.fidelity.min_cosine is None:
        embedder = None
    elif embedder is None:
        embedder = make_embedder()
    judge = cfg.fidelity.judge
    judge_backend = make_backend(judge.backend) if judge is not None and judge.backend is not None else None
    gate_processes = cfg.gate_processes if cfg.gate_processes is not None else int(hasattr(backend, "async_client"))
    rewriter = Rewriter(backend, embedder, RewriteSettings(cfg.fidelity, cfg.context_template, cfg.context_chunks,
                                                           cfg.max_new_tokens, gate_processes), judge_backend)
    provenance = {"backend": backend.name, "model": backend.model}

    def rephrase(docs: list[Document]) -> list[Document]:
        plans = [Plan() for _ in docs]  # filled by plan_longest_first as the rewriter asks for slots
        rewriter.run(plan_longest_first(docs, plans, cfg, styles, backend.count_tokens))
        return [record for doc, plan in zip(docs, plans) for record in records_of(doc, plan, cfg, provenance)]

    rephrase.rewriter = rewriter  # its .stats: the last batch's requests in flight (bench/rephrase_client.py)
    return rephrase


def make_embedder():
    import torch

    from datapipe.llm.embed import Embedder

    return Embedder(device="cuda" if torch.cuda.is_available() else "cpu")


PLAN_GROUP = 16  # the most documents chunked at a time (~35 ms of tokenizer work on web text)


def plan_longest_first(docs: list[Document], plans: list[Plan], cfg: Config, styles, count) -> Iterator[list[Slot]]:
    """Fills plans[i] for each document, longest first, in groups of 1, 2, 4... PLAN_GROUP, yielding
    their slots: the first request goes out once one document is chunked (~3 ms, where a first
    group of 16 took ~60 ms and 64 in flight came at ~0.4 s), and the long documents, whose chains
    of chunks (one latency each) decide when the batch ends, are known first."""
    order = sorted(range(len(docs)), key=lambda i: -len(docs[i]["text"]))
    start, size = 0, 1
    while start < len(order):
        group, start, size = order[start : start + size], start + size, min(2 * size, PLAN_GROUP)
        for i, plan in zip(group, plan_documents([docs[i] for i in group], cfg, styles, count)):
            plans[i] = plan
        yield [slot for i in group for slot in plans[i].slots]


def plan_documents(docs: list[Document], cfg: Config, styles: list[StyleConfig], count) -> list[Plan]:
    """Each document's plan; the texts to rewrite are chunked together (split_many: one tokenizer
    call per level for the batch)."""
    plans, orders = [], []
    for doc in docs:
        plan, order = plan_document(doc, cfg, styles)
        plans.append(plan)
        orders.append(order)
    todo = [i for i, order in enumerate(orders) if order]
    chunked = split_many([docs[i]["text"] for i in todo], cfg.chunk_tokens, count)
    sizes = count_many(chunked, count)
    for i, chunks, chunk_sizes in zip(todo, chunked, sizes):
        if len(chunks) > cfg.max_chunks:
            plans[i] = Plan(skip="too_long")
            continue
        spares = orders[i][cfg.rewrites :]  # one list shared by the slots: a style serves one rewrite only
        plans[i].slots = [Slot(chunks, chunk_sizes, style, spares, cfg.style_retries) for style in orders[i][: cfg.rewrites]]
    return plans


def plan_document(doc: Document, cfg: Config, styles: list[StyleConfig]) -> tuple[Plan, list[StyleConfig]]:
    """The document's plan before chunking, and its styles in order ([] when it is not rewritten)."""
    if doc["kind"] not in cfg.kinds or doc["media"]:
        return Plan(untouched=True), []
    if not doc["text"].strip():
        return Plan(skip="empty_text"), []
    domain = "math" if doc["meta"].get("domain") == "math" or doc["source"] in cfg.math_sources else "knowledge"
    order = style_order(eligible_styles(styles, domain, doc["text"]), doc["id"], cfg.backend.seed)
    return (Plan(), order) if order else (Plan(skip="no_style"), [])


def records_of(doc: Document, plan: Plan, cfg: Config, provenance: dict) -> list[Document]:
    """The original (rewritten, kept or rejected) followed by its created rewrites, failed ones included."""
    if plan.untouched:
        return [doc]
    if plan.skip:
        doc["notes"]["rephrase"] = {"skipped": plan.skip}
        if plan.skip == "empty_text" or cfg.on_failure == "reject":
            doc["reject"] = f"rephrase.{plan.skip}"
        return [doc]
    passed = [slot for slot in plan.slots if not slot.reason]
    failed = [slot for slot in plan.slots if slot.reason]
    first = 0 if cfg.keep_originals or not passed else 1  # the original itself is rewrite 0
    created = []
    for i, slot in enumerate(passed[first:] + failed, start=first):
        created.append(derived_record(doc, i))
        apply_slot(created[-1], slot, i, doc["id"], provenance)
    if passed and not cfg.keep_originals:
        apply_slot(doc, passed[0], 0, doc["id"], provenance)
    elif cfg.keep_originals or cfg.on_failure == "keep_original":
        doc["notes"]["rephrase"] = {"role": "original", "rewrites": [r["id"] for r in created],
                                    **({"no_rewrite_passed": [s.reason for s in failed]} if not passed else {})}
    else:
        doc["reject"] = f"rephrase.{failed[0].reason}"
        doc["notes"]["rephrase"] = {"role": "original", "rewrites": [r["id"] for r in created]}
    return [doc] + created


def derived_record(doc: Document, index: int) -> Document:
    """A new record from `doc`; it starts its own stage history (the stages before were counted on doc)."""
    record = copy.deepcopy({**doc, "tokens": [], "media": [], "transforms": [], "bytes_in": {}, "busy_us": {},
                                "stage_ms": {}})
    record["id"] = f"{doc['id']}#rephrase{index}"
    record["derived_from"] = doc["id"]
    return record


def apply_slot(record: Document, slot: Slot, index: int, source_id: str, provenance: dict) -> None:
    record["notes"]["rephrase"] = {
        "source_id": source_id, "rewrite": index, "style": slot.style.name, **provenance,
        "chunks": len(slot.chunks), "fidelity": slot.scores, "attempts": slot.attempts,
        "output_tokens": slot.output_tokens,
        "source_head": "".join(slot.chunks)[:SOURCE_HEAD],  # the report shows it beside the rewrite
    }
    if slot.reason:
        record["reject"] = f"rephrase.{slot.reason}"
        record["text"] = slot.failed_text
    else:
        record["text"] = stitch(slot.outputs, slot.chunks)
