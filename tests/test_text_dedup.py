"""Exact and near-duplicate removal: cluster logic, planted near-duplicates, the distributed global
pass against the plain union-find (the reference), what the driver sees, resume, and a global
end-to-end cleaning run on real Ray (WARC + saved pages + JSONL through every text stage)."""
import gzip
import json
import random
from functools import partial

import numpy as np
import pyarrow as pa
import pytest
import yaml

from datapipe import cli
from datapipe.pipeline.inspect import read_rejects
from datapipe.pipeline.runner import add_stage, map_documents, run_task
from datapipe.pipeline.runner import dataset_of as runner_dataset_of
from datapipe.schema import docs_from_table, docs_to_table, new_document
from datapipe.stage import GlobalContext, GlobalTasks
from datapipe.storage import Store
from datapipe.text import components
from datapipe.text.dedup import (
    Config,
    decide,
    decision,
    find_clusters,
    gather,
    make_stage,
    signature_row,
    transform_dataset,
)
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


def placed(docs: list, partitions: int = 1) -> list:
    """Documents with their place in a run (the runner's reader sets it): partition i % partitions,
    positions ascending within each partition."""
    for i, doc in enumerate(docs):
        doc["partition"], doc["position"] = i % partitions, (i // partitions) << 12
    return docs


def dataset_of(ray_session, docs: list, blocks: int = 1):
    table = docs_to_table(docs)
    size = -(-len(docs) // blocks)
    return ray_session.data.from_arrow([table.slice(i, size) for i in range(0, len(docs), size)])


def run_global(dataset, cfg: Config, work: Store) -> list:
    return [doc for table in add_stage(dataset, cfg, work).iter_batches(batch_format="pyarrow", batch_size=None)
            for doc in docs_from_table(table)]


def test_rejected_documents_take_no_part_in_global_dedup(ray_session, monkeypatch, tmp_path):
    """On real Ray, as the runner runs it: a document rejected upstream is nobody's survivor, its
    copies are judged among the live ones only, and it keeps its own reject reason."""
    monkeypatch.setattr(ray_session.data.DataContext.get_current().execution_options, "preserve_order", True)
    a, b, c = article(1), article(2), article(3)
    docs = placed([new_document("t", str(i), text) for i, text in enumerate([a, b, a, near_copy(b, 1), a, c])])
    docs[0]["reject"], docs[1]["reject"] = "quality.c4", "langid.language"  # the first batch of 2: all rejected
    out = {doc["source_id"]: doc for doc in run_global(dataset_of(ray_session, docs), Config(stage="dedup", batch_size=2),
                                                         Store(tmp_path))}
    assert {k: doc["reject"] for k, doc in out.items()} == {
        "0": "quality.c4", "1": "langid.language", "2": "", "3": "", "4": "dedup.exact_duplicate", "5": ""}
    assert out["2"]["notes"]["dedup"] == out["4"]["notes"]["dedup"] == {"cluster": "t/2", "size": 2}
    assert not any("dedup" in out[k]["notes"] for k in "0135")  # b's near copy has no live partner
    pair = make_stage(Config(stage="dedup"))([new_document("t", "b", b), new_document("t", "copy", near_copy(b, 1))])
    assert pair[1]["reject"] == "dedup.near_duplicate"  # ...though it is one of b when both live


def test_two_documents_with_one_id_get_their_own_verdicts(ray_session, monkeypatch, tmp_path):
    """Ids come from a source's id_field, which may repeat: a unique text that shares its id with
    a duplicate stays (verdicts keyed by id rejected both); verdicts go by (partition, position)."""
    monkeypatch.setattr(ray_session.data.DataContext.get_current().execution_options, "preserve_order", True)
    a, b = article(1), article(2)
    docs = placed([new_document("t", "first", a), new_document("t", "same", a), new_document("t", "same", b)], 2)
    out = run_global(dataset_of(ray_session, docs), Config(stage="dedup", batch_size=2), Store(tmp_path))
    assert [(doc["id"], doc["reject"]) for doc in out] == [("t/first", ""), ("t/same", "dedup.exact_duplicate"),
                                                           ("t/same", "")]
    assert "dedup" not in out[2]["notes"] and out[1]["notes"]["dedup"] == {"cluster": "t/first", "size": 2}
    assert [doc["partition"] for doc in out] == [0, 1, 0]
    with pytest.raises(Exception, match="share one \\(partition, position\\)"):  # unnumbered: all at (0, 0)
        run_global(dataset_of(ray_session, [new_document("t", str(i), a) for i in range(3)]),
                   Config(stage="dedup"), Store(tmp_path / "unnumbered"))
    batch = make_stage(Config(stage="dedup"))([new_document("t", "x", a), new_document("t", "x", a),
                                               new_document("t", "x", b)])
    assert [doc["reject"] for doc in batch] == ["", "dedup.exact_duplicate", ""]


def words(rng: random.Random, count: int) -> list[str]:
    return [f"w{rng.randrange(10**6)}" for _ in range(count)]


def planted_corpus(seed: int, originals: int = 40, partitions: int = 7) -> list:
    """Distinct articles, exact and near copies of some, chains (windows of 200 words sliding by 10:
    neighbours share ~90% of their 5-grams, the ends ~53%, so a chain's ends meet only through its
    middle), a few rejected upstream; placed round-robin over partitions, then shuffled."""
    rng = random.Random(seed)
    texts = [article(seed * 1000 + i) for i in range(originals)]
    texts += [near_copy(texts[i], seed=i) for i in rng.sample(range(originals), originals // 3)]
    texts += [texts[i] for i in rng.sample(range(len(texts)), originals // 4)]
    for _ in range(3):
        line = words(rng, 260)
        texts += [" ".join(line[start : start + 200]) for start in range(0, 61, 10)]
    rng.shuffle(texts)
    docs = placed([new_document("t", str(i), text) for i, text in enumerate(texts)], partitions)
    for doc in rng.sample(docs, len(docs) // 10):
        doc["reject"] = "quality.c4"
    rng.shuffle(docs)  # the dataset's order is not the run's: (partition, position) is
    return docs


def reference_verdicts(docs: list, cfg: Config) -> dict:
    """The plain union-find over the live documents in the run's order: {(partition, position): (reject, notes)}."""
    live = sorted((doc for doc in docs if not doc["reject"]), key=lambda doc: (doc["partition"], doc["position"]))
    rows = [signature_row(doc["text"], cfg) for doc in live]
    exact = np.array([row[0] for row in rows], np.uint64)
    bands = np.array([row[1] for row in rows], np.uint64).reshape(len(rows), cfg.bands)
    verdicts = {(doc["partition"], doc["position"]): (doc["reject"], None) for doc in docs}
    for i, (reason, survivor, size) in find_clusters(np.arange(len(live)), exact, bands, cfg).items():
        notes = {"cluster": live[survivor]["id"], "size": size}
        verdicts[live[i]["partition"], live[i]["position"]] = (f"dedup.{reason}" if reason else "", notes)
    return verdicts


def verdicts_of(out: list) -> dict:
    return {(doc["partition"], doc["position"]): (doc["reject"], doc["notes"].get("dedup")) for doc in out}


@pytest.mark.parametrize("one_task_max_docs", [0, 10_000], ids=["distributed", "one_task"])
def test_distributed_dedup_equals_the_union_find(ray_session, tmp_path, one_task_max_docs):
    """Same survivors, reasons, cluster ids and sizes as find_clusters, on corpora with exact and
    near copies and chains, over many blocks and partitions, with exact or near dedup alone too;
    through the distributed passes and through the one task that small corpora take."""
    for seed, cfg, blocks in [(1, Config(stage="dedup", batch_size=16), 9),
                              (2, Config(stage="dedup", batch_size=8), 4),
                              (3, Config(stage="dedup", exact=False, batch_size=32), 5),
                              (3, Config(stage="dedup", near=False, batch_size=32), 5)]:
        cfg = cfg.model_copy(update={"one_task_max_docs": one_task_max_docs})
        docs = planted_corpus(seed)
        want = reference_verdicts(docs, cfg)
        out = run_global(dataset_of(ray_session, docs, blocks), cfg, Store(tmp_path / f"{seed}-{cfg.exact}"))
        assert len(out) == len(docs) and verdicts_of(out) == want
        reasons = [reject for reject, _ in want.values()]
        assert reasons.count("quality.c4") == len(docs) // 10
        assert cfg.near <= (reasons.count("dedup.near_duplicate") >= 10)  # the corpus has what the test claims
        assert cfg.exact <= (reasons.count("dedup.exact_duplicate") >= 5)
    assert has_chain(planted_corpus(1), Config(stage="dedup"))


@pytest.mark.parametrize("one_task_max_docs", [0, 10_000], ids=["distributed", "one_task"])
def test_the_partition_form_equals_the_union_find(ray_session, tmp_path, one_task_max_docs):
    """As passes of partition tasks run it: gather on each partition's blocks, decide on the cluster
    through the runner's GlobalTasks, the decision applied to the stored blocks: find_clusters'
    verdicts, through the one task and the distributed passes; a second decide reuses the first's."""
    for seed, cfg in [(1, Config(stage="dedup")), (3, Config(stage="dedup", exact=False)),
                      (4, Config(stage="dedup", near=False))]:
        cfg, work = cfg.model_copy(update={"one_task_max_docs": one_task_max_docs}), Store(tmp_path / str(seed))
        docs = sorted(planted_corpus(seed), key=lambda doc: (doc["partition"], doc["position"]))
        blocks = [docs[i : i + 8] for i in range(0, len(docs), 8)]  # blocks of one partition each: cut at a change
        blocks = [[doc for doc in block if doc["partition"] == p] for block in blocks for p in sorted({d["partition"] for d in block})]
        live = {}
        for block in blocks:
            live[block[0]["partition"]] = live.get(block[0]["partition"], 0) + gather(block, cfg, work)
        assert sum(live.values()) == sum(not doc["reject"] for doc in docs)
        tasks = GlobalTasks(work, partial(run_task, cfg), runner_dataset_of)
        token = decide(cfg, tasks, sorted(p for p, n in live.items() if n), sum(live.values()))
        apply = decision(cfg, work, token)
        out = [doc for block in blocks for doc in apply([{**doc, "notes": {}} for doc in block])]
        assert verdicts_of(out) == reference_verdicts(docs, cfg)
        done = work.read_bytes("done")
        assert decide(cfg, tasks, [], 0) == token and work.read_bytes("done") == done  # made once: reused
        with pytest.raises(ValueError, match="remove .* to redo them"):
            decide(cfg.model_copy(update={"bands": 10}), tasks, [], 0)


def has_chain(docs: list, cfg: Config) -> bool:
    """Whether some cluster holds two documents that share no key: joined only through others."""
    keys = {(doc["partition"], doc["position"]): set(signature_row(doc["text"], cfg)[1]) for doc in docs}
    clusters: dict = {}
    for place, (_, notes) in reference_verdicts(docs, cfg).items():
        if notes:
            clusters.setdefault(notes["cluster"], []).append(place)
    return any(not keys[a] & keys[b] for members in clusters.values() for a in members for b in members)


class DriverSpy:
    """A dataset as the driver holds it: records each method called and each value handed back
    that is not another dataset (or a grouping of one)."""

    def __init__(self, target, seen: list):
        self.target, self.seen = target, seen

    def __getattr__(self, name: str):
        method = getattr(self.target, name)

        def call(*args, **kwargs):
            result = method(*(arg.target if isinstance(arg, DriverSpy) else arg for arg in args), **kwargs)
            if hasattr(result, "map_batches") or hasattr(result, "map_groups"):
                self.seen.append((name, "dataset"))
                return DriverSpy(result, self.seen)
            self.seen.append((name, result))
            return result

        return call


def test_the_driver_receives_counts_only(ray_session, tmp_path):
    """Run on a spied dataset: what comes back to the driver is row counts and the rounds' sums of
    changed edges, a few ints whatever the corpus; no rows, no iteration. A rerun over the same work
    folder (a killed run resumed) only applies the stored verdicts."""
    cfg = Config(stage="dedup", batch_size=16, one_task_max_docs=0)  # the distributed passes
    docs = planted_corpus(4)
    dataset = dataset_of(ray_session, docs, 6)
    dataset.context.shuffle_strategy = "sort_shuffle_pull_based"  # as the runner's add_stage sets
    context = GlobalContext(partial(map_documents, cfg=cfg), Store(tmp_path))
    seen: list = []
    out = transform_dataset(DriverSpy(dataset, seen), cfg, context).target
    assert verdicts_of([doc for table in out.iter_batches(batch_format="pyarrow", batch_size=None)
                        for doc in docs_from_table(table)]) == reference_verdicts(docs, cfg)
    values = [value for _, value in seen if value != "dataset"]
    assert {name for name, value in seen if value != "dataset"} <= {"count", "sum"}
    assert all(isinstance(value, int) or value is None for value in values) and len(values) < 12
    assert not {"iter_batches", "iter_rows", "take", "take_all", "to_pandas", "show"} & {name for name, _ in seen}
    seen.clear()
    transform_dataset(DriverSpy(dataset, seen), cfg, context)
    assert seen == [("map_batches", "dataset")]  # resumed: no materialize, no grouping, no count


def test_a_rerun_reuses_finished_verdicts_and_redoes_unfinished_ones(ray_session, tmp_path):
    """With work/done present the verdicts are read, not made (a changed text changes nothing); without
    it (killed before the end) they are made again, byte for byte the same, stale files gone; verdicts of
    other settings are refused."""
    cfg = Config(stage="dedup", batch_size=16)
    docs, work = planted_corpus(5, partitions=4), Store(tmp_path / "work")
    first = verdicts_of(run_global(dataset_of(ray_session, docs, 3), cfg, work))
    files = {name: work.read_bytes(f"verdicts/{name}") for name in work.list("verdicts")}
    done = work.read_bytes("done")
    assert first == reference_verdicts(docs, cfg) and 0 < len(files) <= 4
    assert all(name.startswith("p") and name.endswith(".arrow") for name in files)
    changed = [{**doc, "text": article(10_000 + i)} for i, doc in enumerate(docs)]  # nothing left to find...
    assert verdicts_of(run_global(dataset_of(ray_session, changed, 3), cfg, work)) == first  # ...but the verdicts stand
    assert work.read_bytes("done") == done
    work.remove("done")
    work.write_bytes("verdicts/p000099.arrow", b"a killed run's leftover")
    assert verdicts_of(run_global(dataset_of(ray_session, docs, 5), cfg, work)) == first
    assert {name: work.read_bytes(f"verdicts/{name}") for name in work.list("verdicts")} == files
    with pytest.raises(ValueError, match="remove .*work to redo them"):
        add_stage(dataset_of(ray_session, docs), Config(stage="dedup", bands=10), work)


def test_connected_components_equal_the_union_find(ray_session, monkeypatch):
    """Random graphs and a long chain: the stars are the union-find's roots; rounds are bounded."""
    rng = random.Random(7)
    nodes = sorted({(rng.randrange(5), rng.randrange(1 << 40)) for _ in range(300)})
    pairs = [tuple(sorted(rng.sample(range(len(nodes)), 2), reverse=True)) for _ in range(200)]
    pairs += [(i + 1, i) for i in range(200, 263)]  # a chain of 64
    edges = pa.table({name: [nodes[pair[side]][field] for pair in pairs]
                      for name, side, field in zip(components.EDGE, (0, 0, 1, 1), (0, 1, 0, 1))})
    dataset = ray_session.data.from_arrow([edges.slice(i, 50) for i in range(0, len(pairs), 50)])
    dataset.context.shuffle_strategy = "sort_shuffle_pull_based"
    stars = [row for table in components.connected_components(dataset, 16).iter_batches(batch_format="pyarrow")
             for row in table.to_pylist()]
    parent = list(range(len(nodes)))
    for a, b in pairs:
        root_a, root_b = find_root(parent, a), find_root(parent, b)
        parent[max(root_a, root_b)] = min(root_a, root_b)
    want = {nodes[i]: nodes[find_root(parent, i)] for i in range(len(nodes)) if find_root(parent, i) != i}
    assert {(row["part"], row["pos"]): (row["to_part"], row["to_pos"]) for row in stars} == want
    assert len(stars) == len(want)
    monkeypatch.setattr(components, "MAX_ROUNDS", 2)
    with pytest.raises(RuntimeError, match="did not settle in 2 rounds"):
        components.connected_components(dataset, 16)


def find_root(parent: list, i: int) -> int:
    while parent[i] != i:
        i = parent[i]
    return i


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
    out = tmp_path / "out"
    assert cli.main(["run", str(tmp_path / "clean.yaml"), "--out", str(out)]) == 0
    stats = json.loads((out / "stats.json").read_text())
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
    rejects = {r["source_id"]: r for r in read_rejects(tmp_path / "out") if r["source"] == "docs"}
    assert rejects["copy-of-warc-0"]["notes"]["dedup"]["cluster"].startswith("crawl/")
    assert rejects["dup"]["notes"]["dedup"]["size"] == 2 and rejects["dup"]["notes"]["dedup"]["cluster"].startswith("docs/j0@")
    # in passes of partition tasks (the default here) and as Ray Data's operator plan: the same bytes
    assert stats["execution"] == "partition tasks"
    ops = tmp_path / "ops"
    assert cli.main(["run", str(tmp_path / "clean.yaml"), "--out", str(ops), "--set", "ray.partition_tasks=false"]) == 0
    assert json.loads((ops / "stats.json").read_text())["execution"] == "an operator a stage"
    for name in ["main/manifest.json", *(p.relative_to(ops).as_posix() for p in ops.glob("rejects/*"))]:
        ours, theirs = (out / name).read_bytes(), (ops / name).read_bytes()
        if name.endswith("manifest.json"):  # the recipe it holds differs in ray.partition_tasks alone
            ours, theirs = ([s["sha256"] for s in json.loads(text)["shards"]] for text in (ours, theirs))
        assert ours == theirs, name
