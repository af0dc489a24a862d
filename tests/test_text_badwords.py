"""C4's bad-words rule: word lists written here (and the installed LDNOOBW lists, which make install fetches)."""
import json
import random
import re

import pytest
from pydantic import ValidationError

from datapipe.schema import new_document
from datapipe.text import badwords, quality
from tests.test_text_filters import GOOD

ENTRIES = ["zorp", "blue moon", "g-spot", "s&m", "x"]


@pytest.fixture
def lists(tmp_path):
    (tmp_path / "en.json").write_text(json.dumps(ENTRIES))
    (tmp_path / "zh.json").write_text(json.dumps(["坏词"]))
    return tmp_path


def c4_quality(lists_dir, text, language=None, **c4):
    options = {"bad_words": True, "bad_words_dir": str(lists_dir), **c4}
    cfg = quality.Config(stage="quality", preset="c4", c4=options)
    doc = new_document("t", "1", text)
    if language:
        doc["language"] = language
    return quality.make_stage(cfg)([doc])[0]


def test_a_listed_word_or_phrase_rejects_the_page(lists):
    assert c4_quality(lists, GOOD)["reject"] == ""
    for sentence in ("They saw a Zorp in the hall.", "It happens once in a BLUE MOON, they said.",
                     "The word g-spot is on the list.", "The s&m shop closed."):
        assert c4_quality(lists, GOOD + "\n" + sentence)["reject"] == "quality.c4.bad_words", sentence


def test_only_whole_words_match(lists):
    for sentence in ("The zorpy hall was open.", "A blue mooner came by.", "The box was red.", "Kg-spots are rare."):
        assert c4_quality(lists, GOOD + "\n" + sentence)["reject"] == "", sentence


def test_the_list_follows_the_page_language(lists):
    chinese = GOOD + "\n他们 说 这是一个坏词的例子."  # C4 keeps lines of 3+ words that end a sentence
    assert c4_quality(lists, chinese, language="zh")["reject"] == "quality.c4.bad_words"  # no word boundaries in zh
    assert c4_quality(lists, GOOD + "\nThey saw a zorp.", language="de")["reject"] == ""  # no German list here
    assert c4_quality(lists, GOOD + "\nThey saw a zorp.", language="en")["reject"] == "quality.c4.bad_words"
    unlabelled = GOOD + "\nThey saw a zorp."
    assert c4_quality(lists, unlabelled, bad_words_default_language="zh")["reject"] == ""


def test_lines_c4_drops_are_not_searched(lists):
    assert c4_quality(lists, GOOD + "\nzorp menu")["reject"] == ""  # no terminal punctuation: the line goes first


def test_same_decisions_as_the_c4_regex(lists):
    """C4's own matcher: the lowercased page against one alternation between non-word characters."""
    regex = re.compile(r"(?:\W|^)({})(?:\W|$)".format("|".join(map(re.escape, ENTRIES))))
    matcher = badwords.BadWords(ENTRIES, unspaced=False)
    rng = random.Random(0)
    pieces = ["zorp", "zorps", "blue", "moon", "g", "spot", "-", "s", "&", "m", "x", "xx", " ", "  ", ".", "_",
              "\n", "é", "Blue", "MOON", "1"]
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 12))) for _ in range(3000)]
    decisions = [(bool(regex.search(text.lower())), matcher.first_match(text) is not None) for text in texts]
    assert sum(expected for expected, _ in decisions) > 200  # the random texts hit the list often
    assert [text for text, (expected, got) in zip(texts, decisions) if expected != got] == []


def test_missing_lists_fail_before_any_work(tmp_path):
    with pytest.raises(ValidationError, match="make install"):
        quality.Config(stage="quality", c4={"bad_words": True, "bad_words_dir": str(tmp_path / "none")})
    assert quality.Config(stage="quality", c4={"bad_words_dir": str(tmp_path / "none")}).c4.bad_words is False


def test_installed_lists_catch_c4_entries():
    if not badwords.has_lists(badwords.INSTALLED):
        pytest.skip(f"the LDNOOBW lists are not in {badwords.INSTALLED}: make install fetches them")
    english = badwords.load(str(badwords.INSTALLED), "en")
    assert english.first_match("He called it a blumpkin, whatever that is.") == "blumpkin"
    assert english.first_match("Two girls went to buy one cup of coffee.") is None
    assert len(english.words) + len(english.others) > 400
    assert badwords.load(str(badwords.INSTALLED), "xx") is None
    assert (badwords.INSTALLED / "LICENSE").read_text().startswith("Attribution 4.0")
