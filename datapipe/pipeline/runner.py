"""Turn a recipe into a streaming Ray Data plan and run it. The only module that imports Ray.

The plan reads top to bottom: one read operator per source (a Ray task per file or
per generator range), their union, then each recipe stage as a `map_batches`
operator (tasks for plain functions, an actor pool for stages that keep a warm
resource). The driver consumes the stream in order: rejects go to the rejects file,
live documents to a spill (out/<run>/spill/, written once). Then each curriculum
phase selects and packs from the whole spill and writes its shards. Order is
preserved, so the same recipe and seed give the same shards.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import tempfile
import time
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterator

from rich.console import Console
from rich.progress import track

from datapipe.packing.bfd import SpecialIds
from datapipe.packing.corpus import Corpus, SpillWriter
from datapipe.packing.curriculum import CurriculumPhase, Usage, pack_phase, phase_stats
from datapipe.packing.writer import ShardWriter, write_run_manifest
from datapipe.pipeline import registry
from datapipe.pipeline.apply import apply_stage, cached_stage, reject_line
from datapipe.pipeline.check import check_recipe
from datapipe.pipeline.inputs import read_work_item, work_items
from datapipe.pipeline.recipe import RayConfig, Recipe, RecipeError, RunError, SourceConfig
from datapipe.pipeline.report import make_progress, update_progress
from datapipe.pipeline.stats import RunStats
from datapipe.schema import Document, docs_from_table, docs_to_table
from datapipe.shardformat import MANIFEST, RUN_MANIFEST
from datapipe.stage import GlobalContext, StageConfig
from datapipe.storage import Store

READ_BATCH = 1024  # documents per Arrow block out of a reader
SPILL = "spill"  # out/<run>/spill/: the live tokenized documents, written once, read by every curriculum phase
WORK = "work"  # out/<run>/work/<stage>/: a global stage's own files (dedup's verdicts)


def run_recipe(recipe: Recipe, out_dir: Path | None = None, ray_address: str | None = None,
               console: Console | None = None) -> dict[str, Any]:
    """Run the whole recipe; return the stats also written to <out>/stats.json.

    Every check comes before the previous output is cleared, and those that need no cluster before Ray starts."""
    console = console or Console(stderr=True)
    check_recipe(recipe)
    out = check_out_dir(Path(out_dir or Path("out") / recipe.name))
    connect(recipe.ray, ray_address)
    check_actor_cpus(recipe)
    prepare_out_dir(out, recipe)
    stats = RunStats(recipe.name)  # before the plan: a global stage (dedup) does work while planning
    dataset = build_plan(recipe, Store(out / WORK))
    ids = special_ids(recipe)
    spill = SpillWriter(out / SPILL, ids, [source.name for source in recipe.sources])
    with open(out / "rejects" / "rejects.jsonl", "w") as rejects:
        with make_progress(console) as progress:
            corpus = spill_documents(dataset, spill, stats, rejects, progress, recipe.name)
        usage = Usage(len(corpus.ids))
        for phase in recipe.phases:
            stats.phases[phase.name] = write_phase(phase, corpus, recipe, out, ids, usage, console)
        reject_unused(corpus, usage, stats, rejects)
    del corpus  # its memory maps close before the spill goes
    shutil.rmtree(out / SPILL)
    stats.finish()
    stats.save(out / "stats.json")
    write_run_manifest(out, [{"name": phase.name} for phase in recipe.phases],  # last: the run is done
                       {"recipe": recipe.name, "seed": recipe.seed})
    return stats.to_dict()


def special_ids(recipe: Recipe) -> SpecialIds:
    tokenize = next(stage for stage in recipe.stages if stage.stage == "tokenize")
    return SpecialIds.from_tokenizer(tokenize.tokenizer)


def spill_documents(dataset, spill: SpillWriter, stats: RunStats, rejects, progress, name: str) -> Corpus:
    """Consume the plan in order: rejects to the rejects file, live documents to the spill."""
    task = progress.add_task(name, total=None, tokens=0, rps=0.0, tps=0.0)
    for table in dataset.iter_batches(batch_format="pyarrow", batch_size=None):
        docs = docs_from_table(table)
        live = [doc for doc in docs if not doc["reject"]]
        for doc, reason in zip(live, spill.add_batch(live)):
            doc["reject"] = reason  # "" when spilled, else why it cannot be packed (media that do not match)
        for doc in docs:
            stats.count(doc)
            if doc["reject"]:
                rejects.write(reject_line(doc) + "\n")
        update_progress(progress, task, stats)
    return spill.finish()


def write_phase(phase: CurriculumPhase, corpus: Corpus, recipe: Recipe, out: Path, ids: SpecialIds, usage: Usage,
                console: Console) -> dict[str, Any]:
    """Pack one curriculum phase over the whole corpus and write its shards; return its stats."""
    started = time.monotonic()
    selection, sequences, samples = pack_phase(phase, corpus, recipe.seed, ids)
    info = {"recipe": recipe.name, "seed": recipe.seed, "phase": phase.name, "seq_len": phase.seq_len,
            "recipe_config": recipe.model_dump(mode="json", exclude={"base_dir"})}
    with ShardWriter(out / phase.name, recipe.shards.samples_per_shard, info, recipe.shards.max_bytes) as shards:
        for sample in track(samples, f"phase {phase.name}", total=sequences.num_sequences, console=console,
                            transient=True):
            shards.write(sample)
        manifest = shards.close()
    usage.record(selection)
    return phase_stats(phase, corpus, selection, sequences, manifest, started)


def reject_unused(corpus: Corpus, usage: Usage, stats: RunStats, rejects) -> None:
    """Documents that no phase packed (over budget, too long, outside every mixture) become rejects."""
    unused = usage.unused()
    while chunk := list(islice(unused, 10_000)):  # described a chunk at a time: memory stays flat
        for (row, reason), record in zip(chunk, corpus.describe([row for row, _ in chunk])):
            stats.reject_late(record, reason, int(corpus.lengths[row]))
            del record["text_chars"], record["text_bytes"]
            line = {**record, "reject": reason, "num_tokens": int(corpus.lengths[row])}
            rejects.write(json.dumps(line, ensure_ascii=False) + "\n")
    stats.stage_passed["pack"] = int((usage.uses > 0).sum())


def check_out_dir(out: Path) -> Path:
    """Refuse a non-empty folder that datapipe did not write (our own previous run is cleared later)."""
    if out.exists() and any(out.iterdir()) and not (out / "stats.json").exists() and not (out / "recipe.json").exists():
        raise RecipeError(f"{out} is not empty and was not written by datapipe; pass a new or empty --out")
    return out


def prepare_out_dir(out: Path, recipe: Recipe) -> None:
    """Clear our own previous run's phases, rejects, spill and stats; write recipe.json."""
    stale = [manifest.parent for manifest in out.glob(f"*/{MANIFEST}")]
    for folder in [*stale, *(out / phase.name for phase in recipe.phases), out / "rejects", out / SPILL, out / WORK]:
        shutil.rmtree(folder, ignore_errors=True)
    (out / "stats.json").unlink(missing_ok=True)
    (out / RUN_MANIFEST).unlink(missing_ok=True)  # written last; its absence marks an unfinished run
    (out / "rejects").mkdir(parents=True)
    (out / "recipe.json").write_text(recipe.model_dump_json(indent=2))


def connect(cfg: RayConfig, address: str | None) -> None:
    """Join a cluster (--ray-address, the recipe, or RAY_ADDRESS), else start Ray on this machine."""
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
            ray.init(num_cpus=cfg.num_cpus, object_store_memory=cfg.object_store_mb << 20, **quiet)
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # same recipe and seed, same shards
    context.enable_progress_bars = False  # ours shows records/s and tokens/s
    context.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.ERROR)  # its notices talk about the bars we turned off


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


def build_plan(recipe: Recipe, work: Store | None = None):
    """Sources, their union, then the recipe's stages in order; `work` holds global stages' own files."""
    datasets, partitions = [], 0
    for source in recipe.sources:
        # Stopgap until the runner's reader wrapper numbers records: partition = work item in plan order.
        items = [{**item, "partition": partitions + i} for i, item in enumerate(work_items(recipe, source))]
        datasets.append(read_source(recipe, source, items))
        partitions += len(items)
    dataset = datasets[0].union(*datasets[1:]) if len(datasets) > 1 else datasets[0]
    for index, cfg in enumerate(recipe.stages):
        dataset = add_stage(dataset, cfg, work.child(f"{index:02d}-{cfg.stage}") if work else None)
    return dataset


def read_source(recipe: Recipe, source: SourceConfig, items: list[dict[str, Any]]):
    import ray

    dataset = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
        read_items, batch_size=1, batch_format="pyarrow", fn_kwargs={"source": source, "seed": recipe.seed}
    )
    return dataset.limit(source.limit) if source.limit else dataset


def read_items(items, source: SourceConfig, seed: int) -> Iterator[Any]:
    """A Ray task: read one work item, yield Arrow blocks of documents."""
    for item in items.to_pylist():
        yield from batched_tables(numbered(read_work_item(source, seed, item), item["partition"]))


def numbered(documents: Iterator[Document], partition: int) -> Iterator[Document]:
    for index, doc in enumerate(documents):
        doc["partition"], doc["position"] = partition, index << 12
        yield doc


def batched_tables(documents: Iterator[Document]) -> Iterator[Any]:
    batch: list[Document] = []
    for doc in documents:
        batch.append(doc)
        if len(batch) == READ_BATCH:
            yield docs_to_table(batch)
            batch = []
    if batch:
        yield docs_to_table(batch)


def check_actor_cpus(recipe: Recipe) -> None:
    """Fail now, not hang later: actor pools hold their CPUs for the whole run, and the read and
    function tasks need at least one more CPU, else Ray waits forever for a free one."""
    import ray

    total = ray.cluster_resources().get("CPU", 0)
    held = {cfg.stage: (cfg.concurrency or 1) * (cfg.num_cpus if cfg.num_cpus is not None else 1)
            for cfg in recipe.stages if type(cfg).actor}
    if held and sum(held.values()) > total - 1:
        pools = ", ".join(f"{stage} {cpus:g}" for stage, cpus in held.items())
        raise RecipeError(f"actor stages hold {sum(held.values()):g} CPUs all run long ({pools}) but Ray has "
                          f"{total:g}, and reading needs one more: lower their concurrency or num_cpus, or "
                          f"set ray.num_cpus to at least {sum(held.values()) + 1:g} (logical CPUs may exceed cores)")


def add_stage(dataset, cfg: StageConfig, work: Store | None = None):
    module = registry.stage_module(cfg.stage)
    if hasattr(module, "transform_dataset"):
        # A global stage (dedup) must see the whole dataset, not one batch: it gets the dataset
        # and returns a new one, using only the dataset's own methods (materialize, map_batches,
        # groupby). Its per-record verdicts go through `map_documents`, so the accounting rules
        # of every other stage (no record dropped, transforms marked) hold too. Its groupings
        # use the sort-based shuffle: Ray 2.60's default hash shuffle took 30-75 s a grouping
        # of 30K rows on 2 CPUs (aggregator actors), the sort-based one 0.3-0.4 s.
        dataset.context.shuffle_strategy = "sort_shuffle_pull_based"  # this plan's context, a copy
        work = work or Store(tempfile.mkdtemp(prefix=f"datapipe-{cfg.stage}-"))  # a plan built without a run
        return module.transform_dataset(dataset, cfg, GlobalContext(partial(map_documents, cfg=cfg), work))
    common = {"batch_size": cfg.batch_size, "batch_format": "pyarrow"}
    resources = {key: value for key, value in (("num_cpus", cfg.num_cpus), ("num_gpus", cfg.num_gpus))
                 if value is not None}
    if type(cfg).actor:
        import ray

        # A read task's output is coalesced into blocks of up to 128 MiB, and a whole block goes to
        # one actor: cut blocks to batch_size rows (streaming, order kept) so the pool shares them.
        dataset = dataset.repartition(target_num_rows_per_block=cfg.batch_size)
        # The config rides on a subclass, not in constructor arguments, which Ray would park in
        # the object store (and warn that an actor restart could lose them).
        actor_class = type(f"{cfg.stage.title()}Actor", (StageActor,), {"cfg": cfg})
        return dataset.map_batches(actor_class, compute=ray.data.ActorPoolStrategy(size=cfg.concurrency or 1),
                                   **common, **resources)
    return dataset.map_batches(run_stage_task, fn_kwargs={"cfg": cfg}, **common, **resources)


def map_documents(dataset, stage: Callable[[list[Document]], list[Document]], cfg: StageConfig):
    """`stage` (a picklable callable over documents) as a task operator with the runner's accounting."""
    resources = {"num_cpus": cfg.num_cpus} if cfg.num_cpus is not None else {}
    return dataset.map_batches(run_callable_task, fn_kwargs={"stage": stage, "name": cfg.stage},
                               batch_size=cfg.batch_size, batch_format="pyarrow", **resources)


def run_callable_task(table, stage: Callable, name: str):
    return apply_stage(stage, name, table)


class StageActor:
    """Holds one stage's warm resource (a tokenizer, a browser, a model) across batches."""

    cfg: StageConfig

    def __init__(self):
        self.stage = registry.stage_module(self.cfg.stage).make_stage(self.cfg)

    def __call__(self, table):
        return apply_stage(self.stage, self.cfg.stage, table)


def run_stage_task(table, cfg: StageConfig):
    return apply_stage(cached_stage(cfg.stage, cfg.model_dump_json()), cfg.stage, table)


