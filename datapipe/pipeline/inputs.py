"""What a source reads: its inputs listed (globs and folders expanded) or its generator
ranges cut, one work item (one Ray task) each, and the reader that turns an item into documents."""
from __future__ import annotations

import glob
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
