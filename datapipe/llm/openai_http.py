"""The OpenAI-compatible HTTP backend: what vLLM, SGLang, llama.cpp and datapipe.llm.server speak.

POST {base_url}/chat/completions, `concurrency` requests in flight per actor (the server batches
them; vLLM's continuous batching wants many), each with a timeout. Connection errors, timeouts,
429 and 5xx are retried with exponential backoff (0.5, 1, 2 s by default); a malformed reply is
retried the same way; a context-length 400 is answered `context_overflow` at once. At start the
backend asks GET /models: a server that is down or does not serve the model stops the run with
the fix, instead of rejecting every record. Standard library only: no client package to install.
"""
from __future__ import annotations

import http.client
import json
import math
import os
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

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

CHARS_PER_TOKEN = 4.0  # English averages ~4 characters a token in Llama-family BPEs; only sizes chunks
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
        self.pool = ThreadPoolExecutor(cfg.concurrency, thread_name_prefix="openai")
        self.check_server()

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
        return [math.ceil(len(text) / CHARS_PER_TOKEN) for text in texts]

    def generate(self, requests: list[Request]) -> list[Completion]:
        return list(self.pool.map(self.complete, requests))

    def complete(self, request: Request) -> Completion:
        body = json.dumps({"model": self.model, "messages": request.messages, "max_tokens": request.max_new_tokens,
                           "temperature": request.temperature, "top_p": request.top_p, "seed": self.cfg.seed}).encode()
        outcome = failed(BACKEND_ERROR, "no attempt made")
        for attempt in range(self.cfg.max_retries + 1):
            if attempt:
                time.sleep(self.cfg.backoff_s * 2 ** (attempt - 1))
            try:
                return self.post(body)
            except Retry as retry:
                outcome = failed(*retry.args)
        outcome.detail = f"after {self.cfg.max_retries + 1} tries: {outcome.detail}"[:500]
        return outcome

    def post(self, body: bytes) -> Completion:
        try:
            with urllib.request.urlopen(self.http_request("/chat/completions", body), timeout=self.cfg.timeout_s) as reply:
                payload = reply.read()
        except urllib.error.HTTPError as err:
            return self.http_error(err.code, err.read().decode("utf-8", "replace"))
        except TRANSIENT as err:
            raise Retry(BACKEND_ERROR, f"{type(err).__name__}: {err}") from None
        return parse_completion(payload)

    def http_error(self, status: int, message: str) -> Completion:
        if status == 429 or status >= 500:
            raise Retry(BACKEND_ERROR, f"HTTP {status}: {message[:300]}")
        if status == 400 and any(word in message.lower() for word in CONTEXT_WORDS):
            return failed(CONTEXT_OVERFLOW, message)
        return failed(BACKEND_ERROR, f"HTTP {status}: {message}")

    def http_request(self, path: str, body: bytes | None = None) -> urllib.request.Request:
        return urllib.request.Request(self.base + path, data=body, headers=self.headers,
                                      method="POST" if body is not None else "GET")


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
