"""HTML extraction quality and speed on the gold pages of ../shared/data/web_text/html_pages.

Pages are decoded by our reader (datapipe.readers.warc.read_html: declared/undeclared charsets);
each backend of the extract stage turns them into text. Quality is bag-of-words
precision/recall/F1 against the gold text (Readability.js expected output and
newspaper4k gold .txt: full texts); goose3's gold `cleaned_text` is only a prefix of the
article, so it counts for recall alone. Words are lower-cased \\w+ runs, with CJK
characters counted one by one. Speed is pages/s on one core.
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
from pathlib import Path
from types import SimpleNamespace

from datapipe.readers.warc import read_html
from datapipe.text.extract import EXTRACTORS, Config

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "web_text" / "html_pages"
WORD = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff]|[^\W\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff]+")


def load_gold() -> list[dict]:
    pages = []
    for row in map(json.loads, (DATA / "index.jsonl").open()):
        if not row["gold"]:
            continue
        page = DATA.parent / row["file"]
        if row["repo"] == "mozilla/readability":
            gold, full = html_text(gzip.decompress((page.parent / "expected.html.gz").read_bytes())), True
        elif row["repo"] == "AndyTheFactory/newspaper4k":
            gold, full = (page.parent / Path(row["gold"]).name).read_text(encoding="utf-8"), True
        else:
            gold_file = page.parent / page.name.replace(".html.gz", ".json")
            gold, full = json.loads(gold_file.read_text(encoding="utf-8"))["expected"]["cleaned_text"], False
        html = next(read_html(SimpleNamespace(name="gold"), str(page)))
        pages.append({"html": html["text"], "charset": html["meta"].get("charset"), "gold": gold, "full": full})
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


def evaluate(backend: str, pages: list[dict]) -> dict:
    cfg, extract = Config(stage="extract", backend=backend), EXTRACTORS[backend]
    for page in pages[:5]:  # warm-up: imports and first-call set-up are not per-page costs
        extract(page["html"], cfg)
    started = time.perf_counter()
    outputs = [extract(page["html"], cfg)[0] for page in pages]
    elapsed = time.perf_counter() - started
    full = [scores(out, page["gold"]) for out, page in zip(outputs, pages) if page["full"]]
    prefix_recall = [scores(out, page["gold"])[1] for out, page in zip(outputs, pages) if not page["full"]]
    return {
        "precision": statistics.mean(s[0] for s in full),
        "recall": statistics.mean(s[1] for s in full),
        "f1": statistics.mean(s[2] for s in full),
        "f1_median": statistics.median(s[2] for s in full),
        "goose3_prefix_recall": statistics.mean(prefix_recall),
        "pages_per_s": len(pages) / elapsed,
    }


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # no options: --help answers instead of starting the run
    if not DATA.is_dir():
        sys.exit(f"bench extract: needs {DATA} (the shared data folder)")
    pages = load_gold()
    charsets = Counter(page["charset"].split(":")[0] for page in pages)
    print(f"{len(pages)} gold pages ({sum(p['full'] for p in pages)} full gold texts); decoded as {dict(charsets)}")
    results = {backend: evaluate(backend, pages) for backend in EXTRACTORS}
    for backend, result in results.items():
        print(f"{backend:12s} " + " ".join(f"{k}={v:.3f}" for k, v in result.items()))
    best = max(results, key=lambda b: results[b]["f1"])
    speed = results["resiliparse"]["pages_per_s"] / results["trafilatura"]["pages_per_s"]
    print(f"bench extract: pages={len(pages)} " + " ".join(f"f1_{b}={r['f1']:.3f}" for b, r in results.items())
          + " " + " ".join(f"pages_per_s_{b}={r['pages_per_s']:.0f}" for b, r in results.items())
          + f" best_f1={best} x_resiliparse_vs_trafilatura={speed:.2f}")


if __name__ == "__main__":
    main()
