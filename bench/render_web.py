"""Benchmark: webpage screenshots per second, our pooled browser vs a browser per page.

    .venv/bin/python bench/render_web.py [--pages 20] [--viewport 1280x720]

On a seeded sample of the offline pages of ../shared/data/html/ (needs_network=false in
pages.jsonl), in the same run, page by page, alternating so that the shared machine's load
hits both alike:
- ours: WebRenderer as the render stage uses it (sandboxed Chromium kept warm, one page
  reused, each page read by the files source with asset_root = the corpus folder and served
  through the route), after one warm-up render;
- per page: what a script does without a pool: launch Chromium, open a page, goto file://,
  screenshot, close (no network either: the same host-resolver rule).
Both take the same viewport; "same output" counts pages whose two screenshots differ on at
most 2% of pixels. Wall time per screenshot, medians and totals.

Then pages that load assets through `../` (--dotdot-pages of them, offline, seeded): each read
by the files source with asset_root = the corpus folder (served from the nearest folder that
holds what it climbs to) and rendered by ours, against a plain Chromium (one browser, a new
page each) that loads the same files from a local http.server over the whole corpus, the way a
developer previews a template; "dotdot_same_output" is the share within 2% of pixels (target
95%), "dotdot_own_folder_same_output" the same pages served from their own folder only (the
behaviour without asset_root). The last line is the summary.
"""
from __future__ import annotations

import argparse
import functools
import http.server
import io
import json
import random
import re
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from renderers.base import RenderError, RenderOptions
from renderers.web import CHROMIUM, WebRenderer

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "html"


CLIMBS = re.compile(rb"""(?:href|src)\s*=\s*["']?\.\./""", re.IGNORECASE)  # a page that links ../


def sample_pages(count: int, seed: int = 0, climbing: bool = False) -> list[Path]:
    rows = [json.loads(line) for line in (DATA / "pages.jsonl").open()]
    offline = sorted(DATA / row["page"] for row in rows if not row["needs_network"])
    if climbing:
        offline = [page for page in offline if CLIMBS.search(page.read_bytes())]
    return sorted(random.Random(seed).sample(offline, min(count, len(offline))))


def render_pooled(web: WebRenderer, path: Path, options: RenderOptions) -> tuple[bytes | str, float]:
    start = time.perf_counter()
    png = render_from_root(web, path, options, DATA)
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


def render_from_root(web: WebRenderer, path: Path, options: RenderOptions, root: Path | None) -> bytes | str:
    """Ours, as the files source reads the page: asset_root=root, or (None) its own folder."""
    from datapipe.pipeline.recipe import FilesSource
    from datapipe.readers.files import read_files

    source = FilesSource(name="bench", type="files", paths=[str(path)], asset_root=str(root or ""))
    doc = next(read_files(source, str(path)))
    try:
        return web.render(doc["text"], Path(doc["asset_dir"]), options,
                          name=doc["meta"].get("page_path", "index.html")).images[0]
    except RenderError as err:
        return err.reason


def serve_folder(folder: Path) -> http.server.ThreadingHTTPServer:
    """A plain local web server over `folder`, on a free port, in a daemon thread."""
    handler = functools.partial(QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def render_served(browser, server, path: Path, options: RenderOptions) -> bytes | str:
    """Plain Chromium's screenshot of the page as the local server serves it."""
    width, height = options.viewports[0]
    page = browser.new_page(viewport={"width": width, "height": height})
    try:
        url = f"http://127.0.0.1:{server.server_port}/{path.relative_to(DATA).as_posix()}"
        page.goto(url, wait_until="load", timeout=options.timeout_s * 1000)
        return page.screenshot(animations="disabled", caret="hide")
    except Exception as err:  # noqa: BLE001 - a failed reference is left out of the share
        return type(err).__name__
    finally:
        page.close()


def compare_climbing(web: WebRenderer, count: int, options: RenderOptions) -> dict[str, float]:
    """Pages that link ../: ours from the nearest root and from their own folder, against plain
    Chromium over a local server; the share of each within 2% of the reference's pixels."""
    pages, server = sample_pages(count, climbing=True), serve_folder(DATA)
    browser = web.playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
        "--no-sandbox", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"])
    rooted, own, missed = [], [], []
    for path in pages:
        reference = render_served(browser, server, path, options)
        if not isinstance(reference, bytes):
            continue
        ours, own_folder = render_from_root(web, path, options, DATA), render_from_root(web, path, options, None)
        rooted.append(isinstance(ours, bytes) and mismatch(ours, reference) <= 0.02)
        own.append(isinstance(own_folder, bytes) and mismatch(own_folder, reference) <= 0.02)
        if not rooted[-1]:
            missed.append(path.relative_to(DATA).as_posix())
    browser.close()
    server.shutdown()
    print(f"pages linking ../: {len(rooted)} of {len(pages)} sampled rendered by the reference; "
          f"ours within 2% from the nearest root {sum(rooted)}, from their own folder {sum(own)}; missed {missed}")
    return {"dotdot_pages": len(rooted), "dotdot_same_output": sum(rooted) / max(len(rooted), 1),
            "dotdot_own_folder_same_output": sum(own) / max(len(own), 1)}


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
    parser.add_argument("--dotdot-pages", type=int, default=40, help="pages that link ../, against a local server")
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
    climbing = compare_climbing(web, args.dotdot_pages, options)
    web.close()
    report(pages, ours, theirs, climbing)


def report(pages: list[Path], ours: list, theirs: list, climbing: dict[str, float]) -> None:
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
          f"same_output={sum(same) / max(len(same), 1):.3f} dotdot_pages={climbing['dotdot_pages']} "
          f"dotdot_same_output={climbing['dotdot_same_output']:.3f} "
          f"dotdot_own_folder_same_output={climbing['dotdot_own_folder_same_output']:.3f} "
          f"x_vs_browser_per_page={rate / rate_theirs:.2f}")


if __name__ == "__main__":
    main()
