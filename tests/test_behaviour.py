"""Refactoring keeps behaviour: shipped recipes give the samples an earlier commit wrote, member for member.

tests/golden/recipes.json holds, per run and phase, a digest of every tar member's name
and bytes (json members re-serialized with sorted keys, so that the header padding is not
compared), and the run's accounting, as written before the layout change of issue 17 (commit
c9872c3) and, for the phases its _comment names, since a change that meant to alter them. Each
run here is a fresh `datapipe run` process, as a user starts it. A change that means to alter
the samples (a new packing rule, a new tokenizer) updates the golden file and says why.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = json.loads((ROOT / "tests/golden/recipes.json").read_text())["runs"]
ACCOUNTING = ("records_in", "created", "written", "rejected", "tokens")


def phase_digests(out: Path) -> dict[str, dict]:
    """Per phase of a finished run: its sample count and one sha256 over its members in shard order."""
    run = json.loads((out / "run.json").read_text())
    digests = {}
    for entry in run.get("phases") or run["stages"]:
        folder = out / entry["name"]
        digest, keys = hashlib.sha256(), set()
        for shard in json.loads((folder / "manifest.json").read_text())["shards"]:
            with tarfile.open(folder / shard["name"]) as tar:
                for member in tar:
                    data = tar.extractfile(member).read()
                    if member.name.endswith(".json"):
                        data = json.dumps(json.loads(data), sort_keys=True).encode()
                    digest.update(member.name.encode() + b"\0" + hashlib.sha256(data).digest())
                    keys.add(member.name.split(".", 1)[0])
        digests[entry["name"]] = {"samples": len(keys), "sha256": digest.hexdigest()}
    return digests


@pytest.mark.slow
@pytest.mark.parametrize("run", sorted(GOLDEN))
def test_shipped_recipes_write_the_samples_they_wrote_before(run, tmp_path):
    out = tmp_path / run
    command = [sys.executable, "-m", "datapipe.cli", "run", *GOLDEN[run]["args"], "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert phase_digests(out) == GOLDEN[run]["phases"]
    stats = json.loads((out / "stats.json").read_text())
    assert {key: stats[key] for key in ACCOUNTING} == GOLDEN[run]["stats"]
