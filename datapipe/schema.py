"""The record schema: the record types that every stage reads and writes.

At run time records are plain dicts (Ray Data rows, WebDataset samples); these
TypedDicts document them and the helpers below build them, so that a stage never
invents a field of its own.

A Document keeps three kinds of data apart, so that what a source brings can never be
mistaken for what the pipeline decided:
- typed fields: everything the pipeline reads back to count, route or trust a record
  (reject, error, derived_from, transforms, bytes_in, busy_us, stage_ms, language and its score, pii,
  num_tokens, asset_dir). The runner and the stage that owns a field write it; a reader
  writes none but asset_dir (the files reader: the file's own folder).
- `meta`: the source's own data: a tabular row's other columns, unchanged whatever
  their names (a column called "language" or "asset_dir" is just a column), or what a
  reader records about the origin (url, path, charset). The runner and the stats never
  read it; a stage reads it only as documented input (rephrase's `domain`).
- `notes`: what each stage recorded about its work, one key per stage, its registry
  name (notes["render"] = renderer, sizes, hashes; notes["dedup"] = cluster). Only that
  stage writes its key; later stages may read it (render_dedup reads notes["render"]).
  Readers never write notes, so no source column can crash or steer a later stage.

Between Ray operators the typed fields are typed Arrow columns; `meta` and `notes`
travel as JSON text (Arrow cannot unify dicts whose keys differ from block to block).
docs_to_table and docs_from_table convert at the boundary.
"""
from __future__ import annotations

import json
from typing import Any, NotRequired, TypedDict

KINDS = ("text", "code", "svg", "html", "mesh", "cad", "scene3d", "image")  # every Document.kind there is

# Where an image goes in Document.text: the i-th placeholder stands for media[i]. The
# tokenize stage replaces each one with the image's media-token span.
MEDIA_PLACEHOLDER = "<|media|>"


class Document(TypedDict):
    """One document: a web page's text, a math note, an SVG program, a CAD script..."""

    id: str  # unique in the run: "<source>/<source_id>", with an id_field "<source>/<value>@<partition>:<record>"
    # (datapipe.pipeline.inputs.unique_ids), or a derived id for rewrites and renders
    source: str  # the recipe source it came from ("pydoc", "web")
    source_id: str  # where in that source: "file.jsonl.gz:1234", a URL, a generator index, or its id_field value
    kind: str  # one of KINDS; decides which renderer (if any) applies
    text: str  # the text, or the code/markup for kinds a renderer draws
    media: list[bytes]  # encoded images (PNG), one per MEDIA_PLACEHOLDER in text, in order; [] for plain text
    tokens: Any  # [] until the tokenize stage; then uint32 ids, EOS last (the document boundary)
    reject: str  # "" while alive; "<stage>.<reason>" once a stage rejects it
    error: str  # "" or, for a reject, what went wrong in words (an exception, a renderer's detail)
    derived_from: str  # "" for a record a source read; the id of the record a stage made it from (a rewrite)
    transforms: list[str]  # the stages that kept it, in order (provenance, and stats' per-stage counts)
    bytes_in: dict[str, int]  # stage -> UTF-8 bytes of text that stage saw (set by the runner, for stats)
    busy_us: dict[str, int]  # stage -> its share of the worker time that stage spent on its batch, in us (runner, stats)
    stage_ms: dict[str, list[int]]  # stage -> [start, end] of the batch it went through that stage in, Unix ms
    # (runner, stats: throughput over time and wall time per stage)
    language: str  # "" until langid; then its ISO 639-1 code ("en"), which picks C4's bad-words list
    language_score: float  # langid's confidence in `language`, 0..1; 0.0 until langid
    pii: dict[str, int]  # redactions by kind ("email": 2), kinds found only; {} until the pii stage
    num_tokens: int  # len(tokens); 0 until the tokenize stage
    asset_dir: str  # "" or the one folder whose files a renderer may read for it (set by the files reader)
    partition: int  # the input partition it came from (a file or generator range), numbered in the run's plan
    position: int  # its place in that partition: record index << 12 | n for the n-th record a stage derived from
    # it; (partition, position) orders a run's records whatever the cluster did (set by the runner)
    meta: dict[str, Any]  # the source's own columns, or what the reader records of the origin (url, path)
    notes: dict[str, Any]  # stage name -> what that stage recorded of its work (see the module docstring)


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


JSON_FIELDS = ("meta", "notes")  # dicts whose keys vary: JSON text in Arrow
MAP_FIELDS = ("bytes_in", "busy_us", "stage_ms", "pii")  # dicts of str: Arrow maps, which read back as (key, value) pairs
TIMING_FIELDS = ("busy_us", "stage_ms")  # differ run to run: kept out of the rejects files (a rerun's are byte-identical)


def arrow_schema():
    """Documents as Arrow rows between Ray operators, one column per Document field."""
    import pyarrow as pa

    counts = pa.map_(pa.string(), pa.int64())
    return pa.schema([
        ("id", pa.string()),
        ("source", pa.string()),
        ("source_id", pa.string()),
        ("kind", pa.string()),
        ("text", pa.large_string()),
        ("media", pa.list_(pa.large_binary())),
        ("tokens", pa.large_list(pa.uint32())),
        ("reject", pa.string()),
        ("error", pa.string()),
        ("derived_from", pa.string()),
        ("transforms", pa.list_(pa.string())),
        ("bytes_in", counts),
        ("busy_us", counts),
        ("stage_ms", pa.map_(pa.string(), pa.list_(pa.int64()))),
        ("language", pa.string()),
        ("language_score", pa.float64()),
        ("pii", counts),
        ("num_tokens", pa.int64()),
        ("asset_dir", pa.string()),
        ("partition", pa.int32()),
        ("position", pa.int64()),
        ("meta", pa.large_string()),
        ("notes", pa.large_string()),
    ])


def new_document(source: str, source_id: str, text: str, kind: str = "text", meta: dict[str, Any] | None = None,
                 asset_dir: str = "") -> Document:
    """Build a live document; the id is stable for the same source and position."""
    return {
        "id": f"{source}/{source_id}",
        "source": source,
        "source_id": source_id,
        "kind": kind,
        "text": text,
        "media": [],
        "tokens": [],
        "reject": "",
        "error": "",
        "derived_from": "",
        "transforms": [],
        "bytes_in": {},
        "busy_us": {},
        "stage_ms": {},
        "language": "",
        "language_score": 0.0,
        "pii": {},
        "num_tokens": 0,
        "asset_dir": asset_dir,
        "partition": 0,
        "position": 0,
        "meta": dict(meta or {}),
        "notes": {},
    }


def new_reject(source: str, source_id: str, reason: str, raw: str = "", meta: dict[str, Any] | None = None) -> Document:
    """A record that failed before it became a document (bad line, unreadable file); `raw`, what
    could be read of it, becomes its text."""
    doc = new_document(source, source_id, raw[:2000], meta=meta)
    doc["reject"] = reason
    return doc


def mark_transform(doc: Document, stage: str) -> Document:
    """Append a stage name to the document's provenance."""
    doc["transforms"].append(stage)
    return doc


def docs_to_table(docs: list[Document]):
    """Documents as an Arrow table of arrow_schema() (meta and notes encoded as JSON)."""
    import pyarrow as pa

    rows = [{**doc, **{name: json.dumps(doc[name], ensure_ascii=False) for name in JSON_FIELDS}} for doc in docs]
    return pa.Table.from_pylist(rows, schema=arrow_schema())


def docs_from_table(table) -> list[Document]:
    """The inverse of docs_to_table; tokens come back as uint32 numpy views, not Python ints.
    ~7 ms per 1,024 documents (the driver converts every block of the run)."""
    tokens = table.column("tokens").combine_chunks()
    offsets, values = tokens.offsets.to_numpy(), tokens.values.to_numpy()
    docs = table.drop_columns(["tokens"]).to_pylist()
    for i, doc in enumerate(docs):
        doc["tokens"] = values[offsets[i] : offsets[i + 1]]
        for name in JSON_FIELDS:
            doc[name] = json.loads(doc[name])
        for name in MAP_FIELDS:
            doc[name] = dict(doc[name])  # an Arrow map reads back as (key, value) pairs
    return docs
