import hashlib

import numpy as np
import pytest

from datapipe.curriculum import CurriculumStage, pack_stage
from datapipe.shards import ShardWriter, read_manifest, read_shards
from datapipe.stream import stream
from tests.test_packing import IDS, make_corpus


def write_run(folder, n_docs=300, per_shard=7):
    samples = list(pack_stage(CurriculumStage(seq_len=128), make_corpus(5, n_docs), 0, IDS)[2])
    with ShardWriter(folder, per_shard, {"stage": "main", "seq_len": 128}) as writer:
        for sample in samples:
            writer.write(sample)
    return samples


def test_round_trip_returns_every_token(tmp_path):
    samples = write_run(tmp_path / "main")
    back = list(read_shards(tmp_path / "main"))
    assert [s["key"] for s in back] == [s["key"] for s in samples]
    for a, b in zip(samples, back):
        assert np.array_equal(a["tokens"], b["tokens"]) and b["tokens"].dtype == np.uint32
        assert np.array_equal(a["doc_lens"], b["doc_lens"])
        assert a["doc_ids"] == b["doc_ids"] and a["num_pad"] == b["num_pad"]


def test_manifest_counts_and_checksums(tmp_path):
    samples = write_run(tmp_path / "main", per_shard=7)
    manifest = read_manifest(tmp_path / "main")
    assert manifest["samples"] == len(samples)
    assert manifest["tokens"] == sum(128 - s["num_pad"] for s in samples)
    assert [s["samples"] for s in manifest["shards"]][:-1] == [7] * (len(manifest["shards"]) - 1)
    for shard in manifest["shards"]:
        data = (tmp_path / "main" / shard["name"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == shard["sha256"] and len(data) == shard["bytes"]
    assert not list((tmp_path / "main").glob(".*.tmp"))


def test_same_samples_give_byte_identical_shards(tmp_path):
    write_run(tmp_path / "a")
    write_run(tmp_path / "b")
    assert read_manifest(tmp_path / "a")["shards"] == read_manifest(tmp_path / "b")["shards"]


def test_plain_webdataset_reads_our_shards(tmp_path):
    import webdataset as wds

    samples = write_run(tmp_path / "main")
    urls = [str(tmp_path / "main" / s["name"]) for s in read_manifest(tmp_path / "main")["shards"]]
    back = list(wds.WebDataset(urls, shardshuffle=False).decode())
    assert len(back) == len(samples)
    assert np.array_equal(back[3]["tokens.npy"], samples[3]["tokens"])
    assert back[3]["json"]["doc_ids"] == samples[3]["doc_ids"]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_stream_rank_splits_are_equal_disjoint_and_cover(tmp_path, world_size):
    samples = write_run(tmp_path / "main")
    per_rank = [[s["key"] for s in stream(tmp_path / "main", rank, world_size)] for rank in range(world_size)]
    assert len({len(keys) for keys in per_rank}) == 1
    seen = [k for keys in per_rank for k in keys]
    assert len(seen) == len(set(seen)) == len(samples) // world_size * world_size


def test_stream_rejects_bad_rank(tmp_path):
    write_run(tmp_path / "main")
    with pytest.raises(ValueError, match="rank 2"):
        next(stream(tmp_path / "main", rank=2, world_size=2))
