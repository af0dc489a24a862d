"""The shard writer: samples into WebDataset tar shards, an index beside each, and the manifest.

The layout is datapipe.shardformat's. Members carry fixed mtime, owner and mode, so the
same samples give byte-identical shards. Each json header is padded with spaces to fill its
last tar block, and up to the block count that the phase's samples have needed so far for
doc_lens and json together (stride_blocks): every text sample of a phase then takes the same
bytes, so the loader sees an array column as one strided 2-D view (datapipe.loader.batches).
Filling the block costs nothing (tar pads it anyway); the rest is capped at a quarter of a
sample's tokens and loss mask, so one odd sample with a huge header does not pad all after it.

A shard closes at `samples_per_shard` samples or, when set, once it holds `max_bytes`
(a target: the sample that crosses it stays, so no sample is ever split). It is written
under a temporary name, flushed (fsync) and renamed when complete, then its folder flushed
(datapipe.storage); then its index; `manifest.json` is
written last, atomically. A writer first removes the previous manifest, shards and
temporaries of its folder, so a crashed rewrite never leaves an old manifest beside new
shards. The index lets the loader find every member without walking tar headers (14 us
of Python a sample at 8K tokens).
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import mmap
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from datapipe.schema import PackedSample
from datapipe.shardformat import (
    FORMAT,
    INDEX_FORMAT,
    INDEX_SUFFIX,
    MANIFEST,
    RUN_FORMAT,
    RUN_MANIFEST,
    index_part,
    sample_digest,
)
from datapipe.storage import Store, space_named


class ShardWriter:
    """Writes samples into <prefix>000000.tar, <prefix>000001.tar, ... of a phase folder (a path or a
    Store: local or remote). With `info` it is the folder's only writer: it clears the folder first
    and writes the manifest on close. Without, it writes one group's shards among others' (prefix
    shard-GGGGG-) and close() returns their manifest entries, which the run assembles."""

    def __init__(self, folder: Path | str | Store, samples_per_shard: int, info: dict[str, Any] | None = None,
                 max_bytes: int | None = None, prefix: str = "shard-"):
        self.store = folder if isinstance(folder, Store) else Store(folder)
        self.samples_per_shard, self.info, self.max_bytes, self.prefix = samples_per_shard, info, max_bytes, prefix
        self.staging = self.store.local() or Path(tempfile.mkdtemp(prefix="datapipe-shards-"))  # where tars are made
        self.staging.mkdir(parents=True, exist_ok=True)
        if info is not None:
            remove_previous_output(self.store)
        self.shards: list[dict[str, Any]] = []
        self.tar: tarfile.TarFile | None = None
        self.current: dict[str, Any] = {}
        self.index: dict[str, Any] = {}  # the open shard's keys and member places (write_index)
        self.result: dict[str, Any] | list[dict[str, Any]] | None = None
        self.stride_blocks = 0  # tar blocks of doc_lens and json together that samples are padded to

    def write(self, sample: PackedSample) -> None:
        with space_named(self.staging / f".{self.current.get('name', self.prefix)}.tmp", sample_bytes(sample)):
            self.add_sample(sample)  # a full disk names the shard and the sample's bytes (the CLI exits 3)

    def add_sample(self, sample: PackedSample) -> None:
        if self.tar is None:
            self.open_shard()
        self.index["keys"].append(sample["key"])
        self.index["bounds"].append(self.tar.offset)  # where the sample's first tar header goes
        self.add_array(sample["key"], "tokens.npy", sample["tokens"])
        self.add_array(sample["key"], "doc_lens.npy", sample["doc_lens"])
        if "loss_mask" in sample:
            self.add_array(sample["key"], "loss_mask.npy", sample["loss_mask"])
        fields = {"doc_ids": sample["doc_ids"], "seq_len": sample["seq_len"], "num_pad": sample["num_pad"],
                  "doc_offsets": sample.get("doc_offsets", [0] * len(sample["doc_ids"])),
                  "media_spans": sample.get("media_spans", [])}
        self.add(sample["key"], "json", self.padded_header(json.dumps(fields, sort_keys=True).encode(), sample))
        for i, image in enumerate(sample.get("images", [])):
            self.add(sample["key"], f"{i}.png", image)
        self.current["samples"] += 1
        self.current["tokens"] += sample["seq_len"] - sample["num_pad"]
        if self.current["samples"] >= self.samples_per_shard or self.tar.offset >= (self.max_bytes or 1 << 62):
            self.close_shard()

    def padded_header(self, header: bytes, sample: PackedSample) -> bytes:
        """The json header with trailing spaces up to the blocks it and doc_lens share with the
        phase's other samples (see the module docstring)."""
        lens_blocks = blocks(self.index["members"]["doc_lens.npy"][2][-1])
        needed = lens_blocks + blocks(len(header))
        fixed = np.asarray(sample["tokens"]).nbytes + np.asarray(sample.get("loss_mask", [])).nbytes
        if needed > self.stride_blocks and needed * tarfile.BLOCKSIZE * 4 <= fixed:
            self.stride_blocks = needed
        size = max(needed, self.stride_blocks) - lens_blocks
        return header.ljust(size * tarfile.BLOCKSIZE, b" ")

    def add(self, key: str, suffix: str, data: bytes) -> None:
        """One member, and its place in the shard's index (tarfile pads the data to the next block)."""
        add_member(self.tar, f"{key}.{suffix}", data)
        numbers, offsets, sizes = self.index["members"].setdefault(suffix, ([], [], []))
        numbers.append(self.current["samples"])
        offsets.append(self.tar.offset - blocks(len(data)) * tarfile.BLOCKSIZE)
        sizes.append(len(data))

    def add_array(self, key: str, suffix: str, array: np.ndarray) -> None:
        """An .npy member; the index keeps its column's layout (dtype, header bytes) while every
        member of the shard has the same one and is 1-D, so the loader needs no header of it."""
        array = np.ascontiguousarray(array)
        data = npy_bytes(array)
        self.add(key, suffix, data)
        layout = {"dtype": array.dtype.str, "header": len(data) - array.nbytes}
        if self.index["arrays"].setdefault(suffix, layout) != layout or array.ndim != 1:
            self.index["arrays"][suffix] = None

    def open_shard(self) -> None:
        name = f"{self.prefix}{len(self.shards):06d}.tar"
        self.current = {"name": name, "samples": 0, "tokens": 0}
        self.index = {"keys": [], "members": {}, "arrays": {}, "bounds": []}
        self.tar = tarfile.open(self.staging / f".{name}.tmp", "w", format=tarfile.USTAR_FORMAT)

    def close_shard(self) -> None:
        self.index["bounds"].append(self.tar.offset)  # the last sample's end, before the end-of-archive blocks
        with space_named(self.staging / f".{self.current['name']}.tmp", 2 * tarfile.RECORDSIZE):
            self.tar.close()  # flushes the last blocks and the end-of-archive record
        self.tar = None
        temporary = self.staging / f".{self.current['name']}.tmp"
        self.current.update(bytes=temporary.stat().st_size, sha256=file_sha256(temporary))
        self.index["digests"] = sample_digests(temporary, self.index["bounds"])
        self.store.put(temporary, self.current["name"])
        self.current["index"] = write_index(self.store, self.current, self.index)
        self.shards.append(self.current)

    def close(self) -> dict[str, Any] | list[dict[str, Any]]:
        """The manifest (with `info`), else the shards' manifest entries."""
        if self.result is not None:
            return self.result
        if self.tar is not None:
            self.close_shard()
        if self.staging != self.store.local():
            shutil.rmtree(self.staging, ignore_errors=True)
        self.result = self.shards if self.info is None else write_manifest(self.store, self.info, self.shards)
        return self.result

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, kind: type | None, *exc: object) -> None:
        try:
            if kind is None:
                self.close()
        finally:
            if self.tar is not None:  # a failed write or close: the partial shard goes, never a finished shard
                with contextlib.suppress(OSError):  # a full disk fails the close's flush too
                    self.tar.close()
                (self.staging / f".{self.current['name']}.tmp").unlink(missing_ok=True)


def write_manifest(store: Store, info: dict[str, Any], shards: list[dict[str, Any]]) -> dict[str, Any]:
    """The phase folder's manifest.json, written last: from then on the folder is finished."""
    manifest = {"format": FORMAT, **info, "shards": shards, "samples": sum(s["samples"] for s in shards),
                "tokens": sum(s["tokens"] for s in shards)}
    store.write_bytes(MANIFEST, json.dumps(manifest, indent=2).encode())
    return manifest


def write_index(store: Store, shard: dict[str, Any], index: dict[str, Any]) -> dict[str, Any]:
    """`shard-N.index.json` beside the shard: its samples' keys and, per member suffix, the sample
    numbers, data offsets and sizes, so the loader never walks tar headers (datapipe.loader.shardindex),
    and the layout of each .npy column whose members share one, so it reads none of their headers.
    It names the shard's size and sha256, so it never passes for another shard's; returns its
    manifest entry."""
    name = shard["name"].removesuffix(".tar") + INDEX_SUFFIX
    arrays = {suffix: layout for suffix, layout in index["arrays"].items() if layout is not None}
    members = {suffix: [index_part(part) for part in column] for suffix, column in index["members"].items()}
    data = json.dumps({"format": INDEX_FORMAT, "shard": shard["name"], "bytes": shard["bytes"], "sha256": shard["sha256"],
                       "keys": index["keys"], "members": members, "arrays": arrays,
                       "bounds": index_part(index["bounds"]), "digests": index["digests"]},
                      separators=(",", ":")).encode()
    store.write_bytes(name, data)
    return {"name": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def remove_previous_output(store: Store) -> None:
    """The manifest goes first: from then on the folder reads as unfinished until close()."""
    store.remove(MANIFEST)
    for name in store.list():
        if name.startswith("shard-") and (name.endswith(".tar") or name.endswith(INDEX_SUFFIX)):
            store.remove(name)
    local = store.local()
    for stale in [*local.glob(".shard-*.tmp")] if local else []:
        stale.unlink()


def write_run_manifest(out: Path | str | Store, phases: list[dict[str, Any]], info: dict[str, Any]) -> dict[str, Any]:
    """out/run.json, written after every phase's manifest: the curriculum the loader follows.

    Each phase entry is {"name": folder name under out/, "token_budget": tokens to train on
    before moving to the next phase, or None for one pass over the phase's shards}."""
    entries = [{**phase, "token_budget": phase.get("token_budget")} for phase in phases]
    manifest = {"format": RUN_FORMAT, **info, "phases": entries}
    store = out if isinstance(out, Store) else Store(out)
    store.write_bytes(RUN_MANIFEST, json.dumps(manifest, indent=2).encode())
    return manifest


def sample_bytes(sample: PackedSample) -> int:
    """A sample's payload bytes (tokens, arrays and images; tar headers aside)."""
    arrays = sum(np.asarray(sample[key]).nbytes for key in ("tokens", "doc_lens", "loss_mask") if key in sample)
    return arrays + sum(len(image) for image in sample.get("images", []))


def blocks(size: int) -> int:
    return -(-size // tarfile.BLOCKSIZE)


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    tar.addfile(info, io.BytesIO(data))


def sample_digests(path: Path, bounds: list[int]) -> str:
    """Each sample's digest (bytes bounds[i] to bounds[i+1] of the shard) as 16 hex digits, one after another."""
    with open(path, "rb") as stream, mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as mapping:
        view = memoryview(mapping)
        try:
            return "".join(f"{sample_digest(view[lo:hi]):016x}" for lo, hi in zip(bounds, bounds[1:]))
        finally:
            view.release()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
