"""Chunk-wise autoregressive rewriting with a fidelity gate, every rewrite its own coroutine.

Each of a document's K rewrites is a Slot: one style walking the document's chunks in order,
every request carrying the previous rewritten chunk(s) as context, as Kimi K2 rewrote long
documents so that the pieces read as one text. Each slot is a coroutine: it sends its next chunk
as soon as the previous one is back, while the gate judges that one, so a slow answer holds only
its own document and the backend client keeps `concurrency` requests in flight, the longest
chains of chunks still to go first (chain_priority; datapipe.llm.client). The gate (datapipe.llm.fidelity) runs its text checks in a worker
process (~1.5 ms of CPU a chunk that would hold the event loop: 30% of its core at 200 requests/s),
the embedder in a worker thread, the LLM judge as one more request; then the slot advances,
retries with a spare style (from chunk 0: a style change mid-document would not read as one
text, and the request already sent after the failed answer is cancelled), or fails with the
first failed check's name.
"""
from __future__ import annotations

import asyncio
import logging
import math
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field

from datapipe.llm import fidelity
from datapipe.llm.base import EMPTY_RESPONSE, BackendError, Completion, Request
from datapipe.llm.client import Gathered, make_client
from datapipe.llm.styles import StyleConfig

log = logging.getLogger(__name__)
RETRYABLE = {EMPTY_RESPONSE, *fidelity.CHECKS}  # another style may do better; overflow and server errors won't


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
    attempts: list[dict] = field(default_factory=list)  # styles that failed: why, every score, the answer in full
    output_tokens: int = 0
    reason: str = ""  # the final failure (a fidelity check's name, "backend_error"...), "" on success
    failed_text: str = ""  # the rewrite as far as it got, with the answer that failed: for the rejects file
    done: bool = False


@dataclass
class RewriteSettings:
    fidelity: fidelity.FidelityConfig
    context_template: str  # {context}: previous rewritten chunk(s); {text}: the style's prompt for this chunk
    context_chunks: int = 1  # how many previous rewritten chunks ride along as context
    max_new_tokens: int = 512  # cap per chunk, whatever the style's length budget says
    gate_processes: int = 0  # worker processes for the text checks; 0 = on the event loop


class Rewriter:
    def __init__(self, backend, embedder, settings: RewriteSettings, judge_backend=None):
        self.backend = backend
        self.embedder = embedder  # None when the cosine check is off
        self.judge_backend = judge_backend or backend  # used only when settings.fidelity.judge is set
        self.settings = settings
        self.stats: dict = {}  # the last run's requests in flight (datapipe.llm.client.Flight)
        self.pool: list = []  # the gate's worker processes (GateProcess), started at the first batch, kept warm
        weakref.finalize(self, close_all, self.pool)  # a stage that is dropped (a test's) ends its workers

    def run(self, planned: Iterable[list[Slot]]) -> None:
        """Every slot to its end; a BackendError (the circuit breaker) stops the run. `planned`
        yields the slots a few documents at a time, most important first (the stage: longest
        first); it runs in a worker thread while the slots it already gave are being rewritten,
        so the first requests go out after a few documents are chunked, not the whole batch."""
        asyncio.run(self.run_async(planned))

    async def run_async(self, planned: Iterable[list[Slot]]) -> None:
        client = make_client(self.backend)
        judge = make_client(self.judge_backend) if self.judge_backend is not self.backend else client
        cosine = Gathered(self.cosines) if self.embedder else None
        gate = Gathered(self.check_batch) if self.settings.gate_processes else None
        parts = iter(planned)
        try:
            async with asyncio.TaskGroup() as group:
                while (slots := await asyncio.to_thread(next, parts, None)) is not None:
                    for slot in slots:
                        group.create_task(self.rewrite(slot, client, judge, cosine, gate))
        except* BackendError as errors:
            raise errors.exceptions[0] from None
        finally:
            for closing in {client, judge, *[helper for helper in (cosine, gate) if helper]}:
                await closing.close()
        self.stats = client.flight.stats()
        log.info("rephrase: %s", self.stats)

    def check_batch(self, items: list[tuple]) -> list[fidelity.Verdict]:
        """fidelity.check for each item, shared among the gate's worker processes (datapipe.llm.gate)."""
        from datapipe.llm.gate import GateProcess

        if not self.pool:
            self.pool.extend(GateProcess() for _ in range(self.settings.gate_processes))
        share = -(-len(items) // len(self.pool))
        workers = list(zip(self.pool, [items[start : start + share] for start in range(0, len(items), share)]))
        for worker, part in workers:  # every part out first, so the workers check at once
            worker.send(self.settings.fidelity, part)
        return [verdict for worker, _ in workers for verdict in worker.receive()]

    def cosines(self, pairs: list[tuple[str, str]]) -> list[float]:
        return self.embedder.cosine([source for source, _ in pairs], [rewrite for _, rewrite in pairs])

    async def rewrite(self, slot: Slot, client, judge, cosine, gate) -> None:
        while not slot.done:
            await self.walk(slot, client, judge, cosine, gate)

    async def walk(self, slot: Slot, client, judge, cosine, gate) -> None:
        """The slot's style from its next chunk to its end or its first failure. Chunk k+1 goes out
        as soon as chunk k's answer is back, while the gate judges that answer: its context is that
        answer either way, and the gate passes most answers; one it fails cancels the request after
        it. So the gate's latency (a worker process, an embedder, a judge request) is off the
        request path: a batch of gate work that waits for a core no longer empties the server."""
        k = len(slot.outputs)
        request, context = self.request(slot, slot.outputs)
        sent = asyncio.ensure_future(client.complete(request))
        while True:
            completion = await sent
            if completion.error:
                self.retry_or_fail(slot, completion.error, completion.detail, answer=completion.text)
                return
            verdict = asyncio.ensure_future(self.judge(slot, k, completion, context, judge, cosine, gate))
            if k + 1 < len(slot.chunks):
                request, next_context = self.request(slot, [*slot.outputs, completion.text])
                sent = asyncio.ensure_future(client.complete(request))
            try:
                passed = await verdict
            except BaseException:
                sent.cancel()
                raise
            slot.output_tokens += completion.output_tokens
            self.advance(slot, completion.text, passed)
            if passed.failed or slot.done:
                sent.cancel()  # a failed answer: the next chunk's request carried it as context
                return
            k, context = k + 1, next_context

    def request(self, slot: Slot, outputs: list[str]) -> tuple[Request, str]:
        """The request for chunk len(outputs), the rewritten chunks before it as its context."""
        k = len(outputs)
        text = slot.style.prompt.format(text=slot.chunks[k])
        context = "\n\n".join(outputs[-self.settings.context_chunks :]) if k and self.settings.context_chunks else ""
        if context:
            text = self.settings.context_template.format(context=context, text=text)
        budget = math.ceil(slot.style.length_budget * slot.chunk_tokens[k]) + 16
        messages = [{"role": "system", "content": slot.style.system}, {"role": "user", "content": text}]
        request = Request(messages, min(budget, self.settings.max_new_tokens), slot.style.temperature, slot.style.top_p,
                          chain_priority(slot, k))
        return request, context

    async def judge(self, slot: Slot, k: int, completion: Completion, context: str, judge, cosine, gate) -> fidelity.Verdict:
        """The text checks first (in the gate's worker process, or here); the embedding in its worker
        thread; the LLM judge last (it costs a request), each only for an answer that passed the
        checks before it."""
        cfg, source = self.settings.fidelity, slot.chunks[k]
        target = "en" if slot.style.non_english_only else None  # the translating styles write English
        item = (source, completion.text, context, completion.finish_reason, target)
        verdict = await gate(item) if gate else fidelity.check_many(cfg, [item])[0]
        if not verdict.failed and cosine is not None:
            fidelity.add_cosine(verdict, round(await cosine((source, completion.text)), 4), cfg)
        if not verdict.failed and cfg.judge is not None:
            answer = await judge.complete(Request(fidelity.judge_messages(source, completion.text, cfg.judge),
                                                  cfg.judge.max_new_tokens, 0.0, priority=chain_priority(slot, k)))
            fidelity.add_judge(verdict, answer.text if not answer.error else f"error: {answer.error}", cfg.judge)
        return verdict

    def advance(self, slot: Slot, text: str, verdict: fidelity.Verdict) -> None:
        if verdict.failed:
            self.retry_or_fail(slot, verdict.reason, verdict.detail(), verdict.scores, text)
            return
        slot.outputs.append(text)
        slot.scores.append(verdict.scores)
        slot.done = len(slot.outputs) == len(slot.chunks)

    def retry_or_fail(self, slot: Slot, reason: str, detail: str, scores: dict | None = None, answer: str = "") -> None:
        attempt = {"style": slot.style.name, "reason": reason, "chunk": len(slot.outputs), "detail": detail}
        slot.attempts.append({**attempt, "scores": scores, "answer": answer} if scores else attempt)
        if reason in RETRYABLE and slot.retries_left > 0 and slot.spares:
            slot.style = slot.spares.pop(0)
            slot.retries_left -= 1
            slot.outputs, slot.scores = [], []
            return
        slot.reason, slot.done = reason, True
        slot.failed_text = "\n\n".join([*slot.outputs, answer]).strip()


def chain_priority(slot: Slot, k: int) -> int:
    """Request.priority of chunk k: minus the chunks its rewrite has left, that one included, so
    the longest chain of answers still to wait for goes first (Hu's rule, optimal for unit tasks
    in chains). Ranking by the document's place in the batch let the last-started documents'
    chains of 4-5 chunks trail with a few requests in flight: 6.2 s instead of 5.6 s for 1,126
    requests at 64 x 300 ms, in a simulation and in bench/rephrase_client.py."""
    return k - len(slot.chunks)


def close_all(workers: list) -> None:
    for worker in workers:
        worker.close()
