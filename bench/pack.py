"""bench pack: our best-fit decreasing packer against concat-and-chunk and first-fit, same lengths, same run.

Two length mixes, as K3's curriculum sees them:
  pretrain  2M documents, lognormal around 2K tokens (sigma 1.1) plus a 0.2% log-uniform tail from 32K to 1M;
  cooldown  200K documents, lognormal around 64K tokens (sigma 1.0), long-heavy, up to 1M;
each packed into 8K, 64K, 256K and 1M sequences by:
  ours          datapipe.packing.bfd: split only documents longer than seq_len, then best-fit decreasing
                over the whole phase (numba, 64-ary bit tree over remaining room), pieces grouped per sequence;
  first-fit     the same pieces in arrival order, each into the first open sequence with room (numba,
                max segment tree over sequences: O(log n), far faster than the O(n * sequences) loops
                that ship in some trainers, so the ratio is algorithmic, not Python against numba);
  concat-chunk  every document end to end, cut every seq_len tokens (numpy): full sequences, but a
                document that crosses a cut is split.
Measured: fill (tokens / (sequences * seq_len)), documents split, documents/s (median wall time of
REPEATS runs; the machine is shared, so the median and CPU-seconds are printed too). Packing plans
lengths, not tokens: copying tokens into samples costs the same whatever the plan, and is left out.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from datapipe.packing.bfd import pack_pieces, split_pieces

REPEATS = 3
SEQ_LENS = {"8k": 8192, "64k": 65536, "256k": 262144, "1m": 1048576}
MAX_LEN = 1 << 20


def pretrain_lengths(rng: np.random.Generator, n: int = 2_000_000) -> np.ndarray:
    body = rng.lognormal(np.log(2048), 1.1, n)
    tail = rng.random(n) < 0.002
    body[tail] = np.exp(rng.uniform(np.log(32768), np.log(MAX_LEN), int(tail.sum())))
    return np.clip(body, 16, MAX_LEN).astype(np.int64)


def cooldown_lengths(rng: np.random.Generator, n: int = 200_000) -> np.ndarray:
    return np.clip(rng.lognormal(np.log(65536), 1.0, n), 256, MAX_LEN).astype(np.int64)


def pack_ours(lengths: np.ndarray, seq_len: int) -> dict:
    sequences = pack_pieces(split_pieces(np.arange(len(lengths)), lengths, seq_len), seq_len)
    return {"sequences": sequences.num_sequences, "split": int((lengths > seq_len).sum())}


def pack_first_fit(lengths: np.ndarray, seq_len: int) -> dict:
    pieces = split_pieces(np.arange(len(lengths)), lengths, seq_len)
    bins = np.empty(len(pieces.length), dtype=np.int64)
    return {"sequences": int(first_fit_loop(pieces.length, seq_len, bins)), "split": int((lengths > seq_len).sum())}


def pack_concat_chunk(lengths: np.ndarray, seq_len: int) -> dict:
    ends = np.cumsum(lengths)
    starts = ends - lengths
    split = int((starts // seq_len != (ends - 1) // seq_len).sum())
    return {"sequences": int(-(-int(ends[-1]) // seq_len)), "split": split}


@njit(cache=True)
def first_fit_loop(lengths, capacity, bins):
    """First-fit in arrival order: leaves are sequences (unopened ones have full room), nodes hold max room."""
    size = 1
    while size < len(lengths):
        size *= 2
    tree = np.full(2 * size, capacity, np.int64)
    used = 0
    for i in range(len(lengths)):
        need, node = lengths[i], 1
        while node < size:
            node = 2 * node if tree[2 * node] >= need else 2 * node + 1
        bins[i] = node - size
        used = max(used, node - size + 1)
        tree[node] -= need
        node //= 2
        while node >= 1:
            tree[node] = max(tree[2 * node], tree[2 * node + 1])
            node //= 2
    return used


PACKERS = {"ours": pack_ours, "first_fit": pack_first_fit, "concat_chunk": pack_concat_chunk}


def measure(packer, lengths: np.ndarray, seq_len: int) -> dict:
    walls, cpus = [], []
    for _ in range(REPEATS):
        wall, cpu = time.perf_counter(), time.process_time()
        result = packer(lengths, seq_len)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    fill = int(lengths.sum()) / (result["sequences"] * seq_len)
    return {**result, "fill": fill, "docs_per_s": len(lengths) / statistics.median(walls),
            "docs_per_cpu_s": len(lengths) / statistics.median(cpus)}


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # no options: --help answers instead of starting the run
    rng = np.random.default_rng(0)
    mixes = {"pretrain": pretrain_lengths(rng), "cooldown": cooldown_lengths(rng)}
    for packer in PACKERS.values():  # compile (or load numba's cache) outside the timings
        packer(mixes["pretrain"][:1000], 8192)
    results = {}
    print(f"{'mix':9} {'seq':>5} {'packer':13} {'sequences':>10} {'fill %':>8} {'docs split':>10} "
          f"{'docs/s':>11} {'docs/cpu-s':>11}")
    for mix, lengths in mixes.items():
        for tag, seq_len in SEQ_LENS.items():
            for name, packer in PACKERS.items():
                r = results[mix, tag, name] = measure(packer, lengths, seq_len)
                print(f"{mix:9} {tag:>5} {name:13} {r['sequences']:>10,} {100 * r['fill']:>8.3f} {r['split']:>10,} "
                      f"{r['docs_per_s']:>11,.0f} {r['docs_per_cpu_s']:>11,.0f}", flush=True)
    print(summary(results, mixes))


def summary(results: dict, mixes: dict) -> str:
    """The one summary line: worst fill per length over both mixes, speed and splits at 8K on the pretrain mix."""
    parts = [f"fill_{tag}={100 * min(results[mix, tag, 'ours']['fill'] for mix in mixes):.3f}" for tag in SEQ_LENS]
    ours, first_fit, chunk = (results["pretrain", "8k", name] for name in PACKERS)
    parts += [f"docs_per_s_8k={ours['docs_per_s']:.3g}", f"docs_per_cpu_s_8k={ours['docs_per_cpu_s']:.3g}",
              f"x_vs_first_fit={ours['docs_per_s'] / first_fit['docs_per_s']:.2f}",
              f"fill_first_fit_8k={100 * first_fit['fill']:.3f}",
              f"split_8k={ours['split']}", f"split_concat_chunk_8k={chunk['split']}",
              f"x_fewer_splits_vs_concat_chunk_8k={chunk['split'] / max(ours['split'], 1):.2f}",
              f"x_fewer_splits_vs_concat_chunk_min={min_split_ratio(results, mixes):.2f}"]
    return "bench pack: " + " ".join(parts)


def min_split_ratio(results: dict, mixes: dict) -> float:
    """Over every mix and length: concat-and-chunk's split documents / ours (ours split only what cannot fit)."""
    return min(results[mix, tag, "concat_chunk"]["split"] / max(results[mix, tag, "ours"]["split"], 1)
               for mix in mixes for tag in SEQ_LENS)


if __name__ == "__main__":
    main()
