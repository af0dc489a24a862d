"""Two Ray nodes on this machine, started as a user starts a cluster: `ray start --head`, then
`ray start --address` for a second raylet with a custom resource (node2), each with its own
--temp-dir (Ray allows one per node), 1 CPU each, token authentication on.

A recipe whose tokenize stage asks for `resources: {node2: 1}` runs its tokenize actors on the
second node (an operator a stage: a pinned stage cannot run in a partition task) and writes the same
shards as the unpinned recipe on the suite's local Ray (partition tasks); a tokenize actor or a
partition task killed mid-run changes nothing either. Placement is read from where each actor's process
logs: every raylet writes its workers' logs under its own --temp-dir, and Ray opens an actor's
log with `:actor_name:<class>`. The cluster's processes are stopped by folder (reaper.stop), not
by `ray stop`, which stops every Ray process of the machine, other people's included.
"""
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

from datapipe import cli
from datapipe.pipeline import reaper
from tests.conftest import tiny_recipe, write_jsonl

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
RAY = str(Path(sys.executable).with_name("ray"))
TOKENIZE_ACTOR = "MapWorker(MapBatches(TokenizeActor))"  # the class name Ray Data gives the tokenize pool's actors
RUN_S = 400  # one run on the cluster; minutes when the 2 shared cores are loaded
COMMON = ["--node-ip-address=127.0.0.1", "--num-cpus=1", f"--object-store-memory={128 << 20}",
          "--disable-usage-stats"]


class Cluster(NamedTuple):
    address: str
    env: dict[str, str]  # what a driver of this cluster needs: the token, this checkout on PYTHONPATH
    head_tmp: str
    node_tmp: str


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ray_start(args: list[str], env: dict[str, str]) -> None:
    done = subprocess.run([RAY, "start", *args, *COMMON], env=env, capture_output=True, text=True, timeout=RUN_S)
    assert done.returncode == 0, f"ray start {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def cluster():
    head_tmp, node_tmp = tempfile.mkdtemp(prefix="dph"), tempfile.mkdtemp(prefix="dpn")  # short: socket paths
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), "PYTHONPATH": str(ROOT)}
    for name in ("RAY_ADDRESS", "RAY_TMPDIR"):
        env.pop(name, None)
    port = free_port()
    try:
        ray_start(["--head", f"--port={port}", f"--temp-dir={head_tmp}", "--include-dashboard=false"], env)
        ray_start([f"--address=127.0.0.1:{port}", f"--temp-dir={node_tmp}", '--resources={"node2": 1}'], env)
        yield Cluster(f"127.0.0.1:{port}", env, head_tmp, node_tmp)
    finally:
        for folder in (node_tmp, head_tmp):
            reaper.stop(folder, {}, exclude={os.getpid()})
            shutil.rmtree(folder, ignore_errors=True)


def cluster_run(cluster: Cluster, recipe: Path, out: Path) -> subprocess.Popen:
    with open(f"{out}.stderr", "w") as stderr:
        return subprocess.Popen([sys.executable, "-m", "datapipe.cli", "run", str(recipe), "--out", str(out),
                                 "--ray-address", cluster.address], env=cluster.env, stdout=subprocess.DEVNULL,
                                stderr=stderr)


def finish(driver: subprocess.Popen) -> None:
    out = driver.args[driver.args.index("--out") + 1]
    assert driver.wait(RUN_S) == 0, Path(f"{out}.stderr").read_text()[-5000:]


def shard_digests(out: Path) -> list[str]:
    shards = sorted((out / "main").glob("*.tar"))
    assert shards, f"no shards in {out}"
    digests = [hashlib.sha256(shard.read_bytes()).hexdigest() for shard in shards]
    manifest = json.loads((out / "main" / "manifest.json").read_text())
    assert digests == [shard["sha256"] for shard in manifest["shards"]]
    return digests


def actor_logs(temp_dir: str, actor_class: str) -> list[Path]:
    """The worker logs of a node (its --temp-dir) that Ray opened for an actor of this class."""
    marker = f":actor_name:{actor_class}".encode()
    return [log for log in Path(temp_dir).glob("session_*/logs/worker-*.out") if marker in log.read_bytes()]


def recipes(tmp_path: Path, tokenizer: Path, programs: int) -> tuple[Path, Path]:
    """The same recipe twice: as is, and with tokenize pinned to node2 (in folders of their own)."""
    write_jsonl(tmp_path / "docs.jsonl", [{"id": str(i), "text": f"document {i} " * (1 + i % 9)} for i in range(60)])
    sources = [{"name": "docs", "type": "jsonl", "paths": [str(tmp_path / "docs.jsonl")]},
               {"name": "code", "type": "python_programs", "count": programs}]
    paths = []
    for name, pin in (("local", {}), ("pinned", {"resources": {"node2": 1}})):
        (tmp_path / name).mkdir()
        recipe = tiny_recipe(tmp_path / name, tokenizer, sources)
        raw = yaml.safe_load(recipe.read_text())
        raw["stages"][1].update(batch_size=32, **pin)  # small batches: many for the pool, a kill lands mid-run
        recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
        paths.append(recipe)
    return paths[0], paths[1]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_tokenizer, ray_session) -> tuple[Path, list[str]]:
    """The pinned recipe, and the shards' digests of the unpinned one run on the suite's local Ray."""
    tmp = tmp_path_factory.mktemp("cluster")
    local, pinned = recipes(tmp, tiny_tokenizer, programs=3000)
    assert cli.main(["run", str(local), "--out", str(tmp / "here")]) == 0
    return pinned, shard_digests(tmp / "here")


def test_a_stage_pinned_to_the_second_node_runs_there_and_changes_no_shard(cluster, reference, tmp_path):
    pinned, local_digests = reference
    assert yaml.safe_load(pinned.read_text())["stages"][1]["resources"] == {"node2": 1}
    finish(cluster_run(cluster, pinned, tmp_path / "cluster"))
    assert shard_digests(tmp_path / "cluster") == local_digests
    assert actor_logs(cluster.node_tmp, TOKENIZE_ACTOR) and not actor_logs(cluster.head_tmp, TOKENIZE_ACTOR)


def test_a_tokenize_actor_killed_mid_batch_changes_no_shard(cluster, reference, tmp_path):
    pinned, local_digests = reference
    before = set(actor_logs(cluster.node_tmp, TOKENIZE_ACTOR))
    driver = cluster_run(cluster, pinned, tmp_path / "cluster")
    os.kill(busy_actor(cluster.node_tmp, driver), signal.SIGKILL)
    finish(driver)
    assert len(set(actor_logs(cluster.node_tmp, TOKENIZE_ACTOR)) - before) >= 2  # the killed actor and its restart
    assert shard_digests(tmp_path / "cluster") == local_digests


def test_a_partition_task_killed_mid_run_changes_no_shard(cluster, reference, tmp_path):
    """The unpinned recipe runs as partition tasks on both nodes; one is killed while it works: Ray runs
    it again (the killed attempt wrote no marker), and the shards are those of the local run."""
    pinned, local_digests = reference
    driver = cluster_run(cluster, pinned.parent.parent / "local" / "tiny.yaml", tmp_path / "cluster")
    worker = wait_for(lambda: next((pid for pid in reaper.processes() if title(pid).startswith("ray::run_partition")
                                    and any(reaper.in_folder(pid, folder) for folder in (cluster.head_tmp, cluster.node_tmp))),
                                   None), driver, pause=0.002, what="a partition task")
    os.kill(worker, signal.SIGKILL)
    finish(driver)
    assert shard_digests(tmp_path / "cluster") == local_digests


def busy_actor(node_tmp: str, driver: subprocess.Popen) -> int:
    """The pid of the tokenize actor on the node of `node_tmp`, caught working on a batch (Ray titles
    the process `ray::<class>.submit` then): its batch is in flight when it dies."""
    actor = wait_for(lambda: next((pid for pid in reaper.processes() if title(pid).startswith(f"ray::{TOKENIZE_ACTOR}")
                                   and reaper.in_folder(pid, node_tmp)), None), driver, pause=0.1)
    return wait_for(lambda: actor if title(actor).startswith(f"ray::{TOKENIZE_ACTOR}.submit") else None, driver,
                    pause=0.002)  # a batch takes milliseconds: look often, at one process only


def wait_for(find, driver: subprocess.Popen, pause: float, what: str = "a tokenize actor on node 2"):
    deadline = time.monotonic() + RUN_S
    while time.monotonic() < deadline and driver.poll() is None:
        if (found := find()) is not None:
            return found
        time.sleep(pause)
    raise AssertionError(f"the run ended (exit code {driver.poll()}) before {what} was seen busy")


def title(pid: int) -> str:
    try:
        return (reaper.PROC / str(pid) / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""
