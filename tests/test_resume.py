"""A killed run resumes: the same command does only the missing work and writes byte-identical shards.

Each test runs `datapipe run` as a user does, in a process of its own, and kills it with SIGKILL
once the run's folder shows it reached a point (a committed partition, a packed group, a phase
manifest), then runs the same command again and compares every shard with an uninterrupted run.
"""
from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import WORDS, write_jsonl

ROOT = Path(__file__).resolve().parent.parent


def recipe_file(tmp_path: Path, tokenizer: Path, **changes) -> Path:
    """Twelve JSONL files (twelve partitions) and a generator; two phases, small groups."""
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    for i in range(12):
        rows = [{"id": f"f{i}-{j}", "text": " ".join(WORDS[(i + j) % len(WORDS):]) * (1 + (i * j) % 7)} for j in range(60)]
        write_jsonl(data / f"part-{i:02d}.jsonl", rows, [b'{"broken'] if i % 5 == 0 else [])
    recipe = {
        "name": "resume", "seed": 3,
        "sources": [{"name": "web", "type": "jsonl", "paths": ["data/*.jsonl"], "id_field": "id"},
                    {"name": "code", "type": "python_programs", "count": 1200}],
        "stages": [{"stage": "normalize"}, {"stage": "dedup"}, {"stage": "tokenize", "tokenizer": str(tokenizer)}],
        "phases": [{"name": "short", "seq_len": 256, "group_tokens": 20_000},
                   {"name": "long", "seq_len": 1024, "fraction": 0.5, "upsample_long": {"min_tokens": 300, "factor": 1.5},
                    "group_tokens": 50_000}],
        "shards": {"samples_per_shard": 16},
        "ray": {"num_cpus": 2, "object_store_mb": 256},
        **changes,
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def datapipe_run(*args: str, **kwargs) -> subprocess.Popen:
    """`datapipe run ARGS` in a process of its own; its stderr goes to a file (process.log), which
    a pipe nobody reads while the run goes on could fill and stall."""
    log = Path(tempfile.mkstemp(prefix="datapipe-run-", suffix=".log")[1])
    with open(log, "w") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "datapipe.cli", "run", *map(str, args)], cwd=ROOT,
                                   stdout=subprocess.DEVNULL, stderr=stderr, text=True, **kwargs)
    process.log = log
    return process


def finish(process: subprocess.Popen, timeout: float = 600) -> tuple[int, str]:
    process.wait(timeout=timeout)
    return process.returncode, process.log.read_text()


def shard_digests(out: Path) -> dict[str, str]:
    """sha256 of every shard and manifest-listed file of a finished run."""
    run = json.loads((out / "run.json").read_text())
    digests = {}
    for phase in run["phases"]:
        manifest = json.loads((out / phase["name"] / "manifest.json").read_text())
        for shard in manifest["shards"]:
            digests[f"{phase['name']}/{shard['name']}"] = hashlib.sha256((out / phase["name"] / shard["name"]).read_bytes()).hexdigest()
    return digests


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_tokenizer):
    """An uninterrupted run: its shards, stats and rejects."""
    tmp = tmp_path_factory.mktemp("reference")
    code, err = finish(datapipe_run(recipe_file(tmp, tiny_tokenizer), "--out", tmp / "out"))
    assert code == 0, err[-3000:]
    stats = json.loads((tmp / "out" / "stats.json").read_text())
    assert stats["phases"]["short"]["groups"] > 1 and stats["phases"]["long"]["groups"] > 1  # the groups are tested too
    assert stats["rejected"].get("dedup.exact_duplicate", 0) > 0  # and dedup's stored verdicts
    return tmp, shard_digests(tmp / "out"), stats


def kill_when(process: subprocess.Popen, reached, timeout: float = 600) -> None:
    """SIGKILL the run once reached() says so (polled); fails if the run ended first."""
    deadline = time.monotonic() + timeout
    while not reached():
        assert process.poll() is None, f"the run ended before the kill point: {process.log.read_text()[-2000:]}"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()


POINTS = {
    "gathering": lambda out: len(list((out / "_work" / "passes" / "1").glob("*.json"))) >= 3,  # blocks stored for dedup
    "dedup": lambda out: any((out / "_work" / "stages").glob("*-dedup/verdicts/*")),
    "reading": lambda out: len(list((out / "_work" / "partitions").glob("*.json"))) >= 3,
    "packing": lambda out: any((out / "_work" / "phases").glob("*/g*.json")),
    "accounting": lambda out: any((out / "_work" / "accounts").glob("*.json")),
}


@pytest.mark.slow
def test_a_run_killed_at_every_point_resumes_to_byte_identical_shards(reference, tmp_path, tiny_tokenizer):
    """Killed while the pass before dedup stores partitions, then (resumed) while dedup writes its
    verdicts, while partitions commit, while packing, while accounting; the last rerun finishes it: the shards, figures and rejects are the
    uninterrupted run's."""
    ref_dir, digests, ref_stats = reference
    recipe, out = recipe_file(tmp_path, tiny_tokenizer), tmp_path / "out"
    for attempt, point in enumerate(("gathering", "dedup", "reading", "packing", "accounting")):
        process = datapipe_run(recipe, "--out", out)
        kill_when(process, lambda point=point: POINTS[point](out))
        assert not (out / "run.json").exists()  # a killed run never looks finished
        assert attempt == 0 or "resuming" in process.log.read_text()  # it said what it kept
        if point == "reading":
            assert_changed_inputs_are_refused(recipe, out)
    code, err = finish(datapipe_run(recipe, "--out", out))
    assert code == 0, err[-3000:]
    assert "resuming" in err
    assert shard_digests(out) == digests
    stats = json.loads((out / "stats.json").read_text())
    for key in ("records_in", "written", "rejected", "tokens", "balanced"):
        assert stats[key] == ref_stats[key], key
    assert not (out / "_work").exists()
    rejects = sorted(p.name for p in (out / "rejects").iterdir())
    assert rejects == sorted(p.name for p in (ref_dir / "out" / "rejects").iterdir())


def test_a_finished_run_is_reported_not_redone(reference, tiny_tokenizer):
    ref_dir, digests, _ = reference
    before = {p: p.stat().st_mtime_ns for p in (ref_dir / "out").rglob("*")}
    code, err = finish(datapipe_run(ref_dir / "recipe.yaml", "--out", ref_dir / "out"))
    assert code == 0 and "nothing to do" in err
    assert {p: p.stat().st_mtime_ns for p in (ref_dir / "out").rglob("*")} == before


def test_another_recipe_or_seed_is_refused_and_restart_replaces_only_when_done(reference, tmp_path, tiny_tokenizer):
    ref_dir, digests, _ = reference
    out = tmp_path / "out"
    subprocess.run(["cp", "-a", str(ref_dir / "out"), str(out)], check=True)
    other = recipe_file(tmp_path, tiny_tokenizer, seed=4)
    code, err = finish(datapipe_run(other, "--out", out))
    assert code == 2 and "another recipe or seed" in err and "seed" in err and "--restart" in err
    assert shard_digests(out) == digests
    # a restart killed before it finished leaves the finished run as it was
    kill_when(datapipe_run(other, "--out", out, "--restart"), lambda: POINTS["packing"](Path(f"{out}.restart")))
    assert shard_digests(out) == digests
    code, err = finish(datapipe_run(other, "--out", out, "--restart"))
    assert code == 0, err[-3000:]
    assert json.loads((out / "run.json").read_text())["seed"] == 4 and shard_digests(out) != digests
    assert not Path(f"{out}.restart").exists()


def assert_changed_inputs_are_refused(recipe: Path, out: Path) -> None:
    """A file added under an unfinished run: the rerun is refused, before it touches the folder."""
    added = recipe.parent / "data" / "part-00a.jsonl"
    write_jsonl(added, [{"id": "new", "text": "a file added meanwhile"}])
    driver_files = [out / "recipe.json", out / "_work" / "plan.json"]  # only the driver writes these
    before = [path.stat().st_mtime_ns for path in driver_files]
    code, err = finish(datapipe_run(recipe, "--out", out))
    assert code == 2 and "not those the unfinished run began with" in err
    assert [path.stat().st_mtime_ns for path in driver_files] == before
    added.unlink()
