"""What a source reads: its inputs listed (globs and folders expanded) or its generator
ranges cut, one work item (one Ray task) each, and the reader that turns an item into documents.

A path is a local path (relative ones start at the recipe's folder), a file:// URL, or any
fsspec URL (s3://bucket/prefix/*.jsonl.gz, gs://..., https://... for single files). Listing
happens once, on the driver, in datapipe.pipeline.check (which judges what it finds); the
workers open the files, so a file this machine lists but a node cannot reach is a
read.missing_file or read.unreadable_file reject there, naming the path and the error.
"""
from __future__ import annotations

import os
from itertools import islice
from pathlib import Path
from typing import Any, Iterator

from datapipe.pipeline import registry
from datapipe.schema import Document, new_reject
from datapipe.storage import folder_inputs, glob_inputs, input_exists, is_folder, is_pattern, is_url, local_path

GENERATOR_CHUNK = 500  # generator indices per work item (one Ray task each)
SAVED_DATASET_FILES = ("dataset_info.json", "dataset_dict.json")  # a folder holding one is an hf_disk input, whole


def work_items(recipe: Any, source: Any) -> list[dict[str, Any]]:
    """Files for readers (globs and folders expanded), index ranges for generators. A URL that cannot
    be listed raises OSError naming it (check.py turns that into a RecipeError)."""
    if source.type in registry.GENERATORS:
        return [{"path": "", "start": s, "stop": min(s + GENERATOR_CHUNK, source.count)}
                for s in range(0, source.count, GENERATOR_CHUNK)]
    return file_items([f for pattern in source.paths for f in expand_path(input_location(recipe, pattern))])


def file_items(files: list[str]) -> list[dict[str, Any]]:
    return [{"path": f, "start": 0, "stop": 0} for f in files]


def input_location(recipe: Any, path: str) -> str:
    """A recipe's path as readers take it: a URL as written, a local path (or file:// URL) made absolute."""
    return path if is_url(path) else str(recipe.resolve(local_path(path)))


def expand_path(location: str) -> list[str]:
    if is_pattern(location):
        # a pattern that matches nothing is read as a missing file: a reject that names it, not a silent skip
        return glob_inputs(location) or [location]
    if is_folder(location) and not any(input_exists(f"{location.rstrip('/')}/{name}") for name in SAVED_DATASET_FILES):
        return folder_inputs(location) or [location]  # an empty folder: a reject that names it, not a silent skip
    return [location]  # a missing file becomes a reject at read time, not a silent skip


def read_work_item(source: Any, seed: int, item: dict[str, Any]) -> Iterator[Document]:
    reader = registry.load(registry.SOURCES[source.type])
    if source.type in registry.GENERATORS:
        return reader(source, seed, item["start"], item["stop"])
    if is_empty_folder(item["path"]):
        return iter([new_reject(source.name, item["path"], "read.unreadable_file",
                                f"{item['path']}: a folder with no files in it; add its files or take it out of paths")])
    return reader(source, item["path"])


def is_empty_folder(location: str) -> bool:
    """A local folder without a file at any depth (expand_path keeps one as itself: a reject, not silence)."""
    return not is_url(location) and os.path.isdir(location) and not any(p.is_file() for p in Path(location).rglob("*"))


def iter_recipe_documents(recipe: Any, inputs: dict[str, list[dict[str, Any]]]) -> Iterator[Document]:
    """Every document of a recipe's sources, read in this process (no Ray), limits applied; `inputs`
    are the work items check.list_inputs listed."""
    for source in recipe.sources:
        documents = (doc for item in inputs[source.name] for doc in read_work_item(source, recipe.seed, item))
        for count, doc in enumerate(documents, start=1):
            yield doc
            if source.limit and count >= source.limit:
                break


def plan_partitions(recipe: Any, inputs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The run's input partitions, numbered by their place in this list: each source's work items (as
    check_recipe listed them) in recipe order. A source with a `limit` is one partition (its first
    `limit` records, read in order by one task), so that a limit never depends on how tasks were
    scheduled."""
    plan = []
    for source in recipe.sources:
        items = inputs[source.name]
        if source.limit and source.type in registry.GENERATORS:
            items = [{"path": "", "start": 0, "stop": min(source.count, source.limit)}]
        elif source.limit:
            items = [{"paths": [item["path"] for item in items], "start": 0, "stop": 0}]
        plan += [{"source": source.name, **item} for item in items]
    return plan


def read_partition(source: Any, seed: int, item: dict[str, Any], partition: int) -> Iterator[Document]:
    """The documents of one planned partition (plan_partitions, number `partition`), its source's limit
    applied, ids made unique (unique_ids)."""
    if "paths" in item:
        documents = (doc for path in item["paths"] for doc in read_work_item(source, seed, {**item, "path": path}))
    else:
        documents = read_work_item(source, seed, item)
    documents = islice(documents, source.limit) if source.limit else documents
    return unique_ids(documents, partition) if getattr(source, "id_field", None) else documents


def unique_ids(docs: Iterator[Document], partition: int) -> Iterator[Document]:
    """A source's id_field may repeat (two files of one dataset, a row written twice), and the id of a
    document must not: a live document's id gets its place in the run, `<source>/<value>@<partition>:<record>`,
    unique by construction with no run-wide pass (the readers run in parallel, one task a partition) and
    the same on every rerun and resume. `source_id` keeps the source's own value."""
    for record, doc in enumerate(docs):
        if not doc["reject"]:  # a reader's reject has a positional id (file:line), unique already
            doc["id"] = f"{doc['id']}@{partition}:{record}"
        yield doc
