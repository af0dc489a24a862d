"""Benchmark: webpage screenshots per second, our pooled browser vs a browser per page.

    .venv/bin/python bench/render_web.py [--pages 20] [--viewport 1280x720]

On a seeded sample of the offline pages of ../shared/data/html/ (needs_network=false in
pages.jsonl), in the same run, page by page, alternating so that the shared machine's load
hits both alike:
- ours: WebRenderer as the render stage uses it (sandboxed Chromium kept warm, one page
  reused, pages served from their own folder through the route), after one warm-up render;
- per page: what a script does without a pool: launch Chromium, open a page, goto file://,
  screenshot, close (no network either: the same host-resolver rule).
Both take the same viewport; "same output" counts pages whose two screenshots differ on at
most 2% of pixels. The ones that differ are by design: MDN pages that link ../styles.css
outside their own folder get it from file:// but not from our route, which serves only the
page's folder (notes.render.blocked_requests lists what was refused). Wall time per
screenshot, medians and totals; the last line is the summary.
"""
from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from renderers.base import RenderError, RenderOptions
from renderers.web import CHROMIUM, WebRenderer

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "html"


def sample_pages(count: int, seed: int = 0) -> list[Path]:
    rows = [json.loads(line) for line in (DATA / "pages.jsonl").open()]
    offline = sorted(DATA / row["page"] for row in rows if not row["needs_network"])
    return sorted(random.Random(seed).sample(offline, min(count, len(offline))))


def read_page(path: Path) -> str:
    from datapipe.readers.files import decode

    return decode(path.read_bytes())[0]


def render_pooled(web: WebRenderer, path: Path, options: RenderOptions) -> tuple[bytes | str, float]:
    start = time.perf_counter()
    try:
        png: bytes | str = web.render(read_page(path), path.parent, options).images[0]
    except RenderError as err:
        png = err.reason
    return png, time.perf_counter() - start


def render_fresh_browser(playwright, path: Path, options: RenderOptions) -> tuple[bytes | str, float]:
    start = time.perf_counter()
    width, height = options.viewports[0]
    browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                         args=["--no-sandbox", "--host-resolver-rules=MAP * ~NOTFOUND"])
    try:
        page = browser.new_page(viewport={"width": width, "height": height})
        page.goto(path.as_uri(), wait_until="load", timeout=options.timeout_s * 1000)
        png: bytes | str = page.screenshot(animations="disabled", caret="hide")
    except Exception as err:  # noqa: BLE001 - a failed page counts against the baseline's success rate
        png = type(err).__name__
    finally:
        browser.close()
    return png, time.perf_counter() - start


def mismatch(a: bytes, b: bytes) -> float:
    from PIL import Image

    first, second = (np.asarray(Image.open(io.BytesIO(x)).convert("RGB"), dtype=np.int16) for x in (a, b))
    if first.shape != second.shape:
        return 1.0
    return float((np.abs(first - second).max(axis=2) > 48).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=20)
    parser.add_argument("--viewport", default="1280x720")
    args = parser.parse_args()
    if not DATA.exists():
        raise SystemExit(f"{DATA} is absent: this benchmark reads the shared HTML corpus")
    width, height = map(int, args.viewport.split("x"))
    options = RenderOptions(viewports=[(width, height)], timeout_s=20)
    pages = sample_pages(args.pages)
    web = WebRenderer()
    render_pooled(web, pages[0], options)  # launch and warm up, as an actor does once
    ours, theirs = [], []
    for page in pages:  # the baseline shares our Playwright driver (one per thread); only browsers differ
        ours.append(render_pooled(web, page, options))
        theirs.append(render_fresh_browser(web.playwright, page, options))
    web.close()
    report(pages, ours, theirs)


def report(pages: list[Path], ours: list, theirs: list) -> None:
    ok = [isinstance(png, bytes) for png, _ in ours]
    ok_theirs = [isinstance(png, bytes) for png, _ in theirs]
    same = [mismatch(a, b) <= 0.02 for (a, _), (b, _) in zip(ours, theirs) if isinstance(a, bytes) and isinstance(b, bytes)]
    total, total_theirs = sum(t for _, t in ours), sum(t for _, t in theirs)
    rate, rate_theirs = sum(ok) / total, sum(ok_theirs) / total_theirs
    failures = [(p.name, o[0], t[0]) for p, o, t in zip(pages, ours, theirs) if isinstance(o[0], str) or isinstance(t[0], str)]
    print(f"sample: {len(pages)} offline pages of {DATA} (seed 0); failures (page, ours, per-page browser): {failures}")
    print(f"pooled (ours):        {rate:.2f} screenshots/s, median {statistics.median(t for _, t in ours):.3f} s a page")
    print(f"browser per page:     {rate_theirs:.2f} screenshots/s, median {statistics.median(t for _, t in theirs):.3f} s a page")
    print(f"same output (<= 2% pixels differ) on {sum(same)}/{len(same)} pages both rendered")
    print(f"bench render_web: pages={len(pages)} screenshots_per_s={rate:.2f} browser_per_page_screenshots_per_s="
          f"{rate_theirs:.2f} success={sum(ok) / len(ok):.3f} browser_per_page_success={sum(ok_theirs) / len(ok_theirs):.3f} "
          f"same_output={sum(same) / max(len(same), 1):.3f} x_vs_browser_per_page={rate / rate_theirs:.2f}")


if __name__ == "__main__":
    main()
