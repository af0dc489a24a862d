"""Loader throughput: datapipe.stream against `cat`, webdataset and MosaicML streaming, on the same samples.

    make bench-deps   # once: webdataset's and MosaicML streaming's peers
    .venv/bin/python bench/stream.py [--seq-len 8192] [--samples 8192] [--per-shard 1024] [--repeats 5] [--no-gc-freeze]

Writes packed samples (lognormal document lengths, as the packer makes them) with our
ShardWriter, converts the same samples to MDS for MosaicML streaming, warms the page
cache, then times in rounds, the loaders in turn: a raw sequential read of the stage's
files (`cat` of the shards and their index files into /dev/null: the bytes our loader
reads, from the same warm page cache), our loader, `webdataset.WebDataset(...).decode()`,
and `streaming.StreamingDataset`. Every loader hands out token arrays already in memory
(ours maps a shard the page cache holds, or reads it whole with one copy as `cat` does;
the others copy per sample); the consumer gathers them into batches of 8 and reads one
token of each. "ours" decodes the same members the peers do (position_ids=False);
"ours_positions" also derives position_ids, the loader's default; "ours_batched" hands out
batches of 8 (batch_size=8: [8, seq_len] views of the mapped shard, datapipe.loader.batches), the
same members; "ours_batched_arrays" the same batches of the array members only (fields=
tokens, loss_mask, doc_lens: what a trainer feeds its model; no json header, so no doc ids);
"ours_walk" reads the same stage as shards of another
writer would come (no index files: it walks the tar headers). "raw_cold" and "ours_cold"
read the same files from disk: the page cache is dropped for them (posix_fadvise
DONTNEED) before each run, as a trainer whose data outgrows its memory reads them.
tokens/s counts every position (seq_len per sample). Then resume: a fresh shuffled loader restores a state at a
random position and yields its next sample.
Before the rounds the objects made so far are frozen out of the garbage collector (gc.freeze),
as a trainer keeps collection off its hot loop; --no-gc-freeze leaves it on.
Medians over the rounds; the machine is shared, so compare the ratios.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from datapipe.loader.reference import read_shards
from datapipe.loader.stream import stream
from datapipe.packing.writer import ShardWriter
from datapipe.shardformat import read_manifest

BATCH = 8
ARRAYS = ("tokens", "loss_mask", "doc_lens")  # what a trainer feeds the model: no json header (doc ids)


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
    with ShardWriter(folder, per_shard, {"stage": "main", "seq_len": len(samples[0]["tokens"])}) as writer:
        for sample in samples:
            writer.write(sample)


def without_index(stage: Path, folder: Path) -> Path:
    """The same shard files (hard links) under a manifest that lists no index files."""
    folder.mkdir()
    manifest = read_manifest(stage)
    for shard in manifest["shards"]:
        os.link(stage / shard["name"], folder / shard["name"])
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


def write_mds(folder: Path, stage: Path, seq_len: int, per_shard_bytes: int) -> None:
    streaming = import_streaming()
    columns = {"tokens": f"ndarray:uint32:{seq_len}", "doc_lens": "ndarray:int32",
               "loss_mask": f"ndarray:uint8:{seq_len}", "json": "json"}
    fields = ("doc_ids", "doc_offsets", "seq_len", "num_pad", "media_spans")
    with streaming.MDSWriter(out=str(folder), columns=columns, size_limit=per_shard_bytes) as writer:
        for s in read_shards(stage):
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


def drop_from_page_cache(paths: list[str]) -> None:
    """The next read of these files comes from disk (a no-op on a file system in memory, such as tmpfs)."""
    for path in paths:
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)  # the kernel drops clean pages only
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


def cold(run, paths: list[str]):
    """`run` timed after the files it reads are dropped from the page cache."""
    def timed() -> float:
        drop_from_page_cache(paths)
        return run()
    return timed


def time_raw(paths: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(["cat", *paths], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def time_loader(make, key: str, seq_len: int, expected: int, eat=consume) -> float:
    start = time.perf_counter()
    count = eat(make(), key, seq_len)
    elapsed = time.perf_counter() - start
    if count != expected:
        raise RuntimeError(f"a loader yielded {count} samples, expected {expected}")
    return elapsed


def time_resume(stage: Path, samples: int, rng: np.random.Generator) -> float:
    position = int(rng.integers(samples))
    state = {**stream(stage, shuffle=True, seed=1).state_dict(), "epoch": int(rng.integers(100)), "position": position}
    start = time.perf_counter()
    loader = stream(stage, shuffle=True, seed=1)
    loader.load_state_dict(state)
    next(iter(loader))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--per-shard", type=int, default=1024, help="samples a shard (datapipe run's default: 1024)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-gc-freeze", action="store_true", help="leave Python's garbage collector as it is")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    stage, seq_len = work / "main", args.seq_len
    write_ours(stage, make_samples(seq_len, args.samples), args.per_shard)
    manifest = read_manifest(stage)
    paths = [str(stage / shard["name"]) for shard in manifest["shards"]]
    indexes = [str(stage / shard["index"]["name"]) for shard in manifest["shards"]]
    walk = without_index(stage, work / "walk")
    write_mds(work / "mds", stage, seq_len, manifest["shards"][0]["bytes"])
    streaming = import_streaming()
    n, total_bytes = manifest["samples"], sum(os.path.getsize(path) for path in paths + indexes)
    print(f"{n} samples x {seq_len} tokens in {len(paths)} shards; raw and ours read the same "
          f"{total_bytes / 2**20:.1f} MiB (shards and index files) from a warm page cache", file=sys.stderr)

    import webdataset as wds

    stage_files = [*paths, *indexes, str(stage / "manifest.json")]
    loaders = {
        "raw": lambda: time_raw(paths + indexes),
        "raw_cold": cold(lambda: time_raw(paths + indexes), stage_files),
        "ours_cold": cold(lambda: time_loader(lambda: stream(stage, position_ids=False), "tokens", seq_len, n),
                          stage_files),
        "ours": lambda: time_loader(lambda: stream(stage, position_ids=False), "tokens", seq_len, n),
        "ours_positions": lambda: time_loader(lambda: stream(stage), "tokens", seq_len, n),
        "ours_shuffled": lambda: time_loader(lambda: stream(stage, shuffle=True, seed=0, position_ids=False),
                                             "tokens", seq_len, n),
        "ours_batched": lambda: time_loader(lambda: stream(stage, position_ids=False, batch_size=BATCH), "tokens",
                                            seq_len, n, consume_batches),
        "ours_batched_arrays": lambda: time_loader(lambda: stream(stage, position_ids=False, batch_size=BATCH,
                                                                  fields=ARRAYS), "tokens", seq_len, n, consume_batches),
        "ours_walk": lambda: time_loader(lambda: stream(walk, position_ids=False), "tokens", seq_len, n),
        "webdataset": lambda: time_loader(lambda: wds.WebDataset(paths, shardshuffle=False).decode(), "tokens.npy",
                                          seq_len, n),
        "streaming": lambda: time_loader(lambda: streaming.StreamingDataset(local=str(work / "mds"), batch_size=BATCH),
                                         "tokens", seq_len, n),
    }
    # As a trainer does once its imports and model are built (torchtitan turns automatic collection off
    # and collects every N steps): without it, the Python objects a loader makes trigger full collections
    # over everything imported (torch, via streaming), which cost our per-sample loader 2.5x (0.15 of `cat`
    # against 0.39) and the peers 10%. --no-gc-freeze measures that case.
    if not args.no_gc_freeze:
        gc.collect()
        gc.freeze()
    for run in loaders.values():  # warm the page cache and each reader: every one then reads from memory
        run()
    times = {name: [] for name in loaders}
    for _ in range(args.repeats):
        for name, run in loaders.items():
            times[name].append(run())
    rates = {name: n * seq_len / statistics.median(values) for name, values in times.items()}
    for name, rate in rates.items():
        print(f"{name:>14}: {rate / 1e6:8.1f} M tokens/s  (runs: {', '.join(f'{t:.3f}s' for t in times[name])})",
              file=sys.stderr)
    rng = np.random.default_rng(0)
    resume = statistics.median(time_resume(stage, n, rng) for _ in range(9))
    print(f"bench stream: tokens_per_s={rates['ours']:.3g} raw_tokens_per_s={rates['raw']:.3g} "
          f"x_vs_webdataset={rates['ours'] / rates['webdataset']:.2f} "
          f"x_vs_streaming={rates['ours'] / rates['streaming']:.2f} frac_of_raw={rates['ours'] / rates['raw']:.2f} "
          f"shuffled_frac_of_raw={rates['ours_shuffled'] / rates['raw']:.2f} "
          f"positions_frac_of_raw={rates['ours_positions'] / rates['raw']:.2f} "
          f"walk_frac_of_raw={rates['ours_walk'] / rates['raw']:.2f} "
          f"cold_frac_of_raw={rates['ours_cold'] / rates['raw_cold']:.2f} "
          f"batched_frac_of_raw={rates['ours_batched'] / rates['raw']:.2f} "
          f"arrays_frac_of_raw={rates['ours_batched_arrays'] / rates['raw']:.2f} resume_s={resume:.3f} "
          f"seq_len={seq_len} samples={n}")


if __name__ == "__main__":
    main()
