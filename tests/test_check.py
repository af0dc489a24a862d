"""check_recipe: what a run needs from this machine, found before Ray starts and before any output is touched."""
import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from datapipe.pipeline.check import check_recipe
from datapipe.pipeline.inspect import read_rejects
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
    inputs = check_recipe(load_recipe(write_recipe(tmp_path, [
        {"name": "web", "type": "jsonl", "paths": ["a.jsonl", "gone.jsonl"]},  # read.missing_file at read time
        {"name": "code", "type": "python_programs", "count": 3}])))
    assert [Path(item["path"]).name for item in inputs["web"]] == ["a.jsonl", "gone.jsonl"]  # the run reads both
    assert [(item["start"], item["stop"]) for item in inputs["code"]] == [(0, 3)]
    assert set(check_recipe(load_recipe(ROOT / "recipes" / "quickstart.yaml"))) == {"pydoc", "programs", "notes"}


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


def test_an_s3_source_that_cannot_be_listed_names_the_url_and_the_cause(tmp_path, s3):
    write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}])
    bucketless = "s3://no-such-bucket-datapipe/in/*.jsonl"
    problems = problems_of(write_recipe(tmp_path, [{"name": "web", "type": "jsonl", "paths": [bucketless]},
                                                   {"name": "empty", "type": "jsonl", "paths": [f"{s3}/in/*.jsonl"]},
                                                   {"name": "local", "type": "jsonl", "paths": ["a.jsonl"]}]))
    assert problems[0].startswith(f"sources.web.paths: cannot list {bucketless} (FileNotFoundError: ")
    assert "The specified bucket does not exist" in problems[0]
    assert problems[1].startswith(f"sources.empty.paths: ['{s3}/in/*.jsonl'] matched no files") and len(problems) == 2


@pytest.mark.skipif(importlib.util.find_spec("gcsfs") is not None, reason="gcsfs is installed here")
def test_a_url_whose_filesystem_package_is_missing_says_what_to_install(tmp_path):
    [problem] = problems_of(write_recipe(tmp_path, [{"name": "web", "type": "jsonl", "paths": ["gs://b/x.jsonl"]}]))
    assert problem.startswith("sources.web.paths: cannot list gs://b/x.jsonl (no filesystem for gs://")
    assert problem.endswith("pip install gcsfs)")


@pytest.fixture
def no_s3_credentials(s3, monkeypatch):
    """The test server's bucket, seen from a machine that has no AWS credentials set."""
    import s3fs

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(Path(s3.removeprefix("s3://")) / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(Path(s3.removeprefix("s3://")) / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance metadata service to ask either
    s3fs.S3FileSystem.clear_instance_cache()  # a cached filesystem keeps the credentials it started with
    yield s3
    s3fs.S3FileSystem.clear_instance_cache()


def test_no_credentials_is_a_recipe_error_before_the_run_and_a_reject_in_a_reader(tmp_path, no_s3_credentials):
    from datapipe.readers.tabular import read_jsonl
    from tests.test_sources import source

    url = f"{no_s3_credentials}/in/a.jsonl"
    [problem] = problems_of(write_recipe(tmp_path, [{"name": "web", "type": "jsonl", "paths": [url]}]))
    assert problem.startswith(f"sources.web.paths: cannot list {url} (NoCredentialsError: Unable to locate credentials)")
    assert "s3fs reads AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in problem and "every Ray node" in problem
    [doc] = read_jsonl(source(), url)  # a worker without credentials: one reject naming the URL and the cause
    assert doc["reject"] == "read.unreadable_file" and doc["text"] == f"{url}: NoCredentialsError: Unable to locate credentials"


def test_a_source_no_worker_could_open_fails_the_run(tmp_path, ray_session, capsys):
    from datapipe import cli

    (tmp_path / "crawl.warc").mkdir()  # listed here, unreadable where the work runs (as a node without the mount)
    recipe = write_recipe(tmp_path, [{"name": "web", "type": "warc", "paths": ["*.warc"]},
                                     {"name": "code", "type": "python_programs", "count": 3}])
    assert cli.main(["run", str(recipe), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert "sources web: no input could be read where the work ran" in " ".join(error.split())
    rejects = "".join(json.dumps(line) for line in read_rejects(tmp_path / "out"))
    assert "read.unreadable_file" in rejects and "crawl.warc" in rejects
