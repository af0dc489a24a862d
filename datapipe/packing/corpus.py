"""The tokenized corpus between the Ray plan and packing: committed pieces, read back by row.

The worker that finishes a block of documents writes its live tokenized documents once, as a
piece (an Arrow IPC file: piece_table) of their input partition (datapipe.pipeline.partitions);
nothing passes through the driver. A pack task reads the pieces of its group of partitions into
a Corpus, rows in run order ((partition, position), whatever order the blocks were written in),
and each phase selects by length and source from its arrays and copies tokens out of them, so
the Ray plan runs once however many phases reuse a document. The columns kept beside the tokens
(the head of the text, the language, the text's size) describe the documents no phase used, for
the rejects file and the run's stats.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from datapipe.packing.bfd import SpecialIds
from datapipe.schema import Document
from datapipe.storage import Store

TEXT_HEAD = 200  # characters of text kept per document, for the rejects file of documents no phase used
NO_SPANS = np.zeros((0, 2), dtype=np.int64)
DESCRIBED = ["id", "source", "source_id", "kind", "text_head", "language", "text_chars", "text_bytes"]


def piece_schema():
    import pyarrow as pa

    return pa.schema([("partition", pa.int32()), ("position", pa.int64()), ("id", pa.string()),
                      ("source", pa.string()), ("source_id", pa.string()), ("kind", pa.string()),
                      ("language", pa.string()), ("text_head", pa.string()), ("text_chars", pa.int64()),
                      ("text_bytes", pa.int64()), ("tokens", pa.large_list(pa.uint32())),
                      ("media", pa.list_(pa.large_binary())), ("media_spans", pa.list_(pa.int64()))])


@dataclass
class Corpus:
    """Documents addressed by row, in run order: their tokens, sources, media spans and images."""

    tokens: np.ndarray  # uint32: every document's tokens end to end
    starts: np.ndarray  # int64 [n]: where document row begins in tokens
    lengths: np.ndarray  # int64 [n]: its token count
    source: np.ndarray  # int64 [n]: index into source_names
    source_names: list[str]
    ids: list[str]  # Document.id per row
    spans: dict[int, np.ndarray] = field(default_factory=dict)  # row -> int64 [k, 2] media spans, rows with media only
    media: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))  # every image end to end
    media_offsets: dict[int, np.ndarray] = field(default_factory=dict)  # row -> int64 [k + 1] into media
    index: Any = None  # the pieces' table without tokens and media (source_id, kind, text head), for reject lines
    partition: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # int64 [n]: Document.partition
    position: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # int64 [n]: Document.position

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
        import pyarrow as pa

        fields = self.index.select(DESCRIBED).take(pa.array(rows, pa.int64())).to_pylist()
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


def pack_reasons(docs: list[Document], ids: SpecialIds) -> list[np.ndarray | str]:
    """Per live document, its media spans, or why it cannot be packed (media that do not match, no
    tokens). One scan for media tokens over the batch's tokens, not one a document (~40x fewer
    numpy calls at ~1K tokens each)."""
    tokens = [np.asarray(doc["tokens"], dtype=np.uint32) for doc in docs]
    flat = np.concatenate(tokens) if tokens else np.zeros(0, np.uint32)
    ends = np.cumsum([len(t) for t in tokens])
    media_ids = np.array([ids.media_begin, ids.media_end], dtype=np.uint32)
    has_media = np.bincount(np.searchsorted(ends, np.flatnonzero(np.isin(flat, media_ids)), side="right"),
                            minlength=len(docs)) > 0
    reasons = []
    for doc, doc_tokens, media in zip(docs, tokens, has_media.tolist()):
        spans = media_spans_of(doc_tokens, len(doc["media"]), ids) if media or doc["media"] else NO_SPANS
        reasons.append(spans if isinstance(spans, str) or len(doc_tokens) else "pack.no_tokens")
    return reasons


def piece_table(docs: list[Document], spans: list[np.ndarray]):
    """Live documents (with their media spans) as a piece: the Arrow table pack tasks read."""
    import pyarrow as pa

    tokens = [np.asarray(doc["tokens"], dtype=np.uint32) for doc in docs]
    offsets = np.concatenate([[0], np.cumsum([len(t) for t in tokens], dtype=np.int64)])
    values = np.concatenate(tokens) if tokens else np.zeros(0, np.uint32)
    columns = {
        "partition": [doc["partition"] for doc in docs], "position": [doc["position"] for doc in docs],
        **{key: [doc[key] for doc in docs] for key in ("id", "source", "source_id", "kind")},
        "language": [doc["language"] for doc in docs],
        "text_head": [doc["text"][:TEXT_HEAD] for doc in docs],
        "text_chars": [len(doc["text"]) for doc in docs],
        "text_bytes": [len(doc["text"].encode("utf-8", "surrogatepass")) for doc in docs],
        "tokens": pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), pa.array(values, pa.uint32())),
        "media": [list(doc["media"]) for doc in docs],
        "media_spans": [s.ravel().tolist() for s in spans],
    }
    return pa.table(columns, schema=piece_schema())


def corpus_from_tables(tables: list, source_names: list[str]) -> Corpus:
    """The corpus of some pieces, rows in run order; source codes follow `source_names` (the
    recipe's, so that a source with no document still has its code and a supply of zero)."""
    import pyarrow as pa

    table = pa.concat_tables(tables) if tables else piece_schema().empty_table()
    order = np.lexsort((table.column("position").to_numpy(), table.column("partition").to_numpy()))
    if np.any(order != np.arange(len(order))):  # pieces come in run order: a take would copy every token again
        table = table.take(pa.array(order, pa.int64()))
    table = table.combine_chunks()
    tokens = table.column("tokens").chunk(0) if table.num_rows else pa.array([], pa.large_list(pa.uint32()))
    starts = tokens.offsets.to_numpy()[:-1].astype(np.int64)
    lengths = np.diff(tokens.offsets.to_numpy()).astype(np.int64)
    names = table.column("source").to_pylist()
    source_names = list(dict.fromkeys([*source_names, *names]))  # a name the caller did not list gets the next code
    codes = {name: code for code, name in enumerate(source_names)}
    corpus = Corpus(tokens=tokens.values.to_numpy(zero_copy_only=False), starts=starts, lengths=lengths,
                    source=np.array([codes[name] for name in names], dtype=np.int64),
                    source_names=list(source_names), ids=table.column("id").to_pylist(),
                    index=table.drop_columns(["tokens", "media"]),
                    partition=table.column("partition").to_numpy().astype(np.int64),
                    position=table.column("position").to_numpy().astype(np.int64))
    add_media(corpus, table)
    return corpus


def add_media(corpus: Corpus, table) -> None:
    """The spans and images of the rows that have media, the images end to end in one array."""
    import pyarrow.compute as pc

    with_media = np.flatnonzero(pc.list_value_length(table.column("media_spans")).to_numpy(zero_copy_only=False) > 0)
    images, size = [], 0
    for row in with_media.tolist():
        corpus.spans[row] = np.array(table.column("media_spans")[row].as_py(), dtype=np.int64).reshape(-1, 2)
        row_images = table.column("media")[row].as_py()
        corpus.media_offsets[row] = np.cumsum([0, *map(len, row_images)]) + size
        size += sum(map(len, row_images))
        images += row_images
    corpus.media = np.frombuffer(b"".join(images), np.uint8)


def corpus_from_documents(docs: list[Document], ids: SpecialIds, source_names: list[str] = ()) -> Corpus:
    """An in-memory corpus (tests, small jobs), rows in list order (which becomes their place in the
    run: partition 0, one position each); raises if a document's media spans and images disagree."""
    docs = [{**doc, "partition": 0, "position": index << 12} for index, doc in enumerate(docs)]
    spans = pack_reasons(docs, ids)
    for doc, reason in zip(docs, spans):
        if isinstance(reason, str):
            raise ValueError(f"document {doc['id']}: {reason}")
    names = list(dict.fromkeys([*source_names, *(doc["source"] for doc in docs)]))
    return corpus_from_tables([piece_table(docs, spans)], names)


def write_piece(store: Store, name: str, table) -> None:
    """A piece as an Arrow IPC file, whole or not at all."""
    store.write_table(name, table)


def read_piece(store: Store, name: str):
    return store.read_table(name)
