"""datapipe.storage.Store: files appear whole, temporaries stay hidden, local paths and file:// URLs alike."""
import pickle

import pytest

from datapipe.storage import Store, is_url, local_path


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
