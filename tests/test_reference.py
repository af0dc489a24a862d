"""Every fast path of the loader equals the plain reference decoder (datapipe.loader.reference),
sample for sample and field for field: in order, shuffled, in batches, with fields=, by index or
by tar-header walk, mapped or read, split over ranks and workers; on shards with and without
media, loss masks and json headers, written by our writer and by plain `tarfile`."""
import io
import json
import shutil
import tarfile

import numpy as np
import pytest

from datapipe.loader.batches import collate
from datapipe.loader.reference import read_shards
from datapipe.loader.stream import Stream, stream
from datapipe.packing.writer import ShardWriter, npy_bytes
from datapipe.shardformat import read_manifest
from tests.test_shards import write_run
from tests.test_stream import drop_indexes

SEQ_LEN = 64


def same(left, right) -> bool:
    """Equal values of equal types: arrays of one dtype and shape, lists item by item, else ==."""
    if isinstance(left, np.ndarray) or isinstance(right, np.ndarray):
        return isinstance(left, np.ndarray) and isinstance(right, np.ndarray) and left.dtype == right.dtype \
            and left.shape == right.shape and np.array_equal(left, right)
    if isinstance(left, list) or isinstance(right, list):
        return type(left) is type(right) and len(left) == len(right) and all(map(same, left, right))
    return type(left) is type(right) and left == right


def assert_same(got, want):
    """Two samples (or batches) with the same fields and values."""
    assert got.keys() == want.keys(), (sorted(got), sorted(want))
    for name in want:
        assert same(got[name], want[name]), (got.get("key"), name)


def without_positions(samples):
    return [{name: value for name, value in sample.items() if name != "position_ids"} for sample in samples]


def tar_of(path, samples):
    """Samples ({suffix: bytes} each under its key) as a plain tar, as another tool writes it."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key, members in samples.items():
            for suffix, data in members.items():
                info = tarfile.TarInfo(f"{key}.{suffix}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def foreign_phase(folder, shards):
    """A phase folder of plain tars (a list of {key: {suffix: bytes}}) and a manifest, no index files."""
    folder.mkdir(parents=True)
    entries = []
    for number, samples in enumerate(shards):
        name = f"shard-{number:06d}.tar"
        tar_of(folder / name, samples)
        entries.append({"name": name, "samples": len(samples), "tokens": SEQ_LEN * len(samples),
                        "bytes": (folder / name).stat().st_size})
    (folder / "manifest.json").write_text(json.dumps({"phase": "main", "shards": entries}))
    return folder


def arrays_only(index, rng):
    """tokens, doc_lens, loss_mask of one length, no json header: another tool's text sample."""
    lens = np.diff(np.sort(rng.integers(0, SEQ_LEN, size=3)), prepend=0).astype(np.int32)
    return {"tokens.npy": npy_bytes(rng.integers(0, 1000, SEQ_LEN, dtype=np.uint32)),
            "doc_lens.npy": npy_bytes(lens), "loss_mask.npy": npy_bytes((rng.random(SEQ_LEN) > 0.5).astype(np.uint8))}


def mixed(index, rng):
    """Samples that differ in their members: images out of order, raw members, no loss mask, no
    json header, tokens of another length (no common position rows), a header repeating its key."""
    length = SEQ_LEN if index % 3 else SEQ_LEN // 2
    members = {"tokens.npy": npy_bytes(np.arange(length, dtype=np.uint32) + index),
               "doc_lens.npy": npy_bytes(np.array([length // 4, length // 2], np.int32))}
    if index % 2:
        members["json"] = json.dumps({"key": f"m{index:03d}", "seq_len": length, "score": index / 10}).encode()
        members["1.png"], members["0.png"] = b"second image", b"first image"
    if index % 4 == 1:
        members["txt"] = f"caption {index}".encode()
        members["loss_mask.npy"] = npy_bytes(np.ones(length, np.uint8))
    if index % 5 == 2:  # a 2-D array, and doc_lens of another dtype: those columns go member by member
        members["grid.npy"] = npy_bytes(np.arange(6, dtype=np.float32).reshape(2, 3) * index)
        members["doc_lens.npy"] = npy_bytes(np.array([length // 4, length // 2], np.int64))
    return members


@pytest.fixture(scope="module")
def phases(tmp_path_factory):
    """Phase folders that take every decoding path, by name."""
    root = tmp_path_factory.mktemp("reference")
    rng = np.random.default_rng(0)
    write_run(root / "media", n_docs=300, per_shard=7)  # images in some samples; our writer, index files
    write_run(root / "text", n_docs=400, per_shard=9, media_every=0)  # text only: strided spans
    samples = write_run(root / "text_only_some_masks", n_docs=300, per_shard=8, media_every=0)
    with ShardWriter(root / "masks", 8, {"phase": "masks", "seq_len": samples[0]["seq_len"]}) as writer:
        for number, sample in enumerate(samples):
            writer.write({k: v for k, v in sample.items() if k != "loss_mask" or number % 3})
    shutil.rmtree(root / "text_only_some_masks")
    foreign_phase(root / "arrays", [{f"a{s}{i:03d}": arrays_only(i, rng) for i in range(11)} for s in range(3)])
    foreign_phase(root / "mixed", [{f"m{i:03d}": mixed(i, rng) for i in range(s, s + 9)} for s in (0, 9)])
    return {folder.name: folder for folder in root.iterdir()}


def test_the_phases_take_every_path(phases):
    """The fixtures hold what the tests claim: media, samples without loss masks or json headers."""
    media, masks = list(read_shards(phases["media"])), list(read_shards(phases["masks"]))
    arrays, odd = list(read_shards(phases["arrays"])), list(read_shards(phases["mixed"]))
    assert any(s["images"] for s in media) and any(not s["images"] for s in media)
    assert any("loss_mask" not in s for s in masks) and any("loss_mask" in s for s in masks)
    assert all("seq_len" not in s and "loss_mask" in s for s in arrays)
    assert odd[1]["images"] == [b"first image", b"second image"] and odd[1]["score"] == 0.1 and "txt" in odd[1]
    assert "seq_len" not in odd[0] and len(odd[0]["tokens"]) == SEQ_LEN // 2
    assert odd[2]["grid"].shape == (2, 3) and odd[2]["doc_lens"].dtype == np.int64
    assert all(s["position_ids"].dtype == np.int32 for s in media + masks + arrays + odd)


def test_same_catches_a_difference():
    sample = {"tokens": np.arange(4, dtype=np.uint32), "doc_ids": ["a"], "images": [b"x"]}
    assert same(sample["tokens"], np.arange(4, dtype=np.uint32))
    assert not same(sample["tokens"], np.arange(4, dtype=np.int64))  # the dtype counts
    assert not same(sample["tokens"], [0, 1, 2, 3]) and not same([b"x"], [b"y"]) and not same(1, 1.0)


@pytest.mark.parametrize("name", ["media", "text", "masks", "arrays", "mixed"])
@pytest.mark.parametrize("options", [{}, {"mmap": False}, {"prefetch": 0}, {"position_ids": False}])
def test_samples_in_order_equal_the_reference(phases, name, options):
    want = list(read_shards(phases[name]))
    if options.get("position_ids") is False:
        want = without_positions(want)
    got = list(stream(phases[name], **options))
    assert len(got) == len(want) == sum(shard["samples"] for shard in read_manifest(phases[name])["shards"])
    for sample, reference in zip(got, want):
        assert_same(sample, reference)


@pytest.mark.parametrize("name", ["media", "text", "masks"])
def test_the_header_walk_equals_the_reference(phases, name, tmp_path):
    walked = drop_indexes(shutil.copytree(phases[name], tmp_path / name))
    want = list(read_shards(phases[name]))
    for sample, reference in zip(list(stream(walked)), want, strict=True):
        assert_same(sample, reference)


@pytest.mark.parametrize("name", ["media", "text", "masks", "arrays", "mixed"])
def test_shuffled_samples_are_the_reference_samples(phases, name):
    want = {sample["key"]: sample for sample in read_shards(phases[name])}
    got = list(stream(phases[name], shuffle=True, seed=5, shuffle_window=10))
    assert sorted(s["key"] for s in got) == sorted(want)
    assert [s["key"] for s in got] != list(want)  # shuffled indeed
    for sample in got:
        assert_same(sample, want[sample["key"]])


@pytest.mark.parametrize("name", ["media", "text", "masks", "arrays", "mixed"])
@pytest.mark.parametrize("fields", [None, ("tokens", "loss_mask"), ("tokens", "doc_lens", "json")])
@pytest.mark.parametrize("batch_size", [1, 4, 10])
def test_batches_are_the_reference_samples_collated(phases, name, fields, batch_size):
    position_ids = fields is None or "doc_lens" in fields
    want = list(read_shards(phases[name], fields))
    if not position_ids:
        want = without_positions(want)
    got = list(stream(phases[name], batch_size=batch_size, fields=fields, position_ids=position_ids))
    assert len(got) == -(-len(want) // batch_size)
    for number, batch in enumerate(got):
        assert_same(batch, collate(want[number * batch_size : (number + 1) * batch_size]))


@pytest.mark.parametrize("name", ["media", "text", "mixed"])
def test_shuffled_batches_are_reference_samples_collated(phases, name):
    want = {sample["key"]: sample for sample in read_shards(phases[name])}
    batches = list(stream(phases[name], batch_size=3, shuffle=True, seed=2, shuffle_window=7))
    assert sorted(key for batch in batches for key in batch["key"]) == sorted(want)
    for batch in batches:
        assert_same(batch, collate([want[key] for key in batch["key"]]))


@pytest.mark.parametrize("name", ["media", "arrays"])
@pytest.mark.parametrize("world_size, num_workers", [(1, 2), (2, 1), (3, 2)])
def test_ranks_and_workers_together_read_the_reference(phases, name, world_size, num_workers):
    """Unshuffled, rank r's workers read the r-th slice in turn: all together the reference's first
    total // world_size * world_size samples, in order."""
    want = list(read_shards(phases[name]))
    got = [sample for rank in range(world_size) for worker in range(num_workers)
           for sample in Stream(phases[name], rank, world_size, worker, num_workers)]
    assert len(got) == len(want) // world_size * world_size
    for sample, reference in zip(got, want):
        assert_same(sample, reference)


@pytest.mark.parametrize("name", ["media", "text", "masks", "arrays"])
@pytest.mark.parametrize("options", [{}, {"batch_size": 4}, {"shuffle": True, "seed": 1}])
def test_position_ids_made_a_few_rows_at_a_time_equal_the_reference(phases, name, options, monkeypatch):
    """Spans hand out their position ids in chunks (positions.CHUNK_BYTES: 4K rows of 64 tokens,
    more than a test span has); here 3 rows a chunk, so that chunks and batches cut across each other."""
    from datapipe.loader import positions

    want = list(read_shards(phases[name]))
    monkeypatch.setattr(positions, "CHUNK_BYTES", 3 * 4 * len(want[0]["tokens"]))
    got = list(stream(phases[name], **options))
    if "batch_size" in options:
        for number, batch in enumerate(got):
            assert_same(batch, collate(want[number * 4 : (number + 1) * 4]))
        return
    by_key = {sample["key"]: sample for sample in want}
    assert sorted(s["key"] for s in got) == sorted(by_key)
    for sample in got:
        assert_same(sample, by_key[sample["key"]])
