"""Our shards are plain WebDataset: webdataset, Hugging Face datasets and Ray Data read the same samples we do."""
import numpy as np
import pytest

from datapipe.shards import read_manifest, read_shards
from tests.test_shards import write_run


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    folder = tmp_path_factory.mktemp("interop") / "main"
    write_run(folder, n_docs=200, per_shard=6)
    return folder


@pytest.fixture(scope="module")
def ours(stage):
    return {sample["key"]: sample for sample in read_shards(stage)}


def shard_paths(stage):
    return [str(stage / shard["name"]) for shard in read_manifest(stage)["shards"]]


def assert_equal_samples(ours, theirs):
    """theirs: key -> (tokens, doc_lens, json fields), as the other reader decoded them."""
    assert sorted(theirs) == sorted(ours)
    for key, (tokens, doc_lens, fields) in theirs.items():
        assert np.array_equal(np.asarray(tokens, dtype=np.uint32), ours[key]["tokens"])
        assert np.array_equal(np.asarray(doc_lens, dtype=np.int32), ours[key]["doc_lens"])
        assert fields == {k: ours[key][k] for k in ("doc_ids", "seq_len", "num_pad")}


def test_webdataset_reads_the_samples_we_read(stage, ours):
    import webdataset as wds

    samples = wds.WebDataset(shard_paths(stage), shardshuffle=False).decode()
    assert_equal_samples(ours, {s["__key__"]: (s["tokens.npy"], s["doc_lens.npy"], s["json"]) for s in samples})


def test_hf_datasets_reads_the_samples_we_read(stage, ours, tmp_path):
    import datasets

    rows = datasets.load_dataset("webdataset", data_files={"train": shard_paths(stage)}, split="train",
                                 cache_dir=str(tmp_path / "hf"))
    assert_equal_samples(ours, {r["__key__"]: (r["tokens.npy"], r["doc_lens.npy"], r["json"]) for r in rows})


def test_ray_data_reads_the_samples_we_read(stage, ours, ray_session):
    rows = ray_session.data.read_webdataset(shard_paths(stage)).take_all()
    assert_equal_samples(ours, {r["__key__"]: (r["tokens.npy"], r["doc_lens.npy"], r["json"]) for r in rows})
