"""WebDataset tar shards and their manifest.

A sample is tar members sharing a key: `<key>.tokens.npy` (uint32, seq_len),
`<key>.doc_lens.npy` (int32), `<key>.loss_mask.npy` (uint8, seq_len), `<key>.json`
(doc_ids, doc_offsets, seq_len, num_pad, media_spans) and one `<key>.<i>.png` per media span, in
span order. Position ids are not stored: read_shard derives them from doc_lens. Members
carry fixed mtime, owner and mode, so the same samples give byte-identical shards.
Each json header is padded with spaces (which JSON ignores) to fill its last tar block, and
up to the block count that the stage's samples have needed so far for doc_lens and json
together (stride_blocks): every text sample of a stage then takes the same bytes, so the
loader sees an array column as one strided 2-D view (datapipe.batches). Filling the block
costs nothing (tar pads it anyway); the rest is capped at a quarter of a sample's
tokens and loss mask, so one odd sample with a huge header does not pad all after it.
A shard closes at `samples_per_shard` samples or, when set, once it holds `max_bytes`
(a target: the sample that crosses it stays, so no sample is ever split). It is written
under a temporary name and renamed when complete, and `manifest.json` (every shard's
samples, tokens with padding excluded, bytes and sha256, plus the recipe and seed) is
written last, atomically: a folder without a manifest is an unfinished run, and a
writer first removes the previous manifest, shards and temporaries of its folder, so
a crashed rewrite never leaves an old manifest beside new shards.

Beside each shard, `shard-N.index.json` (written once the shard is complete, listed in
the manifest with its size and sha256) holds the keys of its samples and, per member
suffix, their sample numbers, data offsets and sizes: the loader finds every member
without walking tar headers (14 us of Python a sample at 8K tokens). It names the
shard's size and sha256, so it never passes for another version of the shard. The tars
stay plain WebDataset: the index is a separate file that other readers never open.

A run folder holds one stage folder per curriculum stage and, written last,
`run.json`: the stages in training order with their token budgets (RUN_MANIFEST below).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from datapipe.schema import PackedSample
from datapipe.shardindex import INDEX_FORMAT, ShardError, index_part
from datapipe.tarsamples import BadSample, iter_samples

MANIFEST = "manifest.json"
RUN_MANIFEST = "run.json"
FORMAT = "datapipe-shards/1"
RUN_FORMAT = "datapipe-run/1"
INDEX_SUFFIX = ".index.json"


class ShardWriter:
    """Writes samples into shard-000000.tar, shard-000001.tar, ... and the manifest on close."""

    def __init__(self, folder: Path, samples_per_shard: int, info: dict[str, Any], max_bytes: int | None = None):
        self.folder, self.samples_per_shard, self.info = Path(folder), samples_per_shard, info
        self.max_bytes = max_bytes
        self.folder.mkdir(parents=True, exist_ok=True)
        remove_previous_output(self.folder)
        self.shards: list[dict[str, Any]] = []
        self.tar: tarfile.TarFile | None = None
        self.current: dict[str, Any] = {}
        self.index: dict[str, Any] = {}  # the open shard's keys and member places (write_index)
        self.manifest: dict[str, Any] | None = None
        self.stride_blocks = 0  # tar blocks of doc_lens and json together that samples are padded to

    def write(self, sample: PackedSample) -> None:
        if self.tar is None:
            self.open_shard()
        self.index["keys"].append(sample["key"])
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
        stage's other samples (see the module docstring)."""
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
        name = f"shard-{len(self.shards):06d}.tar"
        self.current = {"name": name, "samples": 0, "tokens": 0}
        self.index = {"keys": [], "members": {}, "arrays": {}}
        self.tar = tarfile.open(self.folder / f".{name}.tmp", "w", format=tarfile.USTAR_FORMAT)

    def close_shard(self) -> None:
        self.tar.close()
        self.tar = None
        temporary, final = self.folder / f".{self.current['name']}.tmp", self.folder / self.current["name"]
        self.current.update(bytes=temporary.stat().st_size, sha256=file_sha256(temporary))
        os.replace(temporary, final)
        self.current["index"] = write_index(self.folder, self.current, self.index)
        self.shards.append(self.current)

    def close(self) -> dict[str, Any]:
        if self.manifest is not None:
            return self.manifest
        if self.tar is not None:
            self.close_shard()
        manifest = {"format": FORMAT, **self.info, "shards": self.shards}
        manifest["samples"] = sum(s["samples"] for s in self.shards)
        manifest["tokens"] = sum(s["tokens"] for s in self.shards)
        write_atomic(self.folder / MANIFEST, json.dumps(manifest, indent=2).encode())
        self.manifest = manifest
        return manifest

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        elif self.tar is not None:  # leave the partial shard as a .tmp, never as a finished shard
            self.tar.close()


def write_index(folder: Path, shard: dict[str, Any], index: dict[str, Any]) -> dict[str, Any]:
    """`shard-N.index.json` beside the shard: its samples' keys and, per member suffix, the sample
    numbers, data offsets and sizes, so the loader never walks tar headers (datapipe.shardindex),
    and the layout of each .npy column whose members share one, so it reads none of their headers.
    It names the shard's size and sha256, so it never passes for another shard's; returns its
    manifest entry."""
    name = shard["name"].removesuffix(".tar") + INDEX_SUFFIX
    arrays = {suffix: layout for suffix, layout in index["arrays"].items() if layout is not None}
    members = {suffix: [index_part(part) for part in column] for suffix, column in index["members"].items()}
    data = json.dumps({"format": INDEX_FORMAT, "shard": shard["name"], "bytes": shard["bytes"], "sha256": shard["sha256"],
                       "keys": index["keys"], "members": members, "arrays": arrays}, separators=(",", ":")).encode()
    write_atomic(folder / name, data)
    return {"name": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def remove_previous_output(folder: Path) -> None:
    """The manifest goes first: from then on the folder reads as unfinished until close()."""
    (folder / MANIFEST).unlink(missing_ok=True)
    for stale in [*folder.glob("shard-*.tar"), *folder.glob(".shard-*.tar.tmp"), *folder.glob(f"shard-*{INDEX_SUFFIX}"),
                  *folder.glob(f".shard-*{INDEX_SUFFIX}.tmp")]:
        stale.unlink()


def read_manifest(folder: Path | str) -> dict[str, Any]:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no manifest; is {folder} a stage folder written by `datapipe run`? "
                                "(a run that did not finish has shards but no manifest)")
    return json.loads(path.read_text())


def write_run_manifest(out: Path, stages: list[dict[str, Any]], info: dict[str, Any]) -> dict[str, Any]:
    """out/run.json, written after every stage's manifest: the curriculum the loader follows.

    Each stage entry is {"name": folder name under out/, "token_budget": tokens to train on
    before moving to the next stage, or None for one pass over the stage's shards}."""
    entries = [{**stage, "token_budget": stage.get("token_budget")} for stage in stages]
    manifest = {"format": RUN_FORMAT, **info, "stages": entries}
    write_atomic(Path(out) / RUN_MANIFEST, json.dumps(manifest, indent=2).encode())
    return manifest


def read_shard(path: Path | str) -> Iterator[PackedSample]:
    """The samples of one shard, in write order (arrays are views of one buffer holding the shard).
    It walks the tar headers: a shard read on its own has no manifest to check an index against."""
    from datapipe.fetch import read_local

    for sample in iter_samples(read_local(Path(path)), str(path)):
        yield finish_sample(sample)


def read_shards(folder: Path | str) -> Iterator[PackedSample]:
    """Every sample of a stage folder, in manifest order."""
    for shard in read_manifest(folder)["shards"]:
        yield from read_shard(Path(folder) / shard["name"])


def finish_sample(sample: dict[str, Any], with_positions: bool = True) -> PackedSample:
    """The fields a shard does not store: an images list (empty for text), media_spans, and the
    position ids that doc_lens imply. The decoder (datapipe.tarsamples) put images in span order."""
    sample.setdefault("images", [])
    sample.setdefault("media_spans", [])
    seq_len = sequence_length(sample) if with_positions and "doc_lens" in sample else None
    if seq_len is not None:
        sample["position_ids"] = derive_position_ids(sample["doc_lens"], seq_len)
    return sample


def finish_samples(samples: list, with_positions: bool = True, buffers: Any = None,
                   positions: np.ndarray | None = None, shard: str = "a shard") -> None:
    """finish_sample for a list of decoded samples (other items in it are left alone). Position
    ids: row i of `positions` (span_positions') for samples[i] when every sample's seq_len is its
    width, otherwise all derived here at once (add_position_ids), into memory from `buffers` (a
    datapipe.fetch.BufferPool) when given. A sample whose doc_lens cannot be its pieces (damage:
    negative, or more than seq_len in all) becomes a BadSample of `shard`."""
    decoded = [finish_sample(sample, with_positions=False) for sample in samples if sample.__class__ is dict]
    if not with_positions or not decoded:
        return
    width = None if positions is None else positions.shape[1]  # a sample without its json header: the tokens'
    if width is not None and all(s.get("seq_len", width) == width and "doc_lens" in s for s in decoded):
        for sample, row in zip(samples, positions):
            if sample.__class__ is dict:
                sample["position_ids"] = row
        return
    kept, lengths = [], []
    for number, sample in enumerate(samples):
        seq_len = sequence_length(sample) if sample.__class__ is dict and "doc_lens" in sample else None
        if seq_len is None:
            continue
        if not pieces_fit(sample["doc_lens"], seq_len):
            samples[number] = BadSample(shard, ShardError(
                f"{shard}: sample {sample['key']}: doc_lens {np.asarray(sample['doc_lens']).tolist()} are not pieces "
                f"of seq_len {seq_len!r}; check it with verify=True, rewrite it, or read with on_error='skip'"))
        else:
            kept.append(sample)
            lengths.append(seq_len)
    add_position_ids(kept, lengths, buffers)


def sequence_length(sample: dict[str, Any]) -> int | None:
    """The sample's seq_len (its json header); without the header (the loader's fields= left it
    out) its tokens' length, which the writer makes equal; None without either."""
    if "seq_len" in sample:
        return sample["seq_len"]
    tokens = sample.get("tokens")
    return None if tokens is None else len(tokens)


def pieces_fit(doc_lens: Any, seq_len: Any) -> bool:
    """doc_lens can be a sample's pieces: integers, none negative, seq_len (an int) at most in all."""
    if seq_len.__class__ is not int:  # a header of another writer may hold "16" or 16.0
        return False
    lens = np.asarray(doc_lens)
    return lens.ndim == 1 and lens.dtype.kind in "iu" and lens.min(initial=0) >= 0 and \
        int(lens.sum(dtype=np.int64)) <= seq_len


def add_position_ids(samples: list[dict[str, Any]], lengths: list[int], buffers: Any = None) -> None:
    """Each sample's position ids for its sequence length (lengths[i] for samples[i]), as rows of
    one array (positions_from_pieces); samples whose pieces do not tile it (mixed lengths, pieces
    longer than the sequence, none) take derive_position_ids one at a time."""
    if not samples:
        return
    seq_len, lens = lengths[0], [np.asarray(s["doc_lens"]) for s in samples]
    counts = np.fromiter(map(len, lens), dtype=np.int64, count=len(lens))
    pieces = None if any(n != seq_len for n in lengths) else tile_pieces(np.concatenate(lens), counts, seq_len)
    if pieces is None:
        for sample, length in zip(samples, lengths):
            sample["position_ids"] = derive_position_ids(sample["doc_lens"], length)
        return
    for sample, row in zip(samples, positions_from_pieces(pieces, len(samples), seq_len, buffers)):
        sample["position_ids"] = row


def span_positions(plan: Any, buffers: Any = None) -> np.ndarray | None:
    """The position ids of a planned span (datapipe.tarsamples.SpanPlan), row i for its sample i,
    before any sample is built: a prefetch thread runs it while the main thread decodes the
    previous span, and its big numpy passes release the GIL. The sequence length is the tokens'
    (finish_samples checks it against each sample's seq_len). None unless every sample has
    integer doc_lens and tokens of one length, and its pieces fit."""
    from datapipe.tarsamples import ArrayColumn

    lens, tokens, size = plan.columns.get("doc_lens.npy"), plan.columns.get("tokens.npy"), len(plan.keys)
    if not (isinstance(lens, ArrayColumn) and isinstance(tokens, ArrayColumn)) or lens.typed.dtype.kind not in "iu":
        return None
    if len(lens.numbers) != size or len(tokens.numbers) != size or (tokens.counts != tokens.counts[0]).any():
        return None
    firsts = np.cumsum(lens.counts) - lens.counts  # where each sample's pieces start in the gathered array
    flat = lens.typed[np.repeat(lens.starts - firsts, lens.counts) + np.arange(int(lens.counts.sum()))]
    pieces = tile_pieces(flat, lens.counts, int(tokens.counts[0]))
    return None if pieces is None else positions_from_pieces(pieces, size, int(tokens.counts[0]), buffers)


def tile_pieces(flat: np.ndarray, counts: np.ndarray, seq_len: int) -> np.ndarray | None:
    """Samples' document pieces (flat, counts[i] for sample i) with each sample's padding as one
    more piece, so they tile samples x seq_len; None if some sample has no piece, a negative
    one, or more than seq_len."""
    flat = flat.astype(np.int64)
    if not len(counts) or counts.min() == 0 or (len(flat) and flat.min() < 0):
        return None
    ends = np.cumsum(counts)
    padding = seq_len - np.add.reduceat(flat, ends - counts)
    return None if padding.min() < 0 else np.insert(flat, ends, padding)


def positions_from_pieces(pieces: np.ndarray, samples: int, seq_len: int, buffers: Any = None) -> np.ndarray:
    """Position ids (int32, samples x seq_len) of pieces that tile the rows: each piece's positions
    are the start of one cached 0..seq_len-1 ramp, all copied in one np.concatenate. 8 us a sample
    at 8K tokens, 64 at 64K (a fill and a running sum over the array took 9 and 85: the array is
    as large as the tokens, so memory traffic sets the cost); derive_position_ids one sample at a
    time costs 18 at 8K. Memory from `buffers` (reused) matters as much, as a fresh array costs the
    kernel a page fault and a zero-fill per 4 KiB."""
    size = samples * seq_len
    out = (buffers.take(4 * size) if buffers else np.empty(4 * size, dtype=np.uint8)).view(np.int32)
    ramp = int32_range(seq_len)
    return np.concatenate([ramp[:n] for n in pieces[pieces > 0].tolist()], out=out).reshape(samples, seq_len)


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


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_atomic(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)
