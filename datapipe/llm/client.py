"""Asynchronous requests to a backend: one coroutine per request, up to `concurrency` in flight.

The rephrase stage awaits one completion per chunk; a document's next chunk goes out as soon as
its previous chunk is back and judged, while the other documents' chunks fill the gaps, so the
server sees a steady `concurrency` requests instead of rounds that wait for their slowest member.
- HTTP backends get their own async client (datapipe.llm.openai_http.OpenAIClient);
- in-process backends (local transformers, vLLM) are wrapped in a Batcher: the requests waiting
  at that moment go to one generate() call in a worker thread, while the next batch gathers;
- Limit admits `concurrency` requests, lowest Request.priority first: the rewriter gives each
  chunk minus the chunks its rewrite has left, so the longest chains of answers still to wait
  for go first and the batch ends with the server full until its last ~300 ms, not with the
  last-started documents' chains trailing with a few requests in flight (~0.6 s of a 6 s batch);
- Flight counts requests in flight over time (mean and peak), for the logs and bench/rephrase.py;
- Breaker stops the run (BackendError, so the CLI exits non-zero with the message) when the
  backend is down or most requests fail, instead of rejecting a whole corpus as backend_error.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from datapipe.llm.base import BACKEND_ERROR, BackendError, Completion, Request


class Limit:
    """A semaphore whose waiters are served lowest priority first (FIFO among equals)."""

    def __init__(self, size: int):
        self.free = size
        self.waiting: list[tuple[int, int, asyncio.Future]] = []
        self.order = itertools.count()

    async def acquire(self, priority: int) -> None:
        if self.free > 0 and not self.waiting:
            self.free -= 1
            return
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self.waiting, (priority, next(self.order), future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # granted as it was cancelled: pass it on
                self.release()
            raise

    def release(self) -> None:
        while self.waiting:
            future = heapq.heappop(self.waiting)[2]
            if not future.done():
                future.set_result(None)
                return
        self.free += 1


class Flight:
    """Requests in flight, integrated over time: mean = busy request-seconds / elapsed seconds."""

    def __init__(self) -> None:
        self.now = self.peak = self.requests = 0
        self.area = 0.0
        self.started = self.changed = 0.0

    def change(self, delta: int) -> None:
        clock = time.monotonic()
        if not self.started:
            self.started = self.changed = clock
        self.area += self.now * (clock - self.changed)
        self.now, self.changed = self.now + delta, clock
        self.peak = max(self.peak, self.now)
        self.requests += delta > 0

    def stats(self) -> dict:
        elapsed = max(1e-9, self.changed - self.started)
        return {"requests": self.requests, "mean_in_flight": round(self.area / elapsed, 2), "peak_in_flight": self.peak,
                "seconds": round(elapsed, 3), "requests_per_s": round(self.requests / elapsed, 2),
                "mean_latency_s": round(self.area / max(1, self.requests), 4)}  # Little's law: time in flight each


@dataclass
class Breaker:
    """Opens when `max_error_rate` of the last `window` requests (at least `min_requests` of them)
    failed with backend_error after their retries: a server that is down or answers 500 to all."""

    window: int = 50
    min_requests: int = 10
    max_error_rate: float = 0.5
    where: str = "the backend"

    def __post_init__(self) -> None:
        self.outcomes: deque[bool] = deque(maxlen=self.window)

    def record(self, completion: Completion) -> None:
        self.outcomes.append(completion.error == BACKEND_ERROR)
        failed = sum(self.outcomes)
        if len(self.outcomes) >= self.min_requests and failed / len(self.outcomes) > self.max_error_rate:
            raise BackendError(f"circuit breaker open: {failed} of the last {len(self.outcomes)} requests to "
                               f"{self.where} failed after their retries (last: {completion.detail[:200]}); the run "
                               f"stops instead of rejecting every record. Check the server, or raise "
                               f"backend.max_error_rate (now {self.max_error_rate})")


class Batcher:
    """An in-process backend behind the async interface: waiting requests go out as one batch.
    A backend that raises answers each request backend_error; with raises=True (the gate and the
    embedder, whose callers await values, not completions) the error reaches every caller."""

    def __init__(self, backend, max_batch: int = 1 << 30, raises: bool = False):
        self.backend, self.max_batch, self.raises = backend, max_batch, raises
        self.flight = Flight()
        self.waiting: list[tuple[Request, asyncio.Future]] = []
        self.wake: asyncio.Event | None = None
        self.worker: asyncio.Task | None = None

    async def complete(self, request: Request) -> Completion:
        if self.worker is None:
            self.wake, self.worker = asyncio.Event(), asyncio.create_task(self.loop())
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((request, future))
        self.wake.set()
        return await future

    async def loop(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            while self.waiting:
                batch, self.waiting = self.waiting[: self.max_batch], self.waiting[self.max_batch :]
                await self.run(batch)

    async def run(self, batch: list[tuple[Request, asyncio.Future]]) -> None:
        self.flight.change(len(batch))
        try:
            completions = await asyncio.to_thread(self.backend.generate, [request for request, _ in batch])
        except Exception as err:  # noqa: BLE001 - every waiting request learns why; the loop goes on
            if self.raises:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(err)
                return
            completions = [Completion(error=BACKEND_ERROR, detail=f"{type(err).__name__}: {err}"[:500])] * len(batch)
        finally:
            self.flight.change(-len(batch))
        for (_, future), completion in zip(batch, completions):
            if not future.done():
                future.set_result(completion)

    async def close(self) -> None:
        if self.worker is not None:
            self.worker.cancel()
        self.worker = None


class Gathered:
    """Calls fn(list) for the items submitted while the previous call ran: an embedder batch, or
    a batch of fidelity checks for a worker process, in a worker thread, off the event loop."""

    def __init__(self, fn: Callable[[list], list]):
        self.fn = fn
        self.batcher = Batcher(self, max_batch=256, raises=True)

    def generate(self, items: list) -> list:
        return self.fn(items)

    async def __call__(self, item):
        return await self.batcher.complete(item)

    async def close(self) -> None:
        await self.batcher.close()


def make_client(backend):
    """The backend's own async client when it has one (HTTP), else a Batcher around it."""
    if hasattr(backend, "async_client"):
        return backend.async_client()
    return Batcher(backend)
