"""Plain dicts from a recipe name to the code that implements it.

Values are "module:attribute" strings, imported only when a run needs them, so that
importing datapipe stays fast and a stage's heavy dependencies load in its worker.
"""
from __future__ import annotations

import importlib
from typing import Any

# Readers of files: read(source_config, path) -> Iterator[Document]; one Ray task per file.
FILE_READERS: dict[str, str] = {
    "jsonl": "datapipe.sources:read_jsonl",  # .jsonl, .jsonl.gz, .jsonl.zst
    "parquet": "datapipe.sources:read_parquet",
    "hf_disk": "datapipe.sources:read_hf_disk",  # a folder written by datasets' save_to_disk
}

# Generators: generate(source_config, seed, start, stop) -> Iterator[Document]; one task per range.
GENERATORS: dict[str, str] = {
    "pydoc_topics": "datapipe.generators:pydoc_topics",  # the docs every Python install carries
    "python_programs": "datapipe.generators:python_programs",  # seeded, procedurally generated code
}

SOURCES: dict[str, str] = {**FILE_READERS, **GENERATORS}

# Stages: each module defines `Config` (a config.StageConfig) and `make_stage(config)`, which
# returns a callable from a list of documents to a list of documents.
STAGES: dict[str, str] = {
    "normalize": "datapipe.text.normalize",
    "rephrase": "datapipe.text.rephrase",  # K rewrites per document with an LLM (local, OpenAI HTTP, vLLM)
    "tokenize": "tokenizer.stage",
}


def load(target: str) -> Any:
    """Import "module:attribute" (or a whole module when there is no colon)."""
    module_name, _, attribute = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attribute) if attribute else module


def stage_module(name: str) -> Any:
    if name not in STAGES:
        raise KeyError(f"unknown stage {name!r}; known stages: {', '.join(sorted(STAGES))}")
    return load(STAGES[name])


def stage_config_class(name: str) -> type:
    return stage_module(name).Config
