"""End to end on real Ray: the CLI runs a tiny recipe; every record is accounted for."""
import gzip
import json
import socket

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datapipe import cli, stream
from datapipe.pipeline.apply import apply_stage
from datapipe.pipeline.inspect import read_rejects
from datapipe.pipeline.recipe import TabularSource as JsonlConfig
from datapipe.readers.tabular import read_jsonl
from datapipe.schema import docs_from_table, docs_to_table, new_document
from datapipe.text.normalize import Config as NormalizeConfig
from datapipe.text.normalize import make_stage as make_normalize
from tests.conftest import WORDS, tiny_recipe, write_jsonl
from tokenizer.bpe import load_tokenizer

# ids repeat, as a source's id_field may: within mixed.jsonl (g0-g4 twice) and across files (g5-g14 in more.jsonl.gz)
GOOD = [{"id": f"g{i % 15}", "text": " ".join(WORDS[i % 7 :]) * (1 + i % 5)} for i in range(40)]
# the cut line holds U+2028 and U+0085 raw: str.splitlines ends a line at each (a real web text's did)
BAD = [b'{"id": "cut", "text": "no\xe2\x80\xa8end\xc2\x85', b'{"id": "latin1", "text": "caf\xe9"}', b'{"id": "empty", "text": " "}',
       b'{"id": "notext"}']


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_tokenizer, ray_session):
    tmp = tmp_path_factory.mktemp("run")
    write_jsonl(tmp / "mixed.jsonl", GOOD[:20], BAD)
    (tmp / "more.jsonl.gz").write_bytes(gzip.compress(write_jsonl(tmp / "x.jsonl", GOOD[20:30]).read_bytes()))
    pq.write_table(pa.table({"text": [r["text"] for r in GOOD[30:]], "id": [r["id"] for r in GOOD[30:]]}),
                   tmp / "rest.parquet")
    sources = [
        {"name": "web", "type": "jsonl", "paths": ["mixed.jsonl", "more.jsonl.gz", "missing.jsonl"], "id_field": "id"},
        {"name": "table", "type": "parquet", "paths": ["*.parquet"], "id_field": "id"},
        {"name": "code", "type": "python_programs", "count": 30},
    ]
    recipe = tiny_recipe(tmp, tiny_tokenizer, sources)
    out = tmp / "out"
    assert cli.main(["run", str(recipe), "--out", str(out)]) == 0
    return out


def test_records_in_equal_written_plus_rejected(finished_run):
    stats = json.loads((finished_run / "stats.json").read_text())
    records_in = sum(stats["records_in"].values())
    assert records_in == len(GOOD) + len(BAD) + 1 + 30  # + the missing file + 30 generated programs
    assert records_in == sum(stats["written"].values()) + sum(stats["rejected"].values())
    assert stats["balanced"] is True
    assert stats["rejected"] == {"read.bad_json": 1, "read.invalid_utf8": 1, "read.empty_text": 1,
                                 "read.missing_text": 1, "read.missing_file": 1}
    assert stats["stages"]["tokenize"]["kept"] == len(GOOD) + 30
    read = stats["stages"]["read"]
    assert (read["in"], read["kept"], read["rejected"]) == (records_in, records_in - 5, 5)
    assert list(stats["stages"])[0] == "read"


def test_rejects_file_names_source_position_and_reason(finished_run):
    rejects = list(read_rejects(finished_run))
    by_reason = {r["reject"]: r for r in rejects}
    assert len(rejects) == 5
    assert by_reason["read.bad_json"]["source_id"].endswith("mixed.jsonl:21")
    assert by_reason["read.missing_file"]["source_id"].endswith("missing.jsonl")
    assert all(r["source"] == "web" for r in rejects)


def test_a_reject_holding_unicode_line_separators_stays_one_line(finished_run):
    text = b"".join(path.read_bytes() for path in sorted((finished_run / "rejects").glob("*.jsonl"))).decode()
    assert len(text.splitlines()) == len(list(read_rejects(finished_run))) == 5  # no record split in two
    cut = next(r for r in read_rejects(finished_run) if r["reject"] == "read.bad_json")
    assert "no\u2028end\x85" in cut["text"]


def test_every_token_comes_back_from_the_shards(finished_run, tiny_tokenizer):
    tokenizer, normalize = load_tokenizer(tiny_tokenizer), make_normalize(NormalizeConfig(stage="normalize"))
    pieces: dict[str, list[np.ndarray]] = {}
    for sample in stream(finished_run / "main"):
        assert sample["tokens"].shape == (64,)
        start = 0
        for doc_id, offset, length in zip(sample["doc_ids"], sample["doc_offsets"], sample["doc_lens"]):
            pieces.setdefault(doc_id, []).append((offset, sample["tokens"][start : start + length]))
            start += length
    eos = tokenizer.token_to_id("<|eos|>")
    for row, doc_id in zip(GOOD, GOOD_IDS):
        text = normalize([new_document("web", row["id"], row["text"])])[0]["text"]
        expected = tokenizer.encode(text, add_special_tokens=False).ids + [eos]
        assert np.concatenate([t for _, t in sorted(pieces[doc_id], key=lambda p: p[0])]).tolist() == expected
    assert sum(k.startswith("code/") for k in pieces) == 30


# a document's id: <source>/<id_field value>@<partition>:<record> (mixed.jsonl is partition 0, more.jsonl.gz 1,
# missing.jsonl 2, rest.parquet 3)
GOOD_IDS = ([f"web/{r['id']}@0:{i}" for i, r in enumerate(GOOD[:20])] + [f"web/{r['id']}@1:{i}" for i, r in
            enumerate(GOOD[20:30])] + [f"table/{r['id']}@3:{i}" for i, r in enumerate(GOOD[30:])])


def test_a_recipe_without_phases_writes_its_documents(finished_run, tmp_path, capsys):
    """phases: [] needs no tokenize stage and writes the documents that pass every stage, one JSON line
    each (zstd), in run order, that the jsonl reader reads back; rejects as in any run; no shards."""
    import yaml
    import zstandard

    recipe = yaml.safe_load((finished_run.parent / "tiny.yaml").read_text())
    recipe.update(phases=[], stages=[{"stage": "normalize"}])
    (finished_run.parent / "docs.yaml").write_text(yaml.safe_dump(recipe))  # beside the inputs it names
    assert cli.main(["run", str(finished_run.parent / "docs.yaml"), "--out", str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    stats = json.loads((out / "stats.json").read_text())
    files = sorted((out / "documents").glob("*.jsonl.zst"))
    lines = [json.loads(line) for f in files for line in zstandard.decompress(f.read_bytes()).decode().splitlines()]
    assert stats["balanced"] and len(lines) == sum(stats["written"].values()) == len(GOOD) + 30
    assert stats["rejected"] == json.loads((finished_run / "stats.json").read_text())["rejected"]
    assert {line["text"] for line in lines if line["source"] != "code"} == {make_normalize(NormalizeConfig(stage="normalize"))(
        [new_document("web", "x", row["text"])])[0]["text"] for row in GOOD}
    assert all(line["transforms"] == ["normalize"] and "tokens" not in line for line in lines)
    assert [line["id"] for line in lines if line["source"] == "code"] == [f"code/{i}" for i in range(30)]  # run order
    assert not list(out.glob("*/manifest.json")) and json.loads((out / "run.json").read_text())["phases"] == []
    reread = [doc["text"] for f in files for doc in read_jsonl(JsonlConfig(name="again", type="jsonl", paths=["*"]), str(f))]
    assert reread == [line["text"] for line in lines]
    with pytest.raises(ValueError, match="wrote documents .*not shards"):
        stream(out)
    capsys.readouterr()
    assert cli.main(["inspect", str(out)]) == 0
    assert f"documents: {len(lines)} in {len(files)} files" in capsys.readouterr().err
    del recipe["phases"]
    (finished_run.parent / "shards.yaml").write_text(yaml.safe_dump(recipe))
    assert cli.main(["run", str(finished_run.parent / "shards.yaml"), "--out", str(tmp_path / "none")]) == 2
    assert "needs a `- stage: tokenize` entry (or `phases: []`" in capsys.readouterr().err


def test_repeated_id_field_values_give_unique_ids_in_the_shards(finished_run):
    doc_ids = {doc_id for sample in stream(finished_run / "main") for doc_id in sample["doc_ids"]}
    assert {d for d in doc_ids if not d.startswith("code/")} == set(GOOD_IDS)
    assert len(set(GOOD_IDS)) == len(GOOD) > len({(r["id"], i < 30) for i, r in enumerate(GOOD)})


def test_run_json_lists_the_curriculum_and_the_run_folder_streams(finished_run):
    run = json.loads((finished_run / "run.json").read_text())
    assert [s["name"] for s in run["phases"]] == ["main"] and run["seed"] == 0
    manifest = json.loads((finished_run / "main" / "manifest.json").read_text())
    assert manifest["recipe_config"]["name"] == "tiny" and manifest["seed"] == 0
    by_folder = [s["key"] for s in stream(finished_run / "main")]
    assert [s["key"] for s in stream(finished_run)] == by_folder and len(by_folder) == manifest["samples"]


def test_same_recipe_gives_identical_shards(finished_run, tmp_path):
    recipe = finished_run.parent / "tiny.yaml"
    assert cli.main(["run", str(recipe), "--out", str(tmp_path / "again")]) == 0
    first = json.loads((finished_run / "main" / "manifest.json").read_text())["shards"]
    again = json.loads((tmp_path / "again" / "main" / "manifest.json").read_text())["shards"]
    assert [s["sha256"] for s in first] == [s["sha256"] for s in again]


def test_partition_tasks_and_an_operator_a_stage_write_the_same_bytes(finished_run, tmp_path):
    """The default runs each partition start to finish in one task; forcing Ray Data's operator plan
    changes no shard, no rejects file and no figure but the timings."""
    recipe = str(finished_run.parent / "tiny.yaml")
    assert cli.main(["run", recipe, "--out", str(tmp_path / "ops"), "--set", "ray.partition_tasks=false"]) == 0
    tasks, ops = (json.loads((out / "stats.json").read_text()) for out in (finished_run, tmp_path / "ops"))
    assert (tasks["execution"], ops["execution"]) == ("partition tasks", "an operator a stage")
    for out in (finished_run, tmp_path / "ops"):
        assert len(list((out / "main").glob("*.tar"))) > 1 and list((out / "rejects").glob("*.jsonl"))
    shards = [json.loads((out / "main" / "manifest.json").read_text())["shards"] for out in (finished_run, tmp_path / "ops")]
    assert [s["sha256"] for s in shards[0]] == [s["sha256"] for s in shards[1]]
    for name in (path.relative_to(finished_run) for path in finished_run.glob("rejects/*")):
        assert (finished_run / name).read_bytes() == (tmp_path / "ops" / name).read_bytes(), name
    untimed = {"wall_s", "driver", "execution", "phases", "stage_busy_s", "stage_wall_s", "throughput"}
    assert {k: v for k, v in tasks.items() if k not in untimed} == {k: v for k, v in ops.items() if k not in untimed}
    assert {k: v for k, v in tasks["phases"]["main"].items() if k != "wall_s"} == \
        {k: v for k, v in ops["phases"]["main"].items() if k != "wall_s"}
    for stats in (tasks, ops):
        assert_timed_every_stage(stats)


def assert_timed_every_stage(stats: dict) -> None:
    """Both plans time each stage (the report's throughput over time and wall time per stage): every
    record read and every token made lies in the time bins, and pack's tokens are the phase's."""
    stages = [stage for stage in stats["stages"] if stage != "pack"] + ["pack main"]
    assert list(stats["stage_wall_s"]) == stages and all(s >= 0 for s in stats["stage_wall_s"].values())
    timeline = stats["throughput"]
    assert list(timeline["records_per_s"]) == stages and len(timeline["records_per_s"]["read"]) == 60
    assert set(timeline["tokens_per_s"]) == {"tokenize", "pack main"}
    in_bins = {stage: sum(rates) * timeline["bin_s"] for stage, rates in timeline["tokens_per_s"].items()}
    assert sum(timeline["records_per_s"]["read"]) * timeline["bin_s"] == pytest.approx(stats["stages"]["read"]["in"],
                                                                                        rel=0.02)
    assert in_bins["pack main"] == pytest.approx(stats["phases"]["main"]["tokens"], rel=0.02)


def test_inspect_and_recipes_commands(finished_run, capsys):
    assert cli.main(["inspect", str(finished_run), "--samples", "1"]) == 0
    shown = capsys.readouterr().err
    assert "records rejected" in shown and "read.bad_json" in shown and "main-000000000" in shown
    assert cli.main(["recipes"]) == 0
    assert "recipes/demo.yaml" in capsys.readouterr().err


def test_run_refuses_a_foreign_non_empty_folder(finished_run, tmp_path, capsys):
    (tmp_path / "precious.txt").write_text("not ours")
    assert cli.main(["run", str(finished_run.parent / "tiny.yaml"), "--out", str(tmp_path)]) == 2
    assert "not written by datapipe" in capsys.readouterr().err
    assert (tmp_path / "precious.txt").exists()


def test_run_refuses_actor_pools_that_would_starve_reading(finished_run, tmp_path, capsys):
    recipe = str(finished_run.parent / "tiny.yaml")
    pools = ["--set", "stages.tokenize.concurrency=[2, 2]", "--set", "ray.partition_tasks=false"]  # no pool otherwise
    assert cli.main(["run", recipe, "--out", str(tmp_path / "o"), *pools]) == 2
    message = " ".join(capsys.readouterr().err.split())
    assert "actor stages hold CPU 2 from start to end (tokenize 2 x 1" in message and "ray.num_cpus" in message
    assert not (tmp_path / "o").exists()  # refused before the output folder is touched


def test_two_tokenize_actors_on_two_cpus_run_and_change_no_shard(finished_run, tmp_path):
    """Once refused (two actors held both CPUs); now concurrency is a maximum and the pool shares the cluster."""
    recipe = str(finished_run.parent / "tiny.yaml")
    two = ["--set", "stages.tokenize.concurrency=2", "--set", "ray.partition_tasks=false"]  # an actor pool
    assert cli.main(["run", recipe, "--out", str(tmp_path / "two"), *two]) == 0
    first = json.loads((finished_run / "main" / "manifest.json").read_text())["shards"]
    two = json.loads((tmp_path / "two" / "main" / "manifest.json").read_text())["shards"]
    assert [s["sha256"] for s in first] == [s["sha256"] for s in two]


def test_a_resource_no_node_has_fails_at_start_listing_the_cluster(finished_run, tmp_path, capsys):
    recipe = str(finished_run.parent / "tiny.yaml")
    args = ["--set", "stages.normalize.resources={chromium: 1}", "--set", "stages.tokenize.num_gpus=1"]
    assert cli.main(["run", recipe, "--out", str(tmp_path / "o"), *args]) == 2
    message = " ".join(capsys.readouterr().err.split())
    assert "stages[0] (normalize) needs CPU 1, chromium 1 for each task or actor, and no node has chromium" in message
    assert "stages[1] (tokenize) needs CPU 1, GPU 1 for each task or actor, and no node has GPU" in message
    assert "the cluster's nodes: [CPU 2, memory" in message and not (tmp_path / "o").exists()


def test_run_says_when_nothing_answers_at_the_cluster_address(finished_run, tmp_path, capsys):
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    recipe = str(finished_run.parent / "tiny.yaml")
    assert cli.main(["run", recipe, "--out", str(tmp_path / "o"), "--ray-address", f"127.0.0.1:{port}"]) == 2
    message = capsys.readouterr().err
    assert f"nothing answers at 127.0.0.1:{port}" in message and "ray start --head" in message


def test_a_stage_error_rejects_only_the_failing_record():
    def shout(docs):
        for doc in docs:
            if "boom" in doc["text"]:
                raise ValueError("cannot shout at boom")
            doc["text"] = doc["text"].upper()
        return docs

    table = docs_to_table([new_document("s", str(i), text) for i, text in enumerate(["a", "boom", "c"])])
    docs = docs_from_table(apply_stage(shout, "shout", table))
    assert [(d["text"], d["reject"]) for d in docs] == [("A", ""), ("boom", "shout.error"), ("C", "")]
    assert "cannot shout" in docs[1]["error"]
    assert docs[0]["transforms"] == ["shout"] and docs[1]["transforms"] == []


def test_a_stage_that_drops_records_silently_fails_loudly():
    table = docs_to_table([new_document("s", str(i), "x") for i in range(3)])
    with pytest.raises(RuntimeError, match="dropped 2 records"):
        apply_stage(lambda docs: docs[:1], "lossy", table)


def test_a_late_reject_leaves_no_trace_in_the_written_figures():
    """A document packing leaves out (over budget, too long) was counted as written when it was
    spilled: every written figure of it moves to the rejected side, none stays behind."""
    from datapipe.packing.bfd import SpecialIds
    from datapipe.packing.corpus import corpus_from_documents
    from datapipe.pipeline.stats import RunStats

    docs = [new_document("web", str(i), text) for i, text in enumerate(["short é", "x" * 300, "y" * 5000])]
    for doc, num_tokens, language in zip(docs, (3, 40, 700), ("fr", "en", "en")):
        doc["tokens"], doc["language"] = np.arange(5, 5 + num_tokens, dtype=np.uint32), language
    stats = RunStats("late")
    for doc in docs:
        stats.count(doc)
    corpus = corpus_from_documents(docs, SpecialIds(pad=0, media_begin=1, media_end=2), ["web"])
    for row, record in zip((0, 2), corpus.describe([0, 2])):
        stats.reject_late(record, "pack.over_budget", int(corpus.lengths[row]))
    figures = stats.to_dict()
    assert figures["written"] == {"web": 1} and figures["tokens"] == 40 and figures["balanced"]
    assert figures["languages"] == {"en": 1}  # the French document left late: no "fr": 0 either
    lengths = {side: figures["length_histogram"][side] for side in ("written", "rejected")}
    assert lengths == {"written": {"256-1024": 1}, "rejected": {"<64": 1, "4096-16384": 1}}
    assert figures["rejected_bytes"] == {"pack.over_budget": len("short é".encode()) + 5000}
