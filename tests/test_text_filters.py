"""Extraction, language ID, quality rules, PII and mojibake repair on documents made here
(and, opt-in, extraction on the shared pages with gold text)."""
import importlib.util
import statistics
from pathlib import Path

import pytest

from datapipe.schema import new_document
from datapipe.text import extract, langid, normalize, pii, quality
from datapipe.text.words import count_sentences, split_words

ARTICLE = ("The river flooded the lower town after three days of rain, and the council opened the school "
           "hall to families who had to leave their homes. Volunteers brought blankets and food to the hall. ")
GOOD = """The river flooded the lower town after three days of rain, and the council opened the school hall.
Families who had to leave their homes were given blankets, hot food and a place to sleep for the night.
By the next morning the water level had started to fall, but many streets were still closed to traffic.
Engineers from the regional office inspected the old bridge and said that it was safe to use again.
Shop owners began to clean their floors and to count the damage, which some of them put at thousands.

The mayor thanked the volunteers and promised that the town would build a higher wall along the river.
Critics said that the same promise had been made after the last flood, ten years ago, with no result.
The regional government has set aside money for repairs, and the first payments are expected in May.
Farmers in the valley fear that the wet fields will delay the planting of wheat and maize this spring.
Weather services expect a dry week, which should give the town time to recover before the next storm."""


def run(module, text, kind="text", **options):
    stage = module.make_stage(module.Config(stage=module.__name__.rsplit(".", 1)[-1], **options))
    return stage([new_document("t", "1", text, kind=kind)])[0]


@pytest.mark.parametrize("backend", ["article", "precise", "resiliparse", "trafilatura", "fallback"])
def test_extract_keeps_the_article_and_drops_the_menu(backend):
    nav = "".join(f"<li><a href='/{i}'>Menu item {i}</a></li>" for i in range(30))
    html = (f"<html><head><title>News</title><script>var x = 1;</script></head><body><nav><ul>{nav}</ul></nav>"
            f"<article><h1>Flood</h1>{''.join(f'<p>{ARTICLE}</p>' for _ in range(4))}</article>"
            "<footer>Copyright 2024 Example Corp. All rights reserved.</footer></body></html>")
    doc = run(extract, html, kind="html", backend=backend)
    assert not doc["reject"] and doc["kind"] == "text" and "river flooded" in doc["text"]
    assert "Menu item 17" not in doc["text"] and "var x" not in doc["text"]


def test_extract_narrows_to_the_article_container_and_drops_comments():
    teasers = "".join(f"<li><p>Related story {i}: {ARTICLE}</p></li>" for i in range(3))
    html = (f"<html><body><div class='page'><article><h1>Flood</h1>{''.join(f'<p>{ARTICLE}</p>' for _ in range(5))}"
            "</article><section class='comments' id='comments'><h3>34 comments</h3>"
            f"<div class='comment'><p>Reader comment: {ARTICLE}</p></div></section>"
            f"<aside><ul>{teasers}</ul></aside></div></body></html>")
    doc = run(extract, html, kind="html")
    assert doc["notes"]["extract"] == {"extractor": "resiliparse:container"}
    assert "river flooded" in doc["text"] and "Related story" not in doc["text"] and "Reader comment" not in doc["text"]


def test_extract_drops_the_blocks_around_the_article():
    """Byline and dateline, gallery slides, a link list and teasers outside the article's paragraphs go;
    the short paragraph closing the article and its headings stay; an empty link does not make the
    article look like links (resiliparse leaves it open)."""
    slides = "".join("<div class='slide'>Storm over the valley</div>" for _ in range(5))
    pages = "".join(f"<span>{i}</span>" for i in range(1, 8))
    links = "".join(f"<li><a href='/t/{i}'>Topic number {i}</a></li>" for i in range(8))
    teasers = "".join(f"<div><div>May {i}, 2024</div><div>Teaser {i}: {ARTICLE}</div></div>" for i in range(2))
    html = (f"<html><body><div id='main'><a href=''></a><div>By Jane Doe, Staff</div>"
            f"<div>March 3, 2024, updated 10:02</div>{slides}<div>{pages}</div><h2>The flood</h2>"
            f"{''.join(f'<p>{ARTICLE}</p>' for _ in range(10))}<p>The hall stays open.</p>"
            f"<ul>{links}</ul>{teasers}</div></body></html>")
    text = run(extract, html, kind="html")["text"]
    assert text.count("river flooded") == 10 and "The flood" in text and "The hall stays open." in text
    for boilerplate in ("Jane Doe", "March 3", "Storm over", "Topic number", "Teaser", "May 1"):
        assert boilerplate not in text
    kept = run(extract, html, kind="html", drop_blocks=False)["text"]
    assert "Jane Doe" in kept and kept.count("Storm over the valley") == 5


def test_blocks_read_back_from_resiliparse_markup():
    from datapipe.text.blocks import parse_blocks, render

    markup = ('<a href="">\n<h1>Title</h1>\n\n<p>One &amp; <a href="/x">two</a></p>\n'
              '<ul>\n  <li>item</li>\n</ul>\nline one<br>\nline two\n<pre>x = 1\n  y</pre>')
    blocks = parse_blocks(markup)
    assert [(b.kind, b.text, b.linked) for b in blocks] == [
        ("h1", "Title", 0), ("p", "One & two", 3), ("li", "item", 0), ("line", "line one", 0),
        ("line", "line two", 0), ("pre", "x = 1\n  y", 0)]
    assert render(blocks) == "Title\n\nOne & two\n\n• item\nline one\nline two\n\nx = 1\n  y"


GOLD_PAGES = Path(__file__).resolve().parents[2] / "shared" / "data" / "web_text" / "html_pages"


@pytest.mark.slow
@pytest.mark.skipif(not GOLD_PAGES.is_dir(), reason="needs ../shared/data/web_text/html_pages (the shared data folder)")
def test_default_extractor_matches_trafilatura_on_pages_with_gold_text():
    """bench/extract.py's pages and scoring: the default and `precise` at least trafilatura's mean
    bag-of-words F1 over all full gold texts and on each page type."""
    spec = importlib.util.spec_from_file_location("bench_extract", Path(__file__).parents[1] / "bench" / "extract.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    pages = [page for page in bench.load_gold() if page["type"] != "goose3"]
    f1 = {name: [bench.scores(extract_text(page["html"]), page["gold"])[2] for page in pages]
          for name, extract_text in [("default", bench.ours(extract.Config.model_fields["backend"].default)),
                                     ("precise", bench.ours("precise")),
                                     ("trafilatura", bench.peers()["trafilatura"])]}
    for kind in ("all", "readability", "news"):
        chosen = [i for i, page in enumerate(pages) if kind in ("all", page["type"])]
        peer = statistics.mean(f1["trafilatura"][i] for i in chosen)
        for name in ("default", "precise"):
            assert statistics.mean(f1[name][i] for i in chosen) >= peer, (name, kind)


def test_extract_rejects_a_page_without_text_and_leaves_other_kinds():
    assert run(extract, "<html><body><script>x()</script></body></html>", kind="html")["reject"] == "extract.empty"
    assert run(extract, "plain text stays")["text"] == "plain text stays"


def test_words_split_like_spacy_english():
    assert split_words("Don't stop: it's U.S. e.g. 3.5% well-known... ok!") == [
        "Do", "n't", "stop", ":", "it", "'s", "U.S.", "e.g.", "3.5", "%", "well", "-", "known", "...", "ok", "!"]
    assert count_sentences(split_words("One. Two! Three? \"Four.\" five")) == 5


def test_good_text_passes_every_rule():
    doc = run(quality, GOOD)
    assert doc["reject"] == "", doc["reject"]


@pytest.mark.parametrize("text,reason", [
    ("\n".join(["Buy now and save big on everything today."] * 30), "quality.gopher_repetition.dup_line_frac"),
    (GOOD + "\n\nLorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod.", "quality.c4.lorem_ipsum"),
    (GOOD + "\n\nfunction f() { return the value of x; } is what the code does here.", "quality.c4.curly_bracket"),
    (" ".join(f"#tag{i}" for i in range(80)) + " " + GOOD, "quality.gopher_quality.hash_ratio"),
])
def test_each_failing_rule_names_itself(text, reason):
    assert run(quality, text)["reject"] == reason


def test_short_documents_fail_word_count():
    note = "A short note with only a few distinct words in it, far fewer than fifty, so not a document."
    assert run(quality, note, gopher_repetition=None)["reject"] == "quality.gopher_quality.word_count"


def test_short_lines_fail_fineweb_and_groups_can_be_switched_off():
    menu = "\n".join(f"Item {i} of the menu." for i in range(80)) + "\n" + GOOD
    assert run(quality, menu, gopher_repetition=None, gopher_quality=None, c4=None)["reject"] == \
        "quality.fineweb.short_line_ratio"
    assert run(quality, menu, gopher_repetition=None, gopher_quality=None, c4=None, fineweb=None)["reject"] == ""


def test_c4_keeps_only_lines_that_end_a_sentence():
    doc = run(quality, GOOD + "\nShare on Facebook\nThis site uses cookies to work properly.",
              preset="c4", c4={"bad_words": False})
    assert not doc["reject"] and "Share on Facebook" not in doc["text"] and "cookies" not in doc["text"]


def test_langid_sets_language_and_filters():
    english, german = run(langid, ARTICLE), run(langid, "Der Fluss hat die Stadt nach drei Tagen Regen überflutet.")
    assert english["language"] == "en" and english["language_score"] > 0.8
    assert german["language"] == "de"
    assert run(langid, "Der Fluss hat die Stadt überflutet.", languages=["en"])["reject"] == "langid.language"
    unsure = run(langid, "ok 123", min_score=0.99)  # every language kept: only the score can reject it
    assert unsure["reject"] == "langid.low_score" and unsure["language_score"] < 0.99
    assert run(langid, ARTICLE, min_score=0.5)["reject"] == ""
    assert langid.to_confidence(1.00012) == 1.0 and langid.to_confidence(0.123456) == 0.1235
    with pytest.raises(ValueError, match="min_score"):  # a score is 0-1: 1.5 would reject every document
        langid.Config(stage="langid", min_score=1.5)


def test_pii_is_replaced_by_typed_placeholders_and_counted():
    doc = run(pii, "Write to jane.roe@mail.example.org, call +44 20 7946 0958 or reach 10.0.0.12. "
                   "Version 1.2.3 shipped on 2024-05-01 with items 10-20.")
    assert doc["text"] == ("Write to <EMAIL_ADDRESS>, call <PHONE_NUMBER> or reach <IP_ADDRESS>. "
                           "Version 1.2.3 shipped on 2024-05-01 with items 10-20.")
    assert doc["pii"] == {"email": 1, "ip_address": 1, "phone_number": 1}


def test_mojibake_is_repaired_only_when_asked():
    broken = "The cafÃ© served crÃ¨me brÃ»lÃ©e."
    assert run(normalize, broken, fix_mojibake=True)["text"] == "The café served crème brûlée."
    assert run(normalize, broken)["text"] == broken


def test_presets_follow_their_published_pipelines():
    # 7 of 10 lines without terminal punctuation: C4 drops them (then too few sentences), FineWeb's C4 step
    # keeps them and FineWeb's own rule needs only 12% of lines to end a sentence.
    headline_style = "\n".join(line.rstrip(".") if i % 10 < 7 else line for i, line in enumerate(GOOD.splitlines()))
    assert run(quality, headline_style, preset="c4", c4={"bad_words": False})["reject"] == "quality.c4.too_few_sentences"
    assert run(quality, headline_style)["reject"] == ""  # fineweb, the default
    gopher = quality.Config(stage="quality", preset="gopher")
    assert gopher.c4 is None and gopher.fineweb is None and gopher.gopher_quality is not None
    tuned = quality.Config(stage="quality", c4={"min_num_sentences": 3})  # laid over the preset, not replacing it
    assert tuned.c4.min_num_sentences == 3 and not tuned.c4.filter_no_terminal_punct
    with pytest.raises(ValueError, match="fineweb"):
        quality.Config(stage="quality", preset="dclm")


def test_sentences_split_before_a_non_ascii_capital_as_in_spacy():
    assert split_words("Year.Â Julia") == ["Year", ".", "Â", "Julia"]
    assert count_sentences(split_words("Happy New Year.Â Julia said so.Ça va")) == 3
