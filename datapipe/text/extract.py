"""HTML to main text: boilerplate (menus, footers, ads, comment threads) out, the article in.

Backends, measured on the 211 pages of shared/data/web_text/html_pages that carry gold text
(bench/extract.py; figures in the README):
- resiliparse: a C++ DOM and a rule-based main-content pass (comment sections dropped:
  a reader thread cost one sports page precision 0.13), about 20x faster than trafilatura,
  but it keeps teasers, bylines and page chrome around the article;
- trafilatura: tree heuristics plus readability/justext fallbacks, precise and the slowest;
- article (default): resiliparse, narrowed to the page's one article container
  (schema.org articleBody, else a single <article>, else a single <main>) when that container
  holds at least `container_min_share` of the page's main text, so "related stories" and
  sidebars outside it go; then the blocks around the article inside it go too (bylines,
  captions, gallery slides, teasers, link lists: datapipe.text.blocks); trafilatura when
  resiliparse keeps under `fallback_min_chars` (about 2% of pages). F1 0.960 vs trafilatura's
  0.933 at ~8x its speed, and above it on each page type (news 0.954 vs 0.925);
- precise: as article, but trafilatura (favor_precision) on every page without such a container
  (about half of them): news 0.966, at about trafilatura's speed (1.5x);
- fallback: resiliparse, and trafilatura only below `fallback_min_chars` (the old default).
Documents of other kinds pass untouched; a page with no text left is rejected
(extract.empty) and one that crashes the extractor is rejected (extract.error) by the runner.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from pydantic import Field

from datapipe.schema import Document
from datapipe.stage import StageConfig

Backend = Literal["article", "precise", "resiliparse", "trafilatura", "fallback"]
# Most specific first: articleBody is the body alone; <article> and <main> may hold the title too.
CONTAINERS = ("[itemprop=articleBody]", "article", "main")


class Config(StageConfig):
    backend: Backend = "article"  # above trafilatura's F1 on every page type at ~8x its speed (README, Text cleaning)
    min_chars: int = Field(1, ge=1)  # fewer characters of main text: rejected as extract.empty
    fallback_min_chars: int = Field(200, ge=0)  # "article"/"fallback": below this, ask trafilatura too
    # A container with less than half the page's main text is a teaser or one section, not the article.
    container_min_share: float = Field(0.5, ge=0, le=1)
    # "article"/"precise": drop the blocks around the article (bylines, captions, gallery slides,
    # teasers, link lists; datapipe.text.blocks): news F1 0.916 -> 0.954, all 0.953 -> 0.960.
    drop_blocks: bool = True
    good_block_chars: int = Field(80, ge=1)  # a block this long (mostly not links) is the article's text
    include_tables: bool = True  # table cells are content on many pages (specs, prices, results)
    batch_size: int = 64  # pages cost ~1-20 ms each; 64 keeps tasks short


def make_stage(cfg: Config) -> Callable[[list[Document]], list[Document]]:
    extract = EXTRACTORS[cfg.backend]

    def extract_pages(docs: list[Document]) -> list[Document]:
        for doc in docs:
            if doc["kind"] != "html":
                continue
            text, used = extract(doc["text"], cfg)
            doc["text"], doc["kind"] = text, "text"
            doc["notes"]["extract"] = {"extractor": used}
            if len(text.strip()) < cfg.min_chars:
                doc["reject"] = "extract.empty"
        return docs

    return extract_pages


def main_text(tree) -> str:
    """resiliparse's main-content pass over a parsed tree, comment threads left out."""
    from resiliparse.extract.html2text import extract_plain_text

    return extract_plain_text(tree, main_content=True, comments=False, alt_texts=False, links=False,
                              form_fields=False, noscript=False, list_bullets=True,
                              preserve_formatting=True).strip()


def article_main_text(tree, cfg: Config) -> str:
    """main_text less the boilerplate blocks around the article (datapipe.text.blocks)."""
    from resiliparse.extract.html2text import extract_plain_text

    from datapipe.text.blocks import Rules, drop_boilerplate, parse_blocks, render

    if not cfg.drop_blocks:
        return main_text(tree)
    markup = extract_plain_text(tree, main_content=True, comments=False, alt_texts=False, links=True,
                                form_fields=False, noscript=False, preserve_formatting="minimal_html")
    return render(drop_boilerplate(parse_blocks(markup), Rules(good_weight=cfg.good_block_chars)))


def with_resiliparse(html: str, cfg: Config) -> tuple[str, str]:
    from resiliparse.parse.html import HTMLTree

    return main_text(HTMLTree.parse(html)), "resiliparse"


def with_trafilatura(html: str, cfg: Config, favor_precision: bool = False) -> tuple[str, str]:
    import trafilatura

    text = trafilatura.extract(html, include_comments=False, include_tables=cfg.include_tables,
                               include_images=False, deduplicate=False, with_metadata=False,
                               favor_precision=favor_precision)
    return (text or "").strip(), "trafilatura"


def with_fallback(html: str, cfg: Config) -> tuple[str, str]:
    text, used = with_resiliparse(html, cfg)
    return text_or_trafilatura(html, text, used, cfg)


def text_or_trafilatura(html: str, text: str, used: str, cfg: Config) -> tuple[str, str]:
    """`text` unless it is shorter than fallback_min_chars and trafilatura finds more."""
    if len(text) >= cfg.fallback_min_chars:
        return text, used
    other, other_used = with_trafilatura(html, cfg)
    return (other, other_used) if len(other) > len(text) else (text, used)


def with_article(html: str, cfg: Config) -> tuple[str, str]:
    text, narrowed = article_text(html, cfg)
    if narrowed:
        return text, "resiliparse:container"
    return text_or_trafilatura(html, text, "resiliparse", cfg)


def with_precise(html: str, cfg: Config) -> tuple[str, str]:
    text, narrowed = article_text(html, cfg)
    if narrowed:
        return text, "resiliparse:container"
    other, used = with_trafilatura(html, cfg, favor_precision=True)
    return (other, used) if other else (text, "resiliparse")


def article_text(html: str, cfg: Config) -> tuple[str, bool]:
    """The page's main text, narrowed to its article container where it has one (then True)."""
    from resiliparse.parse.html import HTMLTree

    tree = HTMLTree.parse(html)
    text = article_main_text(tree, cfg)
    narrowed = container_text(tree, len(text) * cfg.container_min_share, cfg)
    return (narrowed, True) if narrowed is not None else (text, False)


def container_text(tree, min_chars: float, cfg: Config) -> str | None:
    """Main text of the page's only article container, if it holds at least min_chars."""
    from resiliparse.parse.html import HTMLTree

    if tree.body is None:
        return None
    for selector in CONTAINERS:
        found = tree.body.query_selector_all(selector)
        if len(found) != 1:  # none, or a list of teasers: no single article to narrow to
            continue
        text = article_main_text(HTMLTree.parse(found[0].html), cfg)
        if text and len(text) >= min_chars:
            return text
    return None


EXTRACTORS: dict[str, Callable[[str, Config], tuple[str, str]]] = {
    "article": with_article,
    "precise": with_precise,
    "resiliparse": with_resiliparse,
    "trafilatura": with_trafilatura,
    "fallback": with_fallback,
}
