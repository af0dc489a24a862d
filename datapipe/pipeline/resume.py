"""The run's folder across attempts: what a rerun reuses, and what it must refuse.

    out/recipe.json   the validated recipe, written when a run starts
    out/_work/        what the attempts committed (plan.json: the partitions as first listed;
                      partitions/, parts/, phases/, accounts/, stages/); removed once the run is finished
    out/<phase>/      shards, each phase's manifest.json written when all its groups are
    out/run.json      written last: the run is finished

Rerunning the same command after a kill does only the missing work: committed partitions, pack
groups and accounts are read back from their markers, the rest is done again (deterministic, so
the shards are byte-identical to an uninterrupted run's). A rerun over a finished run reports it.
A different recipe or seed (the recipe without its description and Ray settings, which change no
output) is refused, and so are inputs listed differently than when the run began. `--restart`
starts over; over a finished run it writes beside it (`<out>.restart`) and replaces it only once
the new run is committed, so a kill during a restart never loses the finished output.
"""
from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import dataclass
from typing import Any

from datapipe.pipeline.recipe import Recipe, RecipeError
from datapipe.shardformat import RUN_MANIFEST
from datapipe.storage import Store, remove_temporaries

RECIPE = "recipe.json"
WORK = "_work"
PLAN = "plan.json"
COSMETIC = {"description", "ray", "base_dir"}  # recipe keys that change no output


@dataclass
class RunFolder:
    out: Store  # where the finished run lives
    target: Store  # where this attempt writes: `out`, or a folder beside it when restarting over a finished run
    finished: bool  # `out` holds this recipe's finished run: nothing to do
    restart: bool = False  # what an earlier attempt left in `target` is dropped when this one begins
    recipe: bytes = b""  # the validated recipe, written to recipe.json when the run begins

    @property
    def work(self) -> Store:
        return self.target.child(WORK)

    def resumes(self, plan: list[dict[str, Any]]) -> bool:
        """True when an earlier attempt began this run (its work is kept and reused); reads only. The
        partitions as listed now must be those it began with (their numbers name its files)."""
        stored = None if self.restart else self.work.read_text(PLAN)
        if stored is not None and json.loads(stored) != plan:
            raise RecipeError(f"{self.out.location}: the inputs are not those the unfinished run began with (files "
                              "added, removed or listed in another order); rerun with --restart to start over")
        return stored is not None

    def begin(self, plan: list[dict[str, Any]]) -> None:
        """The attempt's first write, once every check has passed."""
        if self.restart:
            self.target.remove("")
        remove_temporaries(self.target.location)  # a killed attempt's half-written files (a rejects file's .tmp)
        self.target.write_bytes(RECIPE, self.recipe)
        if self.work.read_text(PLAN) is None:
            self.work.write_bytes(PLAN, json.dumps(plan).encode())

    def finish(self) -> None:
        """The run is committed: drop its work files; a restart's output replaces the old run."""
        self.work.remove("")
        if self.target.location != self.out.location:
            replace_folder(self.target, self.out)


def open_run(out: Store, recipe: Recipe, restart: bool = False) -> RunFolder:
    """The run folder for this recipe, or a RecipeError that says why it cannot be used; writes nothing
    (RunFolder.begin does, once every check has passed)."""
    stored = out.read_text(RECIPE)
    if stored is None and out.list():
        raise RecipeError(f"{out.location} is not empty and was not written by datapipe; pass a new or empty --out")
    if stored is not None and not restart and fingerprint(json.loads(stored)) != fingerprint(recipe_dump(recipe)):
        changed = ", ".join(differences(json.loads(stored), recipe_dump(recipe))) or "its format"
        raise RecipeError(f"{out.location} holds a run of another recipe or seed (it differs in: {changed}); "
                          "rerun with --restart to replace it (the finished run stays until the new one is "
                          "committed), or pass another --out")
    finished = stored is not None and out.exists(RUN_MANIFEST)
    target = Store(f"{out.location}.restart") if restart and finished else out
    return RunFolder(out, target, finished and not restart, restart, recipe.model_dump_json(indent=2).encode())


def recipe_dump(recipe: Recipe) -> dict[str, Any]:
    return json.loads(recipe.model_dump_json())


def fingerprint(dump: dict[str, Any]) -> str:
    kept = {key: value for key, value in dump.items() if key not in COSMETIC}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return sorted(key for key in {*old, *new} - COSMETIC if old.get(key) != new.get(key))


def replace_folder(new: Store, old: Store) -> None:
    """`old`'s content becomes `new`'s: two renames on a local filesystem (the old run is kept until
    the new one is in place); on an object store, the old objects removed and the new ones copied."""
    if new.local() and old.local():
        aside = old.local().with_name(f".{old.local().name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(old.local(), aside)
        os.replace(new.local(), old.local())
        Store(aside).remove("")
        return
    old.remove("")
    new.fs.copy(new.path(""), old.path(""), recursive=True)
    new.remove("")
