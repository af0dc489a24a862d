"""A partition start to finish in one task: read it, run every stage on its blocks, commit it.

When every stage of a recipe can share a worker process (`fits_partition_tasks`: no global stage,
no GPU, memory or custom resource, no warm resource to shut down or share), the runner runs each
input partition as one Ray task instead of a Ray Data operator a stage. Why, measured by
bench/scale.py (normalize + tokenize + one 8K phase, 100 MB, one core): the operator plan started
about seven worker processes that each spent 3-5 s importing ray.data and pandas (a third of all
CPU), moved every block through the object store between stages, and on two nodes split the work
by stage (reads on one node, tokenize on the other) rather than by data. A partition task keeps its
blocks in its own memory, a worker process per CPU runs task after task (each stage built once per
process: apply.cached_stage), and nodes share the work by partitions. The cost: a partition (an
input file, or a generator's range) is the unit of parallelism, so one huge file runs on one CPU:
split big inputs into files.

The same blocks of documents reach the same commit (datapipe.pipeline.partitions) as in the
operator plan, so the shards are byte-identical either way (tests/test_runner.py runs both). The
task writes the partition's marker itself, last: a task killed half-way leaves no marker, and Ray
runs it again (or a rerun does).
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass
from functools import partial
from typing import Any

from datapipe.pipeline import registry
from datapipe.pipeline.apply import apply_to_documents, cached_stage
from datapipe.pipeline.inputs import read_partition
from datapipe.pipeline.partitions import CommitSettings, Partition, PartitionLog, commit_documents, numbered_blocks
from datapipe.schema import Document
from datapipe.stage import StageConfig

READ_BATCH = 1024  # documents per block out of a reader (the operator plan's blocks too)


@dataclass(frozen=True)
class PartitionJob:
    """One partition's work: what a task needs besides the code (picklable)."""

    index: int  # the partition's number in the run's plan
    item: dict[str, Any]  # its work item (inputs.plan_partitions)
    source: Any  # its source's config
    stages: tuple[StageConfig, ...]  # the recipe's stages, in order
    settings: CommitSettings


def run_partition(job: PartitionJob) -> Partition:
    """A Ray task: the partition read, staged and committed; its marker's contents returned."""
    log, committed = PartitionLog(job.settings.work), None
    documents = read_partition(job.source, job.settings.seed, job.item, job.index)
    for block in numbered_blocks(documents, job.index, READ_BATCH):
        for row in commit_documents(run_stages(block, job.stages), job.settings):
            committed = log.add(row) or committed
    return committed


def run_stages(block: list[Document], stages: tuple[StageConfig, ...]) -> list[Document]:
    """Every stage on a block, in memory (no Arrow between stages: a third of the task's own CPU). The
    block is pickled once: a stage that fails half-way gets it back by replaying the stages before it
    (stages are deterministic), where the operator plan re-reads its Arrow batch."""
    saved, docs = pickle.dumps(block, protocol=pickle.HIGHEST_PROTOCOL), block
    for done, cfg in enumerate(stages):
        stage = cached_stage(cfg.stage, cfg.model_dump_json())
        docs = apply_to_documents(stage, cfg.stage, docs, partial(replay, saved, stages[:done]))
    return docs


def replay(saved: bytes, stages: tuple[StageConfig, ...]) -> list[Document]:
    return run_stages(pickle.loads(saved), stages)


def fits_partition_tasks(stages: list[StageConfig]) -> bool:
    """Whether every stage can run inside a partition task (the module docstring says why it pays)."""
    return all(fits_task(cfg) for cfg in stages)


def fits_task(cfg: StageConfig) -> bool:
    if hasattr(registry.stage_module(cfg.stage), "transform_dataset"):
        return False  # a global stage (dedup) sees the whole dataset, not one partition
    if type(cfg).actor and not type(cfg).in_partition_task:
        return False  # a browser or a model server: kept in an actor pool, shut down with it
    plain_cpu = (cfg.num_cpus or 1) <= 1 and not (cfg.num_gpus or cfg.reserved_memory_mb or cfg.resources)
    return plain_cpu


def most_at_once(stages: list[StageConfig]) -> int | None:
    """Partition tasks in flight at most: the smallest `concurrency` maximum a stage sets (None: no cap)."""
    caps = [cfg.pool_range()[1] for cfg in stages if cfg.pool_range()[1] is not None]
    return min(caps, default=None)
