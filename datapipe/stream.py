"""Read packed samples back for training: `for sample in datapipe.stream("out/demo/main")`.

This first version reads shards in manifest order and splits samples across ranks
by striding (nanochat's start=rank, step=world_size), every rank getting the same
number of samples so that no rank waits on another at the end of an epoch.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from datapipe.schema import PackedSample
from datapipe.shards import read_manifest, read_shards


def stream(folder: str | Path, rank: int = 0, world_size: int = 1) -> Iterator[PackedSample]:
    """Yield the samples of one stage folder for `rank` of `world_size`."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world_size {world_size}")
    per_rank = read_manifest(folder)["samples"] // world_size  # the remainder is dropped so that ranks stay equal
    taken = 0
    for index, sample in enumerate(read_shards(folder)):
        if taken == per_rank:
            return
        if index % world_size == rank:
            taken += 1
            yield sample

