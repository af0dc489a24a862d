import gzip
import http.server
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from pydantic import TypeAdapter

from datapipe.pipeline.check import list_inputs
from datapipe.pipeline.inputs import iter_recipe_documents, read_partition, read_work_item, work_items
from datapipe.pipeline.recipe import RecipeError, SourceConfig, validate_recipe
from datapipe.pipeline.registry import FILE_READERS
from datapipe.readers.files import read_files
from datapipe.readers.generators import pydoc_topics, python_programs
from datapipe.readers.tabular import read_hf_disk, read_jsonl, read_parquet
from datapipe.readers.warc import read_html, read_warc
from datapipe.storage import filesystem
from tests.conftest import write_jsonl

GOOD = [{"id": f"d{i}", "text": f"document number {i}", "url": f"https://example.org/{i}"} for i in range(5)]
BAD_LINES = [b'{"id": "x", "text": "unterminated', b'{"id": "y", "text": "caf\xe9"}', b'["not", "an", "object"]',
             b'{"id": "z", "text": ""}', b'{"id": "w"}', b'{"id": "v", "text": 42}', b"   "]
BAD_REASONS = ["read.bad_json", "read.invalid_utf8", "read.not_an_object", "read.empty_text",
               "read.missing_text", "read.text_not_a_string"]


def source(**fields) -> SourceConfig:
    """A source's config as a recipe gives it; the tests hand the readers their paths themselves."""
    fields = {"name": "web", "type": "jsonl", **fields}
    if fields["type"] in FILE_READERS:
        fields.setdefault("paths", ["unused"])
    return TypeAdapter(SourceConfig).validate_python(fields)


def test_jsonl_good_and_bad_lines(tmp_path):
    path = write_jsonl(tmp_path / "mix.jsonl", GOOD, BAD_LINES)
    docs = list(read_jsonl(source(id_field="id"), str(path)))
    alive = [d for d in docs if not d["reject"]]
    assert [d["source_id"] for d in alive] == [r["id"] for r in GOOD]
    assert alive[0]["meta"]["url"] == "https://example.org/0" and alive[0]["text"] == "document number 0"
    rejects = [d for d in docs if d["reject"]]
    assert [d["reject"] for d in rejects] == BAD_REASONS  # the blank line is no record
    assert rejects[0]["source_id"] == f"{path}:6"  # file and 1-based line of the bad record


def test_repeated_id_field_values_give_unique_ids_and_keep_the_value(tmp_path):
    rows = [{"id": "same", "text": f"copy {i}"} for i in range(3)]
    path = write_jsonl(tmp_path / "a.jsonl", rows, [b'{"id": "same"}'])
    docs = list(read_partition(source(id_field="id"), 0, {"path": str(path)}, partition=7))
    assert [d["id"] for d in docs[:3]] == ["web/same@7:0", "web/same@7:1", "web/same@7:2"]
    assert [d["source_id"] for d in docs[:3]] == ["same"] * 3 and docs[0]["meta"]["id"] == "same"
    assert docs[3]["reject"] == "read.missing_text" and docs[3]["id"] == f"web/{path}:4"  # positional already


def test_jsonl_without_id_field_uses_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", GOOD[:2])
    assert [d["id"] for d in read_jsonl(source(), str(path))] == [f"web/{path}:1", f"web/{path}:2"]


def test_gzip_and_zstd_read_the_same_documents(tmp_path):
    plain = write_jsonl(tmp_path / "a.jsonl", GOOD)
    gz = tmp_path / "a.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    zst = tmp_path / "a.jsonl.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress(plain.read_bytes()))
    texts = [[d["text"] for d in read_jsonl(source(), str(p))] for p in (plain, gz, zst)]
    assert texts[0] == texts[1] == texts[2] == [r["text"] for r in GOOD]


def test_truncated_gzip_keeps_good_records_and_rejects_the_rest(tmp_path):
    rows = [{"text": f"line {i} " + "x" * 200} for i in range(200)]
    data = gzip.compress(b"\n".join(__import__("json").dumps(r).encode() for r in rows))
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    docs = list(read_jsonl(source(), str(path)))
    assert docs[-1]["reject"] == "read.corrupt_file"
    assert all(not d["reject"] for d in docs[:-1]) and 0 < len(docs) - 1 < 200


def test_a_source_with_no_existing_path_fails_before_any_work(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", GOOD[:1])
    recipe = validate_recipe({
        "name": "t", "stages": [{"stage": "tokenize"}], "base_dir": str(tmp_path),
        "sources": [{"name": "web", "type": "jsonl", "paths": ["a.jsonl", "gone.jsonl", "typo/*.jsonl"]},
                    {"name": "lost", "type": "jsonl", "paths": ["gone.jsonl", "*.nope"]}]})
    items = work_items(recipe, recipe.sources[0])  # one missing file among others: a reject at read time
    assert [item["path"] for item in items] == [str(tmp_path / p) for p in ("a.jsonl", "gone.jsonl", "typo/*.jsonl")]
    unmatched = list(read_work_item(recipe.sources[0], 0, items[2]))  # so is a pattern that matches nothing
    assert [(d["reject"], d["source_id"]) for d in unmatched] == [("read.missing_file", str(tmp_path / "typo/*.jsonl"))]
    with pytest.raises(RecipeError, match=r"sources\.lost\.paths: \['gone.jsonl', '\*.nope'\] matched no files"):
        list_inputs(recipe)  # the listing a run uses judges it: a source with no file at all is a wrong path


def test_an_empty_folder_in_paths_is_a_reject_naming_it(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", GOOD[:1])
    (tmp_path / "empty" / "sub").mkdir(parents=True)  # nothing but a folder in it
    recipe = validate_recipe({
        "name": "t", "stages": [{"stage": "tokenize"}], "base_dir": str(tmp_path),
        "sources": [{"name": "web", "type": "jsonl", "paths": ["a.jsonl", "empty"]}]})
    items = work_items(recipe, recipe.sources[0])
    assert [item["path"] for item in items] == [str(tmp_path / "a.jsonl"), str(tmp_path / "empty")]
    [reject] = read_work_item(recipe.sources[0], 0, items[1])
    assert (reject["reject"], reject["source_id"]) == ("read.unreadable_file", str(tmp_path / "empty"))
    assert "a folder with no files in it" in reject["text"]


@pytest.mark.parametrize("reader, name", [(read_jsonl, "a.jsonl"), (read_jsonl, "a.jsonl.gz"), (read_jsonl, "a.jsonl.zst"),
                                          (read_parquet, "a.parquet"), (read_html, "a.html"), (read_warc, "a.warc.gz"),
                                          (read_files, "a.svg")])
def test_a_folder_where_a_file_should_be_is_unreadable_not_corrupt(tmp_path, reader, name):
    (tmp_path / name).mkdir()  # what a glob such as *.parquet matches when a folder has that name
    [reject] = reader(source(), str(tmp_path / name))
    assert reject["reject"] == "read.unreadable_file" and str(tmp_path / name) in reject["text"]


def test_missing_file_is_one_reject(tmp_path):
    docs = list(read_jsonl(source(), str(tmp_path / "absent.jsonl")))
    assert [d["reject"] for d in docs] == ["read.missing_file"]


def test_parquet_reader(tmp_path):
    table = pa.table({"text": ["alpha", None, "gamma"], "score": [0.5, 0.1, 0.9]})
    path = tmp_path / "p.parquet"
    pq.write_table(table, path)
    docs = list(read_parquet(source(type="parquet"), str(path)))
    assert [d["reject"] for d in docs] == ["", "read.missing_text", ""]
    assert docs[2]["text"] == "gamma" and docs[2]["meta"]["score"] == 0.9


def test_hf_dataset_saved_to_disk(tmp_path):
    import datasets

    folder = tmp_path / "hf"
    datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"content": ["one", "two"]}),
        "test": datasets.Dataset.from_dict({"content": ["three"]}),
    }).save_to_disk(str(folder))
    docs = list(read_hf_disk(source(type="hf_disk", text_field="content"), str(folder)))
    assert sorted(d["text"] for d in docs) == ["one", "three", "two"]
    assert all(not d["reject"] for d in docs)
    for missing in ("gone", "hf-*"):  # a typo, a pattern that matches nothing: as the file readers say it
        docs = list(read_hf_disk(source(type="hf_disk"), str(tmp_path / missing)))
        assert [(d["reject"], d["source_id"]) for d in docs] == [("read.missing_file", str(tmp_path / missing))]
    (tmp_path / "plain").mkdir()  # a folder that is not a saved dataset
    assert [d["reject"] for d in read_hf_disk(source(type="hf_disk"), str(tmp_path / "plain"))] == \
        ["read.unreadable_dataset"]


def test_generators_are_seeded_and_split_invariant():
    cfg = source(type="python_programs", name="code")
    whole = [d["text"] for d in python_programs(cfg, 7, 0, 20)]
    parts = [d["text"] for d in python_programs(cfg, 7, 0, 9)] + [d["text"] for d in python_programs(cfg, 7, 9, 20)]
    assert whole == parts
    assert whole != [d["text"] for d in python_programs(cfg, 8, 0, 20)]
    for text in whole:
        compile(text, "generated", "exec")  # every program is valid Python


def test_pydoc_topics_are_real_documents():
    from pydoc_data.topics import topics

    docs = list(pydoc_topics(source(type="pydoc_topics", name="pydoc"), 0, 0, 1000))
    assert [d["source_id"] for d in docs] == sorted(topics) and len(docs) > 50  # every topic once, in name order
    assert all(d["text"] == topics[d["source_id"]] and len(d["text"]) > 100 for d in docs)
    assert [d["source_id"] for d in pydoc_topics(source(type="pydoc_topics", name="pydoc"), 0, 10, 20)] == \
        sorted(topics)[10:20]  # a task's range gives exactly its slice


def test_json_too_deep_or_too_long_an_int_is_bad_json(tmp_path):
    path = write_jsonl(tmp_path / "odd.jsonl", GOOD[:1], [b"[" * 100_000 + b"]" * 100_000,
                                                          b'{"text": "big", "n": ' + b"9" * 5000 + b"}"])
    docs = list(read_jsonl(source(), str(path)))
    assert [d["reject"] for d in docs] == ["", "read.bad_json", "read.bad_json"]


def test_lone_surrogate_escape_is_invalid_utf8(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", GOOD[:1], [b'{"text": "half \\ud800 pair"}', b'{"text": "ok", "k": "\\udfff"}'])
    docs = list(read_jsonl(source(), str(path)))
    assert [d["reject"] for d in docs] == ["", "read.invalid_utf8", "read.invalid_utf8"]
    assert "surrogate" in docs[1]["text"]


def test_truncated_zstd_keeps_records_before_the_cut_and_rejects(tmp_path):
    compressor = zstandard.ZstdCompressor()
    second = compressor.compress(b'{"text": "frame two"}\n' * 50)
    path = tmp_path / "cut.jsonl.zst"
    path.write_bytes(compressor.compress(b'{"text": "frame one"}\n' * 3) + second[: len(second) // 2])
    docs = list(read_jsonl(source(), str(path)))
    assert [d["text"] for d in docs[:3]] == ["frame one"] * 3 and all(not d["reject"] for d in docs[:-1])
    assert docs[-1]["reject"] == "read.corrupt_file"


def test_zstd_reads_every_frame(tmp_path):
    compressor = zstandard.ZstdCompressor()
    path = tmp_path / "frames.jsonl.zst"
    path.write_bytes(compressor.compress(b'{"text": "one"}\n') + compressor.compress(b'{"text": "two"}\n'))
    assert [d["text"] for d in read_jsonl(source(), str(path))] == ["one", "two"]


def test_utf8_bom_before_the_first_record_is_skipped(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"text": "first"}\n{"text": "second"}\n')
    docs = list(read_jsonl(source(), str(path)))
    assert [(d["reject"], d["text"]) for d in docs] == [("", "first"), ("", "second")]



def put(url: str, data: bytes) -> str:
    """An object on the test S3 server, from bytes made here."""
    filesystem(url).pipe_file(url, data)
    return url


def jsonl_bytes(rows: list[dict]) -> bytes:
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


def test_jsonl_and_parquet_read_from_s3_as_from_disk(s3):
    plain = jsonl_bytes(GOOD)
    urls = [put(f"{s3}/t/a.jsonl", plain), put(f"{s3}/t/a.jsonl.gz", gzip.compress(plain)),
            put(f"{s3}/t/a.jsonl.zst", zstandard.ZstdCompressor().compress(plain))]
    for url in urls:
        docs = list(read_jsonl(source(), url))
        assert [d["text"] for d in docs] == [r["text"] for r in GOOD] and docs[0]["source_id"] == f"{url}:1"
    table = io.BytesIO()
    pq.write_table(pa.table({"text": ["alpha", None, "gamma"], "score": [0.5, 0.1, 0.9]}), table)
    url = put(f"{s3}/t/p.parquet", table.getvalue())
    docs = list(read_parquet(source(type="parquet"), url))
    assert [d["reject"] for d in docs] == ["", "read.missing_text", ""] and docs[2]["meta"]["score"] == 0.9
    assert docs[2]["source_id"] == f"{url}:2"


def test_a_missing_object_is_one_reject_naming_its_url(s3):
    for reader, kind in [(read_jsonl, "jsonl"), (read_parquet, "parquet"), (read_hf_disk, "hf_disk")]:
        url = f"{s3}/gone/x.{kind}"
        docs = list(reader(source(type=kind), url))
        assert [(d["reject"], d["source_id"]) for d in docs] == [("read.missing_file", url)]
        assert url in docs[0]["text"]  # the rejects file says which object, not only its key
    for kind in ("warc", "html", "files"):
        url = f"{s3}/gone/x.{kind}"
        [doc] = read_work_item(source(type=kind), 0, {"path": url, "start": 0, "stop": 0})
        assert (doc["reject"], doc["source_id"]) == ("read.missing_file", url) and url in doc["text"]


def test_a_saved_dataset_reads_from_s3(s3, tmp_path):
    import datasets

    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"content": ["one", "two"]}),
                          "test": datasets.Dataset.from_dict({"content": ["three"]})}).save_to_disk(str(tmp_path / "hf"))
    fs = filesystem(s3)
    fs.put(str(tmp_path / "hf") + "/", f"{s3}/hf/", recursive=True)
    docs = list(read_hf_disk(source(type="hf_disk", text_field="content"), f"{s3}/hf"))
    assert sorted(d["text"] for d in docs) == ["one", "three", "two"] and all(not d["reject"] for d in docs)
    assert {d["source_id"] for d in docs} == {f"{s3}/hf:train:0", f"{s3}/hf:train:1", f"{s3}/hf:test:0"}


def test_pages_archives_and_files_read_from_s3(s3):
    from tests.test_warc import PAGE, pages

    archive = put(f"{s3}/web/crawl.warc.gz", b"".join(gzip.compress(page) for page in pages(3)))
    docs = list(read_warc(source(type="warc"), archive))
    assert [d["meta"]["url"] for d in docs] == [f"http://example.com/{i}" for i in range(3)]
    assert docs[0]["source_id"] == f"{archive}:0" and docs[0]["kind"] == "html"
    page = put(f"{s3}/web/saved.html.gz", gzip.compress(PAGE.format("saved page").encode()))
    [doc] = read_html(source(type="html"), page)
    assert "saved page" in doc["text"] and doc["source_id"] == page
    put(f"{s3}/site/icons/x.svg", b"<svg xmlns='http://www.w3.org/2000/svg'/>")
    put(f"{s3}/site/about.html", b"<html><body>about</body></html>")
    manifest = put(f"{s3}/site/manifest.jsonl", jsonl_bytes([{"file": "icons/x.svg", "alt": "x"},
                                                             {"file": "about.html"}, {"file": "gone.svg"}]))
    docs = list(read_files(source(type="files"), manifest))
    assert [(d["reject"], d["kind"], d["source_id"]) for d in docs] == [
        ("", "svg", "icons/x.svg"), ("", "html", "about.html"), ("read.missing_file", "text", "gone.svg")]
    assert docs[0]["meta"]["path"] == f"{s3}/site/icons/x.svg" and docs[0]["meta"]["manifest"] == {"alt": "x"}
    assert docs[0]["asset_dir"] == "" and f"{s3}/site/gone.svg" in docs[2]["text"]  # renderers serve local folders only
    [doc] = read_files(source(type="files"), f"{s3}/site/icons/x.svg")
    assert (doc["kind"], doc["asset_dir"], doc["meta"]["bytes"]) == ("svg", "", 41)


def test_a_recipe_lists_s3_globs_and_folders_once_in_the_check(s3):
    for name in ["in/a.jsonl", "in/sub/c.jsonl", "in/.d.jsonl.tmp"]:
        put(f"{s3}/{name}", jsonl_bytes(GOOD[:1]))
    put(f"{s3}/in/b.jsonl.gz", gzip.compress(jsonl_bytes(GOOD[:1])))
    put(f"{s3}/in/notes.txt", b"not json\n")
    recipe = validate_recipe({"name": "t", "stages": [{"stage": "tokenize"}], "sources": [
        {"name": "globbed", "type": "jsonl", "paths": [f"{s3}/in/**/*.jsonl", f"{s3}/in/gone.jsonl"]},
        {"name": "folder", "type": "jsonl", "paths": [f"{s3}/in/"]}]})
    inputs = list_inputs(recipe)
    assert [item["path"] for item in inputs["globbed"]] == [f"{s3}/in/{n}" for n in ("a.jsonl", "sub/c.jsonl", "gone.jsonl")]
    assert [item["path"] for item in inputs["folder"]] == [
        f"{s3}/in/{n}" for n in ("a.jsonl", "b.jsonl.gz", "notes.txt", "sub/c.jsonl")]
    docs = list(iter_recipe_documents(recipe, inputs))
    assert [d["reject"] for d in docs] == ["", "", "read.missing_file", "", "", "read.bad_json", ""]


def test_a_single_file_over_http_reads_and_a_404_is_a_missing_file(tmp_path):
    import functools
    import threading

    write_jsonl(tmp_path / "a.jsonl", GOOD)
    handler = functools.partial(QuietHandler, directory=str(tmp_path))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert [d["text"] for d in read_jsonl(source(), f"{base}/a.jsonl")] == [r["text"] for r in GOOD]
        assert [d["reject"] for d in read_jsonl(source(), f"{base}/gone.jsonl")] == ["read.missing_file"]
        server.shutdown()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def test_web_archive_is_the_same_however_it_is_split_and_has_each_fault():
    from datapipe.readers.web_archive import SHAPES, web_archive
    from datapipe.text.extract import Config as ExtractConfig
    from datapipe.text.extract import make_stage as make_extract

    cfg = source(name="web", type="web_archive", count=20)
    whole = list(web_archive(cfg, 0, 0, 20))
    assert whole == list(web_archive(cfg, 0, 0, 7)) + list(web_archive(cfg, 0, 7, 20))
    assert [doc["meta"]["shape"] for doc in whole[:10]] == SHAPES and {doc["kind"] for doc in whole} == {"html"}
    docs = make_extract(ExtractConfig(stage="extract"))(whole)
    text = [" ".join(doc["text"].split()) for doc in docs]  # paragraph breaks differ from page to page
    assert text[5] == text[0]  # the duplicate repeats index 0's article in another page
    assert text[6] != text[0] and "updated after readers" in text[6]  # the near duplicate: one sentence changed
    assert docs[8]["reject"] == "extract.empty" and docs[18]["reject"] == "extract.empty"  # both kinds of broken page
    assert all("cookies" not in t and "Copyright" not in t for t in text[:4])  # the boilerplate is dropped
