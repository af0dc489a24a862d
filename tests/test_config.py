import re
from pathlib import Path

import pytest
import yaml

from datapipe import cli
from datapipe.pipeline.recipe import RecipeError, load_recipe

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, recipe: dict) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def base() -> dict:
    return {
        "name": "t",
        "sources": [{"name": "docs", "type": "pydoc_topics"}],
        "stages": [{"stage": "normalize"}, {"stage": "tokenize"}],
    }


def error_of(tmp_path: Path, recipe: dict, overrides=()) -> str:
    with pytest.raises(RecipeError) as info:
        load_recipe(write(tmp_path, recipe), list(overrides))
    return str(info.value)


def test_shipped_recipes_are_valid():
    recipes = sorted((REPO / "recipes").glob("*.yaml"))
    assert recipes, "no recipes shipped"
    for path in recipes:
        assert load_recipe(path).name


def test_valid_recipe_gets_typed_stage_configs(tmp_path):
    recipe = load_recipe(write(tmp_path, base()))
    assert [s.stage for s in recipe.stages] == ["normalize", "tokenize"]
    assert recipe.stages[0].form == "NFC"
    assert [(c.name, c.seq_len) for c in recipe.phases] == [("main", 2048)]
    assert recipe.base_dir == tmp_path.resolve()


def test_unknown_top_level_key_names_it_and_lists_allowed(tmp_path):
    message = error_of(tmp_path, {**base(), "shardz": {}})
    assert "shardz: unknown key" in message and "shards" in message and "r.yaml" in message


def test_unknown_nested_key_names_the_path(tmp_path):
    message = error_of(tmp_path, {**base(), "phases": [{"seqlen": 10}]})
    assert "phases[0].seqlen: unknown key" in message and "seq_len" in message


def test_unknown_stage_key_names_the_stage_index(tmp_path):
    recipe = base()
    recipe["stages"][0]["lowercase"] = True
    message = error_of(tmp_path, recipe)
    assert "stages[0].lowercase: unknown key" in message and "form" in message


def test_wrong_type_names_key_and_value(tmp_path):
    message = error_of(tmp_path, {**base(), "phases": [{"seq_len": "long"}]})
    assert "phases[0].seq_len" in message and "'long'" in message


def test_bad_literal_lists_allowed_values(tmp_path):
    recipe = base()
    recipe["stages"][0]["form"] = "NFX"
    message = error_of(tmp_path, recipe)
    assert "stages[0].form" in message and "NFKC" in message


def test_unknown_stage_lists_known_stages(tmp_path):
    recipe = base()
    recipe["stages"].insert(0, {"stage": "dedupe"})
    message = error_of(tmp_path, recipe)
    assert "stages[0].stage: unknown stage 'dedupe'" in message and "normalize" in message and "tokenize" in message


def test_unknown_source_type_lists_known_types(tmp_path):
    recipe = base()
    recipe["sources"][0]["type"] = "csv"
    message = error_of(tmp_path, recipe)
    assert "sources[0].type" in message and "jsonl" in message and "parquet" in message


def test_missing_required_key(tmp_path):
    recipe = base()
    del recipe["name"]
    assert "name: required key is missing" in error_of(tmp_path, recipe)


def test_duplicate_source_names_rejected(tmp_path):
    recipe = base()
    recipe["sources"].append(dict(recipe["sources"][0]))
    assert "repeated: docs" in error_of(tmp_path, recipe)


def test_recipe_without_tokenize_is_rejected(tmp_path):
    recipe = base()
    recipe["stages"] = [{"stage": "normalize"}]
    assert "tokenize" in error_of(tmp_path, recipe)


def test_set_overrides_fields_and_stages_by_name(tmp_path):
    path = write(tmp_path, {**base(), "phases": [{"name": "s8k", "seq_len": 8192}]})
    recipe = load_recipe(path, ["phases.s8k.seq_len=4096", "stages.normalize.form=NFKC", "sources.0.count=7"])
    assert recipe.phases[0].seq_len == 4096
    assert recipe.stages[0].form == "NFKC"
    assert recipe.sources[0].count == 7


def test_set_override_is_validated_too(tmp_path):
    message = error_of(tmp_path, {**base(), "phases": [{"seq_len": 8192}]}, ["phases.0.seq_len=tiny"])
    assert "phases[0].seq_len" in message


def test_set_override_bad_syntax_and_bad_item(tmp_path):
    assert "KEY=VALUE" in error_of(tmp_path, base(), ["phases.0.seq_len"])
    assert "no list item 'dedup'" in error_of(tmp_path, base(), ["stages.dedup.x=1"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(RecipeError, match="no such recipe"):
        load_recipe(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(RecipeError, match="not valid YAML"):
        load_recipe(bad)


def test_the_set_example_in_run_help_works_on_the_quickstart_recipe(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    key, value = re.search(r"e\.g\.\s+--set\s+(\S+)=(\S+)", capsys.readouterr().out).groups()
    recipe = load_recipe(REPO / "recipes" / "quickstart.yaml", [f"{key}={value}"])
    assert recipe.phases[0].seq_len == int(value) and key == "phases.main.seq_len"


def test_old_names_are_refused_with_the_new_one(tmp_path):
    message = error_of(tmp_path, {**base(), "curriculum": [{"name": "main", "seq_len": 4096}]})
    assert "curriculum: renamed to `phases:`" in message
    assert "renamed to `phases:`" in error_of(tmp_path, base(), ["curriculum.main.seq_len=4096"])
    recipe = base()
    recipe["stages"].insert(0, {"stage": "render_dedupe"})
    assert "stages[0].stage: render_dedupe is now render_dedup" in error_of(tmp_path, recipe)


def test_set_reaches_a_phase_by_name(tmp_path):
    recipe = load_recipe(write(tmp_path, base()), ["phases.main.seq_len=4096", "phases.main.tokens=1M"])
    assert [(p.name, p.seq_len, p.tokens) for p in recipe.phases] == [("main", 4096, 1_000_000)]


def test_each_source_type_takes_its_own_keys(tmp_path):
    recipe = base()
    recipe["sources"] = [{"name": "web", "type": "jsonl", "paths": ["a.jsonl"], "count": 5},
                         {"name": "docs", "type": "pydoc_topics", "paths": ["x"]},
                         {"name": "crawl", "type": "warc", "paths": ["x.warc"], "text_field": "body"},
                         {"name": "notes", "type": "parquet"}]
    message = error_of(tmp_path, recipe)
    assert "sources[0].count: a jsonl source has no `count` (count is for cad_programs, html_pages, pydoc_topics" in message
    assert "allowed: name, type, limit, paths, text_field, id_field, kind" in message
    assert "sources[1].paths: a pydoc_topics source has no `paths` (paths is for files, hf_disk" in message
    assert "sources[2].text_field: a warc source has no `text_field`" in message
    assert "sources[3].paths: required key is missing" in message


def test_source_kind_is_one_of_the_schema_kinds(tmp_path):
    recipe = base()
    recipe["sources"] = [{"name": "web", "type": "jsonl", "paths": ["a.jsonl"], "kind": "pdf"}]
    assert "sources[0].kind: unknown kind 'pdf'; allowed: text, code, svg, html" in error_of(tmp_path, recipe)
    recipe["sources"][0]["kind"] = "code"
    assert load_recipe(write(tmp_path, recipe)).sources[0].kind == "code"


def test_every_registered_source_type_has_exactly_one_config():
    from datapipe.pipeline import registry
    from datapipe.pipeline.recipe import SOURCE_TYPES, type_tags

    tags = [tag for model in SOURCE_TYPES for tag in type_tags(model)]
    assert sorted(tags) == sorted(registry.SOURCES)


def test_concurrency_on_a_stage_that_runs_as_tasks_is_refused(tmp_path):
    recipe = base()
    recipe["stages"][0]["concurrency"] = 4
    message = error_of(tmp_path, recipe)
    assert "stages[0].concurrency: normalize runs as Ray tasks, not an actor pool; drop concurrency" in message
    assert "render, render_dedup, rephrase, tokenize" in message
    recipe["stages"][0]["concurrency"] = [1, 4]  # a range is refused there too
    assert "stages[0].concurrency: normalize runs as Ray tasks" in error_of(tmp_path, recipe)
    recipe["stages"][0].pop("concurrency")
    recipe["stages"][1]["concurrency"] = 2  # tokenize is an actor pool: concurrency bounds it
    assert load_recipe(write(tmp_path, recipe)).stages[1].pool_range() == (1, 2)


def test_concurrency_is_a_maximum_or_a_range_and_unset_leaves_the_size_to_the_cluster(tmp_path):
    recipe = base()
    assert load_recipe(write(tmp_path, recipe)).stages[1].pool_range() == (1, None)
    recipe["stages"][1]["concurrency"] = [2, 8]
    assert load_recipe(write(tmp_path, recipe)).stages[1].pool_range() == (2, 8)
    assert load_recipe(write(tmp_path, recipe), ["stages.tokenize.concurrency=[3, 3]"]).stages[1].pool_range() == (3, 3)
    for wrong in ([8, 2], [0, 2], [2], [1, 2, 3], 0, 2.5, True, "4"):
        recipe["stages"][1]["concurrency"] = wrong
        message = error_of(tmp_path, recipe)
        assert "stages[1].concurrency: expected a number of actors (4: at most 4) or a range [min, max]" in message
        assert f"got {wrong!r}" in message and message.count("stages[1].concurrency") == 1


def test_render_dedup_stays_one_actor_whatever_the_cluster():
    from renderers.dedup import Config

    assert Config(stage="render_dedup").pool_range() == (1, 1)
    assert Config(stage="render_dedup", concurrency=None).pool_range() == (1, 1)
    with pytest.raises(ValueError, match="runs as one actor"):
        Config(stage="render_dedup", concurrency=[1, 2])


def test_reserved_memory_and_custom_resources_are_validated_and_reach_ray_as_it_spells_them(tmp_path):
    recipe = base()
    recipe["stages"][0].update(reserved_memory_mb=512, resources={"chromium": 1, "node:10.0.0.2": 0.5})
    stage = load_recipe(write(tmp_path, recipe)).stages[0]
    assert stage.reservation() == {"memory": 512 << 20, "resources": {"chromium": 1, "node:10.0.0.2": 0.5}}
    wrongs = {"reserved_memory_mb": (0, "greater than or equal to 1"),
              "resources": ({"CPU": 2}, "CPU is not a custom resource: use num_cpus instead")}
    for key, (wrong, expected) in wrongs.items():
        recipe["stages"][0] = {"stage": "normalize", key: wrong}
        assert f"stages[0].{key}: " in error_of(tmp_path, recipe) and expected in error_of(tmp_path, recipe)
    for wrong in ({"chromium": 0}, {"chromium": True}, {"chromium": "one"}, ["chromium"]):
        recipe["stages"][0] = {"stage": "normalize", "resources": wrong}
        assert re.search(r"stages\[0\]\.resources: (chromium: )?expected a (positive number|mapping)", error_of(tmp_path, recipe))


def test_every_problem_is_reported_at_once_in_recipe_order(tmp_path):
    recipe = base()
    recipe["sources"][0]["count"] = 0
    recipe["stages"] = [{"stage": "normalize", "concurrency": 2}, {"stage": "tokenize", "fast": "maybe"}]
    recipe["phases"] = [{"name": "main", "mixture": {"web": 1}}]
    with pytest.raises(RecipeError) as info:
        load_recipe(write(tmp_path, recipe))
    keys = [problem.split(":", 1)[0] for problem in info.value.problems]
    assert keys == ["sources[0].count", "stages[0].concurrency", "stages[1].fast", "phases[0].mixture"]


def test_recipes_command_shows_an_invalid_recipes_first_problem(tmp_path, capsys):
    recipe = base()
    recipe["sources"][0]["paths"] = ["x"]
    recipe["shards"] = {"samples_per_shard": 0}
    write(tmp_path, recipe)
    assert cli.main(["recipes", "--dir", str(tmp_path)]) == 0
    shown = " ".join(capsys.readouterr().err.split())
    assert "invalid: sources[0].paths: a pydoc_topics source has no `paths`" in shown and "(+1 more)" in shown


def test_stage_sources_must_name_recipe_sources_and_not_a_global_stage(tmp_path):
    recipe = base()
    recipe["stages"] = [{"stage": "normalize", "sources": ["docs", "nope"]}, {"stage": "dedup", "sources": ["docs"]},
                        {"stage": "tokenize"}]
    message = error_of(tmp_path, recipe)
    assert "stages.0 (normalize).sources: unknown source nope; the recipe's sources: docs" in message
    assert "stages.1 (dedup).sources: a global stage sees every document" in message


def test_a_stage_with_sources_leaves_the_other_documents_untouched():
    from datapipe.pipeline.apply import build_stage
    from datapipe.schema import new_document
    from datapipe.text.normalize import Config as NormalizeConfig

    stage = build_stage(NormalizeConfig(stage="normalize", sources=["web"]))
    docs = stage([new_document("web", "1", "a  b\r\n"), new_document("svg", "2", "a  b\r\n")])
    assert [(doc["source"], doc["text"]) for doc in docs] == [("web", "a b"), ("svg", "a  b\r\n")]


@pytest.mark.parametrize("command", [["run"], ["inspect"], ["report"], ["recipes"], ["tokenizer"], ["tokenizer", "train"],
                                     ["tokenizer", "export"]])
def test_every_command_help_ends_with_an_example(command, capsys):
    with pytest.raises(SystemExit):
        cli.main([*command, "--help"])
    assert "example:\n  datapipe " in capsys.readouterr().out
