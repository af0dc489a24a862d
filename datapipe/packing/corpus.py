"""The corpus between the Ray plan and the curriculum: live tokenized documents, spilled once.

Packing is global per curriculum phase, so the driver first writes every live
document's tokens once to out/<run>/spill/: `tokens.u32` (all ids end to end),
`media.bin` (all images end to end) and `docs.arrow` (a row per document: id, source,
length, media spans, image offsets, and for reject lines and the run's stats, the head of
its text, its language and its text's size). Each
phase then selects by length and source from the index and copies tokens out of a
memory map, so the Ray plan runs once however many phases reuse a document, and a corpus
larger than RAM packs with memory for its index only (~60 bytes a document).
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from datapipe.packing.bfd import SpecialIds
from datapipe.schema import Document

TEXT_HEAD = 200  # characters of text kept per document, for the rejects file of documents no phase used
NO_SPANS = np.zeros((0, 2), dtype=np.int64)
DESCRIBED = ["id", "source", "source_id", "kind", "text_head", "language", "text_chars", "text_bytes"]


@dataclass
class Corpus:
    """Documents addressed by row: their tokens, sources, media spans and images."""

    tokens: np.ndarray  # uint32: every document's tokens end to end (a memory map when spilled)
    starts: np.ndarray  # int64 [n]: where document row begins in tokens
    lengths: np.ndarray  # int64 [n]: its token count
    source: np.ndarray  # int64 [n]: index into source_names
    source_names: list[str]
    ids: list[str]  # Document.id per row
    spans: dict[int, np.ndarray] = field(default_factory=dict)  # row -> int64 [k, 2] media spans, rows with media only
    media: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))  # every image end to end
    media_offsets: dict[int, np.ndarray] = field(default_factory=dict)  # row -> int64 [k + 1] into media
    index: Any = None  # the spilled pyarrow index table (source_id, kind, text head), for reject lines

    def document_tokens(self, row: int) -> np.ndarray:
        return self.tokens[self.starts[row] : self.starts[row] + self.lengths[row]]

    def image(self, row: int, k: int) -> bytes:
        offsets = self.media_offsets[row]
        return bytes(self.media[offsets[k] : offsets[k + 1]])

    @property
    def total_tokens(self) -> int:
        return int(self.lengths.sum())

    def describe(self, rows: list[int]) -> list[dict[str, Any]]:
        """What a reject line and the run's stats need of each of these documents (ones no curriculum
        phase used): one take for all of them, 3 us a row, where a slice per row cost 33."""
        fields = self.index.select(DESCRIBED).take(rows).to_pylist()
        for record in fields:
            record["text"] = record.pop("text_head")
        return fields


def media_spans_of(tokens: np.ndarray, num_images: int, ids: SpecialIds) -> np.ndarray | str:
    """A document's media spans as int64 [k, 2], or the reject reason when they do not match its images."""
    from tokenizer.media import media_spans

    try:
        spans = np.array(media_spans(tokens, ids.media_begin, ids.media_end), dtype=np.int64).reshape(-1, 2)
    except ValueError:
        return "pack.unbalanced_media"
    return spans if len(spans) == num_images else "pack.media_mismatch"


def corpus_from_documents(docs: list[Document], ids: SpecialIds, source_names: list[str] = ()) -> Corpus:
    """An in-memory corpus (tests, small jobs); raises if a document's media spans and images disagree."""
    writer = SpillWriter(None, ids, source_names)
    for doc in docs:
        reason = writer.add(doc)
        if reason:
            raise ValueError(f"document {doc['id']}: {reason}")
    return writer.finish()


class SpillWriter:
    """Appends live documents to the spill folder (or to memory when folder is None).

    `source_names` (the recipe's, in order) fixes the source codes, so that a source
    whose every record was rejected still has a code, and a mixture weight, of zero supply.
    """

    def __init__(self, folder: Path | None, ids: SpecialIds, source_names: list[str] = ()):
        self.folder, self.ids = folder, ids
        self.media_ids = np.array([ids.media_begin, ids.media_end], dtype=np.uint32)
        self.source_codes = {name: code for code, name in enumerate(dict.fromkeys(source_names))}
        self.rows: dict[str, list] = {k: [] for k in ("id", "source", "source_code", "source_id", "kind", "text_head",
                                                       "language", "text_chars", "text_bytes", "num_tokens",
                                                       "media_spans", "media_offsets")}
        self.token_chunks: list[np.ndarray] = []
        self.media_chunks: list[bytes] = []
        self.media_size = 0
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            self.token_file, self.media_file = open(folder / "tokens.u32", "wb"), open(folder / "media.bin", "wb")

    def add(self, doc: Document) -> str:
        """Spill one live document; return "" or the reason it cannot be packed."""
        return self.add_batch([doc])[0]

    def add_batch(self, docs: list[Document]) -> list[str]:
        """Spill live documents; return, per document, "" or the reason it cannot be packed.

        Batched because the driver spills every document of the run: one write and one scan
        for media tokens per batch, not per document (~40x fewer numpy calls at ~1K tokens each).
        """
        tokens = [np.asarray(doc["tokens"], dtype=np.uint32) for doc in docs]
        flat = np.concatenate(tokens) if tokens else np.zeros(0, np.uint32)
        ends = np.cumsum([len(t) for t in tokens])
        has_media = np.bincount(np.searchsorted(ends, np.flatnonzero(np.isin(flat, self.media_ids)), side="right"),
                                minlength=len(docs)) > 0
        reasons, kept = [], []
        for doc, doc_tokens, media in zip(docs, tokens, has_media.tolist()):
            spans = media_spans_of(doc_tokens, len(doc["media"]), self.ids) if media or doc["media"] else NO_SPANS
            reason = spans if isinstance(spans, str) else "" if len(doc_tokens) else "pack.no_tokens"
            reasons.append(reason)
            if not reason:
                self.index_row(doc, len(doc_tokens), spans)
                kept.append(doc_tokens)
        self.write(kept, [image for doc, reason in zip(docs, reasons) if not reason for image in doc["media"]])
        return reasons

    def index_row(self, doc: Document, num_tokens: int, spans: np.ndarray) -> None:
        for key in ("id", "source", "source_id", "kind"):
            self.rows[key].append(doc[key])
        self.rows["source_code"].append(self.source_codes.setdefault(doc["source"], len(self.source_codes)))
        self.rows["text_head"].append(doc["text"][:TEXT_HEAD])
        self.rows["language"].append(doc["language"])
        self.rows["text_chars"].append(len(doc["text"]))
        self.rows["text_bytes"].append(len(doc["text"].encode("utf-8", "surrogatepass")))
        self.rows["num_tokens"].append(num_tokens)
        self.rows["media_spans"].append(spans.ravel().tolist())
        self.rows["media_offsets"].append((np.cumsum([0, *map(len, doc["media"])]) + self.media_size).tolist()
                                          if len(spans) else [])
        self.media_size += sum(map(len, doc["media"]))

    def write(self, tokens: list[np.ndarray], images: list[bytes]) -> None:
        if self.folder is None:
            self.token_chunks.extend(tokens)
            self.media_chunks.extend(images)
            return
        if tokens:
            np.concatenate(tokens).tofile(self.token_file)
        for image in images:
            self.media_file.write(image)

    def finish(self) -> Corpus:
        """Close the files and return the corpus over them."""
        import pyarrow as pa

        index = pa.table({**self.rows, "num_tokens": pa.array(self.rows["num_tokens"], pa.int64()),
                          "media_spans": pa.array(self.rows["media_spans"], pa.list_(pa.int64())),
                          "media_offsets": pa.array(self.rows["media_offsets"], pa.list_(pa.int64()))})
        index = index.replace_schema_metadata({"source_names": json.dumps(list(self.source_codes))})
        if self.folder is None:
            tokens = np.concatenate(self.token_chunks) if self.token_chunks else np.zeros(0, np.uint32)
            return corpus_from_index(index, tokens, np.frombuffer(b"".join(self.media_chunks), np.uint8))
        self.token_file.close()
        self.media_file.close()
        with pa.OSFile(str(self.folder / "docs.arrow"), "wb") as sink, pa.ipc.new_file(sink, index.schema) as out:
            out.write_table(index)
        (self.folder / "done.json").write_text(json.dumps({"documents": index.num_rows}))
        return open_spill(self.folder)


def open_spill(folder: Path) -> Corpus:
    """The corpus of a finished spill folder, its tokens and images memory-mapped."""
    import pyarrow as pa

    with pa.memory_map(str(folder / "docs.arrow")) as source:
        index = pa.ipc.open_file(source).read_all()
    return corpus_from_index(index, mapped(folder / "tokens.u32", np.uint32), mapped(folder / "media.bin", np.uint8))


def mapped(path: Path, dtype) -> np.ndarray:
    return np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.zeros(0, dtype)


def corpus_from_index(index, tokens: np.ndarray, media: np.ndarray) -> Corpus:
    import pyarrow.compute as pc

    lengths = index.column("num_tokens").to_numpy().astype(np.int64)
    spans, offsets = {}, {}
    with_media = np.flatnonzero(pc.list_value_length(index.column("media_spans")).to_numpy(zero_copy_only=False) > 0)
    for row in with_media.tolist():
        spans[row] = np.array(index.column("media_spans")[row].as_py(), dtype=np.int64).reshape(-1, 2)
        offsets[row] = np.array(index.column("media_offsets")[row].as_py(), dtype=np.int64)
    return Corpus(tokens=tokens, starts=np.cumsum(lengths) - lengths, lengths=lengths,
                  source=index.column("source_code").to_numpy().astype(np.int64),
                  source_names=json.loads(index.schema.metadata[b"source_names"]),
                  ids=index.column("id").to_pylist(), spans=spans, media=media, media_offsets=offsets, index=index)
