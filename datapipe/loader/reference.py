"""Read shards without the loader's machinery: a shard's samples in write order."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from datapipe.loader.decode import iter_samples
from datapipe.loader.positions import finish_sample
from datapipe.schema import PackedSample
from datapipe.shardformat import read_manifest


def read_shard(path: Path | str) -> Iterator[PackedSample]:
    """The samples of one shard, in write order (arrays are views of one buffer holding the shard).
    It walks the tar headers: a shard read on its own has no manifest to check an index against."""
    from datapipe.loader.fetch import read_local

    for sample in iter_samples(read_local(Path(path)), str(path)):
        yield finish_sample(sample)

def read_shards(folder: Path | str) -> Iterator[PackedSample]:
    """Every sample of a stage folder, in manifest order."""
    for shard in read_manifest(folder)["shards"]:
        yield from read_shard(Path(folder) / shard["name"])
