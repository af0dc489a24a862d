"""The record schema: every field round-trips through Arrow, kinds are one list, and a source's
own columns stay in meta, whatever their names, without touching what the pipeline decides."""
import json
import typing

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from PIL import Image

from datapipe import cli
from datapipe.pipeline import registry
from datapipe.pipeline.apply import reject_line
from datapipe.pipeline.inspect import read_rejects
from datapipe.pipeline.recipe import RecipeError, TabularSource, load_recipe
from datapipe.readers.files import EXTENSION_KINDS
from datapipe.readers.warc import read_warc
from datapipe.schema import (
    KINDS,
    MEDIA_PLACEHOLDER,
    Document,
    arrow_schema,
    docs_from_table,
    docs_to_table,
    new_document,
    new_reject,
)
from datapipe.stage import load
from renderers import RENDERERS
from renderers.samples import LANGUAGES
from tests.conftest import write_jsonl
from tests.test_render_svg import SVG
from tests.test_sources import source as source_config
from tests.test_warc import PAGE, http_response, warc_record

# Columns named like the pipeline's own fields and stage notes, with values that would crash
# or steer the pipeline if it read them: dicts where it counts, numbers where it expects a
# dict, a folder a renderer must never serve, a dHash that is no hex.
HOSTILE = {
    "derived_from": {"id": "web/0"}, "error": 7, "language": {"code": "xx"}, "language_score": "high",
    "num_tokens": "many", "bytes_in": 12345, "transforms": "mine", "pii": {"email": "lots"},
    "asset_dir": "/etc", "render": {"dhash": ["zz"], "sizes": "big"}, "notes": [1, 2], "meta": None,
    "reject": "quality.c4", "kind": "svg", "source": "elsewhere", "tokens": [1, 2, 3], "dedup": {"cluster": 0},
}


def full_document(i: int) -> Document:
    """A document with every field set to something other than its default."""
    doc = new_document("web", f"f.jsonl:{i}", f"text {i} {MEDIA_PLACEHOLDER} é", kind="image",
                       meta={**HOSTILE, "url": f"http://e.com/{i}", "nested": {"a": [1, {"b": None}]}},
                       asset_dir=f"/data/site{i}")
    doc.update(media=[b"\x89PNG" + bytes([i])], tokens=np.arange(i, i + 7, dtype=np.uint32), reject="",
               error="ValueError: bad", derived_from=f"web/{i - 1}", transforms=["normalize", "langid"],
               bytes_in={"normalize": 120 + i, "langid": 118}, busy_us={"langid": 40 + i},
               stage_ms={"langid": [1_764_000_000_000 + i, 1_764_000_000_050]}, language="de", language_score=0.8731,
               pii={"email": 2, "phone_number": 1}, num_tokens=7, notes={"render": {"dhash": ["00ff"]}})
    return doc


def comparable(doc: Document) -> dict:
    return {**doc, "tokens": np.asarray(doc["tokens"]).tolist()}


def test_arrow_schema_has_one_column_per_document_field():
    assert arrow_schema().names == list(typing.get_type_hints(Document))


def test_every_field_round_trips_through_arrow():
    docs = [full_document(i) for i in range(1, 4)] + [new_document("s", "plain", "x"), new_reject("s", "9", "read.bad")]
    table = docs_to_table(docs)
    assert table.schema == arrow_schema()
    assert [comparable(d) for d in docs_from_table(table)] == [comparable(d) for d in docs]
    sliced = docs_from_table(table.slice(1, 2))  # Ray hands stages slices of blocks
    assert [comparable(d) for d in sliced] == [comparable(d) for d in docs[1:3]]
    assert docs_from_table(docs_to_table([])) == []


def test_typed_fields_are_typed_arrow_columns():
    types = dict(zip(arrow_schema().names, arrow_schema().types))
    assert types["transforms"] == pa.list_(pa.string()) and types["num_tokens"] == pa.int64()
    assert types["bytes_in"] == types["pii"] == pa.map_(pa.string(), pa.int64())
    assert types["language"] == types["derived_from"] == types["error"] == types["asset_dir"] == pa.string()


def test_a_reject_line_carries_every_fact_but_media_tokens_and_timings():
    doc = full_document(1)
    doc["reject"] = "tokenize.bad_image"
    line = json.loads(reject_line(doc))
    assert list(line)[:7] == ["id", "source", "source_id", "kind", "reject", "error", "text"]
    timings = ("busy_us", "stage_ms")  # a rerun's rejects files are byte-identical
    assert line == {k: v for k, v in doc.items() if k not in ("media", "tokens", *timings)}


def test_a_source_kind_must_be_one_that_exists(tmp_path):
    with pytest.raises(ValueError, match="unknown kind 'txt'; allowed: " + ", ".join(KINDS)):
        TabularSource(name="web", type="jsonl", paths=["a.jsonl"], kind="txt")
    recipe = {"name": "t", "sources": [{"name": "web", "type": "jsonl", "paths": ["a.jsonl"], "kind": "txt"}],
              "stages": [{"stage": "tokenize"}]}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    with pytest.raises(RecipeError, match=r"sources\[0\]\.kind: .*unknown kind 'txt'; allowed: text, code, svg"):
        load_recipe(tmp_path / "r.yaml")
    assert all(TabularSource(name="web", type="jsonl", paths=["a.jsonl"], kind=kind).kind == kind for kind in KINDS)


def test_every_kind_a_reader_generator_or_renderer_names_is_in_kinds(tmp_path):
    named = {*EXTENSION_KINDS.values(), *RENDERERS, *LANGUAGES}
    for name, target in registry.GENERATORS.items():
        cfg = source_config(name=name, type=name)
        named |= {doc["kind"] for doc in load(target)(cfg, 0, 0, 5)}
    (tmp_path / "a.warc").write_bytes(warc_record(http_response(PAGE.format("a page").encode()), "http://e.com/")
                                      + warc_record(b"extracted text", "http://e.com/", kind="conversion"))
    warc_kinds = {doc["kind"] for doc in read_warc(source_config(name="w", type="warc"), str(tmp_path / "a.warc"))}
    assert warc_kinds == {"html", "text"}
    assert named | warc_kinds <= set(KINDS)


def test_a_manifest_column_cannot_choose_the_folder_a_renderer_serves(tmp_path):
    from datapipe.readers.files import read_files

    (tmp_path / "icons").mkdir()
    (tmp_path / "icons" / "x.svg").write_text("<svg/>")
    write_jsonl(tmp_path / "manifest.jsonl", [{"file": "icons/x.svg", **HOSTILE}])
    [doc] = read_files(source_config(name="site", type="files"), str(tmp_path / "manifest.jsonl"))
    assert doc["asset_dir"] == str(tmp_path / "icons") and doc["meta"]["manifest"] == HOSTILE
    assert (doc["transforms"], doc["language"], doc["derived_from"], doc["notes"]) == ([], "", "", {})


def test_columns_named_like_pipeline_fields_land_in_meta_unchanged(tmp_path):
    from datapipe.readers.tabular import read_jsonl, read_parquet

    row = {"text": "a document", **HOSTILE}
    [from_json] = read_jsonl(source_config(name="web", type="jsonl"), str(write_jsonl(tmp_path / "m.jsonl", [row])))
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "m.parquet")
    [from_parquet] = read_parquet(source_config(name="web", type="parquet"), str(tmp_path / "m.parquet"))
    for doc in (from_json, from_parquet):
        assert doc["meta"] == HOSTILE
        fresh = new_document("web", doc["source_id"], "a document")
        assert {k: v for k, v in doc.items() if k != "meta"} == {k: v for k, v in fresh.items() if k != "meta"}


TEXTS = ["Write to ada@example.org about the river that flooded the old town last spring.",
         "The committee met on Tuesday and agreed to rebuild the bridge before the winter.",
         f"A caption with a placeholder {MEDIA_PLACEHOLDER} but no image: tokenize rejects it."]
ICONS = {"plain": f'<svg {SVG} width="64" height="64"><circle cx="32" cy="32" r="20" fill="#00a"/></svg>',
         "hostile": f'<svg {SVG} width="64" height="64"><rect x="8" y="8" width="30" height="40" fill="#c00"/></svg>'}
LEAK = f'<svg {SVG} width="64" height="64"><image href="secret.png" width="60" height="60"/></svg>'


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory, tiny_tokenizer, ray_session):
    """Three text sources with the same rows (one plain, two whose rows carry HOSTILE columns, JSONL
    and Parquet) and two SVG sources (one whose rows point asset_dir at a folder holding a PNG)."""
    tmp = tmp_path_factory.mktemp("hostile")
    (tmp / "assets").mkdir()
    Image.new("RGB", (60, 60), (200, 30, 30)).save(tmp / "assets" / "secret.png")  # a PNG a renderer would embed
    hostile = {**HOSTILE, "asset_dir": str(tmp / "assets")}
    write_jsonl(tmp / "plain.jsonl", [{"text": text} for text in TEXTS])
    write_jsonl(tmp / "hostile.jsonl", [{"text": text, **hostile} for text in TEXTS])
    pq.write_table(pa.Table.from_pylist([{"text": text, **hostile} for text in TEXTS]), tmp / "hostile.parquet")
    write_jsonl(tmp / "plain_icons.jsonl", [{"text": ICONS["plain"]}, {"text": LEAK}])
    write_jsonl(tmp / "icons.jsonl", [{"text": ICONS["hostile"], **hostile}, {"text": LEAK, **hostile}])
    recipe = {
        "name": "hostile", "seed": 1,
        "sources": [{"name": "plain", "type": "jsonl", "paths": ["plain.jsonl"]},
                    {"name": "rows", "type": "jsonl", "paths": ["hostile.jsonl"]},
                    {"name": "table", "type": "parquet", "paths": ["hostile.parquet"]},
                    {"name": "plain_icons", "type": "jsonl", "paths": ["plain_icons.jsonl"], "kind": "svg"},
                    {"name": "icons", "type": "jsonl", "paths": ["icons.jsonl"], "kind": "svg"}],
        "stages": [{"stage": "langid"}, {"stage": "pii"},
                   {"stage": "render", "kinds": ["svg"], "size": 64, "num_cpus": 0.25},
                   {"stage": "render_dedup"}, {"stage": "code_image_samples"},
                   {"stage": "tokenize", "tokenizer": str(tiny_tokenizer), "num_cpus": 0.5}],
        "phases": [{"name": "main", "seq_len": 1024}],
    }
    (tmp / "hostile.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    assert cli.main(["run", str(tmp / "hostile.yaml"), "--out", str(tmp / "out")]) == 0
    rejects = list(read_rejects(tmp / "out"))
    return json.loads((tmp / "out" / "stats.json").read_text()), rejects, hostile, tmp / "out"


@pytest.mark.slow
def test_hostile_columns_change_no_figure_of_the_run(hostile_run):
    stats, _, _, _ = hostile_run
    texts, icons = len(TEXTS), 2
    assert stats["balanced"] is True and stats["created"] == {}
    assert stats["records_in"] == {"plain": texts, "rows": texts, "table": texts, "plain_icons": icons, "icons": icons}
    assert stats["written"] == {"plain": texts - 1, "rows": texts - 1, "table": texts - 1, "plain_icons": 1, "icons": 1}
    assert stats["rejected"] == {"tokenize.media_count_mismatch": 3, "render.external_reference": 2}
    assert stats["pii_redactions"] == {"email": 3}  # one address per text source; the "pii" columns add nothing
    assert "unknown" not in stats["languages"] and "xx" not in stats["languages"]
    assert stats["languages"]["en"] >= 3 * (texts - 1)
    assert list(stats["stages"]) == ["langid", "pii", "render", "render_dedup", "code_image_samples",
                                     "tokenize", "pack"]  # no stage named by a "transforms" or "bytes_in" column
    for stage in ("langid", "pii", "render", "tokenize"):
        assert stats["stages"][stage]["bytes_in"] > 0 and "bytes_in" not in stats["stages"]
    per_source = stats["phases"]["main"]["sources"]
    assert per_source["plain"] == per_source["rows"] == per_source["table"]


@pytest.mark.slow
def test_hostile_columns_reach_the_rejects_unchanged_and_steer_no_renderer(hostile_run, capsys):
    _, rejects, hostile, out = hostile_run
    by_source = {(line["source"], line["reject"]): line for line in rejects}
    for source in ("rows", "table", "icons"):
        reason = "render.external_reference" if source == "icons" else "tokenize.media_count_mismatch"
        line = by_source[(source, reason)]
        assert line["meta"] == hostile  # every column, its name and value as the source wrote them
        assert line["asset_dir"] == "" and line["derived_from"] == "" and line["kind"] in ("text", "svg")
        assert "render_dedup" not in line["notes"] and line["error"]
    # the icon's asset_dir column names a folder holding secret.png: the renderer served nothing from it
    assert by_source[("icons", "render.external_reference")]["error"] == "secret.png"
    assert by_source[("plain_icons", "render.external_reference")]["error"] == "secret.png"
    assert by_source[("rows", "tokenize.media_count_mismatch")]["transforms"] == ["langid", "pii", "render",
                                                                                  "render_dedup",
                                                                                  "code_image_samples"]
    assert cli.main(["inspect", str(out), "--samples", "0"]) == 0
    shown = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert "render.external_reference" in shown and "error: secret.png" in shown
