"""Batches from the loader (batch_size=): equal to the samples collated, strided views of the shard, exact resume."""
import json
import random

import numpy as np
import pytest

from datapipe.loader.batches import collate
from datapipe.loader.reference import read_shards
from datapipe.loader.shardindex import ShardError
from datapipe.loader.stream import stream
from datapipe.packing.writer import ShardWriter, blocks
from datapipe.shardformat import read_manifest
from tests.test_shards import index_columns, write_run
from tests.test_stream import assert_positions_pooled, damage, write_curriculum

SEQ_LEN = 4096


@pytest.fixture(scope="module")
def image_stage(tmp_path_factory):
    """Some samples with images: their spans are decoded sample by sample, then collated."""
    folder = tmp_path_factory.mktemp("batches") / "main"
    write_run(folder, n_docs=600, per_shard=9)
    return folder


@pytest.fixture(scope="module")
def text_stage(tmp_path_factory):
    """Text only (no images), so every span is laid out at one stride."""
    folder = tmp_path_factory.mktemp("batches") / "main"
    write_run(folder, n_docs=2000, per_shard=10, seq_len=SEQ_LEN, media_every=0)
    return folder


def assert_same_batch(left, right):
    assert left.keys() == right.keys()
    for name, value in left.items():
        other = right[name]
        if isinstance(value, np.ndarray):
            assert isinstance(other, np.ndarray) and value.dtype == other.dtype and np.array_equal(value, other), name
        else:
            assert len(value) == len(other), name
            for a, b in zip(value, other):
                assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b, name


def reference(folder, batch_size, drop_last=False, **options):
    samples = list(stream(folder, **options))
    groups = [samples[i : i + batch_size] for i in range(0, len(samples), batch_size)]
    return [collate(g) for g in groups if len(g) == batch_size or not drop_last]


@pytest.mark.parametrize("batch_size", [1, 4, 10, 23])
@pytest.mark.parametrize("options", [{}, {"position_ids": False}, {"shuffle": True, "seed": 2, "shuffle_window": 17},
                                     {"fields": ("tokens", "doc_lens")}, {"rank": 1, "world_size": 2}])
def test_batches_are_the_samples_collated(image_stage, text_stage, batch_size, options):
    for folder in (image_stage, text_stage):  # with images (decoded spans) and text only (strided spans)
        batches = list(stream(folder, batch_size=batch_size, **options))
        expected = reference(folder, batch_size, **options)
        assert len(batches) == len(expected) == len(stream(folder, batch_size=batch_size, **options))
        for batch, want in zip(batches, expected):
            assert_same_batch(batch, want)
        assert all(b["tokens"].shape[1:] == (b["tokens"].shape[1],) and b["tokens"].ndim == 2 for b in batches)


def test_drop_last_leaves_out_the_short_batch(text_stage):
    total = read_manifest(text_stage)["samples"]
    batches = list(stream(text_stage, batch_size=7, drop_last=True))
    assert len(batches) == total // 7 == len(stream(text_stage, batch_size=7, drop_last=True))
    assert {len(b["key"]) for b in batches} == {7}
    assert total % 7 and len(list(stream(text_stage, batch_size=7))) == total // 7 + 1


def test_a_batch_inside_a_shard_is_a_view_of_it(tmp_path):
    sizes = [(3, 200), (2, 10), (1, 5), (4, 120), (2, 30)]  # json headers of one and two tar blocks
    write_samples(tmp_path, [sample(f"s-{i:03d}", *size) for i, size in enumerate(sizes * 8)], per_shard=10)
    batches = list(stream(tmp_path, batch_size=5, position_ids=False))  # never across two shards
    for batch in batches:
        tokens, mask = batch["tokens"], batch["loss_mask"]
        assert not tokens.flags.owndata and tokens.strides[0] > SEQ_LEN * 4  # rows a tar sample apart
        assert not mask.flags.owndata and mask.strides[0] == tokens.strides[0]
    whole = list(read_shards(tmp_path))
    assert np.array_equal(np.concatenate([b["tokens"] for b in batches]), np.stack([s["tokens"] for s in whole]))
    assert [k for b in batches for k in b["doc_ids"]] == [s["doc_ids"] for s in whole]


def test_batch_position_ids_reuse_a_few_buffers(text_stage, monkeypatch):
    """Position ids made batch by batch (SpanPositions) in pooled memory, handed out again once
    the batch is gone; batches of 5 lie inside the shards of 10 (one across two is a copy)."""
    assert_positions_pooled(text_stage, monkeypatch, {"batch_size": 5})


def test_a_batch_across_shards_is_stacked(text_stage):
    batch = list(stream(text_stage, batch_size=7))[1]  # samples 7-13, shards of 10
    assert batch["tokens"].flags.owndata and batch["tokens"].shape == (7, SEQ_LEN)
    assert batch["position_ids"].shape == (7, SEQ_LEN) and batch["position_ids"].dtype == np.int32


@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_between_batches_equals_the_uninterrupted_run(text_stage, shuffle):
    def make():
        return stream(text_stage, batch_size=6, shuffle=shuffle, seed=3, shuffle_window=13, loop=True)

    rng = random.Random(1)
    total = len(make())
    for cut in [rng.randrange(3 * total) for _ in range(5)]:
        loader, uninterrupted = make(), make()
        it, whole = iter(loader), iter(uninterrupted)
        for _ in range(cut):
            next(it), next(whole)
        resumed = make()
        resumed.load_state_dict(loader.state_dict())
        after = iter(resumed)
        for _ in range(total + 2):  # across the next epoch boundary
            assert_same_batch(next(after), next(whole))


def test_ranks_get_equal_batch_counts(text_stage):
    counts = {len(list(stream(text_stage, rank, 3, batch_size=4))) for rank in range(3)}
    assert counts == {len(stream(text_stage, 0, 3, batch_size=4))}


def test_fields_leave_out_members_and_position_ids_need_theirs(text_stage):
    batch = next(iter(stream(text_stage, batch_size=4, fields=("tokens", "loss_mask"), position_ids=False)))
    assert set(batch) == {"key", "images", "media_spans", "tokens", "loss_mask"}
    with pytest.raises(ValueError, match="position_ids come from doc_lens and tokens"):
        stream(text_stage, fields=("tokens",))
    with pytest.raises(ValueError, match="give a tuple of names"):
        stream(text_stage, fields="tokens", position_ids=False)
    with pytest.raises(ValueError, match="batch_size 0"):
        stream(text_stage, batch_size=0)


def json_offsets(folder, shard):
    return index_columns(json.loads((folder / shard.replace(".tar", ".index.json")).read_text()))["json"][1]


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_bad_sample_in_a_batch_is_raised_or_left_out(tmp_path, text_stage, on_error):
    import shutil

    folder = shutil.copytree(text_stage, tmp_path / "main")
    damage(folder / "shard-000001.tar", json_offsets(folder, "shard-000001.tar")[3], b"{{{{")
    loader = stream(folder, batch_size=4, on_error=on_error, check_samples=False)  # the decoder's own check
    if on_error == "raise":
        with pytest.raises(ShardError, match=r"shard-000001\.tar: member .*\.json does not decode"):
            list(loader)
        return
    keys = [key for batch in loader for key in batch["key"]]
    good = [s["key"] for s in read_shards(text_stage)]
    assert keys == good[:13] + good[14:] and loader.skipped == [str(folder / "shard-000001.tar")]


def sample(key, n_docs, id_length):
    tokens = np.arange(SEQ_LEN, dtype=np.uint32)
    lens = np.full(n_docs, SEQ_LEN // n_docs, dtype=np.int32)
    lens[-1] += SEQ_LEN - lens.sum()
    return {"key": key, "tokens": tokens, "doc_lens": lens, "loss_mask": np.ones(SEQ_LEN, np.uint8),
            "doc_ids": ["d" * id_length] * n_docs, "doc_offsets": [0] * n_docs, "seq_len": SEQ_LEN, "num_pad": 0}


def write_samples(folder, samples, per_shard=100):
    with ShardWriter(folder, per_shard, {"stage": "main", "seq_len": SEQ_LEN}) as writer:
        for s in samples:
            writer.write(s)


def test_the_writer_pads_headers_so_samples_share_one_stride(tmp_path):
    sizes = [(2, 10), (3, 200), (1, 5), (4, 120), (2, 30)]  # json headers of one and two tar blocks
    samples = [sample(f"s-{i:03d}", *size) for i, size in enumerate(sizes * 4)]
    write_samples(tmp_path, samples)
    offsets = np.array(json_offsets(tmp_path, "shard-000000.tar"))
    assert len(set(np.diff(offsets[2:]).tolist())) == 1  # from the first two-block header on, one stride
    back = list(read_shards(tmp_path))
    assert [s["doc_ids"] for s in back] == [s["doc_ids"] for s in samples]  # the padding is JSON whitespace
    natural = [len(json.dumps({k: s[k] for k in ("doc_ids", "doc_offsets", "num_pad", "seq_len")})) for s in samples]
    assert {blocks(size) for size in natural} == {1, 2}  # unpadded, the stride would vary


def test_one_huge_header_does_not_pad_every_sample_after_it(tmp_path):
    write_samples(tmp_path, [sample("s-000", 2, 10), sample("s-001", 8, 2000), sample("s-002", 2, 10)])
    index = json.loads((tmp_path / "shard-000000.index.json").read_text())
    assert index_columns(index)["json"][2] == [512, 16384, 512]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_a_batch_never_mixes_two_curriculum_stages(tmp_path, shuffle, drop_last):
    write_curriculum(tmp_path)  # a short stage (64 tokens) read in several passes, then a long one (128)
    options = {"shuffle": shuffle, "seed": 4, "shuffle_window": 11, "batch_size": 7, "drop_last": drop_last}
    per_rank = [list(stream(tmp_path, rank, 2, **options)) for rank in range(2)]
    samples = list(stream(tmp_path, 1, 2, shuffle=shuffle, seed=4, shuffle_window=11))
    stages = [s["seq_len"] for s in samples]
    switch = stages.index(128)
    groups = [part[i : i + 7] for part in (samples[:switch], samples[switch:]) for i in range(0, len(part), 7)]
    expected = [collate(g) for g in groups if len(g) == 7 or not drop_last]
    assert len(per_rank[0]) == len(per_rank[1]) == len(expected) == len(stream(tmp_path, 0, 2, **options))
    for batch, want in zip(per_rank[1], expected):
        assert_same_batch(batch, want)
        assert batch["tokens"].ndim == 2 and len(set(batch["seq_len"])) == 1
    assert switch % 7 and {b["tokens"].shape[1] for b in per_rank[1]} == {64, 128}  # a short batch at the switch


@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_across_a_stage_switch_with_batches(tmp_path, shuffle):
    write_curriculum(tmp_path)

    def make():
        return stream(tmp_path, 1, 2, shuffle=shuffle, seed=5, shuffle_window=12, loop=True, batch_size=4)

    total = len(make())
    whole = iter(make())
    reference = [next(whole)["key"] for _ in range(total + 3)]
    switch = [keys[0].split("-")[0] for keys in reference].index("long")
    for cut in sorted({0, switch - 1, switch, switch + 1, total - 1, total, *random.Random(2).sample(range(total), 4)}):
        loader = make()
        it = iter(loader)
        for _ in range(cut):
            next(it)
        resumed = make()
        resumed.load_state_dict(loader.state_dict())
        after = iter(resumed)
        assert [next(after)["key"] for _ in range(3)] == reference[cut : cut + 3], f"cut after {cut} batches"


@pytest.mark.parametrize("odd_mask", ["missing", "short"])
@pytest.mark.parametrize("batch_size", [3, 4, 5])
def test_what_a_batch_stacks_depends_on_its_own_samples(tmp_path, odd_mask, batch_size):
    samples = [sample(f"s-{i:03d}", 2, 10) for i in range(24)]
    for s in samples[6:12] + samples[18:]:  # half of each shard: no loss_mask, or one shorter than the tokens
        if odd_mask == "missing":
            del s["loss_mask"]
        else:
            s["loss_mask"] = s["loss_mask"][:-8]
    write_samples(tmp_path, samples, per_shard=12)
    batches = list(stream(tmp_path, batch_size=batch_size))
    expected = reference(tmp_path, batch_size)
    assert len(batches) == len(expected)
    for batch, want in zip(batches, expected):
        assert_same_batch(batch, want)
    assert isinstance(batches[0]["loss_mask"], np.ndarray)  # its samples all have a full mask: stacked


def write_foreign_stage(folder, headers, width=16):
    """One shard as another tool writes it (no index, json headers without seq_len): tokens,
    doc_lens and a json member a sample, the json bytes as given."""
    import io
    import tarfile

    from datapipe.packing.writer import npy_bytes

    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(folder / "shard-000000.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
        for i, header in enumerate(headers):
            members = {"tokens.npy": npy_bytes(np.arange(width, dtype=np.uint32) + i),
                       "doc_lens.npy": npy_bytes(np.array([width], np.int32)), "json": header}
            for suffix, data in members.items():
                info = tarfile.TarInfo(f"s-{i:03d}.{suffix}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    size = (folder / "shard-000000.tar").stat().st_size
    shards = [{"name": "shard-000000.tar", "samples": len(headers), "bytes": size, "tokens": width * len(headers)}]
    (folder / "manifest.json").write_text(json.dumps({"stage": "main", "shards": shards}))


def test_a_json_member_holding_two_headers_is_a_bad_sample(tmp_path):
    headers = [json.dumps({"n": i}).encode() for i in range(6)]
    write_foreign_stage(tmp_path / "good", headers)
    assert [n for batch in stream(tmp_path / "good", batch_size=3) for n in batch["n"]] == list(range(6))
    headers[2] = b'{"n": 2}, {"n": 99}'  # one member, two objects: parsed with its neighbours it shifts them
    write_foreign_stage(tmp_path / "bad", headers)
    with pytest.raises(ShardError, match=r"member s-002\.json does not decode"):
        list(stream(tmp_path / "bad", batch_size=3))
    batches = list(stream(tmp_path / "bad", batch_size=3, on_error="skip"))
    assert [n for batch in batches for n in batch["n"]] == [0, 1, 3, 4, 5]
