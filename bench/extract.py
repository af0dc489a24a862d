"""HTML extraction quality and speed on the gold pages of ../shared/data/web_text/html_pages.

Pages are decoded by our reader (datapipe.readers.warc.read_html: declared/undeclared charsets);
each backend of the extract stage, and the peers at their own settings, turn them into text in
the same run. Quality is bag-of-words precision/recall/F1 against the gold text, per page type:
`readability` (Readability.js expected output of 130 pages of many kinds: news, blogs, docs,
wikis), `news` (newspaper4k's gold .txt of 23 news articles, the article body alone); goose3's
gold `cleaned_text` is only a prefix of the article, so it counts for recall alone
(`goose3_prefix_recall`). Words are lower-cased \\w+ runs, with CJK characters counted one by
one. Speed: pages/s on one core, the median of --repeat passes over all 211 pages.
Peers: trafilatura as documented for main text (comments off; `favor_precision` too, its
most precise setting) and resiliparse's main-content pass with its defaults (comments kept).
Run: .venv/bin/python bench/extract.py
"""
from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

from datapipe.readers.warc import read_html
from datapipe.text.extract import EXTRACTORS, Config

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "web_text" / "html_pages"
WORD = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff]|[^\W\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff]+")
PAGE_TYPES = {"mozilla/readability": "readability", "AndyTheFactory/newspaper4k": "news", "goose3/goose3": "goose3"}
OURS = ("article", "precise", "resiliparse", "fallback")


def load_gold(data: Path = DATA) -> list[dict]:
    """Every page of the index with gold text: its decoded HTML, gold text and page type."""
    pages = []
    for row in map(json.loads, (data / "index.jsonl").open()):
        if not row["gold"]:
            continue
        page = data.parent / row["file"]
        if row["repo"] == "mozilla/readability":
            gold = html_text(gzip.decompress((page.parent / "expected.html.gz").read_bytes()))
        elif row["repo"] == "AndyTheFactory/newspaper4k":
            gold = (page.parent / Path(row["gold"]).name).read_text(encoding="utf-8")
        else:
            gold_file = page.parent / page.name.replace(".html.gz", ".json")
            gold = json.loads(gold_file.read_text(encoding="utf-8"))["expected"]["cleaned_text"]
        html = next(read_html(SimpleNamespace(name="gold"), str(page)))
        pages.append({"html": html["text"], "charset": html["meta"].get("charset"), "gold": gold,
                      "type": PAGE_TYPES[row["repo"]], "file": row["file"]})
    return pages


def html_text(data: bytes) -> str:
    import lxml.html

    return lxml.html.fromstring(data.decode("utf-8")).text_content()


def words(text: str) -> Counter:
    return Counter(WORD.findall(text.lower()))


def scores(predicted: str, gold: str) -> tuple[float, float, float]:
    got, want = words(predicted), words(gold)
    overlap = sum((got & want).values())
    precision = overlap / max(sum(got.values()), 1)
    recall = overlap / max(sum(want.values()), 1)
    return precision, recall, 2 * precision * recall / max(precision + recall, 1e-9)


def peers() -> dict[str, Callable[[str], str]]:
    import trafilatura
    from resiliparse.extract.html2text import extract_plain_text

    def with_trafilatura(html: str, **options) -> str:
        return trafilatura.extract(html, include_comments=False, deduplicate=False, **options) or ""

    return {
        "trafilatura": with_trafilatura,
        "trafilatura_precision": lambda html: with_trafilatura(html, favor_precision=True),
        "resiliparse_defaults": lambda html: extract_plain_text(html, main_content=True),
    }


def ours(backend: str) -> Callable[[str], str]:
    extract, cfg = EXTRACTORS[backend], Config(stage="extract", backend=backend)
    return lambda html: extract(html, cfg)[0]


def extractors() -> dict[str, Callable[[str], str]]:
    return {backend: ours(backend) for backend in OURS} | peers()


def evaluate(extract: Callable[[str], str], pages: list[dict], repeat: int) -> dict:
    for page in pages[:5]:  # warm-up: imports and first-call set-up are not per-page costs
        extract(page["html"])
    rates = []
    for _ in range(repeat):
        started = time.perf_counter()
        outputs = [extract(page["html"]) for page in pages]
        rates.append(len(pages) / (time.perf_counter() - started))
    return quality(outputs, pages) | {"pages_per_s": statistics.median(rates)}


def quality(outputs: list[str], pages: list[dict]) -> dict:
    """Mean precision/recall/F1 over the full gold texts, F1 per page type, goose3 prefix recall."""
    per_page = [(page["type"], scores(out, page["gold"])) for out, page in zip(outputs, pages)]
    full = [s for kind, s in per_page if kind != "goose3"]
    result = {"precision": statistics.mean(s[0] for s in full), "recall": statistics.mean(s[1] for s in full),
              "f1": statistics.mean(s[2] for s in full)}
    for kind in ("readability", "news"):
        result[f"f1_{kind}"] = statistics.mean(s[2] for k, s in per_page if k == kind)
    result["goose3_prefix_recall"] = statistics.mean(s[1] for k, s in per_page if k == "goose3")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed passes per extractor; the median is quoted")
    args = parser.parse_args()
    if not DATA.is_dir():
        sys.exit(f"bench extract: needs {DATA} (the shared data folder)")
    pages = load_gold()
    charsets = Counter(page["charset"].split(":")[0] for page in pages)
    print(f"{len(pages)} gold pages ({Counter(p['type'] for p in pages)}); decoded as {dict(charsets)}")
    results = {}
    for name, extract in extractors().items():
        results[name] = evaluate(extract, pages, args.repeat)
        print(f"{name:22s} " + " ".join(f"{k}={v:.3f}" for k, v in results[name].items()), flush=True)
    default, peer = results[Config.model_fields["backend"].default], results["trafilatura"]
    print(f"bench extract: pages={len(pages)} " + " ".join(f"f1_{b}={r['f1']:.3f}" for b, r in results.items())
          + f" f1_news_default={default['f1_news']:.3f} f1_news_trafilatura={peer['f1_news']:.3f}"
          + f" pages_per_s_default={default['pages_per_s']:.0f} pages_per_s_trafilatura={peer['pages_per_s']:.1f}"
          + f" x_vs_trafilatura={default['pages_per_s'] / peer['pages_per_s']:.2f}")


if __name__ == "__main__":
    main()
