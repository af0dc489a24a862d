"""HTML extraction quality and speed on the gold pages of ../shared/data/web_text/html_pages.

Pages are decoded by our reader (datapipe.readers.warc.read_html: declared/undeclared charsets);
each backend of the extract stage, and the peers at their own settings, turn them into text in
the same run. Quality is bag-of-words precision/recall/F1 against the gold text, per page type:
`readability` (Readability.js expected output of 130 pages of many kinds: news, blogs, docs,
wikis), `news` (newspaper4k's gold .txt of 23 news articles, the article body alone); goose3's
gold `cleaned_text` is only a prefix of the article, so it counts for recall alone
(`goose3_prefix_recall`). Words are lower-cased \\w+ runs, with CJK characters counted one by
one. Speed: pages/s on one core, the median of --repeat passes over all 211 pages, the
extractors' passes taken in turn. `f1_dev`/`f1_heldout`: the full gold texts split in two halves
by a hash of the file name (`half`), to check a rule worked out on one half against the other.
Peers: trafilatura as documented for main text (comments off; `favor_precision` too, its
most precise setting) and resiliparse's main-content pass with its defaults (comments kept).
Run: .venv/bin/python bench/extract.py
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
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
                      "type": PAGE_TYPES[row["repo"]], "file": row["file"], "half": half(row["file"])})
    return pages


def half(file: str) -> str:
    """A fixed split by name: rules are worked out looking at "dev" pages, checked on "heldout" ones."""
    return "dev" if hashlib.sha1(file.encode()).digest()[0] % 2 == 0 else "heldout"


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


def evaluate(extractors: dict[str, Callable[[str], str]], pages: list[dict], repeat: int) -> dict[str, dict]:
    """Quality and pages/s of each extractor. The timed passes take turns (each extractor's first
    pass, then each one's second...), so a change in the shared machine's load falls on all of them."""
    outputs, rates = {}, {name: [] for name in extractors}
    for name, extract in extractors.items():
        outputs[name] = [extract(page["html"]) for page in pages]  # also the warm-up: imports, first calls
    for _ in range(repeat):
        for name, extract in extractors.items():
            started = time.perf_counter()
            for page in pages:
                extract(page["html"])
            rates[name].append(len(pages) / (time.perf_counter() - started))
    return {name: quality(outputs[name], pages) | {"pages_per_s": statistics.median(rates[name])}
            for name in extractors}


def quality(outputs: list[str], pages: list[dict]) -> dict:
    """Mean precision/recall/F1 over the full gold texts, F1 per page type, goose3 prefix recall."""
    per_page = [(page["type"], scores(out, page["gold"])) for out, page in zip(outputs, pages)]
    full = [s for kind, s in per_page if kind != "goose3"]
    result = {"precision": statistics.mean(s[0] for s in full), "recall": statistics.mean(s[1] for s in full),
              "f1": statistics.mean(s[2] for s in full)}
    for kind in ("readability", "news"):
        result[f"f1_{kind}"] = statistics.mean(s[2] for k, s in per_page if k == kind)
    for half in ("dev", "heldout"):
        result[f"f1_{half}"] = statistics.mean(s[2] for (k, s), page in zip(per_page, pages)
                                               if k != "goose3" and page["half"] == half)
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
    results = evaluate(extractors(), pages, args.repeat)
    for name, result in results.items():
        print(f"{name:22s} " + " ".join(f"{k}={v:.3f}" for k, v in result.items()))
    default, peer = results[Config.model_fields["backend"].default], results["trafilatura"]
    print(f"bench extract: pages={len(pages)} " + " ".join(f"f1_{b}={r['f1']:.3f}" for b, r in results.items())
          + "".join(f" f1_{kind}_{name}={result[f'f1_{kind}']:.3f}" for kind in ("readability", "news")
                    for name, result in (("default", default), ("trafilatura", peer)))
          + f" pages_per_s_default={default['pages_per_s']:.0f} pages_per_s_trafilatura={peer['pages_per_s']:.1f}"
          + f" x_vs_trafilatura={default['pages_per_s'] / peer['pages_per_s']:.2f}")


if __name__ == "__main__":
    main()
