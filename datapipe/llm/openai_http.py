"""The OpenAI-compatible HTTP backend: what vLLM, SGLang, llama.cpp and datapipe.llm.server speak.

POST {base_url}/chat/completions from an asyncio client (aiohttp), `concurrency` requests in
flight per actor (the server batches them; vLLM's continuous batching wants many), each with a
timeout. Connection errors, timeouts, 429 and 5xx are retried with jittered exponential backoff
(0.5, 1, 2 s x 0.5-1.5 by default), after the pause a Retry-After header asks for; a malformed
reply is retried the same way; a context-length 400 is answered `context_overflow` at once. At
start the backend asks GET /models: a server that is down or does not serve the model stops the
run with the fix; a server that fails mid-run opens the circuit breaker (datapipe.llm.client),
which stops the run instead of rejecting every record. Chunk sizes use the served model's own
tokenizer where it is here, from local files only (the packaged SmolLM2, a model folder or a
tokenizer.json in backend.tokenizer; a backend.tokenizer that is none of those stops the run).
"""
from __future__ import annotations

import asyncio
import email.utils
import http.client
import json
import math
import os
import random
import socket
import time
import urllib.error
import urllib.request

from datapipe.llm.base import (
    BACKEND_ERROR,
    CONTEXT_OVERFLOW,
    MALFORMED_RESPONSE,
    BackendConfig,
    BackendError,
    Completion,
    Request,
    failed,
    finish,
)
from datapipe.llm.client import Breaker, Flight, Limit

CHARS_PER_TOKEN = 4.0  # English averages ~4 characters a token in Llama-family BPEs; Spanish ~3: a fallback only
TRANSIENT = (urllib.error.URLError, http.client.HTTPException, socket.timeout, ConnectionError, TimeoutError)
CONTEXT_WORDS = ("context length", "context_length", "maximum context", "too long")


class Retry(Exception):
    """A failure worth another try: (reason, detail)."""


class OpenAIBackend:
    name = "openai"

    def __init__(self, cfg: BackendConfig):
        self.cfg = cfg
        self.model = cfg.model
        self.base = cfg.base_url.rstrip("/")
        key = os.environ.get(cfg.api_key_env)
        self.headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        self.check_server()
        self.tokenizer = load_tokenizer(cfg.tokenizer, cfg.model)

    def check_server(self) -> None:
        try:
            with urllib.request.urlopen(self.http_request("/models"), timeout=min(10.0, self.cfg.timeout_s)) as reply:
                served = [m["id"] for m in json.loads(reply.read())["data"]]
        except urllib.error.HTTPError as err:
            raise BackendError(f"{self.base}/models answered HTTP {err.code}; is backend.base_url the server's /v1 "
                               f"root, and backend.api_key_env the variable holding its key?") from None
        except TRANSIENT as err:
            raise BackendError(f"cannot reach the OpenAI-compatible server at {self.base} ({err}); start it, for "
                               f"example `.venv/bin/python -m datapipe.llm.server --port 8000`, or fix "
                               f"backend.base_url") from None
        except (ValueError, KeyError, TypeError) as err:
            raise BackendError(f"{self.base}/models did not answer an OpenAI model list ({err}); is backend.base_url "
                               f"the server's /v1 root?") from None
        if self.model not in served:
            raise BackendError(f"the server at {self.base} serves {served}, not {self.model!r}; set backend.model "
                               f"to one of those") from None

    def count_tokens(self, texts: list[str]) -> list[int]:
        if self.tokenizer is not None:
            return [len(e.ids) for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]
        return [math.ceil(len(text) / CHARS_PER_TOKEN) for text in texts]

    def http_request(self, path: str, body: bytes | None = None) -> urllib.request.Request:
        return urllib.request.Request(self.base + path, data=body, headers=self.headers,
                                      method="POST" if body is not None else "GET")

    def async_client(self) -> OpenAIClient:
        return OpenAIClient(self.cfg, self.base, self.headers)

    def generate(self, requests: list[Request]) -> list[Completion]:
        """The blocking form, for callers outside an event loop (tests, the server's own checks)."""
        async def gather() -> list[Completion]:
            client = self.async_client()
            try:
                return list(await asyncio.gather(*(client.complete(r) for r in requests)))
            finally:
                await client.close()
        return asyncio.run(gather())


class OpenAIClient:
    """aiohttp, one session per run; `concurrency` requests in flight; Retry-After honoured (429/503:
    every request waits until then, the server asked for a pause); other retries back off with
    jitter (backoff_s x 2^k x 0.5-1.5, so clients that failed together do not retry together)."""

    def __init__(self, cfg: BackendConfig, base: str, headers: dict[str, str]):
        self.cfg, self.base, self.headers = cfg, base, headers
        self.flight = Flight()
        self.breaker = Breaker(cfg.breaker_window, min(10, cfg.breaker_window), cfg.max_error_rate, base)
        self.limit = Limit(cfg.concurrency)
        self.session = None
        self.paused_until = 0.0  # monotonic time before which no request is sent (Retry-After)
        self.retries = 0

    async def complete(self, request: Request) -> Completion:
        body = {"model": self.cfg.model, "messages": request.messages, "max_tokens": request.max_new_tokens,
                "temperature": request.temperature, "top_p": request.top_p, "seed": self.cfg.seed}
        outcome = failed(BACKEND_ERROR, "no attempt made")
        for attempt in range(self.cfg.max_retries + 1):
            if attempt:
                self.retries += 1
                await asyncio.sleep(self.cfg.backoff_s * 2 ** (attempt - 1) * random.uniform(0.5, 1.5))
            while (wait := self.paused_until - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            try:
                outcome = await self.send(body, request.priority)
                break
            except Retry as retry:
                outcome = failed(*retry.args[:2])
        else:
            outcome.detail = f"after {self.cfg.max_retries + 1} tries: {outcome.detail}"[:500]
        self.breaker.record(outcome)
        return outcome

    async def send(self, body: dict, priority: int = 0) -> Completion:
        import aiohttp

        if self.session is None:
            self.session = aiohttp.ClientSession(headers=self.headers, timeout=aiohttp.ClientTimeout(
                total=self.cfg.timeout_s), connector=aiohttp.TCPConnector(limit=self.cfg.concurrency))
        await self.limit.acquire(priority)
        self.flight.change(+1)
        try:
            async with self.session.post(self.base + "/chat/completions", json=body) as reply:
                payload = await reply.read()
                status, retry_after = reply.status, reply.headers.get("Retry-After")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
            raise Retry(BACKEND_ERROR, f"{type(err).__name__}: {err}") from None
        finally:
            self.flight.change(-1)
            self.limit.release()
        if status != 200:
            self.pause(status, retry_after)
            return http_error(status, payload.decode("utf-8", "replace"))
        return parse_completion(payload)

    def pause(self, status: int, retry_after: str | None) -> None:
        """429/503 with Retry-After (seconds, or an HTTP date): nobody sends before then (capped at 5 min)."""
        if status not in (429, 503) or not retry_after:
            return
        try:
            seconds = float(retry_after)
        except ValueError:
            try:
                seconds = email.utils.parsedate_to_datetime(retry_after).timestamp() - time.time()
            except (TypeError, ValueError):
                return
        self.paused_until = max(self.paused_until, time.monotonic() + min(max(seconds, 0.0), 300.0))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        self.session = None


def http_error(status: int, message: str) -> Completion:
    if status == 429 or status >= 500:
        raise Retry(BACKEND_ERROR, f"HTTP {status}: {message[:300]}")
    if status == 400 and any(word in message.lower() for word in CONTEXT_WORDS):
        return failed(CONTEXT_OVERFLOW, message)
    return failed(BACKEND_ERROR, f"HTTP {status}: {message}")


def parse_completion(payload: bytes) -> Completion:
    """An OpenAI chat.completion; anything else is retried as malformed."""
    try:
        reply = json.loads(payload)
        choice = reply["choices"][0]
        text = choice["message"]["content"] or ""
        tokens = int((reply.get("usage") or {}).get("completion_tokens") or 0)
        return finish(text, tokens, choice.get("finish_reason") or "")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as err:
        raise Retry(MALFORMED_RESPONSE, f"{type(err).__name__}: {err}; body starts {payload[:200]!r}") from None


def load_tokenizer(name: str | None, model: str):
    """The Rust tokenizer that sizes chunks, from local files only (never a hub): `name`
    (backend.tokenizer: the packaged SmolLM2's name, a model folder, or a tokenizer.json file) or,
    when that is None, the served model's when it is one of those. None: chunks are sized at 4
    characters a token, which made Spanish chunks 268-367 real tokens for a 256 target."""
    from pathlib import Path

    from datapipe.llm.packaged import SMOLLM2

    if name is None:
        local = model == SMOLLM2 or (Path(model).expanduser() / "tokenizer.json").is_file()
        return load_local_tokenizer(model) if local else None
    if name != SMOLLM2 and not (Path(name).expanduser().is_file() or (Path(name).expanduser() / "tokenizer.json").is_file()):
        raise BackendError(f"backend.tokenizer {name!r}: not {SMOLLM2!r}, a model folder with tokenizer.json, "
                           f"nor a tokenizer.json file; tokenizers are read from local files only, never a hub. "
                           f"Point it at the served model's folder, or leave it out to size chunks at 4 characters a token")
    return load_local_tokenizer(name)


def load_local_tokenizer(name: str):
    """A folder's or a file's tokenizer.json; SmolLM2's from its converted folder (converted once)."""
    from pathlib import Path

    from tokenizers import Tokenizer

    from datapipe.llm.packaged import SMOLLM2, model_dir

    try:
        path = model_dir(SMOLLM2) if name == SMOLLM2 else Path(name).expanduser()
    except FileNotFoundError:  # the model package is not installed here: the estimate it is
        return None
    return Tokenizer.from_file(str(path if path.is_file() else path / "tokenizer.json"))
