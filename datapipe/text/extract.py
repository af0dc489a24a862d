"""HTML to main text: boilerplate (menus, footers, ads) out, the article in.

Two extractors, measured on the 211 pages of shared/data/web_text/html_pages that carry
gold text (bench/extract.py; figures in the README):
- resiliparse: a C++ DOM and a rule-based main-content pass, about 20x faster than
  trafilatura, a little less precise on news pages;
- trafilatura: tree heuristics plus readability/justext fallbacks, the most precise,
  and the slowest;
- fallback: resiliparse first; trafilatura only when resiliparse keeps less than
  `fallback_min_chars` (about 5% of pages), which buys most of trafilatura's recall
  on hard pages at a small share of its cost.
Documents of other kinds pass untouched; a page with no text left is rejected
(extract.empty) and one that crashes the extractor is rejected (extract.error) by the runner.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from pydantic import Field

from datapipe.schema import Document
from datapipe.stage import StageConfig

Backend = Literal["resiliparse", "trafilatura", "fallback"]


class Config(StageConfig):
    backend: Backend = "fallback"  # best F1 per second on the gold pages (README, Text cleaning)
    min_chars: int = Field(1, ge=1)  # fewer characters of main text: rejected as extract.empty
    fallback_min_chars: int = Field(200, ge=0)  # "fallback": below this, ask trafilatura too
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


def with_resiliparse(html: str, cfg: Config) -> tuple[str, str]:
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree

    tree = HTMLTree.parse(html)
    text = extract_plain_text(tree, main_content=True, alt_texts=False, links=False, form_fields=False,
                              noscript=False, list_bullets=True, preserve_formatting=True)
    return text.strip(), "resiliparse"


def with_trafilatura(html: str, cfg: Config) -> tuple[str, str]:
    import trafilatura

    text = trafilatura.extract(html, include_comments=False, include_tables=cfg.include_tables,
                               include_images=False, deduplicate=False, with_metadata=False)
    return (text or "").strip(), "trafilatura"


def with_fallback(html: str, cfg: Config) -> tuple[str, str]:
    text, used = with_resiliparse(html, cfg)
    if len(text) >= cfg.fallback_min_chars:
        return text, used
    other, other_used = with_trafilatura(html, cfg)
    return (other, other_used) if len(other) > len(text) else (text, used)


EXTRACTORS: dict[str, Callable[[str, Config], tuple[str, str]]] = {
    "resiliparse": with_resiliparse,
    "trafilatura": with_trafilatura,
    "fallback": with_fallback,
}
