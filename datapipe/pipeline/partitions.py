"""Committed partitions: each input partition's documents, written once by the workers that made them.

A partition is one work item (a file, or a generator's range of indices), numbered in the run's
plan. The reader numbers its records (Document.partition, .position) and closes the partition
with a control row (reject == END, never a record) that counts them. The plan's last operator,
commit_block, runs on the workers: for each partition in a block it writes the live documents as
a piece (datapipe.packing.corpus) and the rejected ones as lines of a rejects piece, under the
run's work folder, and returns one small summary row: the piece names, the block's run figures
(RunStats counters), each phase's supply per source, and whether the partition's closing row was
there. Nothing that grows with the documents reaches the driver.

The driver reads the summaries in plan order (Ray Data keeps the order), so when a partition's
closing row arrives every block of it has been written: PartitionLog then writes the partition's
marker (`partitions/p000042.json`), which is what commits it. A rerun after a kill reads every
committed partition from its marker and reads and processes only the others; pieces that a
killed attempt left behind are never listed in a marker and are ignored.
"""
from __future__ import annotations

import base64
import json
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from datapipe.packing.bfd import SpecialIds
from datapipe.packing.corpus import corpus_from_tables, pack_reasons, piece_table, read_piece, write_piece
from datapipe.packing.curriculum import MISS_REASONS, CurriculumPhase, supply_of
from datapipe.packing.groups import read_usage
from datapipe.pipeline.apply import DERIVED_BITS, json_line, record_busy, reject_line
from datapipe.pipeline.stats import RunStats
from datapipe.schema import Document, docs_from_table, new_document
from datapipe.storage import Store

END = "~end"  # the reject value of a partition's closing row: a control row, never counted as a record
PARTS = "parts"  # work/parts/p000042/<piece>.arrow and <piece>.rejects.jsonl
MARKERS = "partitions"  # work/partitions/p000042.json: the partition is committed
DOCUMENTS = "documents"  # out/documents/p000042.jsonl.zst: a run without phases writes its documents there
DOCUMENT_FIELDS = ("id", "source", "source_id", "kind", "text", "language", "language_score", "transforms", "meta",
                   "notes")  # what a documents file keeps of a Document; no tokens, no run-internal fields
# zstd level 3 (zstd's default): on web text JSON 7% smaller than gzip -6 at 10x its speed (0.05 s for 5.5 MB,
# gzip -6 0.5 s); the .jsonl.zst that DCLM and RedPajama ship, and that the jsonl reader reads back
ZSTD_LEVEL = 3


def numbered(docs: list[Document], partition: int, start: int) -> list[Document]:
    """The reader's records with their place in the run: record start, start + 1, ... of `partition`."""
    for index, doc in enumerate(docs, start):
        doc["partition"], doc["position"] = partition, index << DERIVED_BITS
    return docs


def numbered_blocks(docs: Iterable[Document], partition: int, size: int) -> Iterator[list[Document]]:
    """A partition's records in lists of `size`, numbered (`numbered`) and timed as stage "read" (the
    time spent reading them, not the time their consumer held the generator); the last list, maybe
    holding no record, ends with the row that closes the partition."""
    count, block, clock = 0, [], read_clock()
    for doc in docs:
        block.append(doc)
        if len(block) == size:
            yield timed_read(numbered(block, partition, count), clock)
            count, block, clock = count + size, [], read_clock()
    yield [*timed_read(numbered(block, partition, count), clock), end_row(partition, count + len(block))]


def read_clock() -> tuple[float, int]:
    return time.perf_counter(), time.time_ns() // 1_000_000


def timed_read(block: list[Document], clock: tuple[float, int]) -> list[Document]:
    record_busy(block, "read", time.perf_counter() - clock[0], clock[1])
    return block


def end_row(partition: int, records: int) -> Document:
    """The control row that closes a partition of `records` records (its position counts them)."""
    row = new_document("", f"partition {partition}", "")
    row["reject"], row["partition"], row["position"] = END, partition, records << DERIVED_BITS
    return row


@dataclass(frozen=True)
class CommitSettings:
    """What commit_block needs besides the block (picklable: it rides into the Ray tasks)."""

    work: Store
    ids: SpecialIds | None  # the tokenizer's special tokens; None in a run without phases
    phases: tuple[CurriculumPhase, ...]
    source_names: tuple[str, ...]
    seed: int


def commit_block(table, settings: CommitSettings):
    """A Ray task, the plan's last operator: a block's partitions written as pieces; their summaries."""
    import pyarrow as pa

    return pa.Table.from_pylist(commit_documents(docs_from_table(table), settings), schema=summary_schema())


def commit_documents(docs: list[Document], settings: CommitSettings) -> list[dict[str, Any]]:
    """Some documents' partitions written as pieces; a summary row for each partition."""
    by_partition: dict[int, list[Document]] = defaultdict(list)
    for doc in docs:
        by_partition[doc["partition"]].append(doc)
    return [commit_partition(partition, docs, settings) for partition, docs in by_partition.items()]


def summary_schema():
    import pyarrow as pa

    return pa.schema([("partition", pa.int32()), ("piece", pa.string()), ("rejects", pa.string()),
                      ("records", pa.int64()), ("end", pa.int64()), ("stats", pa.string()), ("supply", pa.string())])


def commit_partition(partition: int, docs: list[Document], settings: CommitSettings) -> dict[str, Any]:
    """One partition's part of a block: its piece (packable documents, or with no phases the documents
    as JSON lines), its rejects piece, its summary row."""
    records = [doc for doc in docs if doc["reject"] != END]
    closing = [doc["position"] >> DERIVED_BITS for doc in docs if doc["reject"] == END]
    live = [doc for doc in records if not doc["reject"]]
    kept, spans = (live, None) if not settings.phases else packable(live, settings.ids)
    stats = RunStats("")
    for doc in records:
        stats.count(doc)
    name = f"{PARTS}/p{partition:06d}/{min((doc['position'] for doc in records), default=0):016x}"
    table, piece = None, ""
    if kept and settings.phases:
        table, piece = piece_table(kept, spans), f"{name}.arrow"
        write_piece(settings.work, piece, table)
    elif kept:
        piece = f"{name}.documents.jsonl"
        settings.work.write_bytes(piece, "".join(json_line(document_line(doc)) + "\n" for doc in kept).encode())
    rejected = sorted((doc for doc in records if doc["reject"]), key=lambda doc: doc["position"])
    if rejected:
        settings.work.write_bytes(f"{name}.rejects.jsonl", "".join(reject_line(doc) + "\n" for doc in rejected).encode())
    return {"partition": partition, "piece": piece, "rejects": f"{name}.rejects.jsonl" if rejected else "",
            "records": sum(1 for doc in records if not doc["derived_from"]), "end": closing[0] if closing else -1,
            "stats": json.dumps(stats.counters()), "supply": json.dumps(phase_supplies(settings, table))}


def packable(live: list[Document], ids: SpecialIds) -> tuple[list[Document], list]:
    """The documents packing can take and their spans; the others rejected with packing's reason."""
    kept, spans = [], []
    for doc, reason in zip(live, pack_reasons(live, ids)):
        if isinstance(reason, str):
            doc["reject"] = reason  # media that do not match their images, or no tokens: it cannot be packed
        else:
            kept.append(doc)
            spans.append(reason)
    return kept, spans


def document_line(doc: Document) -> dict[str, Any]:
    """A written document of a run without phases, as a JSON object: who, the text, what the stages
    found; its images (media) as base64 PNGs, in the order of the placeholders in its text."""
    line = {key: doc[key] for key in DOCUMENT_FIELDS}
    if doc["media"]:
        line["media"] = [base64.b64encode(image).decode("ascii") for image in doc["media"]]
    if doc["num_tokens"]:
        line["num_tokens"] = doc["num_tokens"]
    return line


def phase_supplies(settings: CommitSettings, table) -> dict[str, list[float]]:
    """Per phase, the tokens per source these documents can give it (curriculum.supply_of)."""
    if table is None:
        return {}
    corpus = corpus_from_tables([table], list(settings.source_names))
    return {phase.name: supply_of(phase, corpus, settings.seed).tolist() for phase in settings.phases}


@dataclass
class Partition:
    """A committed partition, as its marker describes it."""

    index: int
    records: int  # records read (a stage's derived records not counted)
    pieces: list[str] = field(default_factory=list)  # its live documents, under the work folder
    rejects: list[str] = field(default_factory=list)  # its rejects pieces (JSON lines)
    stats: dict[str, Any] = field(default_factory=dict)  # RunStats counters of its records
    supply: dict[str, list[float]] = field(default_factory=dict)  # phase -> tokens per source it can give


def marker_name(partition: int) -> str:
    return f"{MARKERS}/p{partition:06d}.json"


def read_partition(work: Store, partition: int) -> Partition | None:
    text = work.read_text(marker_name(partition))
    return None if text is None else Partition(**json.loads(text))


class PartitionLog:
    """The driver's side of the commit stream: per open partition, what its blocks reported; a
    partition is committed (its marker written) when its closing row's summary arrives."""

    def __init__(self, work: Store):
        self.work = work
        self.open: dict[int, Partition] = {}
        self.committed: list[Partition] = []

    def add(self, row: dict[str, Any]) -> Partition | None:
        """One summary row; the partition it committed, if it did."""
        part = self.open.setdefault(row["partition"], Partition(row["partition"], 0))
        part.pieces += [row["piece"]] if row["piece"] else []
        part.rejects += [row["rejects"]] if row["rejects"] else []
        part.records += row["records"]
        stats = RunStats("")  # counters add by RunStats' own rule
        stats.add(part.stats)
        stats.add(json.loads(row["stats"]))
        part.stats = stats.counters()
        for phase, supply in json.loads(row["supply"]).items():
            part.supply[phase] = (np.add(part.supply[phase], supply) if phase in part.supply else supply)
        if row["end"] < 0:
            return None
        return self.commit(self.open.pop(row["partition"]), row["end"])

    def commit(self, part: Partition, expected: int) -> Partition:
        if part.records != expected:
            raise RuntimeError(f"partition {part.index}: its reader read {expected} records but {part.records} "
                               "reached the end of the plan; a stage lost or duplicated records")
        part.supply = {phase: list(map(float, supply)) for phase, supply in part.supply.items()}
        self.work.write_bytes(marker_name(part.index), json.dumps(part.__dict__).encode())
        self.committed.append(part)
        return part


def account_partition(partition: Partition, phases: list[str], work: Store, out: Store,
                      documents: bool = False) -> dict[str, Any]:
    """A Ray task once every phase is packed: the partition's documents that no phase used become
    rejects, with the reason of the phase that came closest (curriculum.Usage's rule); its rejects
    file (out/rejects/p000042.jsonl: every reject of the partition, in run order) is written; the
    run figures these late rejects change are returned and kept in its account marker. `documents`
    (a run without phases): its documents file is written instead of judging any use."""
    if documents:
        write_documents(partition, work, out)
    corpus = corpus_from_tables([read_piece(work, name) for name in partition.pieces if not documents], [])
    lines = [json.loads(line) for name in partition.rejects for line in work.read_bytes(name).split(b"\n") if line]
    stats = RunStats("")
    if len(corpus.lengths) and phases:  # no phases: a run stopped before packing writes its readers' rejects
        uses, miss = read_usage(work, phases, partition.index)
        unused = np.flatnonzero(uses == 0)
        for row, record in zip(unused.tolist(), corpus.describe(unused.tolist())):
            reason = MISS_REASONS[int(miss[row])]
            stats.reject_late(record, reason, int(corpus.lengths[row]))
            del record["text_chars"], record["text_bytes"]
            lines.append({**record, "reject": reason, "num_tokens": int(corpus.lengths[row]),
                          "partition": partition.index, "position": int(corpus.position[row])})
        stats.stage_passed["pack"] += int((uses > 0).sum())
    lines.sort(key=lambda line: line["position"])
    if lines:
        out.write_bytes(rejects_name(partition.index),
                        "".join(json_line(line) + "\n" for line in lines).encode())
    account = {"stats": stats.counters(), "rejects": len(lines)}
    if phases or documents:  # the partition's account is final: a rerun reads it back
        work.write_bytes(account_name(partition.index), json.dumps(account).encode())
    return account


def write_documents(partition: Partition, work: Store, out: Store) -> None:
    """A partition's documents file, from its pieces in run order (none when no document was kept)."""
    if partition.pieces:
        import zstandard

        data = b"".join(work.read_bytes(name) for name in sorted(partition.pieces))  # piece names sort by position
        out.write_bytes(documents_name(partition.index), zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data))


def documents_name(partition: int) -> str:
    return f"{DOCUMENTS}/p{partition:06d}.jsonl.zst"


def rejects_name(partition: int) -> str:
    return f"rejects/p{partition:06d}.jsonl"


def account_name(partition: int) -> str:
    return f"accounts/p{partition:06d}.json"
