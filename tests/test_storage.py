"""datapipe.storage: a Store's files appear whole and temporaries stay hidden, local paths, file:// URLs and
S3 (a real server, tests/s3server.py) alike; inputs are listed and opened the same way locally and on S3."""
import gzip
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from datapipe import cli
from datapipe.pipeline.inspect import read_rejects
from datapipe.storage import (
    Store,
    filesystem,
    folder_inputs,
    glob_inputs,
    input_exists,
    is_folder,
    is_pattern,
    is_url,
    join_location,
    local_path,
    open_input,
    parent_of,
    probe,
)
from tests.conftest import WORDS, tiny_recipe

ROOT = Path(__file__).resolve().parent.parent


def test_local_store_writes_whole_files_and_lists_no_temporaries(tmp_path):
    store = Store(tmp_path / "run")
    store.write_bytes("a/b.json", b"{}")
    (tmp_path / "run" / "a" / ".c.json.1234.tmp").write_bytes(b"half")
    assert store.read_bytes("a/b.json") == b"{}" and store.exists("a/b.json") and not store.exists("a/x")
    assert store.list("a") == ["b.json"] and store.list("missing") == []
    assert store.read_text("nothing") is None
    assert [p.name for p in (tmp_path / "run" / "a").iterdir() if p.name.endswith(".tmp")] == [".c.json.1234.tmp"]


def test_put_moves_a_finished_file_into_place(tmp_path):
    store = Store(f"file://{tmp_path}/run")
    source = tmp_path / ".shard.tar.tmp"
    source.write_bytes(b"tar bytes")
    store.put(source, "main/shard-0.tar")
    assert not source.exists() and (tmp_path / "run" / "main" / "shard-0.tar").read_bytes() == b"tar bytes"
    store.remove("main")
    assert not (tmp_path / "run" / "main").exists()
    store.remove("main")  # nothing there: no error


def test_stores_pickle_and_tell_local_from_remote(tmp_path):
    store = pickle.loads(pickle.dumps(Store(tmp_path)))
    assert store.local() == tmp_path and not store.remote
    assert is_url("s3://bucket/x") and not is_url("file:///x") and not is_url("/x") and not is_url("C:/x")
    assert local_path("file:///data/x") == "/data/x" and local_path("file://localhost/data") == "/data"
    with pytest.raises(OSError, match="no filesystem for nosuchproto"):
        _ = Store("nosuchproto://bucket/run").fs


def test_a_store_on_s3_writes_reads_lists_and_removes(s3, tmp_path):
    store = pickle.loads(pickle.dumps(Store(f"{s3}/run/")))
    assert store.remote and store.local() is None and store.path("a", "b.json") == f"{s3}/run/a/b.json"
    store.write_bytes("a/b.json", b"{}")
    store.write_bytes("a/.c.json.1234.tmp", b"half")  # a temporary another writer left: never listed
    assert store.read_bytes("a/b.json") == b"{}" and store.exists("a/b.json") and not store.exists("a/x")
    assert store.list("a") == ["b.json"] and store.list("missing") == [] and store.read_text("nothing") is None
    with store.open("a/b.json") as stream:
        assert stream.read() == b"{}"
    shard = tmp_path / ".shard.tar.tmp"
    shard.write_bytes(b"tar bytes")
    store.put(shard, "main/shard-0.tar")
    assert not shard.exists() and store.child("main").list() == ["shard-0.tar"]
    assert store.child("main").read_text("shard-0.tar") == "tar bytes"
    store.remove("main")
    assert not store.exists("main/shard-0.tar") and store.list() == ["a"]
    store.remove("main")  # nothing there: no error
    store.remove("a/b.json")
    assert store.list("a") == []


def test_inputs_on_s3_are_listed_and_opened_like_local_files(s3):
    fs = filesystem(s3)
    for name in ["data/a.jsonl", "data/sub/b.jsonl", "data/.c.jsonl.tmp", "data/d.txt"]:
        fs.pipe_file(f"{s3}/{name}", name.encode())
    assert glob_inputs(f"{s3}/data/**/*.jsonl") == [f"{s3}/data/a.jsonl", f"{s3}/data/sub/b.jsonl"]
    assert folder_inputs(f"{s3}/data/") == [f"{s3}/data/{name}" for name in ("a.jsonl", "d.txt", "sub/b.jsonl")]
    assert is_folder(f"{s3}/data") and not is_folder(f"{s3}/data/a.jsonl") and not is_pattern("https://x.org/a?b=1")
    assert input_exists(f"{s3}/data/a.jsonl") and not input_exists(f"{s3}/data/gone.jsonl")
    with open_input(f"{s3}/data/sub/b.jsonl") as stream:
        assert stream.read() == b"data/sub/b.jsonl"
    with pytest.raises(FileNotFoundError, match=f"{s3}/data/gone.jsonl"):
        open_input(f"{s3}/data/gone.jsonl")
    probe(f"{s3}/nothing/*.jsonl")  # the bucket lists: a glob that matches nothing there is a wrong path, not this
    with pytest.raises(FileNotFoundError, match="bucket does not exist"):
        probe("s3://no-such-bucket-datapipe/*.jsonl")


def test_remote_manifest_rows_stay_in_their_bucket():
    assert join_location("s3://b/site", "icons/x.svg") == "s3://b/site/icons/x.svg"
    assert join_location("s3://b/site", "../../../x.svg") == "s3://b/x.svg"
    assert join_location("s3://b/site", "/etc/passwd") == "s3://b/etc/passwd"
    assert join_location("s3://b/site", "file:///etc/passwd") == "s3://b/etc/passwd"
    assert join_location("s3://b/site", "gs://other/y.svg") == "gs://other/y.svg"
    assert join_location("/data/site", "icons/x.svg") == "/data/site/icons/x.svg"
    assert parent_of("s3://b/site/m.jsonl") == "s3://b/site"


@pytest.mark.slow
def test_a_recipe_on_s3_runs_end_to_end_and_its_s3_output_equals_the_local_one(s3, tmp_path, tiny_tokenizer):
    """`datapipe run` as a user starts it, a fresh process whose Ray workers read S3 with the credentials
    and endpoint of its environment; once with a local --out, once with --out s3://...: there the
    workers write pieces, shards and markers, the shards are the local run's byte for byte, and
    datapipe.stream reads them from the bucket."""
    import datapipe

    fs = filesystem(s3)
    rows = [{"id": f"d{i}", "text": " ".join(WORDS[i % 5:]) * 2} for i in range(12)]
    fs.pipe_file(f"{s3}/web/part-0.jsonl", "".join(json.dumps(row) + "\n" for row in rows[:6]).encode())
    fs.pipe_file(f"{s3}/web/part-1.jsonl.gz", gzip.compress("".join(json.dumps(r) + "\n" for r in rows[6:]).encode()))
    fs.pipe_file(f"{s3}/pages/a.html", b"<html><body><p>a page on object storage</p></body></html>")
    recipe = tiny_recipe(tmp_path, tiny_tokenizer, [
        {"name": "web", "type": "jsonl", "paths": [f"{s3}/web/*.jsonl*", f"{s3}/web/gone.jsonl"], "id_field": "id"},
        {"name": "pages", "type": "files", "paths": [f"{s3}/pages/"]},
        {"name": "code", "type": "python_programs", "count": 20}])
    out = tmp_path / "out"
    for where in (str(out), f"{s3}/run"):
        done = subprocess.run([sys.executable, "-m", "datapipe.cli", "run", str(recipe), "--out", where], cwd=ROOT,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    stats = json.loads((out / "stats.json").read_text())
    assert stats["records_in"] == {"web": 13, "pages": 1, "code": 20} and stats["rejected"] == {"read.missing_file": 1}
    assert stats["written"] == {"web": 12, "pages": 1, "code": 20} and stats["balanced"]
    [reject] = list(read_rejects(out))
    assert reject["source_id"] == f"{s3}/web/gone.jsonl"
    local = sorted(p.name for p in (out / "main").iterdir())
    assert sorted(name.rsplit("/", 1)[-1] for name in fs.ls(f"{s3}/run/main")) == local
    for name in local:
        assert fs.cat_file(f"{s3}/run/main/{name}") == (out / "main" / name).read_bytes(), name
    assert not fs.exists(f"{s3}/run/_work") and fs.exists(f"{s3}/run/run.json")
    remote = [sample["key"] for sample in datapipe.stream(f"{s3}/run", shuffle=True, seed=1)]
    assert remote == [sample["key"] for sample in datapipe.stream(out, shuffle=True, seed=1)]
    trained = tmp_path / "tok"  # `datapipe tokenizer train` reads the same recipe's sources, in this process
    assert cli.main(["tokenizer", "train", str(recipe), "--vocab-size", "300", "--out", str(trained)]) == 0
    assert (trained / "tokenizer.json").exists()
