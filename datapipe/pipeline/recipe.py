"""Recipes: YAML files parsed once into typed, validated configs.

Every model forbids unknown keys, and a source's keys depend on its type (a union
discriminated by `type`): a file source has `paths`, a generator a `count`, and neither takes
the other's. A stage's options are its module's Config, and an option that does nothing for
that stage (`concurrency` on a stage that runs as tasks) is refused, not ignored. A recipe
that names an unknown stage or source type, misspells a key or gives a wrong type fails
before any work starts with one RecipeError naming the file and every wrong key, each
with its allowed values. `--set a.b=v` overrides are applied to the raw YAML before
validation, so they get the same checks. What a recipe needs from this machine (its files,
its tokenizer) is checked next, by datapipe.pipeline.check, still before Ray starts.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import AfterValidator, BaseModel, Field, SerializeAsAny, TypeAdapter, ValidationError, field_validator

from datapipe.packing.curriculum import CurriculumPhase, phase_problems
from datapipe.pipeline import registry
from datapipe.schema import KINDS
from datapipe.stage import StageConfig, Strict

RENAMED_KEYS = {"curriculum": "phases"}  # top-level recipe keys: old name -> new name
RENAMED_STAGES = {"render_dedupe": "render_dedup"}  # stage names: old -> new (one spelling of dedup)


class RecipeError(ValueError):
    """A recipe that cannot run; the message names the file, each wrong key and the fix.

    `problems` lists them one a line, in the order they were found (a one-line error is its own problem)."""

    def __init__(self, message: str, problems: Sequence[str] = ()):
        super().__init__("\n  ".join([message, *problems]))
        self.problems = list(problems) or [message]


class RunError(RuntimeError):
    """A run that cannot start for a reason outside the recipe (a cluster that does not answer);
    the message says what to do."""


def known_kind(value: str) -> str:
    if value not in KINDS:
        raise ValueError(f"unknown kind {value!r}; allowed: {', '.join(KINDS)}")
    return value


Kind = Annotated[str, AfterValidator(known_kind)]


class Source(Strict):
    """The keys of every source type."""

    name: str  # becomes Document.source; must be unique within the recipe
    type: str  # a key of registry.SOURCES; each subclass names the types it configures
    limit: int | None = Field(None, ge=1)  # stop after this many records (sample runs)


class FileSource(Source):
    # files, folders or globs: local (relative ones start at the recipe's folder), file://, or fsspec URLs
    # (s3://bucket/prefix/*.jsonl.gz, gs://..., https://... for single files)
    paths: list[str] = Field(min_length=1)


class TabularSource(FileSource):
    """Rows of JSONL, Parquet or a saved Hugging Face dataset: a document per row."""

    type: Literal["jsonl", "parquet", "hf_disk"]
    text_field: str = "text"  # the column/key that holds the text or code
    id_field: str | None = None  # the column that holds the source's id (source_id; may repeat); None uses file:position
    kind: Kind = "text"  # Document.kind for every row


class FilesSource(FileSource):
    """A document per file, or per row of a JSONL manifest that names files."""

    type: Literal["files"]
    file_field: str = "file"  # a manifest's column naming each file, relative to the manifest
    kind: Kind = "text"  # Document.kind of a file whose extension does not say (.svg, .html, .py and .scad do)
    # "" serves each page's own folder; a folder (relative to the recipe): a page under it is served from
    # the nearest folder holding the ../ its markup climbs, up to this one (admin templates keep css/ beside pages/)
    asset_root: str = ""


class PageSource(FileSource):
    """Web archives (WARC/ARC/WET) and saved pages: each record's kind comes from its content."""

    type: Literal["warc", "html"]


class GeneratorSource(Source):
    """Seeded generators: no files, and each decides its documents' kind."""

    type: Literal["pydoc_topics", "python_programs", "svg_programs", "html_pages", "scene_programs", "cad_programs",
                  "web_archive"]
    count: int = Field(1000, ge=1)  # how many records to make


SOURCE_TYPES = (TabularSource, FilesSource, PageSource, GeneratorSource)  # together: every key of registry.SOURCES
SourceConfig = Annotated[TabularSource | FilesSource | PageSource | GeneratorSource, Field(discriminator="type")]


class ShardConfig(Strict):
    samples_per_shard: int = Field(1024, ge=1)  # a shard of 1024 x 8K uint32 tokens is 32 MiB
    max_bytes: int | None = Field(None, ge=1)  # also close a shard once it holds this many bytes; None: samples only


class RayConfig(Strict):
    address: str | None = None  # None: RAY_ADDRESS if set, else a local Ray on this machine
    num_cpus: int | None = Field(None, ge=1)  # local only; None = every core
    object_store_mb: int = Field(1024, ge=128)  # local only; Ray's default (30% of RAM) crowds small machines
    # A Ray task per input partition running every stage, when every stage allows it (partition_task.py:
    # 100 MB of web text in 27.8 s where the operator plan took 50.4 s); false: always a Ray Data operator a stage. Same shards.
    partition_tasks: bool = True


class Recipe(Strict):
    name: str  # the run name; shards go to out/<name>/ unless --out says otherwise
    description: str = ""  # one line, shown by `datapipe recipes`
    seed: int = 0  # every random choice (generators, shuffles) derives from it
    sources: list[SourceConfig] = Field(min_length=1)
    stages: list[SerializeAsAny[StageConfig]] = []  # each validated against its stage's own Config
    # The curriculum, in training order. [] writes no shards: the documents that pass every stage are the
    # output (out/<run>/documents/p000123.jsonl.zst, one file a partition), as text tools exchange them.
    phases: list[CurriculumPhase] = Field([CurriculumPhase()])
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
        raise RecipeError(f"{path}: pack: replaced by a list of curriculum phases; write "
                          "`phases: [{name: main, seq_len: 2048}]` (see README, Curriculum)")
    raw.setdefault("phases", [{"name": "main"}])  # the default phase, spelled out so --set can reach it
    for override in overrides:
        apply_override(raw, override, path)
    raw["base_dir"] = str(path.resolve().parent)
    return validate_recipe(raw, path)


def validate_recipe(raw: dict[str, Any], path: Path | str = "<recipe>") -> Recipe:
    """The typed recipe, or one RecipeError listing every problem found, in recipe order."""
    problems = renamed_key_problems(raw)
    try:
        recipe = Recipe.model_validate({k: v for k, v in raw.items() if k != "stages" and k not in RENAMED_KEYS})
    except ValidationError as err:
        recipe, problems = None, problems + error_lines(err, Recipe)
    stages, stage_problems = validate_stages(raw.get("stages") or [])
    problems += stage_problems + cross_problems(recipe, raw) + stage_source_problems(recipe, stages)
    if raw.get("phases") != [] and "tokenize" not in stage_names(raw):
        problems.append("stages: a recipe that writes shards needs a `- stage: tokenize` entry (or `phases: []` "
                        "to write the cleaned documents instead)")
    if problems:
        raise RecipeError(f"{path}: invalid recipe", problems)
    stages = [resolve_paths(stage, recipe.base_dir) for stage in stages]
    sources = [resolve_asset_root(source, recipe) for source in recipe.sources]
    return recipe.model_copy(update={"stages": stages, "sources": sources})


def resolve_asset_root(source: SourceConfig, recipe: Recipe) -> SourceConfig:
    """A files source's asset_root made absolute (relative ones start at the recipe's folder)."""
    root = getattr(source, "asset_root", "")
    if not root:
        return source
    folder = recipe.resolve(root).resolve()
    if not folder.is_dir():
        raise RecipeError(f"sources.{source.name}.asset_root: {folder} is not a folder; name the folder "
                          "that holds the pages and the css/, js/ they climb to with ../")
    return source.model_copy(update={"asset_root": str(folder)})


def cross_problems(recipe: Recipe | None, raw: dict[str, Any]) -> list[str]:
    """Phases against sources (a mixture names a source), found from the raw recipe when another
    part of it is invalid, as long as the phases themselves are valid."""
    if recipe is not None:
        return phase_problems(recipe.phases, [source.name for source in recipe.sources])
    try:
        phases = TypeAdapter(list[CurriculumPhase]).validate_python(raw.get("phases", []))
    except ValidationError:
        return []  # their own errors are listed already
    sources = raw.get("sources") if isinstance(raw.get("sources"), list) else []
    return phase_problems(phases, [str(source.get("name")) for source in sources if isinstance(source, dict)])


def stage_source_problems(recipe: Recipe | None, stages: list[StageConfig]) -> list[str]:
    """A stage's `sources` must name recipe sources; a global stage (dedup) sees every document."""
    known = [source.name for source in recipe.sources] if recipe is not None else None
    problems = []
    for i, stage in enumerate(stages):
        unknown = [name for name in stage.sources if known is not None and name not in known]
        if unknown:
            problems.append(f"stages.{i} ({stage.stage}).sources: unknown source {', '.join(unknown)}; "
                            f"the recipe's sources: {', '.join(known)}")
        if stage.sources and registry.is_global(stage.stage):
            problems.append(f"stages.{i} ({stage.stage}).sources: a global stage sees every document; remove the key")
    return problems


def renamed_key_problems(raw: dict[str, Any]) -> list[str]:
    return [f"{old}: renamed to `{new}:` (same entries); rename the key (and write --set {new}.NAME.KEY=VALUE)"
            for old, new in RENAMED_KEYS.items() if old in raw]


def resolve_paths(stage: StageConfig, base_dir: Path) -> StageConfig:
    """Relative paths in a stage's path fields start at the recipe's folder when a file is there."""
    updates = {}
    for field in stage.path_fields:
        value = getattr(stage, field)
        if isinstance(value, str) and (base_dir / value).exists() and not Path(value).is_absolute():
            updates[field] = str((base_dir / value).resolve())
    return stage.model_copy(update=updates)


def validate_stages(entries: Any) -> tuple[list[StageConfig], list[str]]:
    """Each entry against its stage's Config; the problems of all of them."""
    if not isinstance(entries, list):
        return [], ["stages: expected a list of `- stage: NAME` entries"]
    stages, problems = [], []
    for index, entry in enumerate(entries):
        stage, stage_problems = validate_stage(entry, index)
        stages += [stage] if stage is not None else []
        problems += stage_problems
    return stages, problems


def stage_names(raw: dict[str, Any]) -> list[str]:
    """The stage names a raw recipe lists, valid entries or not."""
    entries = raw.get("stages") if isinstance(raw.get("stages"), list) else []
    return [entry.get("stage") for entry in entries if isinstance(entry, dict)]


def validate_stage(entry: Any, index: int) -> tuple[StageConfig | None, list[str]]:
    where = f"stages[{index}]"
    name = entry.get("stage") if isinstance(entry, dict) else None
    if not isinstance(name, str):
        return None, [f"{where}: each stage is a mapping with a `stage:` name; allowed: {known_stages()}"]
    if name in RENAMED_STAGES:
        return None, [f"{where}.stage: {name} is now {RENAMED_STAGES[name]}; rename it"]
    if name not in registry.STAGES:
        return None, [f"{where}.stage: unknown stage {name!r}; allowed: {known_stages()}"]
    config_class = registry.stage_config_class(name)
    try:
        stage = config_class.model_validate(entry)
    except ValidationError as err:
        return None, error_lines(err, config_class, prefix=where)
    return stage, option_problems(stage, where)


def option_problems(stage: StageConfig, where: str) -> list[str]:
    """Options every stage accepts that would do nothing for this one: refused, not ignored."""
    problems = []
    if stage.concurrency is not None and not type(stage).actor:
        problems.append(f"{where}.concurrency: {stage.stage} runs as Ray tasks, not an actor pool; drop "
                        f"concurrency (it bounds the pool of an actor stage: {', '.join(actor_stages())}); Ray "
                        "runs as many tasks as the cluster has room for")
    if stage.num_gpus is not None and registry.is_global(stage.stage):
        problems.append(f"{where}.num_gpus: {stage.stage} is a global stage whose passes reserve CPUs only; "
                        "drop num_gpus")
    return problems


def known_stages() -> str:
    return ", ".join(sorted(registry.STAGES))


def actor_stages() -> list[str]:
    """Stages that run in an actor pool (imports every stage module: for error messages only)."""
    return sorted(name for name in registry.STAGES if registry.stage_config_class(name).actor)


def error_lines(err: ValidationError, model: type[BaseModel], prefix: str = "") -> list[str]:
    """One `key.path: what is wrong` line per pydantic error."""
    lines = []
    for error in err.errors():
        key, owner, union, tag = locate(model, error["loc"])
        if error["type"] in ("union_tag_invalid", "union_tag_not_found"):
            key += ".type"
        key = f"{prefix}.{key}" if prefix and key else (prefix or key)
        lines.append(f"{key}: {describe_error(error, owner, union, tag)}")
    return lines


def describe_error(error: dict[str, Any], owner: type[BaseModel], union: list[type[BaseModel]], tag: str) -> str:
    """What is wrong, with what is allowed. `owner` holds the key; it was chosen from `union` by `tag`."""
    if error["type"] == "extra_forbidden":
        return unknown_key(error["loc"][-1], owner, union, tag)
    if error["type"] == "union_tag_invalid":
        return f"unknown type {error['ctx']['tag']!r}; allowed: {', '.join(sorted(union_tags(union)))}"
    if error["type"] in ("missing", "union_tag_not_found"):
        allowed = f"; allowed: {', '.join(sorted(union_tags(union)))}" if error["type"] == "union_tag_not_found" else ""
        return f"required key is missing{allowed}"
    if error["type"] == "value_error":  # our validators' messages name the value already
        return error["msg"].removeprefix("Value error, ")
    got = error.get("input")
    return f"{error['msg']} (got {got!r})" if not isinstance(got, dict | list) else error["msg"]


def unknown_key(key: str, owner: type[BaseModel], union: list[type[BaseModel]], tag: str) -> str:
    allowed = f"allowed: {', '.join(name for name in owner.model_fields if name != 'base_dir')}"
    if not tag:
        return f"unknown key; {allowed}"
    types = sorted(other for member in union if key in member.model_fields for other in type_tags(member))
    elsewhere = f" ({key} is for {', '.join(types)} sources)" if types else ""
    return f"a {tag} source has no `{key}`{elsewhere}; {allowed}"


def locate(model: type[BaseModel], loc: tuple) -> tuple[str, type[BaseModel], list[type[BaseModel]], str]:
    """The key path a person reads ("sources[0].count"), the model holding its last key, and the
    union and tag that chose that model ([] and "" if none). pydantic puts a discriminated union's
    tag (the source type) into `loc`; it is no key of the recipe and is left out of the path."""
    parts, owner, models, union, tag = [], model, [model], [], ""
    for part in loc:
        if isinstance(part, int):
            parts.append(f"[{part}]")
            continue
        chosen = [member for member in models if part in type_tags(member)]
        if len(models) > 1 and chosen:
            union, models, tag = models, chosen, part
            continue
        owner = models[0] if models else owner
        parts.append(f".{part}")
        field = owner.model_fields.get(part)
        models = models_in(field.annotation) if field else []
    if len(models) > 1:  # the error is about the union itself (its tag is missing or unknown)
        union = models
    return "".join(parts).lstrip("."), owner, union, tag


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models inside a field's type: list[X] -> [X], A | B | None -> [A, B]."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in get_args(annotation) for model in models_in(arg)]


def type_tags(model: type[BaseModel]) -> tuple[str, ...]:
    """The `type` values that select this member of a discriminated union (() for other models)."""
    field = model.model_fields.get("type")
    return get_args(field.annotation) if field and get_origin(field.annotation) is Literal else ()


def union_tags(union: list[type[BaseModel]]) -> list[str]:
    return [tag for member in union for tag in type_tags(member)]


def apply_override(raw: dict[str, Any], override: str, path: Path | str) -> None:
    """`a.b=value` (value parsed as YAML); list items by index or, for stages, by stage name."""
    key, sep, value = override.partition("=")
    if not sep or not key:
        raise RecipeError(f"--set {override!r}: expected KEY=VALUE, for example --set phases.main.seq_len=4096")
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

