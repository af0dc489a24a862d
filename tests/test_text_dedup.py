"""Exact and near-duplicate removal: cluster logic, planted near-duplicates, and a global
end-to-end cleaning run on real Ray (WARC + saved pages + JSONL through every text stage)."""
import gzip
import json
import random

import numpy as np
import yaml

from datapipe import cli
from datapipe.pipeline.inspect import read_rejects
from datapipe.pipeline.runner import add_stage
from datapipe.schema import docs_from_table, docs_to_table, new_document
from datapipe.text.dedup import Config, find_clusters, make_stage
from tests.test_warc import http_response, warc_record

NOUNS = (
    "river town council school family home bridge water street engineer office owner floor mayor "
    "wall promise result government money repair payment farmer valley field wheat weather week storm"
).split()
VERBS = "opened closed inspected cleaned counted promised built expected feared gave found moved".split()
ADJECTIVES = "old new wet dry regional local first last higher lower busy quiet".split()


def article(seed: int, sentences: int = 24) -> str:
    """A plain English text that passes the quality rules; different seeds share few 5-grams."""
    rng = random.Random(seed)
    vocabulary = NOUNS + VERBS + ADJECTIVES + ["the", "and", "of", "to", "with", "that"] * 3
    lines = [f"The {' '.join(rng.choices(vocabulary, k=11))} {rng.randint(2, 999)} times." for _ in range(sentences)]
    return "\n".join(lines[:12]) + "\n\n" + "\n".join(lines[12:])


def near_copy(text: str, seed: int, changes: int = 3) -> str:
    rng = random.Random(seed)
    words = text.split(" ")
    for i in rng.sample([i for i, w in enumerate(words) if "\n" not in w], changes):
        words[i] = "changed"
    first, second = " ".join(words).split("\n\n")
    return second + "\n\n" + first  # paragraphs reordered too


def test_clusters_keep_the_earliest_and_name_the_reason():
    exact = np.array([1, 2, 1, 3, 4], np.uint64)
    bands = np.array([[10, 11], [20, 21], [10, 11], [30, 21], [40, 41]], np.uint64)
    verdicts = find_clusters(np.arange(5), exact, bands, Config(stage="dedup", bands=2, rows=1))
    assert verdicts == {0: ("", 0, 2), 2: ("exact_duplicate", 0, 2), 1: ("", 1, 2), 3: ("near_duplicate", 1, 2)}
    empty = find_clusters(np.arange(0), np.zeros(0, np.uint64), np.zeros((0, 2), np.uint64), Config(stage="dedup", bands=2))
    assert empty == {}  # every document rejected upstream: nothing to cluster


def test_rejected_documents_take_no_part_in_global_dedup(ray_session, monkeypatch):
    """On real Ray, as the runner runs it: a document rejected upstream is nobody's survivor, its
    copies are judged among the live ones only, and it keeps its own reject reason."""
    monkeypatch.setattr(ray_session.data.DataContext.get_current().execution_options, "preserve_order", True)
    a, b, c = article(1), article(2), article(3)
    docs = [new_document("t", str(i), text) for i, text in enumerate([a, b, a, near_copy(b, 1), a, c])]
    docs[0]["reject"], docs[1]["reject"] = "quality.c4", "langid.language"  # the first batch of 2: all rejected
    dataset = add_stage(ray_session.data.from_arrow(docs_to_table(docs)), Config(stage="dedup", batch_size=2))
    out = {doc["source_id"]: doc for table in dataset.iter_batches(batch_format="pyarrow", batch_size=None)
           for doc in docs_from_table(table)}
    assert {k: doc["reject"] for k, doc in out.items()} == {
        "0": "quality.c4", "1": "langid.language", "2": "", "3": "", "4": "dedup.exact_duplicate", "5": ""}
    assert out["2"]["notes"]["dedup"] == out["4"]["notes"]["dedup"] == {"cluster": "t/2", "size": 2}
    assert not any("dedup" in out[k]["notes"] for k in "0135")  # b's near copy has no live partner
    pair = make_stage(Config(stage="dedup"))([new_document("t", "b", b), new_document("t", "copy", near_copy(b, 1))])
    assert pair[1]["reject"] == "dedup.near_duplicate"  # ...though it is one of b when both live


def test_two_documents_with_one_id_get_their_own_verdicts(ray_session, monkeypatch):
    """Ids come from a source's id_field, which may repeat: a unique text that shares its id with
    a duplicate stays (verdicts keyed by id rejected both)."""
    monkeypatch.setattr(ray_session.data.DataContext.get_current().execution_options, "preserve_order", True)
    a, b = article(1), article(2)
    docs = [new_document("t", "first", a), new_document("t", "same", a), new_document("t", "same", b)]
    dataset = add_stage(ray_session.data.from_arrow(docs_to_table(docs)), Config(stage="dedup", batch_size=2))
    out = [doc for table in dataset.iter_batches(batch_format="pyarrow", batch_size=None)
           for doc in docs_from_table(table)]
    assert [(doc["id"], doc["reject"]) for doc in out] == [("t/first", ""), ("t/same", "dedup.exact_duplicate"),
                                                           ("t/same", "")]
    assert "dedup" not in out[2]["notes"] and out[1]["notes"]["dedup"] == {"cluster": "t/first", "size": 2}
    assert all("dedup_key" not in doc for doc in out)  # the key column goes with the verdicts
    batch = make_stage(Config(stage="dedup"))([new_document("t", "x", a), new_document("t", "x", a),
                                               new_document("t", "x", b)])
    assert [doc["reject"] for doc in batch] == ["", "dedup.exact_duplicate", ""]


def test_planted_near_duplicates_are_found_and_distinct_texts_kept():
    originals = [article(seed) for seed in range(80)]
    copies = [near_copy(originals[i], seed=i) for i in range(0, 80, 2)]
    docs = [new_document("t", str(i), text) for i, text in enumerate(originals + copies + originals[:5])]
    out = make_stage(Config(stage="dedup"))(docs)
    rejects = {doc["source_id"]: doc for doc in out if doc["reject"]}
    assert {k for k, d in rejects.items() if d["reject"] == "dedup.near_duplicate"} == {str(80 + j) for j in range(40)}
    assert {k for k, d in rejects.items() if d["reject"] == "dedup.exact_duplicate"} == {str(120 + j) for j in range(5)}
    assert rejects["80"]["notes"]["dedup"] == {"cluster": "t/0", "size": 3}  # + its exact copy at 120
    assert all(not doc["reject"] for doc in out[:80])


def test_cleaning_recipe_end_to_end_on_ray(tmp_path, tiny_tokenizer, ray_session):
    texts = [article(seed) for seed in range(30)]
    pages = [f"<html><body><nav><a href='/'>Home</a></nav><article>{''.join(f'<p>{line}</p>' for line in t.splitlines())}"
             f"</article></body></html>" for t in texts[:10]]
    warc = [warc_record(http_response(page.encode()), f"http://example.com/{i}") for i, page in enumerate(pages)]
    (tmp_path / "crawl.warc.gz").write_bytes(b"".join(gzip.compress(r) for r in warc) + b"\x1f\x8b\x08garbage")
    (tmp_path / "pages").mkdir()
    for i, charset in enumerate(["shift_jis", "gb2312", "iso-8859-1", "utf-8"]):
        html = f'<html><head><meta charset="{charset}"></head><body><p>{texts[10 + i].replace(chr(10), "</p><p>")}</p></body></html>'
        (tmp_path / "pages" / f"{i}.html").write_bytes(html.encode(charset))
    rows = [{"id": f"j{i}", "text": t} for i, t in enumerate(texts[14:])]
    rows += [{"id": "copy-of-warc-0", "text": near_copy(texts[0], 1)}, {"id": "mail", "text": article(99) + "\nMail bob@example.com now."},
             {"id": "short", "text": "Too short."}, {"id": "dup", "text": texts[14]}]
    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    recipe = {
        "name": "clean", "sources": [
            {"name": "crawl", "type": "warc", "paths": ["crawl.warc.gz"]},
            {"name": "pages", "type": "html", "paths": ["pages"]},
            {"name": "docs", "type": "jsonl", "paths": ["docs.jsonl"], "id_field": "id"}],
        "stages": [{"stage": "extract"}, {"stage": "normalize", "fix_mojibake": True}, {"stage": "langid", "languages": ["en"]},
                   {"stage": "quality"}, {"stage": "pii"}, {"stage": "dedup", "batch_size": 4},
                   {"stage": "tokenize", "tokenizer": str(tiny_tokenizer)}],
        "phases": [{"name": "main", "seq_len": 64}], "ray": {"object_store_mb": 256}}
    (tmp_path / "clean.yaml").write_text(yaml.safe_dump(recipe))
    assert cli.main(["run", str(tmp_path / "clean.yaml"), "--out", str(tmp_path / "out")]) == 0
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["balanced"] and sum(stats["records_in"].values()) == 10 + 1 + 4 + len(rows)
    assert stats["rejected"] == {"dedup.near_duplicate": 1, "dedup.exact_duplicate": 1, "read.warc_bad_gzip": 1,
                                 "quality.gopher_repetition.top_2_gram": 1}  # short: as datatrove
    for stage in ("extract", "langid", "quality", "pii", "dedup"):
        counts = stats["stages"][stage]
        assert counts["in"] == counts["kept"] + counts["rejected"] and counts["bytes_in"] > 0
    readable = sum(stats["records_in"].values()) - stats["rejected"]["read.warc_bad_gzip"]  # every page and row
    assert stats["stages"]["extract"]["in"] == readable == 10 + 4 + len(rows)
    assert stats["languages"] == {"en": sum(stats["written"].values())}  # langid kept English only
    rules, quality_in = stats["rules"], stats["stages"]["quality"]["in"]
    assert list(rules) == [f"quality.{g}" for g in ("gopher_repetition", "gopher_quality", "c4", "fineweb")]
    assert rules["quality.gopher_repetition"] == {**rules["quality.gopher_repetition"], "in": quality_in, "dropped": 1}
    assert rules["quality.gopher_quality"]["in"] == rules["quality.fineweb"]["kept"] == quality_in - 1
    assert stats["pii_redactions"] == {"email": 1}  # "bob@example.com" in the "mail" document
    rejects = {r["id"]: r for r in read_rejects(tmp_path / "out")}
    assert rejects["docs/copy-of-warc-0"]["notes"]["dedup"]["cluster"].startswith("crawl/")
    assert rejects["docs/dup"]["notes"]["dedup"] == {"cluster": "docs/j0", "size": 2}
