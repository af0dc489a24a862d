"""The plain reference decoder: what a sample is, in a few dozen lines of `tarfile`, numpy and json.

read_shard walks the tar as WebDataset does: regular members in archive order, grouped by
key (the file name up to its first dot) while the key stays the same; each member decodes
by shardformat.member_kind (.npy an array, .json fields merged into the sample, images
their bytes under "images" in index order, anything else raw bytes under its suffix).
Then the fields a shard does not store: "images" and "media_spans" empty where absent,
and position_ids derived from doc_lens (shardformat.derive_position_ids) for the sample's
seq_len (its tokens' length without a json header).

It is the spec, not the loader: `tarfile` plus `np.load` per member costs 100+ us a sample
at 8K tokens, where datapipe.stream's fast paths (datapipe.loader.decode, batches,
positions) build the same samples in a few, and tests/test_reference.py checks them equal
to this one, sample for sample. A member that does not decode raises here.
"""
from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterable, Iterator
from itertools import groupby
from pathlib import Path
from typing import Any

import numpy as np

from datapipe.schema import PackedSample
from datapipe.shardformat import derive_position_ids, member_field, member_kind, read_manifest


def read_shard(path: Path | str, fields: Iterable[str] | None = None) -> Iterator[PackedSample]:
    """The samples of one tar shard, in archive order; with `fields`, of those members only
    (named as the loader's fields= option names them: shardformat.member_field)."""
    with tarfile.open(path, "r:") as tar:
        members = ((member, *member_key(member.name)) for member in tar if member.isreg())
        for key, group in groupby(members, key=lambda item: item[1]):
            data: dict[str, bytes] = {}
            for member, _, suffix in group:
                if suffix in data:
                    raise ValueError(f"{path}: sample {key} has two {suffix} members")
                data[suffix] = tar.extractfile(member).read()
            yield finish(decode_sample(key, {suffix: value for suffix, value in data.items()
                                             if fields is None or member_field(suffix) in fields}))


def read_shards(folder: Path | str, fields: Iterable[str] | None = None) -> Iterator[PackedSample]:
    """Every sample of a phase folder, shard after shard in manifest order."""
    for shard in read_manifest(folder)["shards"]:
        yield from read_shard(Path(folder) / shard["name"], fields)


def member_key(name: str) -> tuple[str, str]:
    """(sample key, member suffix) of a member name: its file name split at the first dot."""
    key, _, suffix = name.rpartition("/")[2].partition(".")
    return key, suffix


def decode_sample(key: str, members: dict[str, bytes]) -> dict[str, Any]:
    """A sample from its members' bytes, by suffix; a json header's fields must be new to it."""
    sample: dict[str, Any] = {"key": key, "images": []}
    header: Any = {}
    for suffix, data in members.items():
        kind, name = member_kind(suffix)
        if kind == "npy":
            sample[name] = np.load(io.BytesIO(data), allow_pickle=False)
        elif kind == "json":
            header = json.loads(data)
        elif kind == "image":
            sample["images"].append((int(name) if name.isdigit() else len(sample["images"]), data))
        else:
            sample[name] = data
    sample["images"] = [data for _, data in sorted(sample["images"], key=lambda image: image[0])]
    if not isinstance(header, dict) or header.get("key", key) != key or (header.keys() - {"key"}) & sample.keys():
        raise ValueError(f"sample {key}: its json member is no object, or its fields shadow the sample's own")
    sample.update(header)
    return sample


def finish(sample: dict[str, Any]) -> PackedSample:
    """The fields a shard does not store: media_spans (empty for text) and position_ids."""
    sample.setdefault("media_spans", [])
    seq_len = sample["seq_len"] if "seq_len" in sample else len(sample["tokens"]) if "tokens" in sample else None
    if "doc_lens" in sample and seq_len is not None:
        lens = sample["doc_lens"]
        if type(seq_len) is not int or lens.ndim != 1 or lens.dtype.kind not in "iu" or \
                lens.min(initial=0) < 0 or int(lens.sum(dtype=np.int64)) > seq_len:
            raise ValueError(f"sample {sample['key']}: doc_lens {lens.tolist()} are not pieces of seq_len {seq_len!r}")
        sample["position_ids"] = derive_position_ids(lens, seq_len)
    return sample
