"""A full disk: the write that failed is named with its bytes, temporaries go, the CLI exits 3 with one line.

The disk is a real one: a tmpfs of a few hundred KB mounted for the test (root only; skipped otherwise).
"""
import contextlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from datapipe.packing.writer import ShardWriter
from datapipe.storage import DiskFull, Store

REPO = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def small_disk(folder: Path, size: str):
    """A tmpfs of `size` mounted at `folder` while the block runs."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def hidden_files(folder: Path) -> list[Path]:
    return [path for path in folder.rglob(".*") if path.is_file()]


def test_a_write_that_does_not_fit_names_its_path_and_size_and_leaves_nothing(tmp_path):
    with small_disk(tmp_path / "disk", "64k") as disk:
        store = Store(disk / "run")
        store.write_bytes("small.json", b"{}")
        with pytest.raises(DiskFull, match=r"big\.bin: no space left on the device \(writing 1,048,576 bytes"):
            store.write_bytes("big.bin", bytes(1 << 20))
        assert store.list() == ["small.json"] and not hidden_files(disk)


def test_a_shard_that_does_not_fit_is_removed(tmp_path):
    sample = {"tokens": np.arange(4096, dtype=np.uint32), "doc_lens": np.array([4096], dtype=np.int32),
              "doc_ids": ["web/1"], "seq_len": 4096, "num_pad": 0}
    with small_disk(tmp_path / "disk", "128k") as disk:
        writer = ShardWriter(disk / "main", samples_per_shard=1000, info={"phase": "main"})
        with pytest.raises(DiskFull, match=r"\.shard-000000\.tar\.tmp: no space left on the device \(writing 16,388 "):
            with writer:
                for index in range(100):  # 1.6 MB into 128 KB
                    writer.write({**sample, "key": f"main-{index:09d}"})
        assert not list((disk / "main").iterdir())  # no partial shard, no manifest: nothing a reader could take


@pytest.mark.slow
def test_a_run_into_a_full_disk_exits_3_with_one_line(tmp_path):
    with small_disk(tmp_path / "disk", "1m") as disk:
        run = subprocess.run([sys.executable, "-m", "datapipe.cli", "run", str(REPO / "recipes" / "quickstart.yaml"),
                              "--out", str(disk / "demo")], capture_output=True, text=True, cwd=REPO, timeout=600)
        assert run.returncode == 3, run.stderr[-3000:]
        errors = [line for line in run.stderr.splitlines() if "error" in line.lower()]
        assert len(errors) == 1 and "Traceback" not in run.stderr, run.stderr[-3000:]
        assert f"{disk}/demo/" in errors[0] and "no space left on the device (writing " in errors[0]
        assert not hidden_files(disk) and not (disk / "demo" / "run.json").exists()  # unfinished, as a reader sees
