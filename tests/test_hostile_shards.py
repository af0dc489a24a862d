"""Damaged and hostile shards, index files and manifests: a ShardError naming the shard (or, with
on_error="skip", the bad samples left out), never a crash, a hang or a wrong sample."""
import io
import json
import shutil
import tarfile

import numpy as np
import pytest

from datapipe.loader.shardindex import ShardError
from datapipe.loader.stream import stream
from datapipe.packing.writer import npy_bytes
from datapipe.shardformat import read_manifest
from tests.test_shards import foreign_phase, index_columns, write_run
from tests.test_stream import damage, rewrite_indexes

TOKENS = np.arange(16, dtype=np.uint32)


def tar_bytes(members, form=tarfile.USTAR_FORMAT):
    """A tar of (name, bytes) members; a TarInfo with None for a member without data (a folder)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=form) as tar:
        for name, data in members:
            info = name if isinstance(name, tarfile.TarInfo) else tarfile.TarInfo(name)
            if data is not None:
                info.size = len(data)
            tar.addfile(info, None if data is None else io.BytesIO(data))
    return out.getvalue()


def sample_members(i, tokens=None, header=None, doc_lens=None):
    header = {"seq_len": 16, "i": i} if header is None else header
    return [(f"s{i:03d}.tokens.npy", npy_bytes(TOKENS + i) if tokens is None else tokens),
            (f"s{i:03d}.doc_lens.npy", npy_bytes(np.array([16], np.int32)) if doc_lens is None else doc_lens),
            (f"s{i:03d}.json", header if isinstance(header, bytes) else json.dumps(header).encode())]


def npy_with_header(fields, data, version=1):
    """An .npy member whose header says whatever `fields` says (numpy would refuse to write it)."""
    text = fields.encode("latin1")
    width = 10 if version == 1 else 12
    text += b" " * (-(width + len(text) + 1) % 64) + b"\n"
    size = len(text).to_bytes(2 if version == 1 else 4, "little")
    return b"\x93NUMPY" + bytes([version, 0]) + size + text + data


def header_of(descr, shape):
    return "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)


def assert_refused(folder, pattern, good_keys):
    for batch_size in (None, 4):
        with pytest.raises(ShardError, match=pattern):
            list(stream(folder, batch_size=batch_size))
        loader = stream(folder, batch_size=batch_size, on_error="skip")
        items = list(loader)
        keys = [s["key"] for s in items] if batch_size is None else [k for b in items for k in b["key"]]
        assert keys == good_keys and loader.skipped


HOSTILE_ARRAYS = {
    "shape of 2**70": npy_with_header(header_of("<u4", "(%d,)" % 2**70), TOKENS.tobytes()),
    "shape of 2**62": npy_with_header(header_of("<u4", "(%d,)" % 2**62), TOKENS.tobytes()),
    "negative shape": npy_with_header(header_of("<u4", "(-1,)"), TOKENS.tobytes()),
    "negative shape, format 2.0": npy_with_header(header_of("<u4", "(-1,)"), TOKENS.tobytes(), version=2),
    "deeply nested shape": npy_with_header(header_of("<u4", "(" + "-" * 20000 + "1,)"), TOKENS.tobytes()),
    "empty dtype": npy_with_header(header_of("|S0", "(16,)"), TOKENS.tobytes()),
}


@pytest.mark.parametrize("case", HOSTILE_ARRAYS)
def test_a_hostile_npy_header_is_a_bad_sample(tmp_path, case):
    members = [m for i in range(3) for m in sample_members(i, HOSTILE_ARRAYS[case] if i == 1 else None)]
    assert_refused(foreign_phase(tmp_path, tar_bytes(members), 3), r"s001\.tokens\.npy does not decode", ["s000", "s002"])


def test_hostile_doc_lens_are_a_bad_sample(tmp_path):
    lens = npy_with_header(header_of("<i4", "(-1,)"), np.array([8, 8], np.int32).tobytes())
    members = [m for i in range(3) for m in sample_members(i, doc_lens=lens if i == 1 else None)]
    assert_refused(foreign_phase(tmp_path, tar_bytes(members), 3), r"s001\.doc_lens\.npy does not decode",
                   ["s000", "s002"])


@pytest.mark.parametrize("header", [b'[["key", "s000"]]', b'{"key": "s000", "seq_len": 16}', b'{"tokens": [7]}'])
def test_a_json_header_that_is_no_object_or_shadows_a_field_is_a_bad_sample(tmp_path, header):
    members = [m for i in range(3) for m in sample_members(i, header=header if i == 1 else None)]
    assert_refused(foreign_phase(tmp_path, tar_bytes(members), 3), r"s001\.json does not decode", ["s000", "s002"])


def test_two_damaged_json_headers_do_not_join_into_two_good_ones(tmp_path):
    halves = [b'{"seq_len": 16, "note": "', b'", "x": 1}, {"seq_len": 16, "note": "b", "x": 2}']  # one object each
    headers = [{"seq_len": 16, "note": "a", "x": 0}, *halves, {"seq_len": 16, "note": "c", "x": 3}]  # when joined
    members = [m for i in range(4) for m in sample_members(i, header=headers[i])]
    assert_refused(foreign_phase(tmp_path, tar_bytes(members), 4), r"s001\.json does not decode", ["s000", "s003"])


def test_a_non_integer_seq_len_is_a_bad_sample(tmp_path):
    members = [m for i in range(3) for m in sample_members(i, header={"seq_len": "16"} if i == 1 else None)]
    assert_refused(foreign_phase(tmp_path, tar_bytes(members), 3), r"sample s001: doc_lens \[16\] are not pieces "
                   r"of seq_len '16'", ["s000", "s002"])


def test_a_negative_member_size_ends_the_walk_instead_of_looping(tmp_path):
    data = bytearray(tar_bytes([m for i in range(2) for m in sample_members(i)]))
    field = b"-0000001000"  # int(..., 8) takes the sign: the next header would be this one again
    data[512 * 2 + 124 : 512 * 2 + 135] = field  # the second member's header
    foreign_phase(tmp_path, bytes(data), 2)
    with pytest.raises(ShardError, match=r"damaged size or checksum field in the tar header at byte 1024"):
        list(stream(tmp_path))


@pytest.mark.parametrize("at, byte", [(10, b"z"), (156, b"5")])  # a letter of the name; the type flag (a folder)
def test_a_header_that_fails_its_checksum_ends_the_walk(tmp_path, at, byte):
    data = bytearray(tar_bytes([m for i in range(3) for m in sample_members(i)]))
    header = 512 * 8  # s001.doc_lens.npy's: s000's three members and s001's tokens (a header and a block each) before
    assert data[header : header + 17] == b"s001.doc_lens.npy"
    data[header + at] = byte[0]
    foreign_phase(tmp_path, bytes(data), 3)
    with pytest.raises(ShardError, match=rf"the tar header at byte {header} fails its checksum"):
        list(stream(tmp_path))
    loader = stream(tmp_path, on_error="skip")  # s001, which the damage cut into, goes with the rest
    assert [s["key"] for s in loader] == ["s000"] and loader.skipped


def test_a_sample_with_a_member_twice_ends_the_walk(tmp_path):
    members = sample_members(0) + [("s000.tokens.npy", npy_bytes(TOKENS + 9))] + sample_members(1)[1:]
    foreign_phase(tmp_path, tar_bytes(members), 2)  # s001 has no tokens: the second s000 ones must not become its
    with pytest.raises(ShardError, match=r"sample s000 has two tokens\.npy members"):
        list(stream(tmp_path))


@pytest.mark.parametrize("form", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_a_long_name_belongs_to_its_own_member_only(tmp_path, form):
    folder = tarfile.TarInfo("d" * 120)  # a long-named folder: its name comes in an extra header
    folder.type = tarfile.DIRTYPE
    members = sample_members(0) + [(folder, None)] + sample_members(1)
    foreign_phase(tmp_path, tar_bytes(members, form), 2)
    back = list(stream(tmp_path))
    assert [(s["key"], s["i"], int(s["tokens"][0])) for s in back] == [("s000", 0, 0), ("s001", 1, 1)]


@pytest.fixture
def our_stage(tmp_path):
    folder = tmp_path / "main"
    write_run(folder, n_docs=80, per_shard=6)
    return folder


def test_an_index_with_another_sample_count_or_a_sample_twice_is_refused(our_stage, caplog):
    reference = [s["key"] for s in stream(our_stage)]

    def drop_a_key(index):
        index["keys"] = index["keys"][:-1]
        return index

    def list_a_sample_twice(index):
        numbers, offsets, sizes = index_columns(index)["json"]
        index["members"]["json"] = [[0, 0, *numbers[2:]], offsets, sizes]  # sample 1's header is sample 0's again
        return index

    for edit in (drop_a_key, list_a_sample_twice):
        folder = shutil.copytree(our_stage, our_stage.parent / edit.__name__)
        rewrite_indexes(folder, edit)
        caplog.clear()
        with caplog.at_level("WARNING"):
            assert [s["key"] for s in stream(folder)] == reference
        assert "its index does not match it" in caplog.text


def test_a_shard_with_more_samples_than_its_manifest_says_is_named(our_stage):
    manifest = read_manifest(our_stage)
    manifest["shards"][0]["samples"] -= 1  # the shard (and its index) hold one more
    (our_stage / "manifest.json").write_text(json.dumps(manifest))
    for batch_size in (None, 4):
        with pytest.raises(ShardError, match=r"shard-000000\.tar: holds more than the 5 samples the manifest lists"):
            list(stream(our_stage, batch_size=batch_size))


def test_an_index_with_a_deeply_nested_dtype_is_refused(our_stage, caplog):
    reference = [s["key"] for s in stream(our_stage)]

    def nest(index):
        suffix = next(iter(index["arrays"]))
        index["arrays"][suffix]["dtype"] = json.loads("[" * 500 + '["a", "<u4"]' + "]" * 500)
        return index

    rewrite_indexes(our_stage, nest)
    with caplog.at_level("WARNING"):
        assert [s["key"] for s in stream(our_stage)] == reference
    assert "its index does not match it" in caplog.text


def test_batches_before_a_bad_sample_come_out_before_its_error(our_stage):
    offsets = index_columns(json.loads((our_stage / "shard-000001.index.json").read_text()))["json"][1]
    damage(our_stage / "shard-000001.tar", offsets[5], b"{{{{")  # sample 11, the last of shard 1
    samples, batches = [], []
    with pytest.raises(ShardError):
        samples.extend(stream(our_stage))
    with pytest.raises(ShardError):
        batches.extend(stream(our_stage, batch_size=4))
    assert len(samples) == 11  # so batches 0-3 and 4-7 (across the two shards) are whole before the error
    assert [b["key"] for b in batches] == [[s["key"] for s in samples[i : i + 4]] for i in (0, 4)]


def test_verify_without_sha256_and_no_phase_say_what_to_do(our_stage):
    manifest = read_manifest(our_stage)
    del manifest["shards"][1]["sha256"]
    (our_stage / "manifest.json").write_text(json.dumps(manifest))
    assert len(list(stream(our_stage)))  # without verify the sha256 is not needed
    with pytest.raises(ValueError, match="verify=True, but the manifest of phase"):
        stream(our_stage, verify=True)
    with pytest.raises(ValueError, match="no phase to read"):
        stream([])


def test_a_json_header_repeating_its_own_key_reads(tmp_path):
    members = [m for i in range(3) for m in sample_members(i, header={"key": f"s{i:03d}", "seq_len": 16, "i": i})]
    foreign_phase(tmp_path, tar_bytes(members), 3)  # as WebDataset writers (img2dataset...) write it
    assert [(s["key"], s["i"]) for s in stream(tmp_path)] == [("s000", 0), ("s001", 1), ("s002", 2)]
    assert [b["key"] for b in stream(tmp_path, batch_size=3)] == [["s000", "s001", "s002"]]


def test_a_stage_without_sha256_reads_through_a_cache(tmp_path):
    from tests.test_stream import serve

    members = [m for i in range(3) for m in sample_members(i)]
    folder = foreign_phase(tmp_path / "site" / "main", tar_bytes(members), 3)
    manifest = read_manifest(folder)
    del manifest["shards"][0]["sha256"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with serve(tmp_path / "site") as url:
        assert [s["key"] for s in stream(f"{url}/main", cache_dir=str(tmp_path / "cache"))] == ["s000", "s001", "s002"]
    assert not list((tmp_path / "cache").glob("*"))  # nothing to check a cache file against: not cached
