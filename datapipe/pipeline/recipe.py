"""Recipes: YAML files parsed once into typed, validated configs.

Every model forbids unknown keys. A recipe that names an unknown stage or source
type, misspells a key or gives a wrong type fails before any work starts, with the
file, the key path and the allowed values (RecipeError). `--set a.b=v` overrides are
applied to the raw YAML before validation, so they get the same checks.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, SerializeAsAny, ValidationError, field_validator

from datapipe.packing.curriculum import CurriculumStage, curriculum_problems
from datapipe.pipeline import registry
from datapipe.schema import KINDS
from datapipe.stage import StageConfig, Strict


class RecipeError(ValueError):
    """A recipe that cannot run; the message names the file, the key and the fix."""


class RunError(RuntimeError):
    """A run that cannot start for a reason outside the recipe (a cluster that does not answer);
    the message says what to do."""


class SourceConfig(Strict):
    name: str  # becomes Document.source; must be unique within the recipe
    type: str  # a key of registry.SOURCES
    paths: list[str] = []  # files, folders or globs; relative paths resolve against the recipe's folder
    text_field: str = "text"  # the column/key that holds the text or code
    id_field: str | None = None  # the column that holds a stable id; None uses file:position
    file_field: str = "file"  # files sources: the manifest column naming each file, relative to the manifest
    kind: str = "text"  # Document.kind for every record of this source
    count: int = Field(1000, ge=1)  # generators only: how many records to make
    limit: int | None = Field(None, ge=1)  # stop after this many records (sample runs)

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        if value not in registry.SOURCES:
            raise ValueError(f"unknown source type {value!r}; allowed: {', '.join(sorted(registry.SOURCES))}")
        return value

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, value: str) -> str:
        if value not in KINDS:
            raise ValueError(f"unknown kind {value!r}; allowed: {', '.join(KINDS)}")
        return value


class ShardConfig(Strict):
    samples_per_shard: int = Field(1024, ge=1)  # a shard of 1024 x 8K uint32 tokens is 32 MiB
    max_bytes: int | None = Field(None, ge=1)  # also close a shard once it holds this many bytes; None: samples only


class RayConfig(Strict):
    address: str | None = None  # None: RAY_ADDRESS if set, else a local Ray on this machine
    num_cpus: int | None = Field(None, ge=1)  # local only; None = every core
    object_store_mb: int = Field(1024, ge=128)  # local only; Ray's default (30% of RAM) crowds small machines


class Recipe(Strict):
    name: str  # the run name; shards go to out/<name>/ unless --out says otherwise
    description: str = ""  # one line, shown by `datapipe recipes`
    seed: int = 0  # every random choice (generators, shuffles) derives from it
    sources: list[SourceConfig] = Field(min_length=1)
    stages: list[SerializeAsAny[StageConfig]] = []  # each validated against its stage's own Config
    curriculum: list[CurriculumStage] = Field([CurriculumStage()], min_length=1)  # packing stages, in training order
    shards: ShardConfig = ShardConfig()
    ray: RayConfig = RayConfig()
    base_dir: Path = Path(".")  # the recipe's folder; set by load_recipe, not by the YAML

    @field_validator("sources")
    @classmethod
    def _unique_names(cls, sources: list[SourceConfig]) -> list[SourceConfig]:
        names = [s.name for s in sources]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"source names must be unique; repeated: {', '.join(dupes)}")
        return sources

    def resolve(self, path: str) -> Path:
        """A recipe path: absolute as is, else relative to the recipe's folder."""
        candidate = Path(path).expanduser()
        return candidate if candidate.is_absolute() else self.base_dir / candidate


def load_recipe(path: str | Path, overrides: list[str] = ()) -> Recipe:
    """Read, override and validate a recipe; raise RecipeError naming what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"{path}: no such recipe file; `datapipe recipes` lists the shipped ones")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise RecipeError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(raw, dict):
        raise RecipeError(f"{path}: a recipe is a YAML mapping with at least `name` and `sources`")
    if "pack" in raw:
        raise RecipeError(f"{path}: pack: replaced by a list of curriculum stages; write "
                          "`curriculum: [{name: main, seq_len: 2048}]` (see README, Curriculum)")
    raw.setdefault("curriculum", [{"name": "main"}])  # the default stage, spelled out so --set can reach it
    for override in overrides:
        apply_override(raw, override, path)
    raw["base_dir"] = str(path.resolve().parent)
    return validate_recipe(raw, path)


def validate_recipe(raw: dict[str, Any], path: Path | str = "<recipe>") -> Recipe:
    try:
        recipe = Recipe.model_validate({k: v for k, v in raw.items() if k != "stages"})
    except ValidationError as err:
        raise RecipeError(format_errors(err, Recipe, path)) from None
    entries = raw.get("stages") or []
    if not isinstance(entries, list):
        raise RecipeError(f"{path}: stages: expected a list of `- stage: NAME` entries")
    stages = [validate_stage(entry, i, path) for i, entry in enumerate(entries)]
    if "tokenize" not in [stage.stage for stage in stages]:
        raise RecipeError(f"{path}: stages: a recipe that writes shards needs a `- stage: tokenize` entry")
    stages = [resolve_paths(stage, recipe.base_dir) for stage in stages]
    problems = curriculum_problems(recipe.curriculum, [source.name for source in recipe.sources])
    if problems:
        raise RecipeError("\n  ".join([f"{path}: invalid recipe", *problems]))
    return recipe.model_copy(update={"stages": stages})


def resolve_paths(stage: StageConfig, base_dir: Path) -> StageConfig:
    """Relative paths in a stage's path fields start at the recipe's folder when a file is there."""
    updates = {}
    for field in stage.path_fields:
        value = getattr(stage, field)
        if isinstance(value, str) and (base_dir / value).exists() and not Path(value).is_absolute():
            updates[field] = str((base_dir / value).resolve())
    return stage.model_copy(update=updates)


def validate_stage(entry: Any, index: int, path: Path | str) -> StageConfig:
    where = f"{path}: stages[{index}]"
    if not isinstance(entry, dict) or "stage" not in entry:
        raise RecipeError(f"{where}: each stage is a mapping with a `stage:` name; allowed: {known_stages()}")
    if entry["stage"] not in registry.STAGES:
        raise RecipeError(f"{where}.stage: unknown stage {entry['stage']!r}; allowed: {known_stages()}")
    config_class = registry.stage_config_class(entry["stage"])
    try:
        return config_class.model_validate(entry)
    except ValidationError as err:
        raise RecipeError(format_errors(err, config_class, f"{path}", prefix=f"stages[{index}]")) from None


def known_stages() -> str:
    return ", ".join(sorted(registry.STAGES))


def format_errors(err: ValidationError, model: type[BaseModel], path: Path | str, prefix: str = "") -> str:
    lines = [f"{path}: invalid recipe"]
    for error in err.errors():
        loc = ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in error["loc"]).replace(".[", "[")
        key = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
        lines.append(f"  {key}: {describe_error(error, model)}")
    return "\n".join(lines)


def describe_error(error: dict[str, Any], model: type[BaseModel]) -> str:
    if error["type"] == "extra_forbidden":
        allowed = ", ".join(allowed_keys(model, error["loc"][:-1]))
        return f"unknown key; allowed: {allowed}"
    if error["type"] == "missing":
        return "required key is missing"
    got = error.get("input")
    return f"{error['msg']} (got {got!r})" if not isinstance(got, dict | list) else error["msg"]


def allowed_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """The field names of the (nested) model that `loc` points into."""
    for part in loc:
        if isinstance(part, int):
            continue
        annotation = model.model_fields[part].annotation
        inner = getattr(annotation, "__args__", (annotation,))
        model = next((a for a in inner if isinstance(a, type) and issubclass(a, BaseModel)), model)
    return [name for name in model.model_fields if name != "base_dir"]


def apply_override(raw: dict[str, Any], override: str, path: Path | str) -> None:
    """`a.b=value` (value parsed as YAML); list items by index or, for stages, by stage name."""
    key, sep, value = override.partition("=")
    if not sep or not key:
        raise RecipeError(f"--set {override!r}: expected KEY=VALUE, for example --set curriculum.main.seq_len=4096")
    parts = key.split(".")
    node: Any = raw
    for depth, part in enumerate(parts[:-1]):
        node = step_into(node, part, ".".join(parts[: depth + 1]), path)
    last = parts[-1]
    if isinstance(node, list):
        node[list_index(node, last, key, path)] = yaml.safe_load(value)
    else:
        node[last] = yaml.safe_load(value)


def step_into(node: Any, part: str, key: str, path: Path | str) -> Any:
    if isinstance(node, list):
        return node[list_index(node, part, key, path)]
    if not isinstance(node, dict):
        raise RecipeError(f"--set {key}: {path} has a scalar there, not a mapping")
    return node.setdefault(part, {})


def list_index(items: list, part: str, key: str, path: Path | str) -> int:
    if part.isdigit() and int(part) < len(items):
        return int(part)
    names = [item.get("stage") or item.get("name") for item in items if isinstance(item, dict)]
    if part in names:
        return names.index(part)
    raise RecipeError(f"--set {key}: {path} has no list item {part!r}; items: {', '.join(map(str, names))}")

