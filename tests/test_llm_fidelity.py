"""The fidelity gate with the real all-MiniLM-L6-v2 embedder, and the style library's rules."""
import pytest

from datapipe.llm import fidelity
from datapipe.llm.fidelity import FidelityConfig
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


def test_paraphrase_passes_the_gate(cosines):
    scores = fidelity.score(SOURCE, PARAPHRASE, cosines["paraphrase"])
    assert scores["numbers"] == 1.0 and scores["entities"] == 1.0
    assert fidelity.failures(scores, FidelityConfig()) == []


def test_a_rewrite_that_drops_a_number_is_rejected(cosines):
    scores = fidelity.score(SOURCE, NO_NUMBER, cosines["no_number"])
    assert scores["cosine"] > FidelityConfig().min_cosine  # close in meaning: only the number check catches it
    assert scores["numbers"] == 0.0
    assert fidelity.failures(scores, FidelityConfig()) == ["numbers 0.0 < 1.0"]


def test_unrelated_text_fails_cosine_and_names(cosines):
    failed = fidelity.failures(fidelity.score(SOURCE, UNRELATED, cosines["unrelated"]), FidelityConfig())
    assert [f.split()[0] for f in failed] == ["cosine", "numbers", "entities"]


def test_an_echo_of_the_source_is_no_rephrasing():
    echo = SOURCE + " However, I made a small punctuation mistake."  # what SmolLM2 sometimes answers
    scores = fidelity.score(SOURCE, echo, None)
    assert scores["overlap"] == 1.0
    assert fidelity.failures(scores, FidelityConfig()) == ["overlap 1.0 > 0.8"]
    assert fidelity.score(SOURCE, PARAPHRASE, None)["overlap"] < 0.5  # keeps a name, not the sentences


def test_numbers_ignore_thousands_separators_and_length_is_bounded():
    assert fidelity.numbers("It cost 7,799,401 francs in 1889.") == {"7799401", "1889"}
    assert fidelity.score("7799401 francs", "7,799,401 francs", None)["numbers"] == 1.0
    long = fidelity.score("short", "x" * 100, None)
    assert fidelity.failures(long, FidelityConfig()) == ["length_ratio 20.0 outside [0.3, 3.0]"]


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
