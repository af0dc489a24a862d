"""The streaming loader: equal rank splits, seeded shuffle, exact resume, curriculum, HTTP, bad shards."""
import contextlib
import functools
import hashlib
import http.server
import json
import os
import random
import shutil
import threading
from itertools import islice

import numpy as np
import pytest

from datapipe.loader.reference import read_shards
from datapipe.loader.shardindex import ShardError
from datapipe.loader.stream import Stream, stream
from datapipe.packing.writer import write_run_manifest
from datapipe.shardformat import read_manifest
from tests.test_shards import index_columns, write_run


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stream") / "main"
    write_run(folder, n_docs=600, per_shard=9)
    return folder


@pytest.fixture
def stage_copy(stage, tmp_path):
    """A private copy to damage."""
    return shutil.copytree(stage, tmp_path / "main")


def write_run_folder(folder):
    write_run(folder, n_docs=60, per_shard=4)
    return folder


def keys(samples):
    return [sample["key"] for sample in samples]


def all_keys(folder):
    return keys(read_shards(folder))


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_rank_splits_are_equal_disjoint_and_cover(stage, world_size, shuffle):
    per_rank = [keys(stream(stage, rank, world_size, shuffle=shuffle, seed=4)) for rank in range(world_size)]
    total = read_manifest(stage)["samples"]
    assert {len(k) for k in per_rank} == {total // world_size}
    seen = [k for rank_keys in per_rank for k in rank_keys]
    assert len(seen) == len(set(seen)) == total // world_size * world_size
    assert set(seen) <= set(all_keys(stage))


@pytest.mark.parametrize("num_workers", [2, 3])
def test_workers_partition_their_rank(stage, num_workers):
    for rank in range(2):
        whole = Stream(stage, rank, 2, shuffle=True, seed=1)
        parts = [keys(whole.for_worker(w, num_workers)) for w in range(num_workers)]
        assert sorted(k for part in parts for k in part) == sorted(keys(whole))
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_shuffle_is_a_seeded_permutation_that_changes_by_epoch(stage):
    loader = stream(stage, shuffle=True, seed=7, shuffle_window=16)
    first, second = keys(loader), keys(loader)  # one iter() is one epoch
    assert first == keys(stream(stage, shuffle=True, seed=7, shuffle_window=16))
    assert first != second and sorted(first) == sorted(second) == sorted(all_keys(stage))
    assert first != keys(stream(stage, shuffle=True, seed=8, shuffle_window=16))
    assert keys(stream(stage)) == all_keys(stage)  # no shuffle: manifest order


def test_set_epoch_starts_that_epoch(stage):
    loader = stream(stage, shuffle=True, seed=7)
    loader.set_epoch(3)
    again = stream(stage, shuffle=True, seed=7)
    for _ in range(3):
        keys(again)
    assert keys(loader) == keys(again)


def resume_at(make, cut, total):
    """The samples of an uninterrupted run, but stopped after `cut`, saved, and resumed in a new loader."""
    first = make()
    head = keys(islice(iter(first), cut))
    state = json.loads(json.dumps(first.state_dict()))  # a state survives a checkpoint file
    second = make()
    second.load_state_dict(state)
    return head + keys(islice(iter(second), total - cut))


@pytest.mark.parametrize("window", [1, 7, 64, 100_000])
def test_resume_at_random_points_equals_the_uninterrupted_run(stage, window):
    def make():
        return stream(stage, shuffle=True, seed=11, shuffle_window=window, loop=True)

    epoch = len(make())
    total = 3 * epoch
    reference = keys(islice(iter(make()), total))
    cuts = {0, 1, epoch - 1, epoch, epoch + 1, min(2 * epoch + window // 2, total - 1)}  # epoch ends, in a window
    cuts |= set(random.Random(window).sample(range(total), 12))
    for cut in sorted(cuts):
        assert resume_at(make, cut, total) == reference, f"resume after {cut} samples"


@pytest.mark.parametrize("rank,world_size,worker,num_workers", [(1, 2, 0, 1), (0, 3, 1, 2), (2, 3, 2, 3)])
def test_resume_per_rank_and_worker(stage, rank, world_size, worker, num_workers):
    def make():
        return Stream(stage, rank, world_size, worker, num_workers, shuffle=True, seed=2, shuffle_window=10, loop=True)

    total = 2 * len(make()) + 3
    reference = keys(islice(iter(make()), total))
    for cut in random.Random(rank).sample(range(total), 8):
        assert resume_at(make, cut, total) == reference


def test_resume_refuses_a_state_from_another_placement(stage):
    state = stream(stage, 0, 2, shuffle=True).state_dict()
    with pytest.raises(ValueError, match="world_size=2"):
        stream(stage, 0, 1, shuffle=True).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        stream(stage, 0, 2, shuffle=True, seed=1).load_state_dict(state)


def test_bad_rank_and_options_are_refused(stage):
    with pytest.raises(ValueError, match="rank 2"):
        stream(stage, rank=2, world_size=2)
    with pytest.raises(ValueError, match="on_error"):
        stream(stage, on_error="ignore")
    with pytest.raises(ValueError, match="shuffle_window 0"):
        stream(stage, shuffle=True, shuffle_window=0)


def test_the_renamed_buffer_option_says_its_new_name_and_old_states_resume(stage):
    with pytest.raises(TypeError, match="shuffle_window="):
        stream(stage, shuffle=True, buffer=16)
    loader = stream(stage, shuffle=True, seed=3, shuffle_window=16)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    old = {**{k: v for k, v in state.items() if k != "shuffle_window"}, "buffer": 16}  # as the code before the rename saved it
    resumed = stream(stage, shuffle=True, seed=3, shuffle_window=16)
    resumed.load_state_dict(old)
    assert next(iter(resumed))["key"] == next(it)["key"]
    with pytest.raises(ValueError, match="shuffle_window=16"):
        stream(stage, shuffle=True, seed=3, shuffle_window=17).load_state_dict(old)


def write_curriculum(out, world_size_budget_factor=2.5):
    write_run(out / "short", n_docs=400, per_shard=8, stage="short", seq_len=64, seed=1)
    write_run(out / "long", n_docs=500, per_shard=8, stage="long", seq_len=128, seed=2)
    budget = int(read_manifest(out / "short")["tokens"] * world_size_budget_factor)
    write_run_manifest(out, [{"name": "short", "token_budget": budget}, {"name": "long"}], {"recipe": "t", "seed": 0})
    return budget


def test_a_run_folder_of_format_1_reads_as_before(tmp_path):
    """run.json of format 1 named the curriculum "stages" and each phase manifest its "stage"."""
    write_curriculum(tmp_path)
    expected = [s["key"] for s in stream(tmp_path, shuffle=True, seed=3)]
    run = json.loads((tmp_path / "run.json").read_text())
    run["format"], run["stages"] = "datapipe-run/1", run.pop("phases")
    (tmp_path / "run.json").write_text(json.dumps(run))
    for phase in ("short", "long"):
        manifest = read_manifest(tmp_path / phase)
        manifest["format"], manifest["stage"] = "datapipe-shards/1", manifest.pop("phase")
        (tmp_path / phase / "manifest.json").write_text(json.dumps(manifest))
    assert [s["key"] for s in stream(tmp_path, shuffle=True, seed=3)] == expected

def test_curriculum_follows_stages_in_order_with_their_budgets(tmp_path):
    budget = write_curriculum(tmp_path)
    per_rank = [list(stream(tmp_path, rank, 2, shuffle=True, seed=3)) for rank in range(2)]
    assert len(per_rank[0]) == len(per_rank[1])
    for samples in per_rank:
        stages = [s["key"].split("-")[0] for s in samples]
        switch = stages.index("long")
        assert set(stages[:switch]) == {"short"} and set(stages[switch:]) == {"long"}
        assert len(stages) - switch == read_manifest(tmp_path / "long")["samples"] // 2
    used = sum(64 - s["num_pad"] for samples in per_rank for s in samples if s["seq_len"] == 64)
    assert abs(used - budget) <= 2 * 64  # the budget, to within a sample per rank
    short = [s["key"] for s in per_rank[0] if s["seq_len"] == 64]
    assert len(short) > len(set(short))  # 2.5 budgets of data: the stage is read in several passes


def test_curriculum_resumes_exactly_across_a_stage_switch(tmp_path):
    write_curriculum(tmp_path)

    def make():
        return stream(tmp_path, 1, 2, shuffle=True, seed=5, shuffle_window=12, loop=True)

    whole = keys(islice(iter(make()), len(make())))
    switch = [k.split("-")[0] for k in whole].index("long")
    for cut in (switch - 1, switch, switch + 5, len(whole) - 1):
        assert resume_at(make, cut, len(whole) + 4) == keys(islice(iter(make()), len(whole) + 4))


@contextlib.contextmanager
def serve(folder):
    """A local HTTP server for `folder`, in a thread; yields its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join()


@pytest.fixture(scope="module")
def http_url(stage):
    with serve(stage.parent) as url:
        yield url


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def assert_same_samples(left, right):
    assert keys(left) == keys(right)
    for a, b in zip(left, right):
        assert np.array_equal(a["tokens"], b["tokens"]) and np.array_equal(a["doc_lens"], b["doc_lens"])
        assert a["doc_ids"] == b["doc_ids"]


def test_loader_over_http_equals_the_local_one(stage, http_url, tmp_path):
    local = list(stream(stage, 1, 2, shuffle=True, seed=9, verify=True))
    assert_same_samples(list(stream(f"{http_url}/main", 1, 2, shuffle=True, seed=9, verify=True)), local)
    cached = stream(f"{http_url}/main", 1, 2, shuffle=True, seed=9, cache_dir=str(tmp_path / "cache"))
    assert_same_samples(list(cached), local)
    assert len(list((tmp_path / "cache").iterdir())) >= len(read_manifest(stage)["shards"]) // 2
    cached.set_epoch(0)
    assert_same_samples(list(cached), local)  # again, from the cache


def test_remote_bad_shards_are_named_by_url(stage_copy):
    (stage_copy / "shard-000004.tar").unlink()
    damage(stage_copy / "shard-000001.tar", 700, b"\xff\xfe")
    with serve(stage_copy.parent) as url:
        with pytest.raises(ShardError, match=r"/main/shard-000001\.tar: sha256 differs"):
            list(stream(f"{url}/main", verify=True))
        with pytest.raises(ShardError, match=r"/main/shard-000001\.tar: sample \S+ differs from the digest"):
            list(stream(f"{url}/main"))
        with pytest.raises(ShardError, match=r"/main/shard-000004\.tar: shard listed in the manifest is missing"):
            list(stream(f"{url}/main", check_samples=False))


def test_missing_remote_folder_says_what_is_wrong(http_url):
    with pytest.raises(FileNotFoundError, match="neither run.json"):
        stream(f"{http_url}/nothing-here")


def damage(path, offset, data):
    with open(path, "r+b") as shard:
        shard.seek(offset)
        shard.write(data)


def test_truncated_shard_error_names_the_shard(stage_copy):
    shard = stage_copy / "shard-000003.tar"
    shard.write_bytes(shard.read_bytes()[:5000])
    with pytest.raises(ShardError, match=r"shard-000003\.tar: 5000 bytes but the manifest says"):
        list(stream(stage_copy))


def drop_indexes(folder):
    """The stage as another tool would write it: shards and a manifest, no index files."""
    manifest = read_manifest(folder)
    for shard in manifest["shards"]:
        (folder / shard.pop("index")["name"]).unlink()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_damaged_header_error_names_the_shard(stage_copy):
    damage(stage_copy / "shard-000002.tar", 512 * 7, b"\xff" * 512)
    with pytest.raises(ShardError, match=r"shard-000002\.tar: sha256 differs"):
        list(stream(stage_copy, verify=True))  # the index locates the members: the header is never read
    with pytest.raises(ShardError, match=r"shard-000002\.tar: damaged tar header"):
        list(stream(drop_indexes(stage_copy)))


def test_index_and_header_walk_give_the_same_samples(stage, tmp_path):
    indexed = list(stream(stage, shuffle=True, seed=3))
    walked = list(stream(drop_indexes(shutil.copytree(stage, tmp_path / "main")), shuffle=True, seed=3))
    assert keys(indexed) == keys(walked)
    for a, b in zip(indexed, walked):
        assert a.keys() == b.keys()
        for name, value in a.items():
            assert np.array_equal(value, b[name]) if isinstance(value, np.ndarray) else value == b[name]


def test_an_index_without_array_layouts_still_reads(stage_copy, caplog):
    """Indexes written before `arrays` was added: the loader reads the .npy headers instead."""
    manifest = read_manifest(stage_copy)
    for shard in manifest["shards"]:
        path = stage_copy / shard["index"]["name"]
        index = json.loads(path.read_text())
        assert index.pop("arrays")
        path.write_bytes(json.dumps(index).encode())
        shard["index"].update(bytes=path.stat().st_size, sha256=hashlib.sha256(path.read_bytes()).hexdigest())
    (stage_copy / "manifest.json").write_text(json.dumps(manifest))
    with caplog.at_level("WARNING"):
        assert_same_samples(list(stream(stage_copy, verify=True)), list(read_shards(stage_copy)))
    assert not caplog.text  # no index was refused: none of the shards was walked


def rewrite_indexes(folder, edit):
    """Every index file of a stage replaced by edit(index), the manifest updated to match."""
    manifest = read_manifest(folder)
    for shard in manifest["shards"]:
        path = folder / shard["index"]["name"]
        path.write_bytes(json.dumps(edit(json.loads(path.read_text()))).encode())
        shard["index"].update(bytes=path.stat().st_size, sha256=hashlib.sha256(path.read_bytes()).hexdigest())
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_a_format_1_index_of_plain_lists_still_reads(stage_copy, caplog):
    compact = [part for shard in read_manifest(stage_copy)["shards"]
               for column in json.loads((stage_copy / shard["index"]["name"]).read_text())["members"].values()
               for part in column if isinstance(part, dict)]
    assert compact  # the writer stored progressions: the rewrite below changes something
    rewrite_indexes(stage_copy, lambda index: {**index, "format": "datapipe-index/1", "members": index_columns(index)})
    with caplog.at_level("WARNING"):
        assert_same_samples(list(stream(stage_copy, verify=True)), list(read_shards(stage_copy)))
    assert not caplog.text


def test_a_progression_that_is_not_integers_refuses_the_index(stage_copy, caplog):
    def spoil(index):
        index["members"]["tokens.npy"][0] = {"start": 0, "step": 1.5, "count": 3}
        return index

    rewrite_indexes(stage_copy, spoil)
    with caplog.at_level("WARNING"):
        assert_same_samples(list(stream(stage_copy)), list(read_shards(stage_copy)))
    assert "its index does not match it (a progression" in caplog.text


def expand(part):
    return index_columns({"members": {"column": [part]}})["column"][0]


def spoil_tokens_column(part):
    def spoil(index):
        index["members"]["tokens.npy"] = part(index["members"]["tokens.npy"])
        return index
    return spoil


@pytest.mark.parametrize("edit", [
    lambda index: [index],  # not an object
    spoil_tokens_column(lambda column: []),  # a column without its three lists
    spoil_tokens_column(lambda column: column[:2]),
    spoil_tokens_column(lambda column: [{"start": 0, "step": 1, "count": 10**12}, *column[1:]]),  # 8 TB of numbers
    spoil_tokens_column(lambda column: [{"start": 2**62, "step": 2**62, "count": 10}, *column[1:]]),  # overflows
    spoil_tokens_column(lambda column: [[[n] for n in expand(column[0])], *column[1:]]),  # nested lists
    spoil_tokens_column(lambda column: [column[0], [1536.5] * len(expand(column[1])), column[2]]),  # not integers
])
def test_a_malformed_index_is_refused_and_the_shard_walked(stage_copy, caplog, edit):
    rewrite_indexes(stage_copy, edit)
    with caplog.at_level("WARNING"):
        assert_same_samples(list(stream(stage_copy)), list(read_shards(stage_copy)))
    assert "its index does not match it" in caplog.text


def test_an_index_that_does_not_match_its_shard_is_not_used(stage_copy, caplog):
    first, second = (stage_copy / f"shard-00000{i}.index.json" for i in (1, 2))
    first.write_bytes(second.read_bytes())  # another shard's index
    reference = list(read_shards(stage_copy))
    with caplog.at_level("WARNING"):
        assert_same_samples(list(stream(stage_copy)), reference)
    assert "reading a shard by its tar headers" in caplog.text and "shard-000001.index.json" in caplog.text
    manifest = read_manifest(stage_copy)
    manifest["shards"][1]["index"] = manifest["shards"][2]["index"]  # a manifest edited to match: still refused
    (stage_copy / "manifest.json").write_text(json.dumps(manifest))
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert_same_samples(list(stream(stage_copy)), reference)
    assert "shard-000001.tar: its index does not match it" in caplog.text


def test_a_missing_index_file_is_walked_around(stage_copy, caplog):
    (stage_copy / "shard-000000.index.json").unlink()  # still listed in the manifest
    with caplog.at_level("WARNING"):
        assert_same_samples(list(stream(stage_copy)), list(read_shards(stage_copy)))
    assert "reading a shard by its tar headers" in caplog.text and "shard-000000.index.json" in caplog.text


def edit_last_offset(path, suffix, new_offset, pinned=True):
    """Replace the last data offset of a column in an index file (written out as lists) by `new_offset`;
    the manifest gets the file's new size, not its sha256: as if edited in place to the same size.
    pinned=False: the manifest lists no sha256 for the index, so only its bounds can catch it."""
    index = json.loads(path.read_text())
    columns = index_columns(index)
    columns[suffix][1][-1] = int(new_offset(str(columns[suffix][1][-1])))
    path.write_text(json.dumps({**index, "members": columns}))
    manifest = read_manifest(path.parent)
    for shard in manifest["shards"]:
        if shard["index"]["name"] == path.name:
            shard["index"]["bytes"] = path.stat().st_size
            if not pinned:
                del shard["index"]["sha256"]
    (path.parent / "manifest.json").write_text(json.dumps(manifest))


def test_a_tampered_index_is_caught_by_verify_or_its_bounds(stage_copy, caplog):
    path = stage_copy / "shard-000003.index.json"
    edit_last_offset(path, "tokens.npy", lambda offset: "9" * len(offset))  # outside the shard
    assert index_columns(json.loads(path.read_text()))["tokens.npy"][1][-1] > read_manifest(stage_copy)["shards"][3]["bytes"]
    reference = list(read_shards(stage_copy))
    with caplog.at_level("WARNING"):
        assert_same_samples(list(stream(stage_copy, verify=True)), reference)
    assert "shard-000003.index.json: sha256 differs" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):  # an index's sha256 is checked by default too: it is small
        assert_same_samples(list(stream(stage_copy)), reference)
    assert "shard-000003.index.json: sha256 differs" in caplog.text
    caplog.clear()
    edit_last_offset(path, "tokens.npy", lambda offset: offset, pinned=False)
    with caplog.at_level("WARNING"):
        assert_same_samples(list(stream(stage_copy)), reference)
    assert "shard-000003.tar: its index does not match it (it points outside the shard" in caplog.text


def test_an_index_offset_off_the_tar_blocks_is_not_used(stage_copy, caplog):
    path = stage_copy / "shard-000003.index.json"
    edit_last_offset(path, "json", lambda offset: offset[:-1] + str((int(offset[-1]) + 1) % 10),  # moved < 512 bytes
                     pinned=False)
    with caplog.at_level("WARNING"):
        assert_same_samples(list(stream(stage_copy)), list(read_shards(stage_copy)))
    assert "shard-000003.tar: its index does not match it (it points outside the shard" in caplog.text


def test_a_member_that_does_not_decode_fails_only_its_sample(stage_copy):
    index = json.loads((stage_copy / "shard-000002.index.json").read_text())
    numbers, offsets, _ = index_columns(index)["json"]
    bad_key = index["keys"][numbers[2]]
    damage(stage_copy / "shard-000002.tar", offsets[2], b"{{{{")  # same size, not JSON any more
    loader = stream(stage_copy, check_samples=False)  # the decoder's own check, as for shards without digests
    got = []
    with pytest.raises(ShardError, match=rf"shard-000002\.tar: member {bad_key}\.json does not decode"):
        for sample in loader:
            got.append(sample["key"])
    assert got[-1] == index["keys"][numbers[1]]  # everything before it came
    skipping = stream(stage_copy, on_error="skip", check_samples=False)
    assert keys(skipping) == [key for key in json_keys(stage_copy) if key != bad_key]
    assert skipping.skipped == [str(stage_copy / "shard-000002.tar")]


def json_keys(folder):
    """Every sample key in manifest order, from the index files."""
    return [key for shard in read_manifest(folder)["shards"]
            for key in json.loads((folder / shard["index"]["name"]).read_text())["keys"]]


def test_verify_catches_a_flipped_byte_that_keeps_the_size(stage_copy):
    damage(stage_copy / "shard-000001.tar", 512 + 200, b"\x00\x01")  # inside the first tokens array
    assert len(list(stream(stage_copy, check_samples=False))) == read_manifest(stage_copy)["samples"]  # unnoticed
    with pytest.raises(ShardError, match=r"shard-000001\.tar: sha256 differs"):
        list(stream(stage_copy, verify=True))


def member_offset(folder, shard, suffix, number):
    """Where member `suffix` of the shard's sample `number` starts, from its index file."""
    numbers, offsets, _ = index_columns(json.loads((folder / shard.replace(".tar", ".index.json")).read_text()))[suffix]
    return offsets[numbers.index(number)]


@pytest.mark.parametrize("where", ["tokens", "tar header", "json"])
def test_a_flipped_byte_fails_its_sample_by_default(stage_copy, where):
    """Without verify: each sample's bytes (tar headers, members, padding) against the digest the writer indexed."""
    at = {"tokens": member_offset(stage_copy, "shard-000001.tar", "tokens.npy", 2) + 300,
          "tar header": member_offset(stage_copy, "shard-000001.tar", "json", 2) - 512 + 140,  # the mtime field
          "json": member_offset(stage_copy, "shard-000001.tar", "json", 2) + 2}[where]
    with open(stage_copy / "shard-000001.tar", "r+b") as shard:  # a flipped bit that leaves valid JSON
        shard.seek(at)
        byte = shard.read(1)[0]
        shard.seek(at)
        shard.write(bytes([byte ^ (1 if where != "json" else 0x20)]))  # json: '"' (0x22) becomes a '\x02'
    bad_key = json.loads((stage_copy / "shard-000001.index.json").read_text())["keys"][2]
    with pytest.raises(ShardError, match=rf"shard-000001\.tar: sample {bad_key} differs from the digest"):
        list(stream(stage_copy))
    assert keys(stream(stage_copy, on_error="skip")) == [key for key in json_keys(stage_copy) if key != bad_key]


def test_missing_shard_error_names_it(stage_copy):
    (stage_copy / "shard-000004.tar").unlink()
    with pytest.raises(ShardError, match=r"1 shard\(s\) this loader reads are missing: \S+shard-000004\.tar;"):
        next(iter(stream(stage_copy)))  # at the start, not when iteration reaches it (after 4 shards)
    skipping = stream(stage_copy, on_error="skip")
    manifest = read_manifest(stage_copy)
    assert len(keys(skipping)) == manifest["samples"] - manifest["shards"][4]["samples"]
    assert skipping.skipped == [str(stage_copy / "shard-000004.tar")]


def test_skip_policy_leaves_out_bad_shards_and_lists_them(stage_copy):
    manifest = read_manifest(stage_copy)
    (stage_copy / "shard-000003.tar").write_bytes(b"x" * 100)
    damage(stage_copy / "shard-000005.tar", 100, b"oops")
    loader = stream(stage_copy, on_error="skip", verify=True, shuffle=True)
    got = keys(loader)
    lost = manifest["shards"][3]["samples"] + manifest["shards"][5]["samples"]
    assert len(got) == len(set(got)) == manifest["samples"] - lost
    assert sorted(p.rsplit("/", 1)[1] for p in loader.skipped) == ["shard-000003.tar", "shard-000005.tar"]


def test_unfinished_run_is_not_mistaken_for_a_finished_one(tmp_path):
    from datapipe.packing.writer import ShardWriter

    samples = list(read_shards(write_run_folder(tmp_path / "done")))
    with pytest.raises(RuntimeError), ShardWriter(tmp_path / "main", 2, {}) as writer:
        for sample in samples[:5]:
            writer.write(sample)
        raise RuntimeError("the run crashed")
    with pytest.raises(FileNotFoundError, match="did not finish"):
        stream(tmp_path / "main")


def test_buffer_pool_reuses_a_buffer_only_when_no_sample_views_it():
    from datapipe.loader.fetch import BufferPool

    pool = BufferPool(keep=2)
    first = pool.take(1000)
    tokens = first[512:].view(np.uint32)  # what a sample holds: a view of a view
    del first
    second = pool.take(1000)
    assert not np.shares_memory(tokens, second)  # still viewed: not handed out again
    del tokens
    assert np.shares_memory(pool.take(800), pool.buffers[0])  # free again: reused


@pytest.mark.parametrize("last_warm", [False, True])  # the previous shard came from the page cache, or not
@pytest.mark.parametrize("nowait", [True, False])  # False: a system or file system without RWF_NOWAIT
@pytest.mark.parametrize("cached", ["all", "none", "start"])
def test_a_shard_reads_whole_whatever_the_page_cache_holds(tmp_path, monkeypatch, cached, nowait, last_warm):
    from datapipe.loader import fetch

    monkeypatch.setattr(fetch, "NOWAIT", fetch.NOWAIT and nowait)
    data = np.random.default_rng(0).integers(0, 256, 5 * fetch.READ_CHUNK + 123, dtype=np.uint8).tobytes()
    path = tmp_path / "shard.tar"
    path.write_bytes(data)
    with open(path, "rb") as file:
        os.fsync(file.fileno())  # the kernel drops clean pages only
        if cached != "all":  # "start": the first two chunks stay in the page cache, the rest is read from disk
            os.posix_fadvise(file.fileno(), 2 * fetch.READ_CHUNK if cached == "start" else 0, 0,
                             os.POSIX_FADV_DONTNEED)
    pool = fetch.BufferPool(keep=1)
    pool.warm = last_warm
    assert fetch.read_local(path, pool).tobytes() == data


def cached_shard(tmp_path) -> tuple:
    from datapipe.loader import fetch

    if fetch.load_mincore() is None:
        pytest.skip("no mincore here: shards are read, never mapped")
    data = np.random.default_rng(1).integers(0, 256, 3 * fetch.READ_CHUNK + 77, dtype=np.uint8).tobytes()
    path = tmp_path / "shard.tar"
    path.write_bytes(data)
    return fetch, path, data


def test_a_shard_in_the_page_cache_is_mapped_and_writes_never_reach_the_file(tmp_path):
    import mmap

    fetch, path, data = cached_shard(tmp_path)
    pool = fetch.BufferPool(keep=1)
    array = fetch.read_local(path, pool, mapped=True)
    assert isinstance(array.base.obj, mmap.mmap) and not pool.buffers and pool.warm
    assert array.tobytes() == data and array.flags.writeable
    array[: fetch.PAGE + 1] ^= 0xFF  # a trainer writing into a sample's tokens: its own copy of the page
    assert path.read_bytes() == data and array[0] == data[0] ^ 0xFF
    assert fetch.read_local(path, pool).base is not None and pool.buffers  # mapped=False: read into the pool


def test_mappings_held_at_once_are_capped_so_descriptors_never_run_out(tmp_path, monkeypatch):
    import gc
    import mmap

    fetch, path, data = cached_shard(tmp_path)
    monkeypatch.setattr(fetch, "MAX_MAPPED", len(fetch.MAPPED) + 2)
    opened = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    held = [fetch.read_local(path, mapped=True) for _ in range(3)]  # samples a consumer keeps
    assert [isinstance(getattr(a.base, "obj", None), mmap.mmap) for a in held] == [True, True, False]
    if opened is not None:  # each mapping keeps one descriptor, the read shard none
        assert len(os.listdir("/proc/self/fd")) == opened + 2
    assert all(a.tobytes() == data for a in held)
    del held[0]
    gc.collect()
    assert isinstance(fetch.read_local(path, mapped=True).base.obj, mmap.mmap)  # one freed: mapped again


@pytest.mark.parametrize("mapped", [False, True])  # False: the whole file leaves the page cache; True: its last third
def test_a_shard_out_of_the_page_cache_is_read_and_one_mostly_in_is_mapped(tmp_path, mapped):
    import mmap

    fetch, path, data = cached_shard(tmp_path)
    with open(path, "rb") as file:
        os.fsync(file.fileno())  # the kernel drops clean pages only
        os.posix_fadvise(file.fileno(), 2 * fetch.READ_CHUNK if mapped else 0, 0,
                         os.POSIX_FADV_DONTNEED)
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapping:  # did the pages leave memory?
            resident = fetch.resident_share(np.frombuffer(mapping, dtype=np.uint8))
    if resident == 1:
        pytest.skip("this file system keeps every page in memory (tmpfs): nothing to tell apart")
    array = fetch.read_local(path, fetch.BufferPool(keep=1), mapped=True)
    assert isinstance(getattr(array.base, "obj", None), mmap.mmap) == mapped and array.tobytes() == data


def test_mapped_and_read_shards_give_the_same_samples(stage):
    mapped, read = list(stream(stage, shuffle=True, seed=5)), list(stream(stage, shuffle=True, seed=5, mmap=False))
    assert [s["key"] for s in mapped] == [s["key"] for s in read] and len(read) > 0
    for a, b in zip(mapped, read):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) if isinstance(a[k], np.ndarray) else a[k] == b[k]
                                            for k in a)


def test_a_warm_shard_comes_from_the_page_cache_in_one_go(tmp_path):
    from datapipe.loader import fetch

    if not fetch.NOWAIT:
        pytest.skip("this system has no RWF_NOWAIT: every shard is read in chunks")
    path = tmp_path / "shard.tar"
    path.write_bytes(bytes(range(256)) * (3 * fetch.READ_CHUNK // 256 + 7))
    view = memoryview(bytearray(path.stat().st_size))
    with open(path, "rb") as file:
        try:
            os.preadv(file.fileno(), [view[:1]], 0, os.RWF_NOWAIT)
        except OSError as err:
            pytest.skip(f"this file system refuses RWF_NOWAIT reads ({err}): shards are read in chunks")
        assert fetch.cached_part(file.fileno(), view, fetch.READ_CHUNK) == len(view)
    assert view.tobytes() == path.read_bytes()


def test_position_ids_reuse_a_few_buffers_while_samples_are_let_go(stage, monkeypatch):
    """Made a chunk at a time (2 rows here), a span's position ids live in a few pooled buffers
    the loader hands out again once the samples viewing them are gone, however long the span."""
    assert_positions_pooled(stage, monkeypatch, {})


def assert_positions_pooled(folder, monkeypatch, options):
    """Every item's position ids lie in one of the few buffers of the loader's pool."""
    from datapipe.loader import positions

    monkeypatch.setattr(positions, "CHUNK_BYTES", 2 * 4 * 128)
    loader, count = stream(folder, prefetch=1, **options), 0
    for count, item in enumerate(loader, 1):  # noqa: B007 - counted
        base = item["position_ids"].base
        assert any(base is kept for kept in loader.position_pool.buffers)  # one of the pool's few, not a fresh one
    assert count > loader.position_pool.keep  # more chunks or batches than the pool keeps buffers


def test_samples_kept_across_epochs_stay_intact(stage):
    loader = stream(stage, shuffle=True, seed=2, prefetch=1)
    kept = [s for _ in range(3) for s in loader]  # three epochs held at once: every buffer stays referenced
    reference = {s["key"]: s for s in read_shards(stage)}
    for sample in kept:
        assert np.array_equal(sample["tokens"], reference[sample["key"]]["tokens"])


PINNED_ORDER = [9, 4, 6, 7, 0, 2, 8, 5, 3, 1]
MASK64 = (1 << 64) - 1


def splitmix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def reference_permutation(n: int, key: list[int]) -> list[int]:
    """The documented algorithm in plain Python ints: no NumPy, so no shared bug with the code under test."""
    text = ",".join(str(k) for k in key)
    base = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
    hashes = [splitmix64((item * 0x9E3779B97F4A7C15 + base) & MASK64) for item in range(n)]
    return sorted(range(n), key=hashes.__getitem__)  # sorted() is stable, like argsort(kind="stable")


def test_shuffle_order_is_pinned_across_library_versions():
    from datapipe.loader.schedule import permutation

    order = permutation(10, [0, 1, 2, 3])  # fixed in code, not by NumPy's Generator: a resume after an upgrade agrees
    assert sorted(order.tolist()) == list(range(10))
    assert order.tolist() == PINNED_ORDER
    assert reference_permutation(10, [0, 1, 2, 3]) == PINNED_ORDER


@pytest.mark.parametrize("key", [[0, 1, 2, 3], [7], [2**40, 3, 0, 1, 5, 2, 9], []])
@pytest.mark.parametrize("n", [1, 2, 10, 1000])
def test_permutation_matches_a_plain_python_splitmix64_sort(n, key):
    from datapipe.loader.schedule import permutation

    assert permutation(n, key).tolist() == reference_permutation(n, key)


def test_a_protocol_without_its_package_says_what_to_install():
    pytest.importorskip("fsspec")
    try:
        import s3fs  # noqa: F401

        pytest.skip("s3fs is installed: nothing to report")
    except ImportError:
        pass
    with pytest.raises(ImportError, match="pip install s3fs"):
        stream("s3://bucket/run")


def test_damaged_doc_lens_fail_only_their_sample(stage_copy):
    index = json.loads((stage_copy / "shard-000002.index.json").read_text())
    numbers, offsets, _ = index_columns(index)["doc_lens.npy"]
    bad_key = index["keys"][numbers[1]]
    header = index["arrays"]["doc_lens.npy"]["header"]
    damage(stage_copy / "shard-000002.tar", offsets[1] + header, np.int32(10**6).tobytes())  # same size
    with pytest.raises(ShardError, match=rf"shard-000002\.tar: sample {bad_key}: doc_lens .* are not pieces"):
        list(stream(stage_copy, check_samples=False))  # the decoder's own check, as for shards without digests
    assert keys(stream(stage_copy, on_error="skip")) == [key for key in json_keys(stage_copy) if key != bad_key]


def test_loop_over_an_empty_share_ends_instead_of_spinning(stage):
    samples = read_manifest(stage)["samples"]
    loader = Stream(stage, world_size=samples, rank=0, worker=0, num_workers=2, loop=True)  # one sample: worker 1 has it
    assert len(loader) == 0 and list(loader) == []


def test_cache_writes_of_one_shard_from_two_threads_do_not_collide(tmp_path):
    from datapipe.loader.fetch import write_cache

    target = tmp_path / "cache" / "shard.tar"
    errors = []

    def write(payload):
        try:
            for _ in range(200):
                write_cache(target, payload)
        except OSError as err:
            errors.append(err)

    threads = [threading.Thread(target=write, args=(bytes([i]) * 4096,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and target.read_bytes() in (b"\x00" * 4096, b"\x01" * 4096)


def test_fields_without_the_json_header_still_check_doc_lens_and_derive_positions(tmp_path):
    from datapipe.packing.writer import ShardWriter
    from datapipe.shardformat import derive_position_ids

    def sample(i, seq_len, lens):
        return {"key": f"s-{i:03d}", "tokens": np.arange(seq_len, dtype=np.uint32), "seq_len": seq_len,
                "doc_lens": np.array(lens, np.int32), "doc_ids": ["d"] * len(lens), "num_pad": seq_len - sum(lens)}

    def write(folder, samples):
        with ShardWriter(folder, 10, {"stage": "main", "seq_len": 64}) as writer:
            for s in samples:
                writer.write(s)

    mixed = [sample(0, 64, [30, 34]), sample(1, 32, [10, 20]), sample(2, 64, [64])]  # two lengths: no shared rows
    write(tmp_path / "mixed", mixed)
    for fields in (None, ("tokens", "doc_lens")):
        back = list(stream(tmp_path / "mixed", fields=fields))
        assert [s["key"] for s in back] == ["s-000", "s-001", "s-002"]
        for got, want in zip(back, mixed):
            assert np.array_equal(got["position_ids"], derive_position_ids(want["doc_lens"], want["seq_len"]))
    write(tmp_path / "damaged", [sample(0, 64, [30, 34]), sample(1, 64, [40, 40]), sample(2, 64, [64])])
    for fields in (None, ("tokens", "doc_lens")):  # 80 tokens of documents in a 64-token sample
        with pytest.raises(ShardError, match=r"sample s-001: doc_lens \[40, 40\] are not pieces of seq_len 64"):
            list(stream(tmp_path / "damaged", fields=fields))
        assert [s["key"] for s in stream(tmp_path / "damaged", fields=fields, on_error="skip")] == ["s-000", "s-002"]


def test_stages_that_give_no_sample_are_passed_over(tmp_path):
    write_curriculum(tmp_path)
    from datapipe.packing.writer import ShardWriter

    with ShardWriter(tmp_path / "empty", 8, {"stage": "empty", "seq_len": 96}):
        pass  # a stage that packed nothing: every document longer than seq_len, dropped
    stages = [{"name": "short", "token_budget": 0}, {"name": "empty"}, {"name": "long"}]
    write_run_manifest(tmp_path, stages, {"recipe": "t", "seed": 0})
    only_long = [s["key"] for s in stream(tmp_path / "long", 1, 2)]
    for options in ({}, {"shuffle": True, "seed": 1}, {"batch_size": 3}):
        loader = stream(tmp_path, 1, 2, **options)
        items = list(loader)
        assert len(items) == len(loader)
        keys_ = [k for b in items for k in b["key"]] if "batch_size" in options else [s["key"] for s in items]
        if options.get("shuffle"):  # the shard order is keyed by the stage's place in the run: another share
            assert len(keys_) == len(only_long) and all(k.startswith("long-") for k in keys_)
        else:
            assert keys_ == only_long
    write_run_manifest(tmp_path, [{"name": "short", "token_budget": 20}], {"recipe": "t", "seed": 0})
    assert len(stream(tmp_path, 0, 4)) == 0 == len(list(stream(tmp_path, 0, 4)))  # 20 tokens: under a sample a rank


def test_a_stage_replaced_at_its_url_is_not_read_from_the_old_cache(tmp_path):
    site, cache = tmp_path / "site", str(tmp_path / "cache")
    write_run(site / "main", n_docs=120, per_shard=6, seed=1)
    with serve(site) as url:
        assert len(list(stream(f"{url}/main", cache_dir=cache)))  # fills the cache
        shutil.rmtree(site / "main")
        write_run(site / "main", n_docs=120, per_shard=6, seed=2)  # a new version, at the same URLs
        drop_indexes(site / "main")  # and read by its tar headers: nothing but the cache tells the versions apart
        assert_same_samples(list(stream(f"{url}/main", cache_dir=cache)), list(stream(site / "main")))


def test_a_cache_dir_that_cannot_be_written_is_logged_and_passed_over(stage, http_url, tmp_path, caplog):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    with caplog.at_level("WARNING"):
        assert_same_samples(list(stream(f"{http_url}/main", cache_dir=str(blocked))), list(stream(stage)))
    assert "cannot be written" in caplog.text and not list(tmp_path.glob(".*.tmp"))


def test_file_urls_with_and_without_localhost(stage):
    reference = keys(stream(stage))
    assert keys(stream(f"file://{stage}")) == keys(stream(f"file://localhost{stage}")) == reference
    odd = shutil.copytree(stage, stage.parent / "odd#50%25")  # taken as it stands, as fsspec does
    assert keys(stream(f"file://{odd}")) == reference
