"""Curriculum phases: budgets, mixtures, upsampling, long-document policies, accounting; one run on real Ray."""
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from datapipe import cli
from datapipe.loader.reference import read_shards
from datapipe.packing.corpus import corpus_from_documents
from datapipe.packing.curriculum import (
    MEDIA_TOO_LONG,
    NOT_IN_MIXTURE,
    OVER_BUDGET,
    TOO_LONG,
    USED,
    CurriculumPhase,
    Usage,
    pack_phase,
    select_phase,
    source_stats,
)
from datapipe.pipeline.inspect import read_rejects
from datapipe.pipeline.recipe import RecipeError, load_recipe
from datapipe.schema import new_document
from tests.conftest import WORDS, tiny_recipe, write_jsonl
from tests.test_packing import FIRST_PLAIN, IDS, make_docs, media_span, png

REPO = Path(__file__).resolve().parent.parent


def two_sources(n_web=2000, n_books=300):
    """`web`: short documents (median 33 tokens); `books`: long ones (median 400, up to 2000)."""
    books = make_docs(11, n_books, media_every=0, max_len=2000, source="books", log_median=6.0)
    return corpus_from_documents(make_docs(10, n_web, media_every=0, source="web") + books, IDS, ["web", "books"])


def tokens_by_source(corpus, selection):
    return {name: use["tokens"] for name, use in source_stats(corpus, selection).items()}


def test_budget_accepts_suffixes_and_one_kind_of_budget():
    assert CurriculumPhase(tokens="20B").tokens == 20_000_000_000
    assert CurriculumPhase(tokens="1.5M").tokens == 1_500_000
    assert CurriculumPhase(tokens=2e9).tokens == 2_000_000_000
    with pytest.raises(ValidationError, match="not both"):
        CurriculumPhase(tokens=10, fraction=0.5)
    with pytest.raises(ValidationError, match="mixture weights"):
        CurriculumPhase(mixture={"web": -1})
    with pytest.raises(ValidationError, match="pattern"):
        CurriculumPhase(name="s.8k")


def write_recipe(tmp_path, phases=None, **extra) -> Path:
    recipe = {"name": "t", "sources": [{"name": "web", "type": "pydoc_topics"}],
              "stages": [{"stage": "tokenize"}], **extra}
    if phases is not None:
        recipe["phases"] = phases
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_recipe_errors_name_the_stage_and_the_fix(tmp_path):
    with pytest.raises(RecipeError, match=r"phases\[1\]\.mixture: unknown source 'code'; sources: web"):
        load_recipe(write_recipe(tmp_path, [{"name": "a"}, {"name": "b", "mixture": {"code": 1}}]))
    with pytest.raises(RecipeError, match="phase name 'rejects' is a folder the run uses"):
        load_recipe(write_recipe(tmp_path, [{"name": "rejects"}]))
    with pytest.raises(RecipeError, match="phase name 'a' is repeated"):
        load_recipe(write_recipe(tmp_path, [{"name": "a"}, {"name": "a", "seq_len": 4096}]))
    with pytest.raises(RecipeError, match=r"phases\[0\]\.long_docs.*'split', 'truncate' or 'drop'"):
        load_recipe(write_recipe(tmp_path, [{"long_docs": "chop"}]))
    with pytest.raises(RecipeError, match="pack: replaced by a list of curriculum phases"):
        load_recipe(write_recipe(tmp_path, pack={"seq_len": 4096}))


def test_a_recipe_without_curriculum_gets_one_default_stage_that_set_can_change(tmp_path):
    assert [(s.name, s.seq_len, s.long_docs) for s in load_recipe(write_recipe(tmp_path)).phases] == [
        ("main", 2048, "split")]
    assert load_recipe(write_recipe(tmp_path), ["phases.main.seq_len=4096"]).phases[0].seq_len == 4096


def test_k3_recipe_has_the_seven_context_stages():
    recipe = load_recipe(REPO / "recipes" / "k3_curriculum.yaml")
    assert [s.seq_len for s in recipe.phases] == [8192, 16384, 32768, 65536, 262144, 524288, 1048576]
    assert all(s.upsample_long for s in recipe.phases[4:])


def test_no_budget_takes_every_document_once():
    corpus = two_sources()
    selection = select_phase(CurriculumPhase(seq_len=128), corpus, 0)
    assert sorted(selection.docs.tolist()) == list(range(len(corpus.ids)))
    assert (selection.outcome == USED).all() and selection.targets.limited_by == ""


def test_mixture_gives_each_source_its_share_of_the_budget():
    corpus = two_sources()
    selection = select_phase(CurriculumPhase(seq_len=256, tokens=40_000, mixture={"web": 3, "books": 1}), corpus, 0)
    got = tokens_by_source(corpus, selection)
    longest = int(corpus.lengths.max())
    assert abs(got["web"] - 30_000) <= longest and abs(got["books"] - 10_000) <= longest
    assert selection.outcome[selection.docs].tolist() == [USED] * len(selection.docs)
    assert (selection.outcome == OVER_BUDGET).sum() == len(corpus.ids) - len(set(selection.docs.tolist()))


def test_a_scarce_source_caps_the_budget_so_the_mixture_holds():
    corpus = two_sources()
    web_supply = int(corpus.lengths[corpus.source == 0].sum())
    assert web_supply < corpus.lengths[corpus.source == 1].sum()
    selection = select_phase(CurriculumPhase(seq_len=256, tokens="1B", mixture={"web": 1, "books": 1}), corpus, 0)
    got = tokens_by_source(corpus, selection)
    assert selection.targets.limited_by == "web" and selection.targets.budget == pytest.approx(2 * web_supply)
    assert got["web"] == web_supply and abs(got["books"] - web_supply) <= int(corpus.lengths.max())


def test_a_mixture_source_with_no_documents_empties_the_stage_and_says_why():
    corpus = corpus_from_documents(make_docs(10, 100, media_every=0), IDS, ["web", "empty"])
    selection = select_phase(CurriculumPhase(mixture={"web": 1, "empty": 1}), corpus, 0)
    assert selection.targets.limited_by == "empty" and selection.targets.budget == 0 and len(selection.docs) == 0
    assert (selection.outcome == OVER_BUDGET).all()


def test_a_source_left_out_of_the_mixture_is_counted_as_such():
    corpus = two_sources()
    selection = select_phase(CurriculumPhase(seq_len=256, mixture={"web": 1}), corpus, 0)
    assert set(corpus.source[selection.docs].tolist()) == {0}
    assert (selection.outcome[corpus.source == 1] == NOT_IN_MIXTURE).all()


def test_fraction_is_of_the_corpus_tokens_in_natural_proportions():
    corpus = two_sources()
    selection = select_phase(CurriculumPhase(seq_len=256, fraction=0.25), corpus, 0)
    got = tokens_by_source(corpus, selection)
    assert sum(got.values()) == pytest.approx(0.25 * corpus.total_tokens, abs=2 * int(corpus.lengths.max()))
    natural = corpus.lengths[corpus.source == 1].sum() / corpus.total_tokens
    assert got["books"] / sum(got.values()) == pytest.approx(natural, abs=0.02)


def test_drop_leaves_long_documents_out_with_a_reason():
    corpus = two_sources()
    samples = list(pack_phase(CurriculumPhase(seq_len=256, long_docs="drop"), corpus, 0, IDS)[2])
    selection = select_phase(CurriculumPhase(seq_len=256, long_docs="drop"), corpus, 0)
    assert (selection.outcome == TOO_LONG).sum() == (corpus.lengths > 256).sum() > 0
    assert max(len(s["doc_ids"]) - len(set(s["doc_ids"])) for s in samples) == 0
    long_ids = {corpus.ids[i] for i in np.flatnonzero(corpus.lengths > 256)}
    assert not long_ids & {doc_id for s in samples for doc_id in s["doc_ids"]}


def test_truncate_keeps_the_first_seq_len_tokens_once():
    corpus = two_sources()
    samples = list(pack_phase(CurriculumPhase(seq_len=256, long_docs="truncate"), corpus, 0, IDS)[2])
    seen = Counter(doc_id for s in samples for doc_id in s["doc_ids"])
    assert set(seen.values()) == {1} and len(seen) == len(corpus.ids)
    for sample in samples:
        start = 0
        for doc_id, offset, length in zip(sample["doc_ids"], sample["doc_offsets"], sample["doc_lens"]):
            row = corpus.ids.index(doc_id)
            assert offset == 0 and length == min(256, corpus.lengths[row])
            assert np.array_equal(sample["tokens"][start : start + length], corpus.document_tokens(row)[:length])
            start += length


def test_upsampling_repeats_long_documents_in_the_stage():
    corpus = two_sources()
    phase = CurriculumPhase(seq_len=512, upsample_long={"min_tokens": 1000, "factor": 3})
    copies = Counter(select_phase(phase, corpus, 0).docs.tolist())
    long_rows = np.flatnonzero(corpus.lengths >= 1000)
    assert len(long_rows) and all(copies[row] == 3 for row in long_rows.tolist())
    assert all(n == 1 for row, n in copies.items() if corpus.lengths[row] < 1000)
    half = Counter(select_phase(CurriculumPhase(seq_len=512, upsample_long={"min_tokens": 1000, "factor": 1.5}),
                                corpus, 0).docs.tolist())
    twice = sum(half[row] == 2 for row in long_rows.tolist())
    assert 0 < twice < len(long_rows)


def test_selection_is_seeded():
    corpus = two_sources()
    phase = CurriculumPhase(seq_len=256, fraction=0.3)
    assert np.array_equal(select_phase(phase, corpus, 1).docs, select_phase(phase, corpus, 1).docs)
    assert not np.array_equal(select_phase(phase, corpus, 1).docs, select_phase(phase, corpus, 2).docs)


def test_a_media_span_longer_than_seq_len_leaves_its_document_out_of_the_stage():
    doc = new_document("web", "1", "x")
    doc["tokens"] = np.array([FIRST_PLAIN] * 10 + media_span(50) + [FIRST_PLAIN] * 10, dtype=np.uint32)
    doc["media"] = [png(1)]
    corpus = corpus_from_documents([doc, *make_docs(12, 50, media_every=0)], IDS)
    small, large = (select_phase(CurriculumPhase(seq_len=n, long_docs="truncate"), corpus, 0) for n in (32, 55))
    assert small.outcome[0] == MEDIA_TOO_LONG and 0 not in small.docs
    assert large.lengths[large.docs.tolist().index(0)] == 10  # truncation stops before the span it would cut


def test_usage_counts_each_document_once_with_the_closest_reason():
    corpus = two_sources(n_web=200, n_books=50)
    usage = Usage(len(corpus.ids))
    short = CurriculumPhase(name="short", seq_len=256, long_docs="drop", tokens=2000, mixture={"web": 1})
    long = CurriculumPhase(name="long", seq_len=4096, mixture={"books": 1})
    for phase in (short, long):
        usage.record(select_phase(phase, corpus, 0))
    unused = dict(usage.unused())
    assert all(corpus.source[row] == 0 for row in unused)  # every book is used by the long phase
    for row, reason in unused.items():  # web: too long or over budget for the short phase, outside the long one's mix
        assert reason == ("pack.too_long" if corpus.lengths[row] > 256 else "pack.over_budget")
    assert "pack.too_long" in unused.values()
    assert usage.uses.sum() == len(select_phase(short, corpus, 0).docs) + len(select_phase(long, corpus, 0).docs)


# ---- one run on real Ray: three phases, a mixture, a budget, upsampling, drop, media rejects ----

LONG_TEXT = " ".join(WORDS * 30)  # ~600 tokens with the tiny tokenizer: longer than the 64 and 256 phases


@pytest.fixture(scope="module")
def curriculum_run(tmp_path_factory, tiny_tokenizer, ray_session):
    tmp = tmp_path_factory.mktemp("curriculum")
    rows = [{"id": f"w{i}", "text": " ".join(WORDS[i % 9 :][:12])} for i in range(60)]
    rows += [{"id": f"long{i}", "text": f"{i} {LONG_TEXT}"} for i in range(6)]
    rows += [{"id": "orphan_placeholder", "text": "see <|media|> here"},  # a placeholder without its image
             {"id": "fake_special", "text": "see <|media_begin|> here"}]  # special-token text stays plain text
    write_jsonl(tmp / "web.jsonl", rows)
    sources = [{"name": "web", "type": "jsonl", "paths": ["web.jsonl"], "id_field": "id"},
               {"name": "code", "type": "python_programs", "count": 20}]
    phases = [
        {"name": "s64", "seq_len": 64, "long_docs": "drop", "mixture": {"web": 1}, "tokens": 600},
        {"name": "s256", "seq_len": 256, "mixture": {"web": 3, "code": 1}, "long_docs": "truncate"},
        {"name": "s1k", "seq_len": 1024, "mixture": {"web": 1, "code": 1}, "upsample_long": {"min_tokens": 300,
                                                                                            "factor": 2}},
    ]
    recipe = tiny_recipe(tmp, tiny_tokenizer, sources, phases=phases)
    out = tmp / "out"
    assert cli.main(["run", str(recipe), "--out", str(out)]) == 0
    return out, json.loads((out / "stats.json").read_text())


@pytest.mark.slow
def test_run_accounts_for_every_document_once(curriculum_run):
    out, stats = curriculum_run
    assert stats["balanced"] is True
    assert sum(stats["records_in"].values()) == 68 + 20
    written = {doc_id for phase in ("s64", "s256", "s1k") for s in read_shards(out / phase) for doc_id in s["doc_ids"]}
    rejects = list(read_rejects(out))
    assert sum(stats["written"].values()) == len(written) and len(rejects) == sum(stats["rejected"].values())
    assert written.isdisjoint(r["id"] for r in rejects) and len(written) + len(rejects) == 88
    assert stats["rejected"]["tokenize.media_count_mismatch"] == 1
    assert "pack.unbalanced_media" not in stats["rejected"]  # typed special-token text never opens a span
    assert stats["rejected"]["pack.over_budget"] > 0  # code documents that neither mixture's budget reached
    assert {r["source"] for r in rejects if r["reject"] == "pack.over_budget"} == {"code"}
    assert not (out / "spill").exists()
    histogram = stats["length_histogram"]  # packing's late rejects move out of the written figures too
    assert sum(stats["languages"].values()) == sum(histogram["written"].values()) == len(written)
    assert sum(histogram["rejected"].values()) == len(rejects)
    late = [r for r in rejects if r["reject"].startswith("pack.")]
    assert stats["rejected_bytes"]["pack.over_budget"] >= sum(len(r["text"]) for r in late if r["reject"] == "pack.over_budget")


@pytest.mark.slow
def test_each_stage_writes_full_sequences_and_reports_its_figures(curriculum_run):
    out, stats = curriculum_run
    for name, seq_len in (("s64", 64), ("s256", 256), ("s1k", 1024)):
        packed = stats["phases"][name]
        samples = list(read_shards(out / name))
        assert len(samples) == packed["samples"] > 0
        assert all(s["tokens"].shape == (seq_len,) and s["position_ids"].shape == (seq_len,) for s in samples)
        assert sum(seq_len - s["num_pad"] for s in samples) == packed["tokens"]
    s64, s256, s1k = (stats["phases"][n] for n in ("s64", "s256", "s1k"))
    assert s64["dropped_too_long"] == 6 and set(s64["sources"]) == {"web"}  # the six long web documents
    assert abs(s64["sources"]["web"]["tokens"] - 600) <= 64 and s64["budget"]["requested"] == 600
    assert s256["truncated_docs"] >= 6 and s256["budget"]["limited_by"] == "web"  # web is 3/4 and has fewer tokens
    assert s256["sources"]["web"]["tokens"] == s256["sources"]["web"]["target"]
    assert s1k["budget"]["limited_by"] == "web" and s1k["upsampled_copies"] >= 6


@pytest.mark.slow
def test_upsampling_on_ray_repeats_exactly_the_long_documents(curriculum_run):
    out, _ = curriculum_run
    copies, tokens = Counter(), Counter()
    for sample in read_shards(out / "s1k"):
        for doc_id, offset, length in zip(sample["doc_ids"], sample["doc_offsets"], sample["doc_lens"]):
            copies[doc_id] += offset == 0
            tokens[doc_id] += int(length)
    for doc_id, n in copies.items():  # web limits the phase, so all its copies are in; code's are cut by budget
        expected = 2 if tokens[doc_id] / n >= 300 else 1
        assert n == expected if doc_id.startswith("web/") else 1 <= n <= expected, doc_id
    assert sum(n == 2 for doc_id, n in copies.items() if doc_id.startswith("web/")) == 6


@pytest.mark.slow
def test_rejects_file_and_inspect_show_the_curriculum(curriculum_run, capsys):
    out, _ = curriculum_run
    rejects = {r["reject"]: r for r in read_rejects(out)}
    assert rejects["tokenize.media_count_mismatch"]["source_id"] == "orphan_placeholder"
    assert rejects["pack.over_budget"]["text"].startswith("def ")  # generated programs, cut by the budget
    assert rejects["pack.over_budget"]["num_tokens"] > 0
    assert cli.main(["inspect", str(out), "--samples", "1"]) == 0
    shown = capsys.readouterr().err
    assert "phase s64" in shown and "phase s1k" in shown and "limited by" in shown and "truncated" in shown


def page(index: int, span: int) -> dict:
    """A "pages" document: text around one image whose media span is `span` tokens."""
    doc = new_document("pages", str(index), "a page")
    doc["tokens"] = np.array([FIRST_PLAIN] * 5 + media_span(span) + [FIRST_PLAIN] * 5, dtype=np.uint32)
    doc["media"] = [png(index)]
    return doc


def test_a_source_no_document_of_which_fits_keeps_its_documents_reasons():
    """Natural proportions give such a source weight 0; its documents are still too long (or their
    image is), not outside the mixture (issue 22: render_demo at seq_len 700, 10K-token documents at 2048)."""
    long_books = [doc for doc in make_docs(13, 40, media_every=0, source="books", log_median=8.0, max_len=20000)
                  if len(doc["tokens"]) > 256][:20]
    docs = make_docs(12, 100, media_every=0) + long_books + [page(i, 300) for i in range(5)]
    corpus = corpus_from_documents(docs, IDS, ["web", "books", "pages"])
    for long_docs, source, reason in (("drop", "books", "pack.too_long"), ("split", "pages", "pack.media_span_too_long")):
        usage = Usage(len(corpus.ids))
        usage.record(select_phase(CurriculumPhase(seq_len=256, long_docs=long_docs), corpus, 0))
        named = corpus.source_names.index(source)
        assert {why for row, why in usage.unused() if corpus.source[row] == named} == {reason}, long_docs
        assert "pack.not_in_mixture" not in dict(usage.unused()).values()
    named = select_phase(CurriculumPhase(seq_len=256, mixture={"web": 1}), corpus, 0)  # a mixture that leaves them out
    assert set(named.outcome[corpus.source != 0].tolist()) == {NOT_IN_MIXTURE}
