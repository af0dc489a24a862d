"""check_recipe: what a run needs from this machine, found before Ray starts and before any output is touched."""
import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from datapipe.pipeline.check import check_recipe
from datapipe.pipeline.recipe import RecipeError, load_recipe
from tests.conftest import write_jsonl

ROOT = Path(__file__).resolve().parent.parent


def write_recipe(tmp_path: Path, sources: list[dict], tokenizer: str = "demo") -> Path:
    recipe = {"name": "t", "sources": sources, "stages": [{"stage": "normalize"},
                                                          {"stage": "tokenize", "tokenizer": tokenizer}]}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def problems_of(path: Path) -> list[str]:
    with pytest.raises(RecipeError) as info:
        check_recipe(load_recipe(path))
    return info.value.problems


def test_a_runnable_recipe_passes_and_a_missing_file_beside_others_stays_a_reject(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}])
    check_recipe(load_recipe(write_recipe(tmp_path, [
        {"name": "web", "type": "jsonl", "paths": ["a.jsonl", "gone.jsonl"]},  # read.missing_file at read time
        {"name": "code", "type": "python_programs", "count": 3}])))
    check_recipe(load_recipe(ROOT / "recipes" / "demo.yaml"))


def test_paths_that_match_nothing_name_the_pattern_and_the_folder(tmp_path):
    [problem] = problems_of(write_recipe(tmp_path, [{"name": "web", "type": "jsonl", "paths": ["data/*.jsonl"]}]))
    assert problem.startswith("sources.web.paths: ['data/*.jsonl'] matched no files")
    assert f"relative ones start at the recipe's folder, {tmp_path.resolve()}" in problem


def test_a_tokenizer_that_does_not_load_is_named_with_the_bundled_ones(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}])
    sources = [{"name": "web", "type": "jsonl", "paths": ["a.jsonl"]}]
    [problem] = problems_of(write_recipe(tmp_path, sources, tokenizer="nope.json"))
    assert problem.startswith("stages[1].tokenizer: tokenizer 'nope.json' not found") and "['demo']" in problem
    (tmp_path / "broken.json").write_text("{not json")
    [problem] = problems_of(write_recipe(tmp_path, sources, tokenizer="broken.json"))
    assert "broken.json does not load as a tokenizer.json" in problem


def test_a_tokenizer_without_the_special_tokens_is_refused(tmp_path):
    from tokenizers import Tokenizer, models

    Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[])).save(str(tmp_path / "plain.json"))
    write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}])
    [problem] = problems_of(write_recipe(tmp_path, [{"name": "web", "type": "jsonl", "paths": ["a.jsonl"]}],
                                         tokenizer="plain.json"))
    assert problem.startswith("stages[1].tokenizer: tokenizer") and "lacks the special tokens" in problem


def test_every_problem_at_once_sources_first(tmp_path):
    problems = problems_of(write_recipe(tmp_path, [{"name": "web", "type": "jsonl", "paths": ["gone/*.jsonl"]},
                                                   {"name": "books", "type": "parquet", "paths": ["none.parquet"]}],
                                        tokenizer="nope.json"))
    assert [problem.split(":", 1)[0] for problem in problems] == [
        "sources.web.paths", "sources.books.paths", "stages[1].tokenizer"]


def tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("problem", ["paths", "tokenizer"])
def test_a_failed_check_leaves_the_previous_output_alone_and_starts_no_ray(tmp_path, problem):
    out = tmp_path / "out"  # a finished run's files, as prepare_out_dir would clear them
    (out / "main").mkdir(parents=True)
    (out / "rejects").mkdir()
    for name, text in {"main/shard-000000.tar": "tar", "main/manifest.json": "{}", "rejects/rejects.jsonl": "",
                       "stats.json": "{}", "run.json": "{}", "recipe.json": "{}"}.items():
        (out / name).write_text(text)
    before = tree_digest(out)
    write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}])
    paths = ["a.jsonl"] if problem == "tokenizer" else ["typo/*.jsonl"]
    recipe = write_recipe(tmp_path, [{"name": "web", "type": "jsonl", "paths": paths}],
                          tokenizer="nope.json" if problem == "tokenizer" else "demo")
    script = ("import sys; from datapipe import cli; code = cli.main(sys.argv[1:]); "
              "print('ray imported' if 'ray' in sys.modules else 'no ray'); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", script, "run", str(recipe), "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stdout.strip() == "no ray"
    assert "cannot run here" in done.stderr and ("matched no files" in done.stderr or "'nope.json'" in done.stderr)
    assert tree_digest(out) == before
