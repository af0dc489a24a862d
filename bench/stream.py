"""Loader throughput: datapipe.stream against `cat`, webdataset and MosaicML streaming, on the same samples.

    make bench-deps   # once: webdataset's and MosaicML streaming's peers
    .venv/bin/python bench/stream.py [--seq-len 8192] [--samples 8192] [--per-shard 1024] [--rounds 5]
    .venv/bin/python bench/stream.py --check-cost   # the digest check alone, on and off (check_cost below)

Writes packed samples (lognormal document lengths, as the packer makes them) with our
ShardWriter, converts the same samples to MDS for MosaicML streaming, warms the page cache,
then times in interleaved rounds, each loader in a fresh process of its own (as a user
runs it: `python train.py`), once with Python's garbage collector on (its default) and once
off (gc.collect() then gc.disable() after the imports, as a trainer keeps collection off
its hot loop: torchtitan collects every N steps). Every timed loop runs with torch loaded,
as in a trainer (webdataset and MosaicML streaming import it themselves): with collection
on, the objects a loader makes trigger full collections over torch's objects, which costs a
loader that makes many (webdataset: a dict per member) up to 2x. The child times its loop
(the tokens/s figures); the parent times the whole process, start-up included, less the
torch import a user's script of our loader would not make (the whole-process seconds).

Loaders: "raw" is `cat` of the shards and their index files into /dev/null (the bytes our
loader reads); "ours" is `datapipe.stream(path)` with its defaults (per-sample, position
ids derived); "ours_same_work" decodes only what the peers decode (position_ids=False);
"ours_shuffled", "ours_walk" (no index files: the tar headers walked, as shards of another
writer come), "ours_batched" (batch_size=8: [8, seq_len] views of the mapped shard) and
"ours_batched_arrays" (the same, fields= tokens, loss_mask, doc_lens: no json header) do the
same work as ours_same_work. "ours_unchecked" and "ours_batched_arrays_unchecked" are
ours_same_work and ours_batched_arrays with check_samples=False: check_cost is the share of the
loader's time the per-sample digest check takes (1 - checked rate / unchecked rate). "webdataset" is `webdataset.WebDataset(urls, shardshuffle=False)
.decode()`, its documented decoder (numpy's .npy reader, json); "streaming" is
`streaming.StreamingDataset(local=mds, batch_size=8)`: both decode tokens, doc_lens,
loss_mask and the json header of every sample, as ours does. "raw_cold" and "ours_cold"
read the same files with the page cache dropped before each run (posix_fadvise DONTNEED).
Every loader hands out token arrays; the consumer gathers them into batches of 8 and reads
one token of each. tokens/s counts every position (seq_len a sample). Then resume: a fresh
shuffled loader restores a state at a random position and yields its next sample.
Medians over the rounds; the machine is shared: compare the ratios, and the load printed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from datapipe.loader.stream import stream
from datapipe.shardformat import read_manifest

BATCH = 8
ARRAYS = ("tokens", "loss_mask", "doc_lens")  # what a trainer feeds the model: no json header (doc ids)
OURS = {  # loader name -> datapipe.stream options
    "ours": {}, "ours_same_work": {"position_ids": False},
    "ours_shuffled": {"shuffle": True, "seed": 0, "position_ids": False},
    "ours_batched": {"batch_size": BATCH, "position_ids": False},
    "ours_batched_arrays": {"batch_size": BATCH, "position_ids": False, "fields": ARRAYS},
    "ours_walk": {"position_ids": False}, "ours_cold": {"position_ids": False},
    # the per-sample digest check off: what it costs ours_same_work and ours_batched_arrays
    "ours_unchecked": {"position_ids": False, "check_samples": False},
    "ours_batched_arrays_unchecked": {"batch_size": BATCH, "position_ids": False, "fields": ARRAYS,
                                      "check_samples": False},
}
# --check-cost: loaders with the digest check on and their twins with it off. "collated" consumers copy each
# batch into one array (a trainer's collate: torch.stack), reading every token as training does, where the
# others read one token a sample; "cold" ones read with the page cache dropped, as shards come in a long run
CHECKED = {"ours_same_work": "ours_unchecked", "ours_batched_arrays": "ours_batched_arrays_unchecked",
           "ours_collated": "ours_collated_unchecked", "ours_cold": "ours_cold_unchecked"}
CHECK_TWINS = {"ours_collated": {"position_ids": False}, "ours_cold_unchecked": OURS["ours_unchecked"],
               "ours_collated_unchecked": OURS["ours_unchecked"]}
PEERS = ("webdataset", "streaming")
COLD = ("raw_cold", "ours_cold")  # read from disk: timed with collection on only


def make_samples(seq_len: int, n_samples: int, seed: int = 0) -> list[dict]:
    """Packed samples as the curriculum packer writes them: pieces of lognormal documents (median
    ~1.1K tokens) filling each sequence, a little padding, a loss mask; random token ids."""
    rng, samples = np.random.default_rng(seed), []
    for index in range(n_samples):
        num_pad = int(rng.integers(0, 64))
        lengths = np.clip(rng.lognormal(7.0, 1.2, size=seq_len // 16 + 1).astype(np.int64), 16, None)
        lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), seq_len - num_pad)) + 1]
        lengths[-1] -= lengths.sum() - (seq_len - num_pad)
        tokens = rng.integers(3, 160_000, size=seq_len, dtype=np.uint32)
        tokens[seq_len - num_pad :] = 2
        mask = np.ones(seq_len, dtype=np.uint8)
        mask[seq_len - num_pad :] = 0
        samples.append({"key": f"main-{index:09d}", "tokens": tokens, "doc_lens": lengths.astype(np.int32),
                        "loss_mask": mask, "doc_ids": [f"web/doc{index}-{i}" for i in range(len(lengths))],
                        "doc_offsets": [0] * len(lengths), "seq_len": seq_len, "num_pad": num_pad, "media_spans": []})
    return samples


def write_ours(folder: Path, samples, per_shard: int) -> None:
    from datapipe.packing.writer import ShardWriter

    with ShardWriter(folder, per_shard, {"phase": "main", "seq_len": len(samples[0]["tokens"])}) as writer:
        for sample in samples:
            writer.write(sample)


def without_index(phase: Path, folder: Path) -> Path:
    """The same shard files (hard links) under a manifest that lists no index files."""
    folder.mkdir()
    manifest = read_manifest(phase)
    for shard in manifest["shards"]:
        os.link(phase / shard["name"], folder / shard["name"])
        del shard["index"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def import_streaming():
    # streaming/__init__ imports its vision datasets, which need torchvision; PyPI's torchvision is
    # built against CUDA torch and fails to load beside the CPU build. The text path never uses it.
    sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
    try:
        import streaming
    except ImportError as err:
        raise SystemExit(
            f"bench/stream.py compares with MosaicML streaming: run `make bench-deps` first ({err})"
        ) from err

    return streaming


def write_mds(folder: Path, phase: Path, seq_len: int, per_shard_bytes: int) -> None:
    from datapipe.loader.reference import read_shards

    streaming = import_streaming()
    columns = {"tokens": f"ndarray:uint32:{seq_len}", "doc_lens": "ndarray:int32",
               "loss_mask": f"ndarray:uint8:{seq_len}", "json": "json"}
    fields = ("doc_ids", "doc_offsets", "seq_len", "num_pad", "media_spans")
    with streaming.MDSWriter(out=str(folder), columns=columns, size_limit=per_shard_bytes) as writer:
        for s in read_shards(phase):
            writer.write({"tokens": s["tokens"], "doc_lens": s["doc_lens"], "loss_mask": s["loss_mask"],
                          "json": {k: s[k] for k in fields}})


def consume(samples, key: str, seq_len: int) -> int:
    """Gather token arrays into batches, as a trainer's collate receives them; return how many samples came."""
    batch, count, checksum = [], 0, 0
    for sample in samples:
        tokens = sample[key]
        if len(tokens) != seq_len:
            raise RuntimeError(f"a sample of {len(tokens)} tokens, expected {seq_len}")
        batch.append(tokens)
        checksum += int(tokens[-1])
        count += 1
        if len(batch) == BATCH:
            batch = []
    return count


def consume_collated(samples, key: str, seq_len: int) -> int:
    """A trainer's collate: each batch of BATCH samples copied into one [BATCH, seq_len] array."""
    batch, count, out = [], 0, np.empty((BATCH, seq_len), dtype=np.uint32)
    for sample in samples:
        batch.append(sample[key])
        count += 1
        if len(batch) == BATCH:
            np.stack(batch, out=out)
            batch = []
    return count


def consume_batches(batches, key: str, seq_len: int) -> int:
    """The trainer's side of a batched loader (batch_size=BATCH): [BATCH, seq_len] token arrays."""
    count, checksum = 0, 0
    for batch in batches:
        tokens = batch[key]
        if tokens.shape[1] != seq_len:
            raise RuntimeError(f"a batch of {tokens.shape} tokens, expected rows of {seq_len}")
        checksum += int(tokens[-1, -1])
        count += len(tokens)
    return count


def open_loader(name: str, work: Path):
    """(iterable, token key, consumer) of a loader, its imports done (the child's untimed part)."""
    if name in CHECK_TWINS:
        return stream(work / "main", **CHECK_TWINS[name]), "tokens", consume_collated if "collated" in name else consume
    if name in OURS:
        folder = work / ("walk" if name == "ours_walk" else "main")
        eat = consume_batches if "batch_size" in OURS[name] else consume
        return stream(folder, **OURS[name]), "tokens", eat
    if name == "webdataset":
        import webdataset as wds

        urls = sorted(str(path) for path in (work / "main").glob("*.tar"))
        return wds.WebDataset(urls, shardshuffle=False).decode(), "tokens.npy", consume
    streaming = import_streaming()
    streaming.base.util.clean_stale_shared_memory()  # as its docs advise between runs
    return streaming.StreamingDataset(local=str(work / "mds"), batch_size=BATCH), "tokens", consume


def child(name: str, work: Path, gc_mode: str, seq_len: int, expected: int) -> None:
    """One timed run in this fresh process: the loader opened (its own imports: the peers load
    torch), then torch loaded as in a trainer (timed apart: a new user's script would not),
    collection left on or turned off, the loop timed; prints both times."""
    import gc

    loader, key, eat = open_loader(name, work)
    start = time.perf_counter()
    import torch  # noqa: F401 - a trainer's process has it; the peers imported it already
    trainer_s = time.perf_counter() - start
    if gc_mode == "off":
        gc.collect()
        gc.disable()
    start, cpu = time.perf_counter(), time.process_time()
    count = eat(loader, key, seq_len)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    if count != expected:
        raise RuntimeError(f"{name} yielded {count} samples, expected {expected}")
    print(json.dumps({"inner_s": elapsed, "cpu_s": cpu, "trainer_s": trainer_s}))


def run_child(name: str, work: Path, gc_mode: str, seq_len: int, expected: int) -> tuple[float, float, float]:
    """(inner loop seconds, whole process seconds but the trainer's torch import, inner loop CPU
    seconds of all threads) of one child run."""
    command = [sys.executable, __file__, "--child", name, "--work", str(work), "--gc", gc_mode,
               "--seq-len", str(seq_len), "--samples", str(expected)]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    whole = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{name} (gc {gc_mode}) failed:\n{done.stderr[-3000:]}")
    times = json.loads(done.stdout.strip().splitlines()[-1])
    return times["inner_s"], whole - times["trainer_s"], times["cpu_s"]


def drop_from_page_cache(paths: list[str]) -> None:
    """The next read of these files comes from disk (a no-op on a file system in memory, such as tmpfs)."""
    for path in paths:
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)  # the kernel drops clean pages only
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


def time_raw(paths: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(["cat", *paths], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def time_resume(phase: Path, samples: int, rng: np.random.Generator) -> float:
    position = int(rng.integers(samples))
    state = {**stream(phase, shuffle=True, seed=1).state_dict(), "epoch": int(rng.integers(100)), "position": position}
    start = time.perf_counter()
    loader = stream(phase, shuffle=True, seed=1)
    loader.load_state_dict(state)
    next(iter(loader))
    return time.perf_counter() - start


def prepare(work: Path, seq_len: int, samples: int, per_shard: int) -> tuple[list[str], list[str]]:
    """The phase, the same shards without index files, the MDS copy; (shard paths, their files + manifest)."""
    phase = work / "main"
    write_ours(phase, make_samples(seq_len, samples), per_shard)
    manifest = read_manifest(phase)
    paths = [str(phase / shard["name"]) for shard in manifest["shards"]]
    indexes = [str(phase / shard["index"]["name"]) for shard in manifest["shards"]]
    without_index(phase, work / "walk")
    write_mds(work / "mds", phase, seq_len, manifest["shards"][0]["bytes"])
    size = sum(os.path.getsize(path) for path in paths + indexes)
    print(f"{samples} samples x {seq_len} tokens in {len(paths)} shards; raw and ours read the same "
          f"{size / 2**20:.1f} MiB (shards and index files) from a warm page cache", file=sys.stderr)
    return paths + indexes, [*paths, *indexes, str(phase / "manifest.json")]


def one_round(work: Path, files: list[str], phase_files: list[str], seq_len: int, n: int) -> dict[str, tuple]:
    """Every loader once, in turn: name@gc mode ("on", "off") -> run_child's times (raw: cat's)."""
    times: dict[str, tuple] = {"raw": (time_raw(files),) * 3}
    drop_from_page_cache(phase_files)
    times["raw_cold"] = (time_raw(files),) * 3
    for name in [*OURS, *PEERS]:
        for gc_mode in ("on",) if name in COLD else ("on", "off"):
            if name in COLD:
                drop_from_page_cache(phase_files)
            times[f"{name}@{gc_mode}"] = run_child(name, work, gc_mode, seq_len, n)
    return times


def summary(rounds: list[dict], n: int, seq_len: int) -> dict[str, float]:
    """tokens/s of the inner loop (wall, and CPU: key#cpu) and whole-process seconds (key#whole_s),
    medians over the rounds, per loader and gc mode."""
    rates = {}
    for key in rounds[0]:
        rates[key] = n * seq_len / statistics.median(r[key][0] for r in rounds)
        rates[f"{key}#whole_s"] = statistics.median(r[key][1] for r in rounds)
        rates[f"{key}#cpu"] = n * seq_len / statistics.median(r[key][2] for r in rounds)
    return rates


def report(rates: dict[str, float], loads: list[float], resume: float, seq_len: int, n: int) -> None:
    for key in (k for k in rates if "#" not in k):
        print(f"{key:>24}: {rates[key] / 1e6:8.1f} M tokens/s  (a CPU second: {rates[key + '#cpu'] / 1e6:7.1f} M; "
              f"whole process {rates[key + '#whole_s']:.2f} s)", file=sys.stderr)
    raw = rates["raw"]

    def x(left: str, right: str) -> str:
        return f"{rates[left] / rates[right]:.2f}"

    whole = rates["webdataset@on#whole_s"] / rates["ours@on#whole_s"]
    print(f"bench stream: tokens_per_s={rates['ours@on']:.3g} raw_tokens_per_s={raw:.3g} "
          f"x_vs_webdataset={x('ours@on', 'webdataset@on')} x_vs_streaming={x('ours@on', 'streaming@on')} "
          f"x_vs_webdataset_gc_off={x('ours@off', 'webdataset@off')} "
          f"x_vs_streaming_gc_off={x('ours@off', 'streaming@off')} "
          f"same_work_x_vs_webdataset={x('ours_same_work@on', 'webdataset@on')} "
          f"same_work_x_vs_webdataset_gc_off={x('ours_same_work@off', 'webdataset@off')} "
          f"whole_x_vs_webdataset={whole:.2f} frac_of_raw={rates['ours@on'] / raw:.2f} "
          f"frac_of_raw_gc_off={rates['ours@off'] / raw:.2f} "
          + " ".join(f"{name.removeprefix('ours_')}_frac_of_raw={rates[name + '@on'] / raw:.2f}"
                     for name in OURS if name not in ("ours", "ours_cold"))
          + f" cold_frac_of_raw={x('ours_cold@on', 'raw_cold')} resume_s={resume:.3f} "
          f"check_cost={1 - rates['ours_same_work@on'] / rates['ours_unchecked@on']:.3f} "
          f"check_cost_batched={1 - rates['ours_batched_arrays@on'] / rates['ours_batched_arrays_unchecked@on']:.3f} "
          f"seq_len={seq_len} samples={n} load={min(loads):.1f}-{max(loads):.1f}")


def check_cost(work: Path, seq_len: int, samples: int, per_shard: int, rounds: int) -> None:
    """The digest check alone: each CHECKED loader and its unchecked twin in turn, in fresh processes,
    gc off (the loaders' own time), for `rounds` rounds; the share of the loop's wall time and of its
    CPU time (all threads) the check takes, medians."""
    write_ours(work / "main", make_samples(seq_len, samples), per_shard)
    files = [str(path) for path in (work / "main").iterdir()]
    names = [name for pair in CHECKED.items() for name in pair]
    runs, loads = {name: [] for name in names}, [os.getloadavg()[0]]
    for _ in range(rounds + 1):  # the first round warms the page cache and the imports: not counted
        for name in names:
            if "cold" in name:
                drop_from_page_cache(files)
            runs[name].append(run_child(name, work, "off", seq_len, samples))
    loads.append(os.getloadavg()[0])
    costs = {}
    for checked, unchecked in CHECKED.items():
        label = checked.removeprefix("ours_").replace("same_work", "per_sample")
        for what, column in (("", 0), ("_cpu", 2)):
            on, off = (statistics.median(r[column] for r in runs[name][1:]) for name in (checked, unchecked))
            costs[f"check_cost_{label}{what}"] = 1 - off / on
            print(f"{checked:>24}{what or '_wall'}: {on:.3f} s checked, {off:.3f} s unchecked", file=sys.stderr)
    print("bench stream_check: " + " ".join(f"{k}={v:.3f}" for k, v in costs.items())
          + f" seq_len={seq_len} samples={samples} per_shard={per_shard} rounds={rounds}"
          f" load={min(loads):.1f}-{max(loads):.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--per-shard", type=int, default=1024, help="samples a shard (datapipe run's default: 1024)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of every loader and gc mode")
    parser.add_argument("--check-cost", action="store_true", help="time only the digest check on and off")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one timed run: bench/stream.py starts these itself
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--gc", default="on", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, Path(args.work), args.gc, args.seq_len, args.samples)
    work = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    if args.check_cost:
        try:
            return check_cost(work, args.seq_len, args.samples, args.per_shard, args.rounds)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    try:
        files, phase_files = prepare(work, args.seq_len, args.samples, args.per_shard)
        n = read_manifest(work / "main")["samples"]
        one_round(work, files, phase_files, args.seq_len, n)  # warms the page cache and every reader's files
        rounds, loads = [], []
        for _ in range(args.rounds):
            loads.append(os.getloadavg()[0])
            rounds.append(one_round(work, files, phase_files, args.seq_len, n))
        loads.append(os.getloadavg()[0])
        rng = np.random.default_rng(0)
        resume = statistics.median(time_resume(work / "main", n, rng) for _ in range(9))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(summary(rounds, n, args.seq_len), loads, resume, args.seq_len, n)


if __name__ == "__main__":
    main()
