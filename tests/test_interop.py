"""Our shards are plain WebDataset: webdataset, Hugging Face datasets and Ray Data read the same samples we do.

Hugging Face's webdataset builder insists that every sample of an archive has the same member
types, so it reads a text-only stage; a stage whose samples carry images on some samples only
(`<key>.<i>.png`) is read by webdataset and Ray Data."""
import numpy as np
import pytest

from datapipe.loader.reference import read_shards
from datapipe.shardformat import read_manifest
from tests.conftest import rgb
from tests.test_shards import write_run


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    folder = tmp_path_factory.mktemp("interop") / "main"
    samples = write_run(folder, n_docs=200, per_shard=6)
    assert any(sample["images"] for sample in samples) and not all(sample["images"] for sample in samples)
    return folder


@pytest.fixture(scope="module")
def text_stage(tmp_path_factory):
    folder = tmp_path_factory.mktemp("interop") / "text"
    write_run(folder, n_docs=200, per_shard=6, media_every=0)
    return folder


@pytest.fixture(scope="module")
def ours(stage):
    return {sample["key"]: sample for sample in read_shards(stage)}


def shard_paths(stage):
    return [str(stage / shard["name"]) for shard in read_manifest(stage)["shards"]]


def assert_equal_samples(ours, theirs):
    """theirs: key -> the other reader's row (members by suffix, as it decoded them)."""
    assert sorted(theirs) == sorted(ours)
    for key, row in theirs.items():
        mine = ours[key]
        assert np.array_equal(np.asarray(row["tokens.npy"], dtype=np.uint32), mine["tokens"])
        assert np.array_equal(np.asarray(row["doc_lens.npy"], dtype=np.int32), mine["doc_lens"])
        assert np.array_equal(np.asarray(row["loss_mask.npy"], dtype=np.uint8), mine["loss_mask"])
        assert row["json"] == {k: mine[k] for k in row["json"]} and set(row["json"]) >= {"doc_ids", "num_pad"}
        # Ray fills a member that a sample lacks with NaN
        present = [k for k in row if k.endswith(".png") and isinstance(row[k], bytes | np.ndarray)]
        images = sorted(present, key=lambda k: int(k[: -len(".png")]))
        assert len(images) == len(mine["images"])
        for name, png in zip(images, mine["images"]):  # webdataset keeps the bytes; Ray decodes to pixels
            assert row[name] == png if isinstance(row[name], bytes) else np.array_equal(row[name], rgb(png))


def test_webdataset_reads_the_samples_we_read(stage, ours):
    import webdataset as wds

    samples = wds.WebDataset(shard_paths(stage), shardshuffle=False).decode()
    assert_equal_samples(ours, {s["__key__"]: s for s in samples})


def test_hf_datasets_reads_the_samples_we_read(text_stage, tmp_path):
    import datasets

    rows = datasets.load_dataset("webdataset", data_files={"train": shard_paths(text_stage)}, split="train",
                                 cache_dir=str(tmp_path / "hf"))
    assert_equal_samples({s["key"]: s for s in read_shards(text_stage)}, {r["__key__"]: r for r in rows})


def test_ray_data_reads_the_samples_we_read(stage, ours, ray_session):
    rows = ray_session.data.read_webdataset(shard_paths(stage)).take_all()
    assert_equal_samples(ours, {r["__key__"]: r for r in rows})
