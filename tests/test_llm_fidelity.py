"""The fidelity gate (facts both ways, relations, negation, repeats, cap, language, loops, the
judge's score) with the real all-MiniLM-L6-v2 embedder, and the style library's rules."""
import importlib.util
import json
import sys

import pytest

from datapipe.llm import facts, fidelity
from datapipe.llm.fidelity import FidelityConfig, JudgeConfig
from datapipe.llm.styles import StyleConfig, eligible_styles, is_english, load_styles, style_order
from tests.llm_helpers import REPO, embedder

SOURCE = "The Eiffel Tower in Paris was completed in 1889 and is 330 metres tall."
PARAPHRASE = "Completed in 1889, the Eiffel Tower in Paris stands 330 metres tall."
NO_NUMBER = "The Eiffel Tower in Paris was completed long ago and is very tall."
UNRELATED = "Photosynthesis turns light, water and carbon dioxide into sugar in green leaves."


@pytest.fixture(scope="module")
def cosines():
    return dict(zip(("paraphrase", "no_number", "unrelated"),
                    embedder().cosine([SOURCE] * 3, [PARAPHRASE, NO_NUMBER, UNRELATED])))


def test_embedding_separates_paraphrase_from_unrelated_text(cosines):
    assert cosines["paraphrase"] > 0.8
    assert cosines["unrelated"] < 0.3


def verdict(source: str, rewrite: str, **kw) -> fidelity.Verdict:
    return fidelity.check(source, rewrite, FidelityConfig(), **kw)


def test_paraphrase_passes_and_unrelated_text_fails(cosines):
    good = verdict(SOURCE, PARAPHRASE)
    fidelity.add_cosine(good, cosines["paraphrase"], FidelityConfig())
    assert good.failed == [] and good.scores["numbers_dropped"] == 0 and good.scores["names_dropped"] == 1.0
    bad = verdict(SOURCE, UNRELATED)
    fidelity.add_cosine(bad, cosines["unrelated"], FidelityConfig())
    assert bad.failed[:2] == ["numbers_dropped", "names_dropped"] and "cosine" in bad.failed
    assert verdict(SOURCE, NO_NUMBER).failed == ["numbers_dropped"]  # cosine alone (0.9) would pass it


# The pairs the issue's tester wrote: each wrong one must fail the named check, the faithful ones pass.
ISSUE_PAIRS = [
    ("The treaty was signed on 4 March 1889 in Paris.", "In Paris, the treaty was signed on March 4, 1889.", []),
    ("The treaty was signed on 4 March 1889 in Paris.", "The treaty was signed in Paris on 24 March 1889.",
     ["numbers_dropped", "numbers_invented"]),
    ("The trail is 3 km long.", "The trail is three kilometres long.", []),
    ("The trail is 3 km long.", "The trail is 3,000 m long.", []),
    ("In 1903 Becquerel won the prize for physics, and Ostwald won the prize for chemistry in 1909.",
     "In 1903 Becquerel won the prize for chemistry, and Ostwald won the prize for physics in 1909.", ["relations"]),
    ("Hillary, from New Zealand, and Tenzing, from Nepal, reached the summit in 1953.",
     "Hillary, from Nepal, and Tenzing, from New Zealand, reached the summit in 1953.", ["relations"]),
    ("Hillary, from New Zealand, and Tenzing, from Nepal, reached the summit in 1953.",
     "In 1953 the summit was reached by Hillary of New Zealand and Tenzing of Nepal.", []),
    ("The central bank lowered interest rates in 2020.", "The central bank did not lower interest rates in 2020.",
     ["negation"]),
    ("The firm employs 2,500 workers in India.", "The firm employs 25,000 workers in Indiana.",
     ["numbers_dropped", "numbers_invented", "names_dropped", "names_invented"]),
    ("Henri Becquerel discovered radioactivity in 1896.", "Henrietta Becquerel discovered radioactivity in 1896.",
     ["names_dropped", "names_invented"]),
    (SOURCE, PARAPHRASE + " Gustave Eiffel was paid 7,799,401 francs for it.", ["numbers_invented", "names_invented"]),
]


@pytest.mark.parametrize("source,rewrite,failed", ISSUE_PAIRS)
def test_the_gate_checks_facts_both_ways(source, rewrite, failed):
    assert verdict(source, rewrite).failed == failed


def test_answers_that_repeat_stop_switch_or_loop_are_named():
    context = "The tower was built for the 1889 World's Fair, which marked the centenary of the revolution."
    assert verdict(SOURCE, f"{context} {PARAPHRASE}", context=context).reason == "repeats_context"
    assert verdict(SOURCE, "Completed in 1889, the Eiffel Tower in", finish_reason="length").reason == "truncated"
    german = "Der Eiffelturm in Paris wurde 1889 fertiggestellt und ist 330 Meter hoch, ein Wahrzeichen der Stadt."
    assert verdict(SOURCE, german).reason == "language_switch"
    assert verdict("Löse 2x + 3 = 7 und teile durch 2, dann erhältst du die Lösung x = 2 für die Gleichung.",
                   "Solve 2x + 3 = 7 and divide by 2, then you get the solution x = 2 for the equation.",
                   target_language="en").failed == []  # the translating styles are meant to switch
    looping = PARAPHRASE + " It is a tall tower in Paris." * 6
    assert verdict(SOURCE, looping).reason == "loop"
    echo = SOURCE + " However, I made a small punctuation mistake."  # what SmolLM2 sometimes answers
    assert verdict(SOURCE, echo).reason == "copied" and verdict(SOURCE, echo).scores["copied"] == 1.0


def test_quantities_are_normalized_and_whole():
    keys = {q.key for q in facts.extract("It cost 7,799,401 francs in 1889, 20% more; 3 km or 2.5 million.").quantities}
    assert keys == {"n:7799401", "n:1889", "percent:20", "length:3000", "n:2500000"}
    assert facts.unmatched(facts.extract("20 people").quantities, facts.extract("200 people").quantities) == ["n:20"]
    assert not facts.present(facts.extract("Henrietta spoke."), "henri")
    long = verdict("short", "x" * 100)
    assert long.failed == ["length_ratio"] and long.scores["length_ratio"] == 20.0


def test_the_judge_reads_a_score_and_fails_below_its_bound():
    cfg = JudgeConfig()
    for answer, failed in (("5", []), ("Score: 2", ["judge"]), ("no idea", ["judge"])):
        scored = fidelity.Verdict()
        fidelity.add_judge(scored, answer, cfg)
        assert scored.failed == failed
    assert "REWRITE:\nb" in fidelity.judge_messages("a", "b", cfg)[1]["content"]


def test_benchmark_pairs_built_from_real_text_meet_the_targets():
    """bench/fidelity.py's pair maker on the shipped sample facts (real encyclopedic text): every
    wrong kind that applies is caught and every faithful rewrite passes."""
    spec = importlib.util.spec_from_file_location("bench_fidelity", REPO / "bench" / "fidelity.py")
    bench = sys.modules["bench_fidelity"] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(bench)
    passages = [json.loads(line)["text"] for line in (REPO / "recipes" / "data" / "rephrase_facts.jsonl").open()]
    pairs = bench.make_pairs(passages * 6, seed=1)
    result = bench.evaluate([p for p in pairs if p.kind != "language_switch"], None)
    assert result["wrong"] >= 20 and result["faithful"] >= 20
    assert result["gate_recall"] >= 0.9 and result["gate_faithful_passed"] >= 0.95, result


def test_shipped_style_library_covers_knowledge_and_math():
    styles = load_styles([], str(REPO / "recipes" / "styles" / "k2.yaml"))
    assert len([s for s in styles if s.domain == "knowledge"]) >= 8
    assert {s.name for s in styles if s.domain == "math"} >= {"math_learning_note", "math_translate_english"}


def test_math_translation_only_for_non_english_text():
    styles = load_styles([], str(REPO / "recipes" / "styles" / "k2.yaml"))
    english = eligible_styles(styles, "math", "Solve 2x + 3 = 7. Subtract 3 from both sides, then divide by 2.")
    german = eligible_styles(styles, "math", "Löse 2x + 3 = 7. Ziehe auf beiden Seiten 3 ab und teile durch 2.")
    chinese = eligible_styles(styles, "math", "解方程 2x + 3 = 7。两边减去 3，再除以 2。")
    assert "math_translate_english" not in [s.name for s in english]
    for non_english in (german, chinese):
        assert style_order(non_english, "doc", 0)[0].name == "math_translate_english"  # translated first
    assert is_english("The café serves crème brûlée to the guests, and it is good.")


def test_style_order_is_seeded_by_document():
    styles = [StyleConfig(name=f"s{i}", system="x") for i in range(8)]
    first = [s.name for s in style_order(styles, "doc-1", 0)]
    assert first == [s.name for s in style_order(styles, "doc-1", 0)]
    assert len({tuple(s.name for s in style_order(styles, f"doc-{i}", 0)) for i in range(20)}) > 10
    with pytest.raises(ValueError, match="unique names"):
        load_styles([styles[0], styles[0]], None)
