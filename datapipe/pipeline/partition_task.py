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

A global stage (dedup) splits the work into passes over the partitions when it has a partition form
(datapipe.stage): a pass runs the stages up to the next global stage, hands each block to that
stage's `gather` (dedup: its key rows) and stores the block (work/passes/1/p000123/000000.arrow);
once every partition is stored, the driver has the stage `decide` (dedup: one task clusters every key
row, or the distributed passes for big corpora); the next pass reads the stored blocks back, applies
the decision (the verdicts, with the accounting of any stage) and goes on to the next global stage or
to the commit. What this saves, on bench/dedup.py's 3,264 documents (dedup, tokenize, one phase; 2
CPUs; the whole `datapipe run`): 28.3 s as the operator plan (its materialize, signature tasks,
grouping and verdict tasks, each a Ray Data operator), 17.8 s in passes. The cost: the documents
between two passes are written once to the work folder (the operator plan keeps them in Ray's object
store, spilled to disk when they do not fit).

The same blocks of documents reach the same commit (datapipe.pipeline.partitions) as in the
operator plan, so the shards are byte-identical either way (tests/test_runner.py runs both). The
task writes the partition's marker itself, last (a pass's marker for the blocks it stored): a task
killed half-way leaves no marker, and Ray runs it again (or a rerun does).
"""
from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from datapipe.pipeline import registry
from datapipe.pipeline.apply import apply_to_documents, cached_stage
from datapipe.pipeline.inputs import read_partition
from datapipe.pipeline.partitions import END, CommitSettings, Partition, PartitionLog, commit_documents, numbered_blocks
from datapipe.pipeline.stats import RunStats
from datapipe.schema import Document, docs_from_table, docs_to_table
from datapipe.stage import StageConfig
from datapipe.storage import Store

READ_BATCH = 1024  # documents per block out of a reader (the operator plan's blocks too)
PASSES = "passes"  # work/passes/1/p000123/000000.arrow: the blocks pass 1 reads; passes/1/p000123.json: all there


@dataclass(frozen=True)
class Pass:
    """One sweep over the partitions: the stages from one global stage (or the read) to the next (or the commit)."""

    number: int  # 0 reads the sources; pass n reads the blocks pass n - 1 stored
    opening: tuple[int, StageConfig] | None  # the global stage (its place in the recipe) whose decision opens it
    stages: tuple[StageConfig, ...]  # the plain stages it runs, in order
    closing: tuple[int, StageConfig] | None  # the global stage it gathers for; None: the last pass, which commits


def split_passes(stages: list[StageConfig]) -> list[Pass]:
    """The recipe's stages cut at each global stage: one pass, the recipe whole, when it has none."""
    passes, opening, plain = [], None, []
    for index, cfg in enumerate(stages):
        if registry.is_global(cfg.stage):
            passes.append(Pass(len(passes), opening, tuple(plain), (index, cfg)))
            opening, plain = (index, cfg), []
        else:
            plain.append(cfg)
    return [*passes, Pass(len(passes), opening, tuple(plain), None)]


def stage_folder(work: Store, place: tuple[int, StageConfig]) -> Store:
    """A global stage's own folder in the run (the operator plan's too: runner.build_plan)."""
    index, cfg = place
    return work.child(f"stages/{index:02d}-{cfg.stage}")


@dataclass(frozen=True)
class PartitionJob:
    """One partition's work: what a task needs besides the code (picklable)."""

    index: int  # the partition's number in the run's plan
    item: dict[str, Any]  # its work item (inputs.plan_partitions)
    source: Any  # its source's config
    step: Pass  # the pass of the recipe this task runs
    settings: CommitSettings
    decision: Any = None  # the opening global stage's per-batch step (its `decision`); None for pass 0


def run_partition(job: PartitionJob) -> Partition | dict[str, Any]:
    """A Ray task: the partition's pass run; the last pass commits and returns the partition's marker
    contents, an earlier one stores its blocks and returns the pass marker's (stored_marker)."""
    log, committed, stored = PartitionLog(job.settings.work), None, []
    for block in opened_blocks(job):
        docs = run_stages(block, job.step.stages)
        if job.step.closing is None:
            for row in commit_documents(docs, job.settings):
                committed = log.add(row) or committed
        else:
            stored.append(store_block(job, docs, len(stored)))
    return committed if job.step.closing is None else write_stored_marker(job, stored)


def opened_blocks(job: PartitionJob) -> Iterator[list[Document]]:
    """Pass 0: the partition read, in numbered blocks. Later passes: the blocks the previous pass stored,
    each with the opening global stage's decision applied (its accounting as any stage's)."""
    if job.step.opening is None:
        yield from numbered_blocks(read_partition(job.source, job.settings.seed, job.item, job.index), job.index,
                                   READ_BATCH)
        return
    marker = json.loads(job.settings.work.read_bytes(stored_name(job.step.number, job.index) + ".json"))
    name = job.step.opening[1].stage
    for block in marker["blocks"]:
        def fresh(block=block):
            return docs_from_table(job.settings.work.read_table(block))

        yield apply_to_documents(job.decision, name, fresh(), fresh)


def store_block(job: PartitionJob, docs: list[Document], number: int) -> dict[str, Any]:
    """A block that reached the closing global stage: gathered by it, stored for the next pass."""
    index, cfg = job.step.closing
    live = registry.stage_module(cfg.stage).gather(docs, cfg, stage_folder(job.settings.work, (index, cfg)))
    name = f"{stored_name(job.step.number + 1, job.index)}/{number:06d}.arrow"
    job.settings.work.write_table(name, docs_to_table(docs))
    stats = RunStats("")
    for doc in docs:
        if doc["reject"] != END:  # a partition's closing row is no record
            stats.count(doc)
    return {"name": name, "live": live, "stats": stats.counters()}


def write_stored_marker(job: PartitionJob, stored: list[dict[str, Any]]) -> dict[str, Any]:
    """The pass marker, last: the blocks stored (in order), the live documents gathered, their figures."""
    stats = RunStats("")
    for block in stored:
        stats.add(block["stats"])
    marker = {"partition": job.index, "blocks": [block["name"] for block in stored],
              "live": sum(block["live"] for block in stored), "stats": stats.counters()}
    job.settings.work.write_bytes(stored_name(job.step.number + 1, job.index) + ".json", json.dumps(marker).encode())
    return marker


def stored_name(number: int, partition: int) -> str:
    """The blocks pass `number` reads of a partition: this folder, listed by this name + ".json" once all there."""
    return f"{PASSES}/{number}/p{partition:06d}"


def read_stored_marker(work: Store, number: int, partition: int) -> dict[str, Any] | None:
    text = work.read_text(stored_name(number, partition) + ".json")
    return None if text is None else json.loads(text)


def run_stages(block: list[Document], stages: tuple[StageConfig, ...]) -> list[Document]:
    """Every stage on a block, in memory (no Arrow between stages: a third of the task's own CPU). The
    block is pickled once: a stage that fails half-way gets it back by replaying the stages before it
    (stages are deterministic), where the operator plan re-reads its Arrow batch."""
    if not stages:  # a pass with no plain stage (dedup first or last): nothing to replay
        return block
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
    if registry.is_global(cfg.stage) and not hasattr(registry.stage_module(cfg.stage), "gather"):
        return False  # a global stage without a partition form (datapipe.stage) sees the whole dataset
    if type(cfg).actor and not type(cfg).in_partition_task:
        return False  # a browser or a model server: kept in an actor pool, shut down with it
    plain_cpu = (cfg.num_cpus or 1) <= 1 and not (cfg.num_gpus or cfg.reserved_memory_mb or cfg.resources)
    return plain_cpu


def most_at_once(stages: list[StageConfig]) -> int | None:
    """Partition tasks in flight at most: the smallest `concurrency` maximum a stage sets (None: no cap)."""
    caps = [cfg.pool_range()[1] for cfg in stages if cfg.pool_range()[1] is not None]
    return min(caps, default=None)
