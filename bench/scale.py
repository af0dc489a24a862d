"""bench scale: how a run's driver and wall time grow with the corpus, and what more CPUs buy.

On generated web-text corpora of 20, 100 and 400 MB (JSONL files of ~10 MB each, made from the
shared web documents when ../shared/data/web_text is there, else from generated words), the same
recipe as `datapipe run` runs it: normalize, tokenize (the bundled demo tokenizer), one 8K phase.
Every run is a fresh `datapipe run` process, as a user starts it; measured:

  driver heap      the driver's peak Python heap (PYTHONTRACEMALLOC=1 in a second run of each size:
                   tracing slows the driver 2-3x, so the timed run is not traced; stats.json
                   `driver`), and its peak RSS: target flat, within +20% from 20 to 400 MB
  driver CPU share the driver's CPU seconds over those of its whole process tree (Ray's GCS, raylet
                   and workers: sampled every 0.2 s), untraced: target under 5% at 400 MB
  s/MB             wall time per MB of input
  rerun            a run SIGKILLed at 90% of the fresh run's wall time, then the same command again:
                   the rerun's wall time over the fresh run's, median of --rerun-trials (3): where
                   the kill lands (still reading, or packing) varies with the run's pace, and is
                   printed (target under 20%; largest size)
  2 CPUs vs 1      a two-raylet Ray cluster on this machine (`ray start --head`, `ray start
                   --address`), each node's processes pinned to one core of its own (taskset)
                   with 1 logical CPU (partition tasks need no more), the driver on the head's
                   core, against its head alone, with --ray-address (target at least 1.7x;
                   100 MB by default)
  vs plain         the same work in one plain Python process (our own reader, normalize, tokenize,
                   best-fit packing and shard writer, no Ray) against `datapipe run`, both pinned
                   to one core (taskset; the run's local Ray with 1 logical CPU): the plain
                   script's wall time over ours, x_vs_plain_1cpu (the issue's target: ours at
                   most 1.0x the plain script's, x_vs_plain_1cpu >= 1.0, so Ray's overhead is paid
                   back; 100 MB by default)
The machine is shared and noisy: read ratios; `uptime` is printed beside the figures.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
WEB_DOCS = ROOT.parent / "shared" / "data" / "web_text" / "web_docs.jsonl.gz"
FILE_MB = 10  # one input file (one partition) per 10 MB
RAY = str(Path(sys.executable).with_name("ray"))


def make_corpus(folder: Path, megabytes: int, seed: int = 0) -> Path:
    """JSONL files of web text, FILE_MB each, `megabytes` in all; each document once per file at most."""
    folder.mkdir(parents=True, exist_ok=True)
    rng, texts = random.Random(seed), source_texts()
    written, index = 0, 0
    while written < megabytes << 20:
        with open(folder / f"web-{index:04d}.jsonl", "w", encoding="utf-8") as out:
            size = 0
            while size < FILE_MB << 20 and written + size < megabytes << 20:
                text = f"Page {index}-{size}.\n" + rng.choice(texts)
                line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
                out.write(line)
                size += len(line.encode())
        written, index = written + size, index + 1
    return folder


def source_texts() -> list[str]:
    if WEB_DOCS.is_file():
        with gzip.open(WEB_DOCS, "rt", encoding="utf-8") as lines:
            return [json.loads(line)["text"] for line in lines]
    rng = random.Random(1)
    words = [("".join(rng.choice("etaoinshrdlucmfwyp") for _ in range(rng.randint(2, 9)))) for _ in range(5000)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(200, 3000))) + "." for _ in range(2000)]


def write_recipe(folder: Path, corpus: Path, num_cpus: int | None = None) -> Path:
    recipe = {"name": "scale", "seed": 0,
              "sources": [{"name": "web", "type": "jsonl", "paths": [f"{corpus}/*.jsonl"]}],
              "stages": [{"stage": "normalize"}, {"stage": "tokenize", "tokenizer": "demo"}],
              "phases": [{"name": "p8k", "seq_len": 8192}]}
    if num_cpus:
        recipe["ray"] = {"num_cpus": num_cpus}
    path = folder / f"recipe-{num_cpus or 'all'}.yaml"
    path.write_text(json.dumps(recipe))  # JSON is YAML
    return path


class TreeCPU:
    """CPU seconds of a process and its descendants, sampled while it runs (exited children keep the
    last figure seen: their final 0.2 s at most is missed)."""

    def __init__(self, pid: int):
        import psutil

        self.root, self.seen, self.stop = psutil.Process(pid), {}, threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()

    def sample(self) -> None:
        import psutil

        while not self.stop.is_set():
            try:
                for process in [self.root, *self.root.children(recursive=True)]:
                    with_times = process.cpu_times()
                    self.seen[(process.pid, process.create_time())] = with_times.user + with_times.system
            except psutil.Error:
                pass
            self.stop.wait(0.2)

    def total(self) -> float:
        self.stop.set()
        self.thread.join()
        return sum(self.seen.values())


def datapipe_run(recipe: Path, out: Path, env: dict[str, str] | None = None, address: str | None = None,
                 kill_after: float | None = None, trace: bool = False, core: int | None = None) -> dict:
    """One `datapipe run` process: its wall time, the CPU of its process tree, its stats.json; `trace`:
    the driver traces its heap; `core`: the run (and the Ray it starts) pinned to that core."""
    command = [*pinned(core), sys.executable, "-m", "datapipe.cli", "run", str(recipe), "--out", str(out)]
    command += ["--ray-address", address] if address else []
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    if trace:
        environment["PYTHONTRACEMALLOC"] = "1"  # the driver only: the runner keeps it from the Ray it starts
    started = time.monotonic()
    process = subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    cpu = TreeCPU(process.pid)
    if kill_after is not None:
        try:
            process.wait(kill_after)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
    _, err = process.communicate()
    wall, tree_cpu = time.monotonic() - started, cpu.total()
    if kill_after is not None:
        return {"wall_s": wall}
    if process.returncode != 0:
        raise SystemExit(f"datapipe run failed ({process.returncode}):\n{err[-4000:]}")
    stats = json.loads((out / "stats.json").read_text())
    return {"wall_s": wall, "tree_cpu_s": tree_cpu, "stats": stats}


def plain(corpus: Path, out: Path) -> None:
    """The same work in one process, no Ray: read every file, normalize, tokenize, pack 8K, write shards."""
    from datapipe.packing.bfd import SpecialIds
    from datapipe.packing.corpus import corpus_from_documents
    from datapipe.packing.curriculum import CurriculumPhase, pack_phase
    from datapipe.packing.writer import ShardWriter
    from datapipe.pipeline.recipe import TabularSource
    from datapipe.readers.tabular import read_jsonl
    from datapipe.text.normalize import Config as NormalizeConfig
    from datapipe.text.normalize import make_stage as make_normalize
    from tokenizer.stage import Config as TokenizeConfig
    from tokenizer.stage import make_stage as make_tokenize

    source = TabularSource(name="web", type="jsonl", paths=[str(corpus)])
    normalize = make_normalize(NormalizeConfig(stage="normalize"))
    tokenize = make_tokenize(TokenizeConfig(stage="tokenize", tokenizer="demo"))
    docs = []
    for path in sorted(corpus.glob("*.jsonl")):
        batch = [doc for doc in read_jsonl(source, str(path)) if not doc["reject"]]
        docs += [doc for doc in tokenize(normalize(batch)) if not doc["reject"]]
    ids = SpecialIds.from_tokenizer("demo")
    samples = pack_phase(CurriculumPhase(name="p8k", seq_len=8192), corpus_from_documents(docs, ids, ["web"]), 0, ids)[2]
    with ShardWriter(out / "p8k", 1024, {"phase": "p8k", "seq_len": 8192}) as writer:
        for sample in samples:
            writer.write(sample)


def pinned(core: int | None) -> list[str]:
    return ["taskset", "-c", str(core)] if core is not None else []


def plain_run(corpus: Path, out: Path) -> float:
    started = time.monotonic()
    subprocess.run([*pinned(0), sys.executable, __file__, "--plain", str(corpus), str(out)], check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    return time.monotonic() - started


@contextmanager
def two_raylets():
    """A Ray cluster on this machine, one CPU each node: yields (address, env, add_second_node)."""
    from datapipe.pipeline import reaper

    folders = [tempfile.mkdtemp(prefix="dph"), tempfile.mkdtemp(prefix="dpn")]
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    common = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--disable-usage-stats"]
    start = [*pinned(0), RAY, "start", "--head", f"--port={port}", f"--temp-dir={folders[0]}", "--include-dashboard=false", *common]

    def add_second_node() -> None:
        subprocess.run([*pinned(1), RAY, "start", f"--address=127.0.0.1:{port}", f"--temp-dir={folders[1]}", *common],
                       env=env, check=True, capture_output=True)
        time.sleep(3)

    try:
        subprocess.run(start, env=env, check=True, capture_output=True)
        yield f"127.0.0.1:{port}", env, add_second_node
    finally:
        for folder in reversed(folders):
            reaper.stop(folder, {}, exclude={os.getpid()})
            shutil.rmtree(folder, ignore_errors=True)


def load() -> str:
    return open("/proc/loadavg").read().split()[0] if os.path.exists("/proc/loadavg") else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="20,100,400", help="corpus sizes in MB (default 20,100,400)")
    parser.add_argument("--compare-mb", type=int, default=100, help="corpus size of the 1-vs-2-CPU and plain runs")
    parser.add_argument("--work", type=Path, default=None, help="work folder (default: a temporary one, removed)")
    parser.add_argument("--rerun-trials", type=int, default=3, help="kills at 90%% and reruns (median; default 3)")
    parser.add_argument("--no-compare", action="store_true", help="skip the 1-vs-2-CPU and plain-script runs")
    parser.add_argument("--plain", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain:
        return plain(*args.plain)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-scale-"))
    sizes = [int(size) for size in args.sizes.split(",")]
    try:
        figures = measure(work, sizes, args.compare_mb, args.rerun_trials, not args.no_compare)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(summary_line(figures))


def killed_at(out: Path) -> str:
    """Where a killed run stopped, from its committed markers."""
    work = out / "_work"
    if (out / "run.json").exists():
        return "finished"
    if not (work / "plan.json").exists():
        return "before any partition"
    partitions = len(json.loads((work / "plan.json").read_text()))
    committed = len(list((work / "partitions").glob("*.json")))
    if committed < partitions:
        return f"reading: {committed} of {partitions} partitions committed"
    return f"packing: {len(list((work / 'phases').glob('*/g*.json')))} groups committed"


def measure(work: Path, sizes: list[int], compare_mb: int, rerun_trials: int = 3, compare: bool = True) -> dict:
    figures: dict = {"sizes": {}}
    for size in sizes:
        corpus = make_corpus(work / f"corpus-{size}", size)
        result = datapipe_run(write_recipe(work, corpus), work / f"out-{size}")
        driver = result["stats"]["driver"]
        traced = datapipe_run(write_recipe(work, corpus), work / f"out-{size}-traced", trace=True)
        shutil.rmtree(work / f"out-{size}-traced")
        figures["sizes"][size] = {"wall_s": result["wall_s"], "s_per_mb": result["wall_s"] / size,
                                  "heap_mb": traced["stats"]["driver"]["heap_peak_mb"], "rss_mb": driver["max_rss_mb"],
                                  "driver_cpu_share": driver["cpu_s"] / max(result["tree_cpu_s"], 1e-9),
                                  "fill": result["stats"]["phases"]["p8k"]["fill"],
                                  "groups": result["stats"]["phases"]["p8k"]["groups"]}
        print(f"{size} MB: {figures['sizes'][size]} (load {load()})", flush=True)
    largest = max(sizes)
    corpus, fresh = work / f"corpus-{largest}", figures["sizes"][largest]["wall_s"]
    fractions = []
    for trial in range(2 * rerun_trials):  # where a kill at 90% lands varies with the run's pace: a median
        if len(fractions) == rerun_trials:
            break
        out = work / f"out-killed-{trial}"
        datapipe_run(write_recipe(work, corpus), out, kill_after=0.9 * fresh)
        landed = killed_at(out)
        if landed == "finished":  # this run went faster than the fresh one: nothing was left to kill
            print(f"trial {trial}: the run finished before the kill at {0.9 * fresh:.1f} s; not counted", flush=True)
            shutil.rmtree(out)
            continue
        rerun = datapipe_run(write_recipe(work, corpus), out)
        fractions.append(rerun["wall_s"] / fresh)
        print(f"rerun after a kill at 90% of {fresh:.1f} s ({landed}): {rerun['wall_s']:.1f} s (load {load()})",
              flush=True)
        shutil.rmtree(out)
    figures["rerun_frac"] = statistics.median(fractions)
    if not compare:
        return figures
    corpus = make_corpus(work / f"corpus-{compare_mb}", compare_mb)
    figures["plain_s"] = plain_run(corpus, work / "out-plain")
    figures["one_cpu_s"] = datapipe_run(write_recipe(work, corpus, num_cpus=1), work / "out-1cpu", core=0)["wall_s"]
    with two_raylets() as (address, env, add_second_node):
        figures["cluster_1_s"] = datapipe_run(write_recipe(work, corpus), work / "out-c1", env, address, core=0)["wall_s"]
        add_second_node()
        figures["cluster_2_s"] = datapipe_run(write_recipe(work, corpus), work / "out-c2", env, address, core=0)["wall_s"]
    print(f"{compare_mb} MB: plain {figures['plain_s']:.1f} s, datapipe on 1 CPU {figures['one_cpu_s']:.1f} s, "
          f"cluster 1 node {figures['cluster_1_s']:.1f} s, 2 nodes {figures['cluster_2_s']:.1f} s (load {load()})")
    return figures


def summary_line(figures: dict) -> str:
    sizes = figures["sizes"]
    smallest, largest = min(sizes), max(sizes)
    parts = [f"heap_mb_{size}={sizes[size]['heap_mb']:.1f}" for size in sizes]
    parts += [f"heap_growth={sizes[largest]['heap_mb'] / max(sizes[smallest]['heap_mb'], 1e-9):.2f}",
              f"rss_growth={sizes[largest]['rss_mb'] / sizes[smallest]['rss_mb']:.2f}",
              f"driver_cpu_share_{largest}={sizes[largest]['driver_cpu_share']:.3f}"]
    parts += [f"s_per_mb_{size}={sizes[size]['s_per_mb']:.3f}" for size in sizes]
    parts += [f"fill_{largest}={100 * sizes[largest]['fill']:.3f}", f"groups_{largest}={sizes[largest]['groups']}",
              f"rerun_frac={figures['rerun_frac']:.3f}"]
    if "plain_s" in figures:
        parts += [f"x_2cpu_vs_1cpu={figures['cluster_1_s'] / figures['cluster_2_s']:.2f}",
                  f"x_vs_plain_1cpu={figures['plain_s'] / figures['one_cpu_s']:.2f}"]
    return "bench scale: " + " ".join(parts)


if __name__ == "__main__":
    main()
