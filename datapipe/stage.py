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
Its partition form, which lets recipes holding it run as partition tasks in passes
(datapipe.pipeline.partition_task), is three more functions:
- `gather(docs, config, work) -> int`: in each partition task, on each block of documents that
  reached the stage; writes what the decision needs under `work` (the stage's folder) and returns
  how many live documents it took;
- `decide(config, tasks, partitions, live) -> token`: on the driver once every partition is
  gathered (`live` documents in all); puts the work on the cluster through `tasks` (a GlobalTasks),
  never holding what grows with the corpus; returns a token naming the decision (a rerun that
  finds the decision made returns its token at once);
- `decision(config, work, token)`: the picklable per-batch step that applies it in the next pass.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from datapipe.storage import Store

BUILTIN_RESOURCES = {"CPU": "num_cpus", "GPU": "num_gpus", "memory": "reserved_memory_mb"}  # Ray's own, asked for by these fields


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StageConfig(Strict):
    """Fields every stage accepts; each stage module subclasses this as `Config`."""

    path_fields: ClassVar[tuple[str, ...]] = ()  # fields holding file paths, resolved against the recipe's folder
    actor: ClassVar[bool] = False  # True: runs in a Ray actor pool that keeps a warm resource
    # An actor stage whose warm resource is only memory of its process (a tokenizer), with nothing to shut
    # down (a browser) or to share (a model server): it may also run inside a partition task
    # (datapipe.pipeline.partition_task). Stages that are not actors always may.
    in_partition_task: ClassVar[bool] = False

    stage: str  # the registry name
    batch_size: int = Field(256, ge=1)  # records per Ray Data batch: big enough to amortize per-batch overhead
    # Actor stages: at most N actors, or [min, max]; None = 1 up to as many as the cluster's resources hold.
    # Ray Data grows the pool while its actors are busy, within the cluster's free resources.
    concurrency: int | tuple[int, int] | None = None
    num_cpus: float | None = Field(None, gt=0)  # CPUs each task or actor reserves; None = Ray's default (1)
    num_gpus: float | None = Field(None, ge=0)  # GPUs each task or actor reserves (a vLLM engine: 1); None = none
    # Heap memory each task or actor reserves (Ray's `memory` resource), in MiB; None = none. Not `memory_mb`,
    # which the render stage already uses for its browser's heap cap.
    reserved_memory_mb: int | None = Field(None, ge=1)
    resources: dict[str, float] = {}  # custom resources each task or actor needs ({chromium: 1}): only nodes with them run it
    # Only documents of these recipe sources go through the stage; the others pass by untouched and
    # count as kept by it. [] = every source. One recipe can then clean web text and render programs.
    sources: list[str] = []

    @field_validator("concurrency", mode="before")
    @classmethod
    def _pool_size(cls, value: Any) -> Any:
        """One message for every wrong shape (pydantic would list one per member of the union)."""
        if value is None or (type(value) is int and value >= 1):
            return value
        if (isinstance(value, list | tuple) and len(value) == 2 and all(type(v) is int for v in value)
                and 1 <= value[0] <= value[1]):
            return tuple(value)
        raise ValueError(f"expected a number of actors (4: at most 4) or a range [min, max] with 1 <= min <= max "
                         f"([2, 8]); got {value!r}")

    @field_validator("resources", mode="before")
    @classmethod
    def _custom_resources(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise ValueError(f"expected a mapping of resource names to amounts ({{chromium: 1}}); got {value!r}")
        for name, amount in value.items():
            if name in BUILTIN_RESOURCES:
                raise ValueError(f"{name} is not a custom resource: use {BUILTIN_RESOURCES[name]} instead")
            if type(amount) not in (int, float) or amount <= 0:
                raise ValueError(f"{name}: expected a positive number of units per task or actor; got {amount!r}")
        return value

    def pool_range(self) -> tuple[int, int | None]:
        """(min, max) actors of an actor stage; max None = as many as the cluster holds."""
        if isinstance(self.concurrency, tuple):
            return self.concurrency
        return 1, self.concurrency

    def reservation(self) -> dict[str, Any]:
        """What each task or actor of this stage reserves, as keyword arguments of Ray Data's map_batches."""
        options = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus, "resources": self.resources or None,
                   "memory": self.reserved_memory_mb << 20 if self.reserved_memory_mb else None}
        return {key: value for key, value in options.items() if value is not None}


@dataclass(frozen=True)
class GlobalContext:
    """What the runner hands a global stage besides the dataset and its config."""

    # (dataset, fn) -> dataset: fn, from a batch's live documents to the same documents, applied as a
    # task operator with the run's accounting (rejected records pass by, none dropped, transforms marked)
    map_documents: Callable[[Any, Callable[[list], list]], Any]
    work: Store  # the stage's own folder in the run: kept when a killed run is rerun, so finished work is reused


@dataclass(frozen=True)
class GlobalTasks:
    """What the runner hands a global stage's `decide`: its folder and two ways onto the cluster."""

    work: Store  # the stage's own folder in the run, as GlobalContext.work
    run_task: Callable[..., Any]  # run_task(fn, *args): fn(*args) as one Ray task with the stage's resources; its result
    # dataset_of(items, fn): a dataset of the Arrow tables fn(item) returns, a task an item (for the
    # distributed passes, which use the dataset's own methods as transform_dataset does)
    dataset_of: Callable[[list, Callable[[Any], Any]], Any]


def load(target: str) -> Any:
    """Import "module:attribute" (or a whole module when there is no colon)."""
    module_name, _, attribute = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attribute) if attribute else module
