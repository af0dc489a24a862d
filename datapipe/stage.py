"""What a stage is: its config's common fields, and how its code is found.

A stage module (datapipe/text/normalize.py, tokenizer/stage.py, renderers/stage.py...)
defines `Config`, a StageConfig subclass with the stage's own options, and
`make_stage(config)`, which returns a callable from a list of documents to a list of
documents (datapipe.schema). The recipe names stages; datapipe.pipeline.registry maps each
name to its module; the runner turns the list into Ray operators. Stage modules import
this module and the schema, never the pipeline.
"""
from __future__ import annotations

import importlib
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StageConfig(Strict):
    """Fields every stage accepts; each stage module subclasses this as `Config`."""

    path_fields: ClassVar[tuple[str, ...]] = ()  # fields holding file paths, resolved against the recipe's folder
    actor: ClassVar[bool] = False  # True: runs in a Ray actor pool that keeps a warm resource

    stage: str  # the registry name
    batch_size: int = Field(256, ge=1)  # records per Ray Data batch: big enough to amortize per-batch overhead
    concurrency: int | None = Field(None, ge=1)  # actor-pool size for warm stages; None = one actor
    num_cpus: float | None = Field(None, gt=0)  # CPUs each task or actor reserves; None = Ray's default (1)
    num_gpus: float | None = Field(None, ge=0)  # GPUs each task or actor reserves (a vLLM engine: 1); None = none


def load(target: str) -> Any:
    """Import "module:attribute" (or a whole module when there is no colon)."""
    module_name, _, attribute = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attribute) if attribute else module
