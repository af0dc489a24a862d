"""What a source reads: its inputs listed (globs and folders expanded) or its generator
ranges cut, one work item (one Ray task) each, and the reader that turns an item into documents."""
from __future__ import annotations

import glob
from itertools import islice
from pathlib import Path
from typing import Any, Iterator

from datapipe.pipeline import registry
from datapipe.pipeline.recipe import RecipeError
from datapipe.schema import Document

GENERATOR_CHUNK = 500  # generator indices per work item (one Ray task each)


def work_items(recipe: Any, source: Any) -> list[dict[str, Any]]:
    """Files for readers (globs and folders expanded), index ranges for generators."""
    if source.type in registry.GENERATORS:
        return [{"path": "", "start": s, "stop": min(s + GENERATOR_CHUNK, source.count)}
                for s in range(0, source.count, GENERATOR_CHUNK)]
    files = [f for pattern in source.paths for f in expand_path(recipe.resolve(pattern))]
    # One missing file among others is a reject (read.missing_file); a source with none is a wrong path.
    if not any(Path(f).exists() for f in files):
        raise RecipeError(f"sources.{source.name}.paths: {source.paths} matched no files; fix the paths "
                          f"(relative ones start at the recipe's folder, {recipe.base_dir})")
    return [{"path": f, "start": 0, "stop": 0} for f in files]


def expand_path(path: Path) -> list[str]:
    if any(ch in str(path) for ch in "*?["):
        # a pattern that matches nothing is read as a missing file: a reject that names it, not a silent skip
        return sorted(glob.glob(str(path), recursive=True)) or [str(path)]
    if path.is_dir() and not (path / "dataset_info.json").exists() and not (path / "dataset_dict.json").exists():
        return sorted(str(p) for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    return [str(path)]  # a missing file becomes a reject at read time, not a silent skip


def read_work_item(source: Any, seed: int, item: dict[str, Any]) -> Iterator[Document]:
    reader = registry.load(registry.SOURCES[source.type])
    if source.type in registry.GENERATORS:
        return reader(source, seed, item["start"], item["stop"])
    return reader(source, item["path"])


def iter_recipe_documents(recipe: Any) -> Iterator[Document]:
    """Every document of a recipe's sources, read in this process (no Ray), limits applied."""
    for source in recipe.sources:
        documents = (doc for item in work_items(recipe, source) for doc in read_work_item(source, recipe.seed, item))
        for count, doc in enumerate(documents, start=1):
            yield doc
            if source.limit and count >= source.limit:
                break


def plan_partitions(recipe: Any) -> list[dict[str, Any]]:
    """The run's input partitions, numbered by their place in this list: each source's work items in
    recipe order. A source with a `limit` is one partition (its first `limit` records, read in order
    by one task), so that a limit never depends on how tasks were scheduled."""
    plan = []
    for source in recipe.sources:
        items = work_items(recipe, source)
        if source.limit and source.type in registry.GENERATORS:
            items = [{"path": "", "start": 0, "stop": min(source.count, source.limit)}]
        elif source.limit:
            items = [{"paths": [item["path"] for item in items], "start": 0, "stop": 0}]
        plan += [{"source": source.name, **item} for item in items]
    return plan


def read_partition(source: Any, seed: int, item: dict[str, Any]) -> Iterator[Document]:
    """The documents of one planned partition (plan_partitions), its source's limit applied."""
    if "paths" in item:
        documents = (doc for path in item["paths"] for doc in read_work_item(source, seed, {**item, "path": path}))
    else:
        documents = read_work_item(source, seed, item)
    return islice(documents, source.limit) if source.limit else documents
