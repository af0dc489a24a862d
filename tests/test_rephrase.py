"""The rephrase stage with the real local model: rewrites, provenance, the gate, bad input, accounting."""
import json

import pytest
import yaml

from datapipe import cli
from datapipe.llm.fidelity import CHECKS
from datapipe.pipeline.inspect import read_rejects
from datapipe.schema import new_document
from datapipe.text.rephrase import Config, make_stage
from tests.conftest import write_jsonl
from tests.llm_helpers import LOOSE_GATE, PLAIN_STYLES, embedder, local_backend

EIFFEL = "The Eiffel Tower in Paris was completed in 1889. It is 330 metres tall."
WATER = ("Water boils at 100 degrees Celsius at sea level.\n\n"
         "Salt water freezes at a lower temperature than fresh water.")
REASONS = {f"rephrase.{check}" for check in CHECKS} | {"rephrase.empty_response"}  # what a live model may earn


def stage(**fields):
    cfg = Config(stage="rephrase", **{"styles": PLAIN_STYLES, "max_new_tokens": 32, **fields})
    return make_stage(cfg, backend=local_backend(), embedder=embedder())


def doc(i: int, text: str, **kw):
    return new_document("web", str(i), text, **kw)


@pytest.mark.slow
def test_each_input_becomes_k_rewrites_in_distinct_styles_with_provenance():
    out = stage(rewrites=2, chunk_tokens=16, fidelity=LOOSE_GATE)([doc(0, EIFFEL), doc(1, WATER)])
    assert [d["id"] for d in out] == ["web/0", "web/0#rephrase1", "web/1", "web/1#rephrase1"]
    for original, extra in (out[0:2], out[2:4]):
        assert original["derived_from"] == ""  # the input itself: counted in, not created
        assert extra["derived_from"] == original["id"] and extra["transforms"] == []  # its own stage history
        rewrites = [r for r in (original, extra) if "style" in r["notes"]["rephrase"]]
        assert len({r["notes"]["rephrase"]["style"] for r in rewrites}) == len(rewrites)  # distinct styles
        for record in rewrites:
            info = record["notes"]["rephrase"]
            assert info["source_id"] == original["id"] and info["chunks"] == 2  # 2 sentences / 2 paragraphs
            assert info["model"] == "SmolLM2-135M-Instruct" and info["backend"] == "local"
            assert info["source_head"] == {"web/0": EIFFEL, "web/1": WATER}[original["id"]][:600]  # for the report
            if record["reject"]:  # a failed rewrite: its answer and every score are kept for the rejects file
                assert record["reject"] in REASONS and info["attempts"][-1]["detail"]
            else:  # both chunks passed and were stitched with their source's break
                assert len(info["fidelity"]) == 2 and all(s["cosine"] >= 0.3 for s in info["fidelity"])
                assert ("\n\n" in record["text"]) == (original["id"] == "web/1")
        if not rewrites or all(r["reject"] for r in rewrites):  # nothing passed: the original is kept, unchanged
            assert not original["reject"] and original["text"] in (EIFFEL, WATER)
    assert sum(not d["reject"] and "style" in d["notes"]["rephrase"] for d in out) >= 1, "the model rewrote nothing"


@pytest.mark.slow
def test_keep_originals_passes_the_input_and_creates_every_rewrite():
    out = stage(rewrites=1, keep_originals=True, fidelity=LOOSE_GATE)([doc(0, EIFFEL)])
    assert [d["id"] for d in out] == ["web/0", "web/0#rephrase0"]
    assert out[0]["text"] == EIFFEL and not out[0]["reject"]
    assert out[0]["notes"]["rephrase"] == {"role": "original", "rewrites": ["web/0#rephrase0"]}
    assert out[1]["derived_from"] == "web/0" and out[1]["notes"]["rephrase"]["rewrite"] == 0


@pytest.mark.slow
def test_fidelity_gate_retries_another_style_then_rejects_with_scores():
    useless = [{"name": f"say_{word}", "system": f"Reply with the single word {word} and nothing else.",
                "temperature": 0.0} for word in ("OK", "YES")]
    out = stage(styles=useless, rewrites=1, style_retries=1, max_new_tokens=4,
                fidelity={"reject_truncated": False})([doc(0, EIFFEL)])  # 4 tokens may cut "OK."; the numbers tell
    assert [d["id"] for d in out] == ["web/0", "web/0#rephrase0"]
    assert not out[0]["reject"] and out[0]["text"] == EIFFEL  # nothing passed: the original is written
    assert out[0]["notes"]["rephrase"]["no_rewrite_passed"] == ["numbers_dropped"]
    assert out[1]["reject"] == "rephrase.numbers_dropped" and out[1]["derived_from"] == "web/0"
    attempts = out[1]["notes"]["rephrase"]["attempts"]
    assert sorted(a["style"] for a in attempts) == ["say_OK", "say_YES"]  # a spare style was tried
    assert all(a["scores"]["numbers_dropped"] == 2 and "1889" in a["detail"] for a in attempts)
    assert out[1]["text"] == attempts[-1]["answer"]  # the refused rewrite itself goes to the rejects file


def test_bad_input_is_rejected_with_reasons_before_any_generation():
    huge = "word " * 8400  # one chunk of 8,400 tokens cannot fit the 8,192-token context
    docs = [doc(0, "   "), doc(1, EIFFEL * 20), doc(2, huge), doc(3, "def f(): pass", kind="code"),
            doc(4, EIFFEL, meta={"domain": "math"})]
    out = stage(max_chunks=2, chunk_tokens=40)([docs[0], docs[1], docs[3], docs[4]])
    assert [d["reject"] for d in out] == ["rephrase.empty_text", "", "", ""]  # the others are kept as they are
    assert [out[i]["notes"]["rephrase"]["skipped"] for i in (1, 3)] == ["too_long", "no_style"]
    assert out[2]["text"] == "def f(): pass" and "rephrase" not in out[2]["notes"]  # code passes untouched
    strict = stage(max_chunks=2, chunk_tokens=40, on_failure="reject")([doc(1, EIFFEL * 20)])
    assert strict[0]["reject"] == "rephrase.too_long"  # only when the recipe says so
    overflow = stage(chunk_tokens=9000, rewrites=1, style_retries=1)([docs[2]])
    assert overflow[1]["reject"] == "rephrase.context_overflow" and not overflow[0]["reject"]
    assert "8192-token context" in overflow[1]["notes"]["rephrase"]["attempts"][0]["detail"]
    assert len(overflow[1]["notes"]["rephrase"]["attempts"]) == 1  # another style would not fit either


def test_recipe_needs_a_style_library():
    with pytest.raises(ValueError, match="style library"):
        Config(stage="rephrase")
    with pytest.raises(ValueError, match="must contain"):
        Config(stage="rephrase", styles=[{"name": "x", "system": "s", "prompt": "no placeholder"}])


def test_documents_are_planned_longest_first_in_doubling_groups_with_the_chunks_of_one_batch():
    from datapipe.llm.styles import load_styles
    from datapipe.text.rephrase import plan_documents, plan_longest_first

    cfg = Config(stage="rephrase", styles=PLAIN_STYLES, rewrites=2, chunk_tokens=16)
    styles, count = load_styles(cfg.styles, None), local_backend().count_tokens
    docs = [doc(i, " ".join([EIFFEL] * (1 + i % 7))) for i in range(40)]
    plans = [None] * len(docs)
    groups = [[slot.chunks for slot in slots] for slots in plan_longest_first(docs, plans, cfg, styles, count)]
    assert [len(group) // 2 for group in groups] == [1, 2, 4, 8, 16, 9]  # 2 slots a document; the first alone
    lengths = [len(chunks) for group in groups for chunks in group]
    assert lengths == sorted(lengths, reverse=True)  # longest first
    reference = plan_documents(docs, cfg, styles, count)  # the whole batch at once: the same chunks
    assert [[s.chunks for s in plan.slots] for plan in plans] == [[s.chunks for s in plan.slots] for plan in reference]


def test_each_request_goes_out_by_the_chunks_its_rewrite_has_left():
    from datapipe.llm.fidelity import FidelityConfig
    from datapipe.llm.rewriter import Rewriter, RewriteSettings, Slot
    from datapipe.text.rephrase import CONTEXT_TEMPLATE

    rewriter = Rewriter(local_backend(), None, RewriteSettings(FidelityConfig(min_cosine=None), CONTEXT_TEMPLATE))
    style = Config(stage="rephrase", styles=PLAIN_STYLES).styles[0]
    slot = Slot(["a. ", "b. ", "c. ", "d. ", "e."], [2] * 5, style, [], 0)
    priorities = [rewriter.request(slot, ["rewrite"] * k)[0].priority for k in range(5)]
    assert priorities == [-5, -4, -3, -2, -1]  # lowest first: the longest chain still to wait for


@pytest.mark.slow
def test_recipe_end_to_end_on_ray_accounts_for_every_record(tmp_path, tiny_tokenizer, ray_session):
    rows = [{"id": "eiffel", "text": EIFFEL}, {"id": "water", "text": WATER.split("\n\n")[0]},
            {"id": "huge", "text": "Paris. " * 400}]
    write_jsonl(tmp_path / "facts.jsonl", rows, [b'{"id": "broken", "text": '])
    recipe = {
        "name": "rephrase-test", "sources": [{"name": "web", "type": "jsonl", "paths": ["facts.jsonl"], "id_field": "id"}],
        "stages": [{"stage": "normalize"},
                   {"stage": "rephrase", "styles": PLAIN_STYLES, "rewrites": 2, "max_new_tokens": 32, "max_chunks": 4,
                    "num_cpus": 0.5, "backend": {"threads": 1}, "fidelity": LOOSE_GATE},
                   {"stage": "tokenize", "tokenizer": str(tiny_tokenizer), "num_cpus": 0.5}],
        "phases": [{"name": "main", "seq_len": 64}], "ray": {"object_store_mb": 256},
    }
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    assert cli.main(["run", str(tmp_path / "r.yaml"), "--out", str(tmp_path / "out")]) == 0
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["balanced"] and stats["records_in"] == {"web": 4}
    assert sum(stats["written"].values()) + sum(stats["rejected"].values()) == 4 + sum(stats["created"].values())
    assert stats["rejected"].get("read.bad_json") == 1 and "rephrase.too_long" not in stats["rejected"]  # huge: kept
    assert set(stats["rejected"]) <= REASONS | {"read.bad_json"}
    assert stats["stages"]["normalize"]["in"] == 3  # each record once: rewrites do not inherit its count
    for reject in read_rejects(tmp_path / "out"):
        if reject["reject"].startswith("rephrase."):
            assert reject["notes"]["rephrase"]["attempts"]  # the styles tried, their scores and answers
    assert sum(stats["written"].values()) >= 3  # the 3 originals at least, rewritten or kept
