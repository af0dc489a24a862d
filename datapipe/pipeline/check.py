"""What a run needs from this machine, checked before Ray starts and before any output is touched.

Validation (datapipe.pipeline.recipe) judges the recipe by itself; these checks look outside
it, at what a run would otherwise meet minutes later inside a Ray worker, after the previous
output was cleared: every file source's paths match at least one file (a missing file beside
existing ones stays a per-record reject, read.missing_file), and each tokenize stage's
tokenizer loads, has the special tokens packing needs and, on the fast path, tiktoken's layout.
Every problem is reported at once, in recipe order, so one edit fixes them all. The cost is a
listing of the inputs (done again when the run plans its reads) and one tokenizer load: well
under a second for the shipped recipes.
"""
from __future__ import annotations

from datapipe.pipeline import registry
from datapipe.pipeline.inputs import work_items
from datapipe.pipeline.recipe import Recipe, RecipeError, Source
from datapipe.stage import StageConfig


def check_recipe(recipe: Recipe) -> None:
    """Raise one RecipeError listing every problem a run of this recipe would meet here."""
    problems = recipe_problems(recipe)
    if problems:
        raise RecipeError(f"recipe {recipe.name!r} ({recipe.base_dir}) cannot run here", problems)


def recipe_problems(recipe: Recipe) -> list[str]:
    problems = [problem for source in recipe.sources for problem in source_problems(recipe, source)]
    for index, stage in enumerate(recipe.stages):
        if stage.stage == "tokenize":
            problems += tokenizer_problems(recipe, stage, f"stages[{index}].tokenizer")
    return problems


def source_problems(recipe: Recipe, source: Source) -> list[str]:
    """A file source's paths listed as the run lists them; none existing is a wrong path, not data."""
    if source.type in registry.GENERATORS:
        return []
    try:
        work_items(recipe, source)
    except RecipeError as err:
        return err.problems
    return []


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
