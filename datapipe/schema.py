"""The record schema: the three record types that every stage reads and writes.

At run time records are plain dicts (Ray Data rows, WebDataset samples); these
TypedDicts document them and the helpers below build them, so that a stage never
invents a field of its own. `meta` is a dict while a stage holds the record and
travels between Ray operators as a JSON string (Arrow cannot unify dicts whose
keys differ from block to block); the runner converts at the boundary.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, NotRequired, TypedDict

KINDS = ("text", "code", "svg", "html", "mesh", "cad", "scene", "image")

# Where an image goes in Document.text: the i-th placeholder stands for media[i]. The
# tokenize stage replaces each one with the image's media-token span.
MEDIA_PLACEHOLDER = "<|media|>"


class Document(TypedDict):
    """One document: a web page's text, a math note, an SVG program, a CAD script..."""

    id: str  # globally unique: "<source>/<source_id>", or a derived id for rewrites and renders
    source: str  # the recipe source it came from ("pydoc", "web")
    source_id: str  # where in that source: "file.jsonl.gz:1234", a URL, a generator index
    kind: str  # one of KINDS; decides which renderer (if any) applies
    text: str  # the text, or the code/markup for kinds a renderer draws
    media: list[bytes]  # encoded images (PNG), one per MEDIA_PLACEHOLDER in text, in order; [] for plain text
    meta: dict[str, Any]  # provenance ("transforms": stage names applied, in order) and stage outputs
    reject: str  # "" while alive; "<stage>.<reason>" once a stage rejects it
    tokens: Any  # [] until the tokenize stage; then a TokenizedDocument


class TokenizedDocument(Document):
    """A document after the tokenize stage: `tokens` holds uint32 ids, EOS last (the
    document boundary); meta["num_tokens"] counts them."""


class PackedSample(TypedDict):
    """One training sequence, as written to a shard and yielded by `datapipe.stream`."""

    key: str  # "<phase>-<index>", unique within a run
    tokens: Any  # uint32 array of exactly seq_len ids, padding explicit at the end
    doc_lens: Any  # int32 array: lengths of the document pieces in order; they sum to seq_len - num_pad
    doc_ids: list[str]  # the Document.id of each piece (pieces of one split doc repeat the id)
    doc_offsets: list[int]  # where each piece starts in its document: 0 unless the document was split
    position_ids: NotRequired[Any]  # int32 [seq_len]: 0, 1, ... restarting at each piece (padding is one more);
    # not packed nor stored: read_shard and datapipe.stream derive it from doc_lens
    loss_mask: Any  # uint8 [seq_len]: 1 where the next-token loss applies; 0 on padding and inside media spans
    media_spans: list[list[int]]  # [start, stop) of each media span in tokens, in order; a span is never split
    images: list[bytes]  # the encoded image (PNG) of each media span, same order; shards store them as <key>.<i>.png
    seq_len: int  # the curriculum phase's sequence length
    num_pad: int  # how many trailing tokens are padding


def arrow_schema():
    """Documents as Arrow rows between Ray operators (meta as JSON text, see above)."""
    import pyarrow as pa

    return pa.schema([
        ("id", pa.string()),
        ("source", pa.string()),
        ("source_id", pa.string()),
        ("kind", pa.string()),
        ("text", pa.large_string()),
        ("media", pa.list_(pa.large_binary())),
        ("meta", pa.large_string()),
        ("reject", pa.string()),
        ("tokens", pa.large_list(pa.uint32())),
    ])


def new_document(source: str, source_id: str, text: str, kind: str = "text", **meta: Any) -> Document:
    """Build a live document; the id is stable for the same source and position."""
    return {
        "id": f"{source}/{source_id}",
        "source": source,
        "source_id": source_id,
        "kind": kind,
        "text": text,
        "media": [],
        "meta": {"transforms": [], **meta},
        "reject": "",
        "tokens": [],
    }


def new_reject(source: str, source_id: str, reason: str, raw: str = "") -> Document:
    """A record that failed before it became a document (bad line, unreadable file)."""
    doc = new_document(source, source_id, raw[:2000])
    doc["reject"] = reason
    return doc


def mark_transform(doc: Document, stage: str) -> Document:
    """Append a stage name to the document's provenance."""
    doc["meta"].setdefault("transforms", []).append(stage)
    return doc


def content_hash(text: str) -> str:
    """A short stable hash, for derived ids and exact dedup."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def docs_to_table(docs: list[Document]):
    """Documents as an Arrow table of arrow_schema() (meta encoded as JSON)."""
    import pyarrow as pa

    rows = [{**doc, "meta": json.dumps(doc["meta"], ensure_ascii=False)} for doc in docs]
    return pa.Table.from_pylist(rows, schema=arrow_schema())


def docs_from_table(table) -> list[Document]:
    """The inverse of docs_to_table; tokens come back as uint32 numpy views, not Python ints."""
    tokens = table.column("tokens").combine_chunks()
    offsets, values = tokens.offsets.to_numpy(), tokens.values.to_numpy()
    docs = table.drop_columns(["tokens"]).to_pylist()
    for i, doc in enumerate(docs):
        doc["meta"] = json.loads(doc["meta"])
        doc["tokens"] = values[offsets[i] : offsets[i + 1]]
    return docs
