import hashlib
import io
import json
import tarfile

import numpy as np
import pytest

from datapipe.loader.reference import read_shard, read_shards
from datapipe.loader.shardindex import part_values
from datapipe.loader.stream import stream
from datapipe.packing.curriculum import CurriculumPhase, pack_phase
from datapipe.packing.writer import ShardWriter
from datapipe.shardformat import read_manifest
from tests.test_packing import IDS, make_corpus


def write_run(folder, n_docs=300, per_shard=7, stage="main", seq_len=128, seed=5, max_bytes=None, **docs):
    """A stage folder of packed random documents (some with images, unless media_every=0); returns
    the samples in write order."""
    stage_config = CurriculumPhase(name=stage, seq_len=seq_len)
    samples = list(pack_phase(stage_config, make_corpus(seed, n_docs, **docs), 0, IDS)[2])
    with ShardWriter(folder, per_shard, {"phase": stage, "seq_len": seq_len}, max_bytes) as writer:
        for sample in samples:
            writer.write(sample)
    return samples


def index_columns(index: dict) -> dict[str, tuple[list[int], list[int], list[int]]]:
    """An index file's members per suffix as (numbers, offsets, sizes) lists, progressions expanded."""
    return {suffix: tuple(part_values(part).tolist() for part in column) for suffix, column in index["members"].items()}


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
    assert read_manifest(tmp_path / "a")["shards"] == read_manifest(tmp_path / "b")["shards"]  # index sha256s too
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(p.name for p in (tmp_path / "b").iterdir())


def test_index_locates_every_member_as_tarfile_does(tmp_path):
    import json
    import tarfile

    write_run(tmp_path / "main")
    for shard in read_manifest(tmp_path / "main")["shards"]:
        index_file = tmp_path / "main" / shard["index"]["name"]
        assert hashlib.sha256(index_file.read_bytes()).hexdigest() == shard["index"]["sha256"]
        index = json.loads(index_file.read_text())
        assert (index["bytes"], index["sha256"], index["shard"]) == (shard["bytes"], shard["sha256"], shard["name"])
        with tarfile.open(tmp_path / "main" / shard["name"]) as tar:
            members = [(m.name, m.offset_data, m.size) for m in tar.getmembers()]
        listed = sorted((f"{index['keys'][number]}.{suffix}", offset, size)
                        for suffix, columns in index_columns(index).items() for number, offset, size in zip(*columns))
        assert listed == sorted(members) and len(index["keys"]) == shard["samples"]


def test_index_gives_each_array_columns_layout_as_np_save_wrote_it(tmp_path):
    import io
    import json
    import tarfile

    write_run(tmp_path / "main")
    shard = read_manifest(tmp_path / "main")["shards"][0]
    index = json.loads((tmp_path / "main" / shard["index"]["name"]).read_text())
    assert sorted(index["arrays"]) == ["doc_lens.npy", "loss_mask.npy", "tokens.npy"]
    with tarfile.open(tmp_path / "main" / shard["name"]) as tar:
        for member in tar.getmembers():
            suffix = member.name.partition(".")[2]
            if suffix in index["arrays"]:
                stream_ = io.BytesIO(tar.extractfile(member).read())
                assert np.lib.format.read_magic(stream_) == (1, 0)
                dtype = np.lib.format.read_array_header_1_0(stream_)[2]
                assert index["arrays"][suffix] == {"dtype": dtype.str, "header": stream_.tell()}


def test_a_column_of_mixed_dtypes_has_no_layout_and_still_reads(tmp_path):
    import json

    samples = write_run(tmp_path / "src", per_shard=100)
    samples[1]["tokens"] = samples[1]["tokens"].astype(np.uint16)
    with ShardWriter(tmp_path / "main", 100, {"stage": "main", "seq_len": 128}) as writer:
        for sample in samples:
            writer.write(sample)
    shard = read_manifest(tmp_path / "main")["shards"][0]
    index = json.loads((tmp_path / "main" / shard["index"]["name"]).read_text())
    assert "tokens.npy" not in index["arrays"] and "doc_lens.npy" in index["arrays"]
    back = list(stream(tmp_path / "main"))
    assert back[1]["tokens"].dtype == np.uint16 and back[0]["tokens"].dtype == np.uint32
    assert all(np.array_equal(a["tokens"], b["tokens"]) for a, b in zip(samples, back))


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


def test_max_bytes_closes_shards_at_the_byte_target(tmp_path):
    samples = write_run(tmp_path / "main", per_shard=10_000, max_bytes=20_000)
    manifest = read_manifest(tmp_path / "main")
    assert len(manifest["shards"]) > 3 and manifest["samples"] == len(samples)
    sample_bytes = max(s["bytes"] for s in manifest["shards"]) // min(s["samples"] for s in manifest["shards"][:-1])
    for shard in manifest["shards"][:-1]:  # the sample that crosses the target stays in its shard
        assert 20_000 <= shard["bytes"] <= 20_000 + 3 * sample_bytes + 10240


def test_rewrite_clears_the_previous_output_before_the_first_shard(tmp_path):
    write_run(tmp_path / "main", n_docs=300, per_shard=3)
    with pytest.raises(RuntimeError), ShardWriter(tmp_path / "main", 3, {}):
        raise RuntimeError("crashed before the first sample")
    assert not list((tmp_path / "main").iterdir())  # no old manifest beside a half-new folder


def test_a_failure_leaves_finished_shards_but_no_partial_shard_and_no_manifest(tmp_path):
    """An error inside the writer (a full disk, a bug) removes the shard it was writing; the finished
    ones stay, and without a manifest a reader knows the folder is unfinished."""
    samples = write_run(tmp_path / "whole", per_shard=5)
    with pytest.raises(RuntimeError), ShardWriter(tmp_path / "main", 5, {}) as writer:
        for sample in samples[:12]:
            writer.write(sample)
        raise RuntimeError("killed")
    folder = tmp_path / "main"
    assert sorted(p.name for p in folder.iterdir()) == ["shard-000000.index.json", "shard-000000.tar",
                                                        "shard-000001.index.json", "shard-000001.tar"]


def tar_of(path, members, form=tarfile.PAX_FORMAT):
    """A tar of {name: bytes} members, as another tool writes it."""
    with tarfile.open(path, "w", format=form) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def foreign_phase(folder, data, samples):
    """A phase folder of one shard (tar bytes) as another tool writes it: a manifest, no index file."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "shard-000000.tar").write_bytes(data)
    entry = {"name": "shard-000000.tar", "samples": samples, "tokens": 16 * samples, "bytes": len(data),
             "sha256": hashlib.sha256(data).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps({"phase": "main", "shards": [entry]}))
    return folder


def both_decoders(tmp_path, members, samples, form=tarfile.PAX_FORMAT):
    """A shard's samples by the reference decoder and by the loader (its header walk)."""
    path = tar_of(tmp_path / "x.tar", members, form)
    folder = foreign_phase(tmp_path / "phase", path.read_bytes(), samples)
    return list(read_shard(path)), list(stream(folder))


def test_members_decode_generically_by_extension(tmp_path):
    key = "k" * 150  # a long key: tarfile writes a pax header for it
    members = {f"{key}.tokens.npy": npy(np.arange(8, dtype=np.uint32)),
               f"{key}.loss_mask.npy": npy(np.ones(8, np.uint8)),
               f"{key}.json": json.dumps({"seq_len": 8, "captions": ["a", "b"]}).encode(), f"{key}.1.png": b"png-one",
               f"{key}.0.png": b"png-zero", f"{key}.txt": b"hello", "k2.tokens.npy": npy(np.zeros((2, 3), np.int32))}
    for first, second in both_decoders(tmp_path, members, 2):
        assert first["key"] == key and first["loss_mask"].dtype == np.uint8
        assert first["tokens"].tolist() == list(range(8)) and first["captions"] == ["a", "b"]
        assert first["images"] == [b"png-zero", b"png-one"] and first["txt"] == b"hello"
        assert second["tokens"].shape == (2, 3) and second["images"] == [] and second["media_spans"] == []


def npy(array):
    from datapipe.packing.writer import npy_bytes

    return npy_bytes(array)


def test_position_ids_of_a_span_equal_one_at_a_time():
    from datapipe.loader.fetch import BufferPool
    from datapipe.loader.positions import positions_of
    from datapipe.shardformat import derive_position_ids

    rng, pool = np.random.default_rng(1), BufferPool(keep=2)
    for trial in range(100):
        seq_len = int(rng.integers(1, 300))
        lens = []
        for _ in range(int(rng.integers(1, 12))):
            cuts = np.sort(rng.integers(0, seq_len + 1, size=int(rng.integers(1, 6))))
            lens.append(np.diff(cuts, prepend=0).astype(np.int32))  # pieces of length 0 too; the rest is padding
        if trial % 10 == 0:  # not tiling: pieces longer than the sequence
            lens.append(np.array([seq_len + 3], np.int32))
        counts = np.array([len(row) for row in lens])
        rows = positions_of(np.concatenate(lens), counts, seq_len, pool if trial % 2 else None)
        if trial % 10 == 0:
            assert rows is None
            continue
        assert rows.dtype == np.int32 and rows.shape == (len(lens), seq_len)
        for row, pieces in zip(rows, lens):
            assert np.array_equal(row, derive_position_ids(pieces, seq_len))


def test_position_ids_restart_per_piece_and_padding():
    from datapipe.shardformat import derive_position_ids

    assert derive_position_ids(np.array([3, 2]), 8).tolist() == [0, 1, 2, 0, 1, 0, 1, 2]
    assert derive_position_ids(np.array([4]), 4).tolist() == [0, 1, 2, 3]
    rng = np.random.default_rng(0)
    for _ in range(200):
        lens = rng.integers(1, 900, size=int(rng.integers(1, 20))).astype(np.int32)
        pad = int(rng.integers(0, 50))
        derived = derive_position_ids(lens, int(lens.sum()) + pad)
        expected = [i for n in [*lens.tolist(), pad] for i in range(n)]  # plain Python: one run per piece
        assert derived.dtype == np.int32 and derived.tolist() == expected


@pytest.mark.parametrize("shape", [(2, 3), ()])
def test_arrays_that_are_not_1d_keep_their_shape(tmp_path, shape):
    arrays = [np.arange(np.prod(shape), dtype=np.int32).reshape(shape) + i for i in range(3)]
    members = {}
    for i, array in enumerate(arrays):  # one header for all three: the column's fast path is tried
        data = io.BytesIO()
        np.save(data, array)  # another tool's writer: shape kept (ours writes 1-D arrays only)
        members[f"k{i}.grid.npy"] = data.getvalue()
    for samples in both_decoders(tmp_path, members, 3, tarfile.USTAR_FORMAT):
        got = [sample["grid"] for sample in samples]
        assert [g.shape for g in got] == [shape] * 3 and all(np.array_equal(g, a) for g, a in zip(got, arrays))
