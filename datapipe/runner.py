"""Turn a recipe into a streaming Ray Data plan and run it. The only module that imports Ray.

The plan reads top to bottom: one read operator per source (a Ray task per file or
per generator range), their union, then each recipe stage as a `map_batches`
operator (tasks for plain functions, an actor pool for stages that keep a warm
resource). The driver consumes the stream in order: rejects go to the rejects file,
live documents to the packer and the shard writer. Order is preserved, so the same
recipe and seed give the same shards.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

from rich.console import Console

from datapipe import registry
from datapipe.config import Recipe, RecipeError, RayConfig, SourceConfig, StageConfig
from datapipe.packing import Packer
from datapipe.report import RunStats, make_progress, update_progress
from datapipe.schema import Document, docs_from_table, docs_to_table, mark_transform
from datapipe.shards import ShardWriter
from datapipe.sources import read_work_item, work_items

READ_BATCH = 1024  # documents per Arrow block out of a reader


def run_recipe(recipe: Recipe, out_dir: Path | None = None, ray_address: str | None = None,
               console: Console | None = None) -> dict[str, Any]:
    """Run the whole recipe; return the stats also written to <out>/stats.json."""
    console = console or Console(stderr=True)
    out = prepare_out_dir(Path(out_dir or Path("out") / recipe.name), recipe)
    connect(recipe.ray, ray_address)
    dataset = build_plan(recipe)
    stats = RunStats(recipe.name)
    packer = Packer(recipe.pack.name, recipe.pack.seq_len, recipe.pack.window, pad_id(recipe))
    info = {"recipe": recipe.name, "seed": recipe.seed, "stage": recipe.pack.name, "seq_len": recipe.pack.seq_len}
    with ShardWriter(out / recipe.pack.name, recipe.shards.samples_per_shard, info) as shards, \
            open(out / "rejects" / "rejects.jsonl", "w") as rejects, make_progress(console) as progress:
        task = progress.add_task(recipe.name, total=None, tokens=0, rps=0.0, tps=0.0)
        for table in dataset.iter_batches(batch_format="pyarrow", batch_size=None):
            for doc in docs_from_table(table):
                stats.count(doc)
                if doc["reject"]:
                    rejects.write(reject_line(doc) + "\n")
                else:
                    for sample in packer.add(doc["id"], doc["tokens"]):
                        shards.write(sample)
            update_progress(progress, task, stats)
        for sample in packer.flush():
            shards.write(sample)
        manifest = shards.close()
    stats.packing[recipe.pack.name] = packing_stats(manifest, packer)
    stats.finish()
    stats.save(out / "stats.json")
    return stats.to_dict()


def pad_id(recipe: Recipe) -> int:
    from tokenizer.bpe import special_token_ids

    tokenize = next(stage for stage in recipe.stages if stage.stage == "tokenize")
    return special_token_ids(tokenize.tokenizer)["<|pad|>"]


def prepare_out_dir(out: Path, recipe: Recipe) -> Path:
    """Refuse a non-empty folder that datapipe did not write; clear our own previous run."""
    if out.exists() and any(out.iterdir()) and not (out / "stats.json").exists() and not (out / "recipe.json").exists():
        raise RecipeError(f"{out} is not empty and was not written by datapipe; pass a new or empty --out")
    for stale in (out / recipe.pack.name, out / "rejects"):
        shutil.rmtree(stale, ignore_errors=True)
    (out / "stats.json").unlink(missing_ok=True)
    (out / "rejects").mkdir(parents=True)
    (out / "recipe.json").write_text(recipe.model_dump_json(indent=2))
    return out


def connect(cfg: RayConfig, address: str | None) -> None:
    """Join a cluster (--ray-address, the recipe, or RAY_ADDRESS), else start Ray on this machine."""
    import ray

    if not ray.is_initialized():
        address = address or cfg.address or os.environ.get("RAY_ADDRESS")
        quiet = {"logging_level": logging.ERROR, "log_to_driver": True, "include_dashboard": False}
        if address:
            import datapipe, renderers, tokenizer

            ray.init(address=address, runtime_env={"py_modules": [datapipe, renderers, tokenizer]}, **quiet)
        else:
            ray.init(num_cpus=cfg.num_cpus, object_store_memory=cfg.object_store_mb << 20, **quiet)
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # same recipe and seed, same shards
    context.enable_progress_bars = False  # ours shows records/s and tokens/s
    context.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.ERROR)  # its notices talk about the bars we turned off


def build_plan(recipe: Recipe):
    """Sources, their union, then the recipe's stages in order."""
    datasets = [read_source(recipe, source) for source in recipe.sources]
    dataset = datasets[0].union(*datasets[1:]) if len(datasets) > 1 else datasets[0]
    for cfg in recipe.stages:
        dataset = add_stage(dataset, cfg)
    return dataset


def read_source(recipe: Recipe, source: SourceConfig):
    import ray

    items = work_items(recipe, source)
    dataset = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
        read_items, batch_size=1, batch_format="pyarrow", fn_kwargs={"source": source, "seed": recipe.seed}
    )
    return dataset.limit(source.limit) if source.limit else dataset


def read_items(items, source: SourceConfig, seed: int) -> Iterator[Any]:
    """A Ray task: read one work item, yield Arrow blocks of documents."""
    for item in items.to_pylist():
        yield from batched_tables(read_work_item(source, seed, item))


def batched_tables(documents: Iterator[Document]) -> Iterator[Any]:
    batch: list[Document] = []
    for doc in documents:
        batch.append(doc)
        if len(batch) == READ_BATCH:
            yield docs_to_table(batch)
            batch = []
    if batch:
        yield docs_to_table(batch)


def add_stage(dataset, cfg: StageConfig):
    common = {"batch_size": cfg.batch_size, "batch_format": "pyarrow"}
    resources = {key: value for key, value in (("num_cpus", cfg.num_cpus), ("num_gpus", cfg.num_gpus))
                 if value is not None}
    if type(cfg).actor:
        import ray

        # The config rides on a subclass, not in constructor arguments, which Ray would park in
        # the object store (and warn that an actor restart could lose them).
        actor_class = type(f"{cfg.stage.title()}Actor", (StageActor,), {"cfg": cfg})
        return dataset.map_batches(actor_class, compute=ray.data.ActorPoolStrategy(size=cfg.concurrency or 1),
                                   **common, **resources)
    return dataset.map_batches(run_stage_task, fn_kwargs={"cfg": cfg}, **common, **resources)


class StageActor:
    """Holds one stage's warm resource (a tokenizer, a browser, a model) across batches."""

    cfg: StageConfig

    def __init__(self):
        self.stage = registry.stage_module(self.cfg.stage).make_stage(self.cfg)

    def __call__(self, table):
        return apply_stage(self.stage, self.cfg.stage, table)


def run_stage_task(table, cfg: StageConfig):
    return apply_stage(cached_stage(cfg.stage, cfg.model_dump_json()), cfg.stage, table)


@lru_cache(maxsize=32)
def cached_stage(name: str, cfg_json: str) -> Callable:
    module = registry.stage_module(name)
    return module.make_stage(module.Config.model_validate_json(cfg_json))


def apply_stage(stage: Callable, name: str, table):
    """Run a stage on the live documents of a batch; rejected ones pass by untouched."""
    docs = docs_from_table(table)
    dead = [doc for doc in docs if doc["reject"]]
    alive = [doc for doc in docs if not doc["reject"]]
    try:
        out = stage(alive) if alive else []
    except Exception:  # noqa: BLE001 - one bad record must not fail the batch: retry one by one
        out = [kept for doc in docs_from_table(table) if not doc["reject"] for kept in run_one(stage, name, doc)]
    check_accounted(name, alive, out)
    for doc in out:
        if not doc["reject"]:
            mark_transform(doc, name)
    return docs_to_table(out + dead)


def run_one(stage: Callable, name: str, doc: Document) -> list[Document]:
    try:
        return stage([doc])
    except Exception as err:  # noqa: BLE001 - the error becomes the record's reject reason
        doc["reject"] = f"{name}.error"
        doc["meta"]["error"] = f"{type(err).__name__}: {err}"[:500]
        return [doc]


def check_accounted(name: str, alive: list[Document], out: list[Document]) -> None:
    missing = {doc["id"] for doc in alive} - {doc["id"] for doc in out}
    if missing:
        raise RuntimeError(f"stage {name!r} dropped {len(missing)} records without a reject reason "
                           f"(for example {sorted(missing)[0]}); a stage sets doc['reject'] instead of dropping")


def reject_line(doc: Document) -> str:
    keep = {k: doc[k] for k in ("id", "source", "source_id", "kind", "reject")}
    return json.dumps({**keep, "text": doc["text"][:2000], "meta": doc["meta"]}, ensure_ascii=False)


def packing_stats(manifest: dict[str, Any], packer: Packer) -> dict[str, Any]:
    capacity = manifest["samples"] * packer.seq_len
    return {
        "seq_len": packer.seq_len,
        "samples": manifest["samples"],
        "shards": len(manifest["shards"]),
        "tokens": manifest["tokens"],
        "fill": manifest["tokens"] / capacity if capacity else 0.0,
        "split_docs": packer.split_docs,
    }
