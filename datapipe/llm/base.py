"""The one interface every LLM backend speaks: a batch of chat requests in, completions out.

A backend never raises for one bad request: each Completion carries `error`, a short reason
that the rephrase stage turns into `rephrase.<error>`. It raises BackendError only when it
cannot work at all (server down, wrong model name, a model package missing), so that a run
fails at start with the fix instead of rejecting every record.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import Field

from datapipe.stage import Strict

# Completion.error values; the stage rejects with "rephrase.<error>".
CONTEXT_OVERFLOW = "context_overflow"  # prompt + max_new_tokens exceed the model's context
BACKEND_ERROR = "backend_error"  # the server failed (down, 5xx, timeout) after every retry
MALFORMED_RESPONSE = "malformed_response"  # a reply that is not the OpenAI schema, after every retry
EMPTY_RESPONSE = "empty_response"  # the model answered nothing but whitespace


class BackendError(RuntimeError):
    """The backend cannot serve at all; the message says what to fix."""


class BackendConfig(Strict):
    """One flat config for every backend; each reads the fields of its own group."""

    type: Literal["local", "openai", "vllm"] = "local"  # a key of datapipe.llm.BACKENDS
    model: str = "smollm2-135m-instruct"  # local/vllm: "smollm2-135m-instruct" (packaged) or a model folder; openai: the served name
    max_context: int | None = Field(None, ge=64)  # tokens; None = the model's own (8192 for SmolLM2)
    seed: int = 0  # sampling seed; the same batch gives the same text
    # local (transformers on this machine)
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto = cuda when torch sees a GPU
    threads: int | None = Field(None, ge=1)  # torch CPU threads; None = torch's default (one per core)
    max_batch: int = Field(8, ge=1)  # requests per generate() call: 8 keeps padding waste low on CPU
    # openai (any OpenAI-compatible server: vLLM, SGLang, llama.cpp, datapipe.llm.server)
    base_url: str = "http://127.0.0.1:8000/v1"
    api_key_env: str = "OPENAI_API_KEY"  # the variable that holds the key; unset sends none
    concurrency: int = Field(8, ge=1)  # requests in flight per actor; the server batches them
    timeout_s: float = Field(120.0, gt=0)  # per request; 512 new tokens at 10 tok/s fit
    max_retries: int = Field(3, ge=0)  # after the first try: connection errors, 429 and 5xx only
    backoff_s: float = Field(0.5, ge=0)  # first retry waits this, then doubles (0.5, 1, 2 s), each x 0.5-1.5 jitter
    tokenizer: str | None = None  # chunk sizes: "smollm2-135m-instruct", a model folder or a tokenizer.json (local only); None = the served model's when it is one of those, else chars/4
    max_error_rate: float = Field(0.5, gt=0, le=1)  # of the last breaker_window requests failed: the run stops
    breaker_window: int = Field(50, ge=1)  # requests the circuit breaker looks back over (it opens after 10 at least)
    # vllm (GPU, in the stage's actor; the stage's num_gpus gives it a device)
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)  # of the GPU's memory for weights + KV cache
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"


@dataclass
class Request:
    messages: list[dict[str, str]]  # OpenAI chat messages: [{"role": "system"|"user", "content": ...}]
    max_new_tokens: int
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    priority: int = 0  # lower goes first when requests wait for a free slot: the rephrase stage's longest chains of chunks first


@dataclass
class Completion:
    text: str = ""
    output_tokens: int = 0
    finish_reason: str = ""  # "stop" | "length" | "" on error
    error: str = ""  # "" or one of the reasons above
    detail: str = ""  # the server's or the engine's words, for notes["rephrase"]


class Backend(Protocol):
    name: str  # "local", "openai", "vllm"
    model: str  # the model as named in provenance

    def generate(self, requests: list[Request]) -> list[Completion]:
        """One completion per request, in order; never raises for a single bad request."""

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Token counts used for chunking (exact for local/vllm, an estimate for openai)."""


def failed(error: str, detail: str = "") -> Completion:
    return Completion(error=error, detail=detail[:500])


def finish(text: str, output_tokens: int, finish_reason: str) -> Completion:
    """A completion, or empty_response when the model said nothing."""
    if not text.strip():
        return Completion(text="", output_tokens=output_tokens, finish_reason=finish_reason, error=EMPTY_RESPONSE)
    return Completion(text=text.strip(), output_tokens=output_tokens, finish_reason=finish_reason)
