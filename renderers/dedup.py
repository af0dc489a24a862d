"""The render_dedup stage: reject exact and near-duplicate renders, globally and deterministically.

A render is a near-duplicate when the dHash of its first image is within `max_distance` bits
(of 256) of an earlier kept render's: the same icon drawn twice (feather and lucide share
~130 of their first 2,000), a page that only changed an id. The index splits each hash into max_distance + 1 bands; by pigeonhole two
hashes that close agree on at least one whole band, so a lookup reads a few buckets instead of
every hash, and nothing within the distance is missed.

Global, and so deterministic: the stage is one actor (concurrency 1) fed in stream order
(the runner preserves order), so the first render of a group in input order is kept and the
later ones are rejected with notes["render_dedup"]["duplicate_of"], whatever the number of render actors.
Per-actor indexes would depend on which actor got which batch, and miss cross-actor copies.
Its cost is a few microseconds a record; 10 million hashes take ~2 GB.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from pydantic import Field, field_validator

from datapipe.schema import Document
from datapipe.stage import StageConfig
from renderers.gates import hamming


class Config(StageConfig):
    actor: ClassVar[bool] = True

    max_distance: int = Field(2, ge=0, le=63)  # bits of 256; 4 already joins folder-up with folder-down
    num_cpus: float | None = Field(0.1, gt=0)  # microseconds a record: it must not hold a core the renderers need
    concurrency: int | tuple[int, int] | None = 1  # one actor, never sized to the cluster: see the module docstring

    @field_validator("concurrency")
    @classmethod
    def _one_actor(cls, value: int | tuple[int, int] | None) -> int:
        if value not in (None, 1, (1, 1)):
            raise ValueError("render_dedup runs as one actor so that it is global and deterministic; drop concurrency")
        return 1


class HashIndex:
    """Hashes kept so far, bucketed by band, with the id of the document that owns each."""

    def __init__(self, max_distance: int, bits: int = 256):
        self.max_distance = max_distance
        width = bits // (max_distance + 1)
        self.bands = [(i * width, (i + 1) * width) for i in range(max_distance + 1)]
        self.bands[-1] = (self.bands[-1][0], bits)
        self.buckets: list[dict[int, list[tuple[int, str]]]] = [{} for _ in self.bands]

    def keys(self, value: int) -> list[int]:
        return [(value >> start) & ((1 << (stop - start)) - 1) for start, stop in self.bands]

    def find(self, value: int) -> str | None:
        for bucket, key in zip(self.buckets, self.keys(value)):
            for other, owner in bucket.get(key, ()):
                if hamming(value, other) <= self.max_distance:
                    return owner
        return None

    def add(self, value: int, owner: str) -> None:
        for bucket, key in zip(self.buckets, self.keys(value)):
            bucket.setdefault(key, []).append((value, owner))


def make_stage(cfg: Config) -> Callable[[list[Document]], list[Document]]:
    index = HashIndex(cfg.max_distance)

    def dedup(docs: list[Document]) -> list[Document]:
        for doc in docs:
            hashes = doc["notes"].get("render", {}).get("dhash")
            if not hashes:
                continue  # not a render: nothing to compare
            value = int(hashes[0], 16)
            owner = index.find(value)
            if owner is None:
                index.add(value, doc["id"])
            else:
                doc["reject"] = "render_dedup.duplicate"
                doc["notes"]["render_dedup"] = {"duplicate_of": owner}
                doc["media"] = []
        return docs

    return dedup
