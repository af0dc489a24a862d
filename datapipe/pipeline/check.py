"""What a run needs from this machine, checked before Ray starts and before any output is touched.

Validation (datapipe.pipeline.recipe) judges the recipe by itself; these checks look outside
it, at what a run would otherwise meet minutes later inside a Ray worker, after the previous
output was cleared: every file source's paths can be listed (a URL whose bucket is missing,
whose credentials are not set or whose fsspec package is not installed is named with the
cause) and match at least one file (a missing file beside existing ones stays a per-record
reject, read.missing_file), and each tokenize stage's tokenizer loads, has the special tokens
packing needs and, on the fast path, tiktoken's layout. Every problem is reported at once, in
recipe order, so one edit fixes them all. The listing made here is the one the run reads
(check_recipe returns it): inputs are listed once, on the driver. The cost is that listing
(one request per 1000 objects on S3) and one tokenizer load: well under a second for the
shipped recipes.

After the read, check_read fails a run in which some file source had inputs but its readers,
where the work ran, could open none of them: a node that cannot see a mount or lacks the
credentials turns every input into a read.missing_file or read.unreadable_file reject, and
a run that goes on to write empty shards and exit 0 would hide it.
"""
from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from datapipe.pipeline import registry
from datapipe.pipeline.inputs import expand_path, file_items, input_location, work_items
from datapipe.pipeline.recipe import Recipe, RecipeError, RunError, Source
from datapipe.pipeline.stats import RunStats
from datapipe.stage import StageConfig
from datapipe.storage import MissingBackend, RemoteError, input_exists, probe

Inputs = dict[str, list[dict[str, Any]]]  # a source's name -> its work items, as listed here
CREDENTIALS = {  # what fsspec's back ends read, by URL scheme: the remedy for a listing they refused
    "s3": "s3fs reads AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), and AWS_ENDPOINT_URL for an "
          "S3-compatible server",
    "gs": "gcsfs reads GOOGLE_APPLICATION_CREDENTIALS (a service-account key file) or the gcloud login",
}
CREDENTIALS["s3a"], CREDENTIALS["gcs"] = CREDENTIALS["s3"], CREDENTIALS["gs"]


def check_recipe(recipe: Recipe) -> Inputs:
    """Raise one RecipeError listing every problem a run of this recipe would meet here; else return
    every source's work items, for the run to read."""
    inputs, problems = source_inputs(recipe)
    for index, stage in enumerate(recipe.stages):
        if stage.stage == "tokenize":
            problems += tokenizer_problems(recipe, stage, f"stages[{index}].tokenizer")
    if problems:
        raise RecipeError(f"recipe {recipe.name!r} ({recipe.base_dir}) cannot run here", problems)
    return inputs


def list_inputs(recipe: Recipe) -> Inputs:
    """Every source's work items; a RecipeError when a source's paths cannot be listed or match nothing."""
    inputs, problems = source_inputs(recipe)
    if problems:
        raise RecipeError(f"recipe {recipe.name!r} ({recipe.base_dir}): sources cannot be read here", problems)
    return inputs


def source_inputs(recipe: Recipe) -> tuple[Inputs, list[str]]:
    inputs, problems = {}, []
    for source in recipe.sources:
        inputs[source.name], source_problems = list_source(recipe, source)
        problems += source_problems
    return inputs, problems


def list_source(recipe: Recipe, source: Source) -> tuple[list[dict[str, Any]], list[str]]:
    """A source's work items, or its problems: a path that cannot be listed, or no file at all (a wrong
    path, not data)."""
    if source.type in registry.GENERATORS:
        return work_items(recipe, source), []
    files, problems = [], []
    for pattern in source.paths:
        location = input_location(recipe, pattern)
        try:
            files += expand_path(location)
        except OSError as err:
            problems.append(unlisted(source, location, err))
    if not problems:
        problems += none_found(recipe, source, files)
    return ([] if problems else file_items(files)), problems


def none_found(recipe: Recipe, source: Source, files: list[str]) -> list[str]:
    """[] when one of the files exists, else why none does: the first that could not be asked, a
    bucket that cannot be listed (a glob over it matches nothing, silently), or paths that match nothing."""
    errors = []
    for location in files:
        try:
            if input_exists(location):
                return []
        except OSError as err:
            errors.append(unlisted(source, location, err))
    for location in [input_location(recipe, pattern) for pattern in source.paths]:
        try:
            probe(location)
        except OSError as err:
            errors.append(unlisted(source, location, err))
    return errors[:1] or [f"sources.{source.name}.paths: {source.paths} matched no files; fix the paths "
                          f"(relative ones start at the recipe's folder, {recipe.base_dir})"]


def unlisted(source: Source, location: str, err: OSError) -> str:
    """A location this machine could not list or ask about, with the cause and what to set."""
    cause = str(err).removeprefix(f"{location}: ")
    cause = cause if isinstance(err, RemoteError) else f"{type(err).__name__}: {cause}"
    refused = isinstance(err, RemoteError | PermissionError) and not isinstance(err, MissingBackend)
    hint = CREDENTIALS.get(urlsplit(location).scheme) if refused else None
    remedy = f"; {hint}, here and on every Ray node" if hint else ""
    return f"sources.{source.name}.paths: cannot list {location} ({cause}){remedy}"


def check_read(recipe: Recipe, inputs: Inputs, stats: RunStats) -> None:
    """Raise RunError when a file source had inputs but every record it gave is a reject saying its
    reader could not open an input (read.missing_file, read.unreadable_file): the listing here saw
    them, the nodes that ran the reads did not."""
    unread = [source.name for source in recipe.sources if source.type in registry.FILE_READERS
              and stats.records_in[source.name] == stats.unopened[source.name] >= len(inputs[source.name]) > 0]
    if unread:
        raise RunError(f"sources {', '.join(unread)}: no input could be read where the work ran (every one is a "
                       "read.missing_file or read.unreadable_file reject; the rejects file names each with its "
                       "error). Every Ray node needs the inputs: a shared mount or object storage, with its "
                       "credentials in the node's environment")


def tokenizer_problems(recipe: Recipe, stage: StageConfig, where: str) -> list[str]:
    """The tokenizer as the tokenize stage and the packer load it."""
    from datapipe.packing.bfd import SpecialIds
    from tokenizer.fast import make_encoder

    try:
        SpecialIds.from_tokenizer(stage.tokenizer)
        if stage.fast:
            make_encoder(stage.tokenizer, fast=True)
    except FileNotFoundError as err:
        return [f"{where}: {err} (relative paths start at the recipe's folder, {recipe.base_dir})"]
    except ValueError as err:  # no special tokens, or not laid out for the fast path: the message says what to do
        return [f"{where}: {err}"]
    except Exception as err:  # noqa: BLE001 - tokenizers raises a bare Exception for a file it cannot parse
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return [f"{where}: {stage.tokenizer} does not load as a tokenizer.json ({first_line}); give a file "
                "written by `datapipe tokenizer train` or a bundled name"]
    return []
