"""What a stage is: its config's common fields, and how its code is found.

A stage module (datapipe/text/normalize.py, tokenizer/stage.py, renderers/stage.py...)
defines `Config`, a StageConfig subclass with the stage's own options, and
`make_stage(config)`, which returns a callable from a list of documents to a list of
documents (datapipe.schema). The recipe names stages; datapipe.pipeline.registry maps each
name to its module; the runner turns the list into Ray operators. Stage modules import
this module and the schema, never the pipeline.

A global stage (dedup) must see the whole dataset, not one batch: its module also defines
`transform_dataset(dataset, config, context)`, which returns a new dataset built with the
dataset's own methods only; `context` (a GlobalContext) carries what else it needs from the run.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from datapipe.storage import Store


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


@dataclass(frozen=True)
class GlobalContext:
    """What the runner hands a global stage besides the dataset and its config."""

    # (dataset, fn) -> dataset: fn, from a batch's live documents to the same documents, applied as a
    # task operator with the run's accounting (rejected records pass by, none dropped, transforms marked)
    map_documents: Callable[[Any, Callable[[list], list]], Any]
    work: Store  # the stage's own folder in the run: kept when a killed run is rerun, so finished work is reused


def load(target: str) -> Any:
    """Import "module:attribute" (or a whole module when there is no colon)."""
    module_name, _, attribute = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attribute) if attribute else module
