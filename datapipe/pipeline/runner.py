"""Turn a recipe into Ray work and run it. The only module that imports Ray.

The driver plans; the workers do the work and write their own outputs to the run's folder (any
fsspec location: datapipe.storage), and nothing that grows with the corpus reaches the driver.

1. Documents: when every stage can share a worker process, one Ray task per partition reads it,
   runs every stage and commits it (datapipe.pipeline.partition_task), in passes cut at each global
   stage, whose decision the driver has made on the cluster between two passes. Otherwise a streaming Ray
   Data plan, read top to bottom: one read operator per source (a Ray
   task per input partition: a file or a generator range, the ones not yet committed), their
   union, each recipe stage as a `map_batches` operator (tasks for plain functions, an actor pool
   for stages that keep a warm resource), and last commit_block, which writes each block's
   documents as pieces of their partitions (datapipe.pipeline.partitions). The driver reads only
   the small summaries, in order, and commits each partition when its closing row arrives.
2. Phases: per phase the driver computes the budget from the partitions' supplies, groups the
   partitions, and runs one Ray task per group that selects, packs and writes its shards
   (datapipe.packing.groups); the phase's manifest is assembled from the tasks' results.
3. Accounts: one Ray task per partition turns the documents no phase used into rejects and
   writes the partition's rejects file; then stats.json and, last, run.json.
Every step commits with a marker (datapipe.pipeline.resume): rerunning after a kill does only
what is missing, and the same recipe and seed give byte-identical shards however the work was
scheduled, since every choice depends on (partition, position), never on arrival order.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import tempfile
import time
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
from rich.console import Console

from datapipe.packing.bfd import SpecialIds
from datapipe.packing.curriculum import phase_stats, phase_targets
from datapipe.packing.groups import GroupJob, plan_groups, run_group
from datapipe.packing.writer import write_manifest, write_run_manifest
from datapipe.pipeline import reaper, registry
from datapipe.pipeline.apply import apply_stage, build_stage, cached_stage
from datapipe.pipeline.check import check_read, check_recipe, list_inputs
from datapipe.pipeline.inputs import plan_partitions, read_partition
from datapipe.pipeline.partition_task import (
    READ_BATCH,
    PartitionJob,
    Pass,
    fits_partition_tasks,
    most_at_once,
    read_stored_marker,
    run_partition,
    split_passes,
    stage_folder,
)
from datapipe.pipeline.partitions import (
    DOCUMENTS,
    CommitSettings,
    Partition,
    PartitionLog,
    account_name,
    account_partition,
    commit_block,
    numbered_blocks,
)
from datapipe.pipeline.partitions import (
    read_partition as read_committed,
)
from datapipe.pipeline.recipe import RayConfig, Recipe, RecipeError, RunError
from datapipe.pipeline.report import partition_progress, task_progress, update_progress
from datapipe.pipeline.resume import RunFolder, open_run
from datapipe.pipeline.sizing import held_problems, placement_problems, pool_bounds
from datapipe.pipeline.stats import RunStats
from datapipe.pipeline.timeline import add_times, throughput
from datapipe.schema import Document, docs_to_table
from datapipe.stage import GlobalContext, GlobalTasks, StageConfig
from datapipe.storage import Store

WAIT_S = 0.5  # how long the driver waits in Ray at a time: a Ctrl-C is seen within that
STARTED_SESSIONS: list[str] = []  # the session folder of a local Ray that connect started, until disconnect
MIN_IN_FLIGHT = 64  # partition tasks queued at least: an autoscaler sees the demand and adds nodes


def run_recipe(recipe: Recipe, out_dir: Path | str | None = None, ray_address: str | None = None,
               console: Console | None = None, restart: bool = False) -> dict[str, Any]:
    """Run the whole recipe (or what a killed run left to do); return the stats also written to
    <out>/stats.json. Every check that needs no cluster comes before Ray starts, and none of them
    touches a previous run's output."""
    console = console or Console(stderr=True)
    inputs = check_recipe(recipe)  # every source's inputs, listed once, here
    run = open_run(Store(out_dir or Path("out") / recipe.name), recipe, restart)
    if run.finished:
        console.print(f"{run.out.location} holds this recipe's finished run; nothing to do (--restart runs it again)")
        return json.loads(run.out.read_text("stats.json"))
    plan = plan_partitions(recipe, inputs)
    resuming = run.resumes(plan)
    connect(recipe.ray, ray_address)
    check_actor_cpus(recipe)
    run.begin(plan)  # the first write to the output: every check has passed
    if resuming:
        console.print(f"resuming {run.target.location}: what an earlier attempt committed is kept", highlight=False)
    started = time.monotonic(), time.time_ns() // 1_000_000  # the run's time, and its wall clock for the timeline
    partitions = commit_documents(recipe, plan, run, console)
    try:
        check_read(recipe, inputs, partition_stats(recipe, partitions))
    except RunError:
        account_partitions(recipe, partitions, run, phases=[])  # the rejects files name every input and its error
        raise
    phases, packed = pack_phases(recipe, partitions, run, console)
    stats = run_stats(recipe, partitions, account_partitions(recipe, partitions, run), phases, packed, started)
    run.target.write_bytes("stats.json", json.dumps(stats, indent=2).encode())
    documents = {} if recipe.phases else {"documents": f"{DOCUMENTS}/"}  # no phases: where the documents are
    write_run_manifest(run.target, [{"name": phase.name} for phase in recipe.phases],  # last: the run is done
                       {"recipe": recipe.name, "seed": recipe.seed, **documents})
    run.finish()
    return stats


def special_ids(recipe: Recipe) -> SpecialIds:
    tokenize = next(stage for stage in recipe.stages if stage.stage == "tokenize")
    return SpecialIds.from_tokenizer(tokenize.tokenizer)


def commit_documents(recipe: Recipe, plan: list[dict[str, Any]], run: RunFolder, console: Console) -> list[Partition]:
    """Every partition committed: the ones a killed run committed read back, the others run now, as
    partition tasks when every stage allows it (datapipe.pipeline.partition_task), else as a Ray Data
    plan of an operator a stage."""
    done = {index: read_committed(run.work, index) for index in range(len(plan))}
    todo = [index for index, part in done.items() if part is None]
    if len(todo) < len(plan):
        console.print(f"{len(plan) - len(todo)} of {len(plan)} partitions were committed by an earlier attempt",
                      highlight=False)
    if todo:
        settings = CommitSettings(run.work, special_ids(recipe) if recipe.phases else None, tuple(recipe.phases),
                                  tuple(source.name for source in recipe.sources), recipe.seed)
        if uses_partition_tasks(recipe):
            committed = run_partition_tasks(recipe, plan, todo, settings, console)
        else:
            committed = run_operator_plan(recipe, plan, todo, settings, console)
        done.update({part.index: part for part in committed})
    missing = [index for index, part in done.items() if part is None]
    if missing:
        raise RuntimeError(f"partitions {missing[:5]} never reached the end of the plan; rerun to finish them")
    return [done[index] for index in range(len(plan))]


def uses_partition_tasks(recipe: Recipe) -> bool:
    return recipe.ray.partition_tasks and fits_partition_tasks(recipe.stages)


def run_partition_tasks(recipe: Recipe, plan: list[dict[str, Any]], todo: list[int], settings: CommitSettings,
                        console: Console) -> list[Partition]:
    """The recipe's passes (partition_task.split_passes), each a Ray task per partition, a global stage's
    decision between two; the driver receives each partition's marker contents, nothing more. A pass
    that ends at a global stage runs only while no partition is committed, so `todo` is then every one."""
    limit, decision = in_flight(recipe), None
    for step in split_passes(recipe.stages):
        if step.closing is None:
            return run_pass(recipe, plan, todo, step, decision, settings, console, limit)
        decision = gather_and_decide(recipe, plan, todo, step, decision, settings, console, limit)


def gather_and_decide(recipe: Recipe, plan: list[dict[str, Any]], todo: list[int], step: Pass, decision: Any,
                      settings: CommitSettings, console: Console, limit: int) -> Any:
    """A pass that ends at a global stage, for the partitions it has not stored yet; then the stage's
    decision (a killed run's is reused); its per-batch step for the next pass returned."""
    stored = {index: read_stored_marker(settings.work, step.number + 1, index) for index in todo}
    missing = [index for index, marker in stored.items() if marker is None]
    for marker in run_pass(recipe, plan, missing, step, decision, settings, console, limit):
        stored[marker["partition"]] = marker
    _, cfg = step.closing
    module, folder = registry.stage_module(cfg.stage), stage_folder(settings.work, step.closing)
    live = {index: marker["live"] for index, marker in stored.items() if marker["live"]}
    with console.status(f"{cfg.stage}: deciding over {sum(live.values()):,} documents of {len(live):,} partitions"):
        token = module.decide(cfg, GlobalTasks(folder, partial(run_task, cfg), dataset_of), sorted(live),
                              sum(live.values()))
    return module.decision(cfg, folder, token)


def run_pass(recipe: Recipe, plan: list[dict[str, Any]], todo: list[int], step: Pass, decision: Any,
             settings: CommitSettings, console: Console, limit: int) -> list:
    """One pass as a Ray task per partition, up to `limit` in flight; the tasks' results (partition_task.run_partition)."""
    import ray

    sources = {source.name: source for source in recipe.sources}
    jobs = iter(PartitionJob(index, plan[index], sources[plan[index]["source"]], step, settings, decision)
                for index in todo)
    # SPREAD: partitions dealt over the nodes, where Ray's default fills the driver's node first
    task = ray.remote(run_partition).options(num_cpus=1, max_retries=3, scheduling_strategy="SPREAD")
    pending, results, shown = {}, [], RunStats(recipe.name)
    with partition_progress(console) as progress:
        bar = progress.add_task(pass_label(recipe, step), total=len(todo), records=0, tokens=0, rps=0.0, tps=0.0)
        while True:
            for job in islice(jobs, limit - len(pending)):
                pending[task.remote(job)] = job
            if not pending:
                return results
            ready = next_done(pending)
            del pending[ready]
            results.append(ray.get(ready))
            shown.add(results[-1].stats if step.closing is None else results[-1]["stats"])
            update_progress(progress, bar, shown, partitions=len(results))


def pass_label(recipe: Recipe, step: Pass) -> str:
    """The bar's name: the recipe's, and with global stages which stretch of the recipe this pass is."""
    if step.opening is None and step.closing is None:
        return recipe.name
    begin = "read" if step.opening is None else step.opening[1].stage
    return f"{recipe.name}: {begin} -> {'commit' if step.closing is None else step.closing[1].stage}"


def run_task(cfg: StageConfig, fn: Callable, *args: Any) -> Any:
    """fn(*args) as one Ray task with the stage's resources (GlobalTasks.run_task); its result."""
    import ray

    ref = ray.remote(fn).options(max_retries=3, **cfg.reservation()).remote(*args)
    return ray.get(next_done({ref: None}))


def dataset_of(items: list, fn: Callable[[Any], Any]):
    """A dataset of the Arrow tables fn(item) returns, a Ray task an item (GlobalTasks.dataset_of)."""
    import ray

    configure_ray_data()
    dataset = ray.data.from_items([{"item": item} for item in items], override_num_blocks=max(len(items), 1))
    dataset.context.shuffle_strategy = "sort_shuffle_pull_based"  # as add_stage sets for global stages
    return dataset.map_batches(call_per_item, fn_kwargs={"fn": fn}, batch_size=1, batch_format="pyarrow")


def call_per_item(items, fn: Callable[[Any], Any]) -> Iterator[Any]:
    for item in items.column("item").to_pylist():
        yield fn(item)


def next_done(pending: dict) -> Any:
    """The first of these Ray tasks to finish. ray.wait is asked again every WAIT_S: blocked in it
    without a timeout, the driver never saw a Ctrl-C (it stayed in Ray's C++ wait for good)."""
    import ray

    while True:
        done, _ = ray.wait(list(pending), num_returns=1, timeout=WAIT_S)
        if done:
            return done[0]


def in_flight(recipe: Recipe) -> int:
    """Partition tasks submitted at once: the stages' `concurrency` cap, else twice the cluster's CPUs
    at start, and at least 64 (queued work is what makes an autoscaler add nodes). Asked once: a Ctrl-C
    stops Ray's GCS with the driver, and a driver asking the GCS then would wait for it for good."""
    import ray

    return most_at_once(recipe.stages) or max(MIN_IN_FLIGHT, 2 * int(ray.cluster_resources().get("CPU", 1)))


def run_operator_plan(recipe: Recipe, plan: list[dict[str, Any]], todo: list[int], settings: CommitSettings,
                      console: Console) -> list[Partition]:
    """The Ray Data plan (build_plan), its last operator committing blocks; the driver reads the small
    summaries in order and commits each partition when its closing row arrives."""
    summaries = build_plan(recipe, plan, todo, settings.work).map_batches(
        commit_block, fn_kwargs={"settings": settings}, batch_size=None, batch_format="pyarrow")
    log, shown = PartitionLog(settings.work), RunStats(recipe.name)
    with partition_progress(console) as progress:  # partitions committed of all: the bar and its ETA
        task = progress.add_task(recipe.name, total=len(todo), records=0, tokens=0, rps=0.0, tps=0.0)
        for table in summaries.iter_batches(batch_format="pyarrow", batch_size=None):
            for row in table.to_pylist():
                log.add(row)
                shown.add(json.loads(row["stats"]))
            update_progress(progress, task, shown, partitions=len(log.committed))
    return log.committed


def partition_stats(recipe: Recipe, partitions: list[Partition]) -> RunStats:
    """The run's figures as the committed partitions counted them (before packing's late rejects)."""
    stats = RunStats(recipe.name)
    for part in partitions:
        stats.add(part.stats)
    return stats


def pack_phases(recipe: Recipe, partitions: list[Partition], run: RunFolder,
                console: Console) -> tuple[dict[str, Any], list[tuple[str, list[int]]]]:
    """Every phase's groups packed by Ray tasks (those a killed run committed read back); each phase's
    manifest written from its groups' shards; its stats returned, and each group's times as a stage
    "pack <phase>" ([start ms, end ms, documents, tokens]: timeline.throughput's entries)."""
    import ray

    if not recipe.phases:  # the documents are the output (account_partitions writes them)
        return {}, []
    started, names = time.monotonic(), [source.name for source in recipe.sources]
    tokens = [part.stats.get("tokens", 0) for part in partitions]  # each partition's live tokens
    jobs, results, targets = [], {}, {}
    for phase in recipe.phases:
        supplies = [np.asarray(part.supply.get(phase.name, np.zeros(len(names))), dtype=float) for part in partitions]
        targets[phase.name] = phase_targets(phase, names, np.sum(supplies, axis=0) if supplies else np.zeros(len(names)),
                                            sum(tokens))
        for group, members in enumerate(plan_groups(phase, supplies, tokens, targets[phase.name])):
            job = group_job(recipe, phase, group, [partitions[i] for i in members], targets[phase.name])
            marker = run.work.read_text(job.marker)
            results[phase.name, group] = json.loads(marker) if marker is not None else None
            jobs += [job] if marker is None else []
    pack = ray.remote(run_group).options(num_cpus=1, max_retries=3, scheduling_strategy="SPREAD")
    pending = {pack.remote(job, run.work, run.target): job for job in jobs}
    with task_progress(console) as progress:
        task = progress.add_task(f"packing {len(recipe.phases)} phases", total=len(results),
                                 completed=len(results) - len(pending))
        while pending:
            ready = next_done(pending)
            job = pending.pop(ready)
            results[job.phase.name, job.group] = ray.get(ready)
            progress.update(task, completed=sum(value is not None for value in results.values()))
    phases = {phase.name: write_phase(recipe, phase, [results[key] for key in sorted(results) if key[0] == phase.name],
                                      targets[phase.name], run, time.monotonic() - started)
              for phase in recipe.phases}
    return phases, [(f"pack {phase.name}", [*group["span_ms"], group["stats"]["copies"], group["stats"]["tokens"]])
                    for phase in recipe.phases for (name, _), group in sorted(results.items())
                    if name == phase.name and "span_ms" in group]


def group_job(recipe: Recipe, phase, group: int, members: list[Partition], targets) -> GroupJob:
    tokenize = next(stage for stage in recipe.stages if stage.stage == "tokenize")
    return GroupJob(phase, group, tuple(part.index for part in members),
                    tuple(piece for part in members for piece in part.pieces), targets,
                    tuple(source.name for source in recipe.sources), recipe.seed, tokenize.tokenizer,
                    recipe.shards.samples_per_shard, recipe.shards.max_bytes)


def write_phase(recipe: Recipe, phase, groups: list[dict[str, Any]], targets, run: RunFolder,
                wall_s: float) -> dict[str, Any]:
    """A phase's manifest (its groups' shards, in group order) and its stats."""
    info = {"recipe": recipe.name, "seed": recipe.seed, "phase": phase.name, "seq_len": phase.seq_len,
            "recipe_config": recipe.model_dump(mode="json", exclude={"base_dir"})}
    write_manifest(run.target.child(phase.name), info, [shard for group in groups for shard in group["shards"]])
    names = [source.name for source in recipe.sources]
    return phase_stats(phase, targets, names, [group["stats"] for group in groups], wall_s)


def account_partitions(recipe: Recipe, partitions: list[Partition], run: RunFolder,
                       phases: list[str] | None = None) -> list[dict[str, Any]]:
    """Every partition's late rejects and rejects file (Ray tasks; a killed run's read back), and in a run
    without phases its documents file. With phases=[] (a run that stops before packing) only the readers'
    and stages' rejects are written."""
    import ray

    documents = not recipe.phases and phases is None
    phases = [phase.name for phase in recipe.phases] if phases is None else phases
    account = ray.remote(account_partition).options(num_cpus=1, max_retries=3)
    stored = [run.work.read_text(account_name(part.index)) for part in partitions]
    refs = [account.remote(part, phases, run.work, run.target, documents) if text is None else None
            for part, text in zip(partitions, stored)]
    return [json.loads(text) if text is not None else ray.get(ref) for text, ref in zip(stored, refs)]


def run_stats(recipe: Recipe, partitions: list[Partition], accounts: list[dict[str, Any]], phases: dict[str, Any],
              packed: list[tuple[str, list[int]]], started: tuple[float, int]) -> dict[str, Any]:
    """The run's figures; `packed`: pack_phases' group times; `started`: the run's monotonic and Unix ms start."""
    stats = partition_stats(recipe, partitions)
    for account in accounts:
        stats.add(account["stats"])
    for stage, times in packed:
        add_times(stats.stage_times, stage, times)
    stats.phases = phases
    stats.wall_s = time.monotonic() - started[0]
    execution = "partition tasks" if uses_partition_tasks(recipe) else "an operator a stage"
    entries = [(stage, times) for part in partitions for stage, times in part.stats.get("stage_times", {}).items()]
    timeline = throughput(entries + packed, started[1], time.time_ns() // 1_000_000)
    return {**stats.to_dict(), "throughput": timeline, "execution": execution, "driver": driver_figures()}


def driver_figures() -> dict[str, Any]:
    """What this process (the driver) spent: its CPU seconds, its peak resident memory and, when Python
    traces allocations (PYTHONTRACEMALLOC=1), its peak Python heap: they grow with partitions, not documents."""
    import resource
    import tracemalloc

    usage = resource.getrusage(resource.RUSAGE_SELF)
    figures = {"cpu_s": round(usage.ru_utime + usage.ru_stime, 2), "max_rss_mb": round(usage.ru_maxrss / 1024, 1)}
    if tracemalloc.is_tracing():
        figures["heap_peak_mb"] = round(tracemalloc.get_traced_memory()[1] / 2**20, 2)
    return figures


def connect(cfg: RayConfig, address: str | None) -> None:
    """Join a cluster (--ray-address, the recipe, or RAY_ADDRESS), else start Ray on this machine,
    watched by a process that stops it if this one dies (datapipe.pipeline.reaper)."""
    import ray

    address = address or cfg.address or os.environ.get("RAY_ADDRESS")
    if address:
        check_reachable(address)
    if not ray.is_initialized():
        quiet = {"logging_level": logging.ERROR, "log_to_driver": True, "include_dashboard": False}
        if address:
            import datapipe
            import renderers
            import tokenizer

            try:
                ray.init(address=address, runtime_env={"py_modules": [datapipe, renderers, tokenizer]}, **quiet)
            except (ConnectionError, RuntimeError) as err:
                raise RunError(cluster_hint(address, err)) from None
        else:
            # Ray's processes inherit this one's environment: tracing the driver's heap (bench/scale.py) must
            # not make every worker trace its allocations too (2-5x slower work).
            os.environ.pop("PYTHONTRACEMALLOC", None)
            watchdog = reaper.watch()  # before ray.init: a driver killed while Ray starts leaves nothing either
            started = ray.init(num_cpus=cfg.num_cpus, object_store_memory=cfg.object_store_mb << 20, **quiet)
            reaper.tell_session(watchdog, started.address_info["session_dir"])
            STARTED_SESSIONS.append(started.address_info["session_dir"])


def disconnect() -> None:
    """Stop the local Ray that connect started, its autoscaler monitor killed first (reaper.kill_monitor:
    ray.shutdown then takes 0.4 s, not 1.4 s). A Ray this process had joined already (a notebook's, the
    tests') is left running, and a cluster's connection ends with the process."""
    import ray

    while STARTED_SESSIONS:
        reaper.kill_monitor(STARTED_SESSIONS.pop())
        ray.shutdown()


def check_reachable(address: str) -> None:
    """Fail at once when nothing listens at host:port (ray.init would retry for minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():  # "auto", "local": Ray finds the cluster itself
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as err:
        raise RunError(f"nothing answers at {address} ({err.strerror or err}): start the cluster (`ray start --head` "
                       "on its head node prints the address to use) or fix --ray-address / RAY_ADDRESS") from None


def cluster_hint(address: str, err: Exception) -> str:
    first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    hint = (f"cannot join the Ray cluster at {address} ({first_line}). Check the address (`ray status` on the "
            "head node prints it; ray://host:10001 for Ray Client) and that this machine runs the same Ray version")
    if os.environ.get("RAY_AUTH_MODE") != "token":
        hint += ("; a cluster started with `ray start` uses token authentication by default: set "
                 "RAY_AUTH_MODE=token here (the token comes from ~/.ray/auth_token or RAY_AUTH_TOKEN)")
    return hint


def build_plan(recipe: Recipe, plan: list[dict[str, Any]] | None = None, todo: list[int] | None = None,
               work: Store | None = None):
    """The partitions to do (default: all) of each source, their union, then the recipe's stages in
    order. `work` is the run's work folder (global stages keep their files there; default: a
    temporary folder, for callers outside a run)."""
    configure_ray_data()
    plan = plan_partitions(recipe, list_inputs(recipe)) if plan is None else plan
    todo = range(len(plan)) if todo is None else todo
    work = work or Store(tempfile.mkdtemp(prefix="datapipe-work-"))
    datasets = [read_source(recipe, source, [{**plan[i], "partition": i} for i in todo
                                             if plan[i]["source"] == source.name]) for source in recipe.sources]
    datasets = [dataset for dataset in datasets if dataset is not None]
    dataset = datasets[0].union(*datasets[1:]) if len(datasets) > 1 else datasets[0]
    for index, cfg in enumerate(recipe.stages):
        dataset = add_stage(dataset, cfg, stage_folder(work, (index, cfg)))
    return dataset


def configure_ray_data() -> None:
    """Ray Data's settings for our plans (imported here only: partition tasks never load ray.data)."""
    import ray.data

    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # same recipe and seed, same shards
    context.enable_progress_bars = False  # ours shows records/s and tokens/s
    context.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.ERROR)  # its notices talk about the bars we turned off


def read_source(recipe: Recipe, source, items: list[dict[str, Any]]):
    """A Ray task per partition of the source (None when none is left to do)."""
    import ray

    if not items:
        return None
    return ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
        read_items, batch_size=1, batch_format="pyarrow", fn_kwargs={"source": source, "seed": recipe.seed})


def read_items(items, source, seed: int) -> Iterator[Any]:
    """A Ray task: read one partition, yield Arrow blocks of its documents, numbered; the last block
    ends with the row that closes the partition (datapipe.pipeline.partitions.end_row)."""
    for item in items.to_pylist():
        for block in numbered_blocks(read_partition(source, seed, item, item["partition"]), item["partition"], READ_BATCH):
            yield docs_to_table(block)


def check_actor_cpus(recipe: Recipe) -> None:
    """Fail now, not hang later (datapipe.pipeline.sizing): a stage whose task or actor fits on no node,
    or minimum actor pools that leave no CPU for the reads, would make Ray wait forever. The name is
    older than the check, which covers every resource a stage reserves, CPUs included."""
    import ray

    nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    problems = placement_problems(recipe.stages, nodes)
    if not uses_partition_tasks(recipe):  # partition tasks hold no pool: one CPU runs them all, in turn
        problems += held_problems(recipe.stages, ray.cluster_resources())
    if problems:
        raise RecipeError(f"recipe {recipe.name!r} cannot run on this Ray cluster", problems)


def add_stage(dataset, cfg: StageConfig, work: Store | None = None):
    module = registry.stage_module(cfg.stage)
    if registry.is_global(cfg.stage):
        # A global stage (dedup) must see the whole dataset, not one batch: it gets the dataset
        # and returns a new one, using only the dataset's own methods (materialize, map_batches,
        # groupby). Its per-record verdicts go through `map_documents`, so the accounting rules
        # of every other stage (no record dropped, transforms marked) hold too. Its groupings
        # use the sort-based shuffle: Ray 2.60's default hash shuffle took 30-75 s a grouping
        # of 30K rows on 2 CPUs (aggregator actors), the sort-based one 0.3-0.4 s.
        dataset.context.shuffle_strategy = "sort_shuffle_pull_based"  # this plan's context, a copy
        work = work or Store(tempfile.mkdtemp(prefix=f"datapipe-{cfg.stage}-"))  # a plan built without a run
        return module.transform_dataset(dataset, cfg, GlobalContext(partial(map_documents, cfg=cfg), work))
    common = {"batch_size": cfg.batch_size, "batch_format": "pyarrow", **cfg.reservation()}
    if type(cfg).actor:
        import ray

        # A read task's output is coalesced into blocks of up to 128 MiB, and a whole block goes to
        # one actor: cut blocks to batch_size rows (streaming, order kept) so the pool shares them.
        dataset = dataset.repartition(target_num_rows_per_block=cfg.batch_size)
        # The config rides on a subclass, not in constructor arguments, which Ray would park in
        # the object store (and warn that an actor restart could lose them).
        actor_class = type(f"{cfg.stage.title()}Actor", (StageActor,), {"cfg": cfg})
        # A worker that dies (killed, out of memory, its node lost) costs nothing: Ray Data restarts
        # actors and retries their batches and tasks without limit (max_restarts, max_task_retries and
        # max_retries all -1 by default; Ray 2.60 deprecates setting them here). Order is kept, so the
        # shards are the same (tests/test_cluster.py kills a tokenize actor mid-run).
        low, high = pool_bounds(cfg, ray.cluster_resources())
        return dataset.map_batches(actor_class, compute=ray.data.ActorPoolStrategy(min_size=low, max_size=high),
                                   **common)
    return dataset.map_batches(run_stage_task, fn_kwargs={"cfg": cfg}, **common)


def map_documents(dataset, stage: Callable[[list[Document]], list[Document]], cfg: StageConfig):
    """`stage` (a picklable callable over documents) as a task operator with the runner's accounting."""
    return dataset.map_batches(run_callable_task, fn_kwargs={"stage": stage, "name": cfg.stage},
                               batch_size=cfg.batch_size, batch_format="pyarrow", **cfg.reservation())


def run_callable_task(table, stage: Callable, name: str):
    return apply_stage(stage, name, table)


class StageActor:
    """Holds one stage's warm resource (a tokenizer, a browser, a model) across batches."""

    cfg: StageConfig

    def __init__(self):
        self.stage = build_stage(self.cfg)

    def __call__(self, table):
        return apply_stage(self.stage, self.cfg.stage, table)


def run_stage_task(table, cfg: StageConfig):
    return apply_stage(cached_stage(cfg.stage, cfg.model_dump_json()), cfg.stage, table)


