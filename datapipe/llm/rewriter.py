"""Chunk-wise autoregressive rewriting with a fidelity gate, batched across documents.

Each of a document's K rewrites is a Slot: one style walking the document's chunks in order,
every request carrying the previous rewritten chunk(s) as context, as Kimi K2 rewrote long
documents so that the pieces read as one text. The Rewriter runs rounds: every unfinished slot
of the batch contributes its next chunk, all of them go to the backend as one batch, every answer
is scored against its source chunk, and each slot then advances, retries with a spare style
(from chunk 0: a style change mid-document would not read as one text), or fails with a reason.
A batch of 16 documents x 2 rewrites keeps 32 requests in flight per round.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

from datapipe.llm import fidelity
from datapipe.llm.base import EMPTY_RESPONSE, Backend, Completion, Request
from datapipe.llm.styles import StyleConfig

FIDELITY_LOW = "fidelity_low"
COPIED = "copied"  # the only failed check was overlap: the model echoed its input
log = logging.getLogger(__name__)
RETRYABLE = {EMPTY_RESPONSE, FIDELITY_LOW, COPIED}  # another style may do better; overflow and server errors won't


@dataclass
class Slot:
    """One rewrite of one document, in progress."""

    chunks: list[str]  # the source chunks; "".join(chunks) is the document
    chunk_tokens: list[int]
    style: StyleConfig
    spares: list[StyleConfig]  # shared by the document's slots, so their styles stay distinct
    retries_left: int
    outputs: list[str] = field(default_factory=list)  # rewritten chunks so far
    scores: list[dict] = field(default_factory=list)  # fidelity scores of those chunks
    attempts: list[dict] = field(default_factory=list)  # styles that failed, with why
    output_tokens: int = 0
    reason: str = ""  # the final failure ("fidelity_low", "backend_error"...), "" on success
    done: bool = False


@dataclass
class RewriteSettings:
    fidelity: fidelity.FidelityConfig
    context_template: str  # {context}: previous rewritten chunk(s); {text}: the style's prompt for this chunk
    context_chunks: int = 1  # how many previous rewritten chunks ride along as context
    max_new_tokens: int = 512  # cap per chunk, whatever the style's length budget says


class Rewriter:
    def __init__(self, backend: Backend, embedder, settings: RewriteSettings):
        self.backend = backend
        self.embedder = embedder  # None when the cosine check is off
        self.settings = settings

    def run(self, slots: list[Slot]) -> None:
        """Rounds until every slot has finished or failed."""
        while active := [slot for slot in slots if not slot.done]:
            started = time.monotonic()
            completions = self.backend.generate([self.request(slot) for slot in active])
            self.judge(active, completions)
            log.info("rephrase round: %d requests, %d output tokens, %.1f s", len(active),
                     sum(c.output_tokens for c in completions), time.monotonic() - started)

    def request(self, slot: Slot) -> Request:
        k = len(slot.outputs)
        text = slot.style.prompt.format(text=slot.chunks[k])
        if k and self.settings.context_chunks:
            context = "\n\n".join(slot.outputs[-self.settings.context_chunks :])
            text = self.settings.context_template.format(context=context, text=text)
        budget = math.ceil(slot.style.length_budget * slot.chunk_tokens[k]) + 16
        messages = [{"role": "system", "content": slot.style.system}, {"role": "user", "content": text}]
        return Request(messages, min(budget, self.settings.max_new_tokens), slot.style.temperature, slot.style.top_p)

    def judge(self, slots: list[Slot], completions: list[Completion]) -> None:
        answered = [(slot, c) for slot, c in zip(slots, completions) if not c.error]
        sources = [slot.chunks[len(slot.outputs)] for slot, _ in answered]
        rewrites = [c.text for _, c in answered]
        cosines = self.embedder.cosine(sources, rewrites) if self.embedder else [None] * len(answered)
        for (slot, completion), source, cosine in zip(answered, sources, cosines):
            slot.output_tokens += completion.output_tokens
            scores = fidelity.score(source, completion.text, cosine)
            self.advance(slot, completion.text, scores, fidelity.failures(scores, self.settings.fidelity))
        for slot, completion in zip(slots, completions):
            if completion.error:
                self.retry_or_fail(slot, completion.error, completion.detail)

    def advance(self, slot: Slot, text: str, scores: dict, failed: list[str]) -> None:
        if failed:
            reason = COPIED if all(f.startswith("overlap") for f in failed) else FIDELITY_LOW
            self.retry_or_fail(slot, reason, "; ".join(failed), scores)
            return
        slot.outputs.append(text)
        slot.scores.append(scores)
        slot.done = len(slot.outputs) == len(slot.chunks)

    def retry_or_fail(self, slot: Slot, reason: str, detail: str, scores: dict | None = None) -> None:
        attempt = {"style": slot.style.name, "reason": reason, "chunk": len(slot.outputs), "detail": detail}
        slot.attempts.append({**attempt, "scores": scores} if scores else attempt)
        if reason in RETRYABLE and slot.retries_left > 0 and slot.spares:
            slot.style = slot.spares.pop(0)
            slot.retries_left -= 1
            slot.outputs, slot.scores = [], []
            return
        slot.reason, slot.done = reason, True
