"""The shard format: the contract between the writer (datapipe.packing.writer) and the loader (datapipe.loader).

Neither side imports the other; both import this module.

A phase folder holds WebDataset tar shards (`shard-00000-000000.tar`, ...: a run's pack group,
then the shard's number; a ShardWriter on its own writes `shard-000000.tar`) and `manifest.json`
(FORMAT: every shard's name, samples, tokens with padding excluded, bytes and sha256, plus
the recipe, seed, phase name and seq_len), written last: a folder without a manifest is
unfinished. A run folder holds one phase folder per curriculum phase and, written last,
`run.json` (RUN_FORMAT: the phases in training order with their token budgets).

A sample is the tar members sharing a key (the file name up to its first dot, as in
WebDataset): `<key>.tokens.npy` (uint32, seq_len), `<key>.doc_lens.npy` (int32: the
document pieces, summing to seq_len - num_pad), `<key>.loss_mask.npy` (uint8, seq_len),
`<key>.json` (doc_ids, doc_offsets, seq_len, num_pad, media_spans; padded with spaces,
which JSON ignores) and one `<key>.<i>.png` per media span, in span order. A member
decodes by its last extension (member_kind): .npy an array named by the middle of the
name, .json fields merged into the sample, images their bytes under "images" in index
order, anything else raw bytes under its suffix. Position ids are not stored: they are
derive_position_ids(doc_lens, seq_len), 0, 1, ... restarting at each piece, the padding
one more piece.

Beside each shard, `shard-N.index.json` (INDEX_FORMAT, listed in the manifest with its
size and sha256) holds the keys of its samples and, per member suffix, their sample
numbers, data offsets and sizes (a list, or a progression {start, step, count}:
index_part), and the dtype and header size of each .npy column of one layout. It names
the shard's size and sha256, so it never passes for another version of the shard. Other
readers never open it: the tars stay plain WebDataset. Since the writer of this version it
also holds every sample's byte range ("bounds": samples + 1 offsets, a sample's members
lying together from its first tar header to its last member's padding) and its digest
("digests": sample_digest of those bytes, 16 hex digits a sample, one string), which the
loader checks as it reads each sample: a flipped bit fails its sample, at xxh3's pace (tens
of GB/s of one core, with the GIL released) where a shard's sha256 runs at about 1.5.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

MANIFEST = "manifest.json"  # a phase folder's; RUN_MANIFEST is the run folder's

RUN_MANIFEST = "run.json"

FORMAT = "datapipe-shards/2"  # 2: the phase's name under "phase" (1: "stage")

RUN_FORMAT = "datapipe-run/2"  # 2: the curriculum under "phases" (1: "stages")

INDEX_SUFFIX = ".index.json"
INDEX_FORMAT = "datapipe-index/2"  # 2: a column's list may be a progression (index_part); 1 is read as well

READABLE_FORMATS = ("datapipe-index/1", INDEX_FORMAT)
IMAGE_SUFFIXES = ("png", "jpg", "jpeg", "webp", "gif", "bmp", "tif", "tiff")


def sample_digest(data) -> int:
    """A sample's digest as the index keeps it: xxh3 (64 bits) of its bytes in the shard."""
    return digest_function()(data)


@lru_cache(maxsize=1)
def digest_function():
    """sample_digest's hash itself, for callers that hash thousands of samples in a loop."""
    import xxhash

    return xxhash.xxh3_64_intdigest


def run_phases(run: dict[str, Any]) -> list[dict[str, Any]]:
    """A run manifest's phases in training order: {"name", "token_budget"} each (format 1 said "stages")."""
    return run["phases"] if "phases" in run else run["stages"]


def phase_name(manifest: dict[str, Any], folder: str) -> str:
    """A phase manifest's phase name (format 1 said "stage"), else its folder's name."""
    return manifest.get("phase") or manifest.get("stage") or folder.rstrip("/").rsplit("/", 1)[-1]


def read_manifest(folder: Path | str) -> dict[str, Any]:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no manifest; is {folder} a phase folder written by `datapipe run`? "
                                "(a run that did not finish has shards but no manifest)")
    return json.loads(path.read_text())

def derive_position_ids(doc_lens: np.ndarray, seq_len: int) -> np.ndarray:
    """int32 positions restarting at 0 for each document piece; padding counts as one more piece.
    int32 throughout with a cached arange (3x faster than int64 and a fresh arange, which the
    loader feels: it derives them for every sample it yields)."""
    lens = np.asarray(doc_lens, dtype=np.int32)
    used = int(lens.sum())
    if used < seq_len:  # the padding counts as one more piece
        lens = np.append(lens, np.int32(seq_len - used))
    return int32_range(seq_len) - np.repeat(np.cumsum(lens, dtype=np.int32) - lens, lens)

@lru_cache(maxsize=64)
def int32_range(n: int) -> np.ndarray:
    positions = np.arange(n, dtype=np.int32)
    positions.flags.writeable = False  # shared by every call: nobody may write into it
    return positions

def index_part(values: list[int]) -> list[int] | dict[str, int]:
    """A column's numbers, offsets or sizes as the index stores them: an arithmetic progression
    (every sample's member at one stride, as ShardWriter lays text samples) as {start, step,
    count}, read in microseconds where a list costs ~25 ns an item to parse; any other as a list."""
    if len(values) > 2 and len({b - a for a, b in zip(values, values[1:])}) == 1:
        return {"start": values[0], "step": values[1] - values[0], "count": len(values)}
    return values

@lru_cache(maxsize=1024)
def member_kind(suffix: str) -> tuple[str, str]:
    """("npy", array name) | ("json", "") | ("image", index) | ("bytes", suffix), by the last extension."""
    stem, _, extension = suffix.rpartition(".")
    if extension == "npy":
        return "npy", stem
    if extension == "json":
        return "json", ""
    if extension in IMAGE_SUFFIXES:
        return "image", stem
    return "bytes", suffix

def member_field(suffix: str) -> str:
    """The sample field a member fills, as the loader's `fields` option names it: an array's name
    ("tokens" for k.tokens.npy), "json" for the header whose fields merge into the sample,
    "images" for k.0.png..., a raw member's suffix."""
    kind, name = member_kind(suffix)
    return {"npy": name, "json": "json", "image": "images"}.get(kind, suffix)
