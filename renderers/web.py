"""Webpages to PNG: Debian's Chromium driven by Playwright, one warm browser and page per actor.

Cost measured here (README): reusing a page costs ~150 CPU-ms a 1280x720 shot, a new page
~430, a new browser per shot ~1,100; so the renderer keeps one browser, one context and one
page across renders, and replaces only what broke.

Isolation, each layer on its own enough to stop what it targets:
- Chromium runs through the sandbox launcher (renderers.sandbox exec): its own uid, a
  process cap, the whole tree killed by uid when it is replaced, and (as root, where
  /sys/fs/cgroup is writable) a memory cgroup of its own capping the whole browser at
  memory_mb + BROWSER_BASE_MB: ArrayBuffers and images live outside V8's heap;
- no network: an offline context AND --host-resolver-rules mapping every host to NOTFOUND
  (route interception alone lets sendBeacon and WebSocket through);
- no files: a page is never opened from file://. It is served from an in-memory route at
  http://render.invalid/<name>; the same route serves files under the page's asset folder (its
  own, or the root the files source chose with asset_root, where <name> is the page's path;
  resolved, symlinks followed, size-capped) and answers everything else with an abort, so a
  page cannot embed /etc/hostname (an http origin cannot load file: URLs either);
- one time budget: navigation, viewport changes, the page-height query and screenshots all draw
  on one deadline, `timeout_s` after the page is asked for (a page that spun 4 s before load and
  forever after took 10-12 s with timeout_s=5 when each step had its own). Playwright's own
  timeouts end most overruns; a watchdog thread SIGKILLs the page's renderer processes (by the
  browser's uid, as root) RENDERER_GRACE_S past the deadline, because some calls (a
  page.evaluate, a viewport change) have no timeout and wait forever on a page spinning in
  JavaScript. Past the deadline the context is closed and a fresh one made; the browser stays
  up. A crashed page costs a new context, a crashed browser a relaunch; the record is rejected
  (render.timeout / render.crashed) and the batch goes on;
- the picture is of the page: every main-frame navigation passes the route, so one after the
  page's own load (a meta refresh, `location.href =`, a form that submits itself) is
  render.navigated_away, whether or not it got anywhere; and a main frame showing Chromium's
  error page, or any document not of the page's origin (about:blank, blob:), is
  render.error_page: a screenshot of it would be a training sample of the browser's own UI;
- JavaScript can be turned off (static pages), V8's heap is capped at memory_mb, and
  Math.random is seeded so that the same page gives the same pixels.
"""
from __future__ import annotations

import mimetypes
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from urllib.parse import unquote, urlsplit

from renderers.base import Render, RenderError, RenderOptions, file_inside
from renderers.sandbox import Limits, allocate_uid, cgroup_name, kill_tree, processes_of, remove_memory_cgroups

CHROMIUM = "/usr/bin/chromium"
HOST = "render.invalid"  # .invalid never resolves (RFC 2606); only our route answers it
MAX_ASSET_BYTES = 16 << 20  # a page's single local file; larger ones get a 404
CONTEXT_RECYCLE = 200  # renders per context: bounds what a page can leave behind (caches, leaks)
CHROMIUM_LIMITS = Limits(memory_mb=None, nproc=1024, nofile=8192, fsize=None)  # V8 reserves TBs of address space
RENDERER_GRACE_S = 0.5  # past the deadline, for Playwright's own timeout to win the race when it can
BROWSER_BASE_MB = 1024  # the browser's own processes (about 300 MB) and a page's images, beside the V8 heap
SEEDED_RANDOM = """(() => { let s = 0x2545F491; Math.random = () => { s = (s + 0x6D2B79F5) | 0;
  let t = Math.imul(s ^ (s >>> 15), 1 | s); t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296; }; })();"""


class BrowserGone(RenderError):
    """The browser (not just the page) died; the render is tried once more on a fresh one."""

    def __init__(self, detail: str):
        super().__init__("crashed", detail)


class WebRenderer:
    name = "chromium"

    def __init__(self):
        self.playwright = None
        self.browser = None
        self.context = None
        self.page = None
        self.uid: int | None = None
        self.context_javascript: bool | None = None  # what the page was made with; memory_mb relaunches the browser
        self.memory_mb: int | None = None  # the V8 heap cap the browser was launched with
        self.renders_in_context = 0
        self.served: tuple[str, bytes, Path | None] = ("", b"", None)  # (doc path, html, resolved asset folder)
        self.scratch: str | None = None  # scratch_dir(), made (and stale ones swept) at the first launch
        self.blocked: list[str] = []
        self.navigations = 0  # main-frame navigations the route saw in this render: 1 is the page's own load

    def render(self, code: str, asset_dir: Path | None, options: RenderOptions, name: str = "index.html") -> Render:
        html = code.encode("utf-8", "surrogatepass")
        if len(html) > options.max_input_bytes:
            raise RenderError("too_large", f"{len(html)} bytes > max_input_bytes={options.max_input_bytes}")
        try:
            return self.attempt(html, asset_dir, options, name)
        except BrowserGone:  # it died between renders (or under this one): a fresh browser gets one more try
            return self.attempt(html, asset_dir, options, name)

    def attempt(self, html: bytes, asset_dir: Path | None, options: RenderOptions, name: str) -> Render:
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        page = self.ensure_page(options)
        deadline = time.monotonic() + options.timeout_s  # one budget for every step below
        watchdog = threading.Timer(options.timeout_s + RENDERER_GRACE_S, kill_renderers, (self.uid,))
        watchdog.start()
        try:
            result = self.capture(page, html, asset_dir, options, name, deadline)
        except PlaywrightTimeout:
            self.abandon_page()
            raise RenderError("timeout", f"page not loaded and captured within {options.timeout_s:g}s") from None
        except PlaywrightError as err:
            message = str(err).splitlines()[0][:300]
            if "has been closed" in message or not self.browser or not self.browser.is_connected():
                self.stop_browser()
                raise BrowserGone(message) from None
            self.abandon_page()  # the page crashed (out of memory, a renderer bug, the watchdog): the browser is fine
            if self.navigations > 1:
                raise RenderError("navigated_away", f"the page left itself during the render: {message}") from None
            if watchdog.finished.is_set() and time.monotonic() > deadline:
                raise RenderError("timeout", f"page not captured within {options.timeout_s:g}s") from None
            raise RenderError("crashed", message) from None
        finally:
            watchdog.cancel()
            watchdog.join()  # one that fired has finished killing before the next page's renderer starts
        self.check_still_the_page(page)
        return result

    def capture(self, page, html: bytes, asset_dir: Path | None, options: RenderOptions, name: str,
                deadline: float) -> Render:
        root = asset_dir.resolve() if asset_dir is not None else None  # once per render, not per request
        self.served, self.blocked, self.navigations = ("/" + name.lstrip("/"), html, root), [], 0
        self.renders_in_context += 1
        page.set_viewport_size(dict(zip(("width", "height"), options.viewports[0])))
        page.goto(self.page_url(), wait_until="load", timeout=remaining_ms(deadline))
        images, sizes = [], []
        for index, (width, height) in enumerate(options.viewports):
            if index:  # the page loaded at the first size
                page.set_viewport_size({"width": width, "height": height})
            images.append(self.screenshot(page, width, height, options, remaining_ms(deadline)))
            sizes.append(png_size(images[-1]))
        meta = {"renderer": self.name, "version": self.browser.version, "sizes": sizes,
                "options": {"viewports": [list(v) for v in options.viewports], "full_page": options.full_page,
                            "javascript": options.javascript, "background": options.background}}
        if self.blocked:
            meta["blocked_requests"] = self.blocked[:20]
        return Render(images, meta)

    def page_url(self) -> str:
        return f"http://{HOST}{self.served[0]}"

    def check_still_the_page(self, page) -> None:
        """The main frame must still hold the document we served: no navigation after its load,
        and not Chromium's error page or another origin's document (about:blank, blob:)."""
        if self.navigations > 1:
            self.abandon_page()  # it may still be loading whatever it went to
            raise RenderError("navigated_away", f"{self.navigations - 1} navigation(s) after the page loaded; "
                              f"blocked: {', '.join(self.blocked[:3])}")
        current = urlsplit(page.url)
        if (current.scheme, current.netloc) != ("http", HOST):
            self.abandon_page()
            raise RenderError("error_page", f"the main frame shows {page.url[:200]}, not the page")

    def screenshot(self, page, width: int, height: int, options: RenderOptions, timeout_ms: float) -> bytes:
        shot = {"animations": "disabled", "caret": "hide", "timeout": timeout_ms, "type": "png",
                "omit_background": options.background == "transparent"}
        if not options.full_page:
            return page.screenshot(**shot)
        full_height = page.evaluate("Math.max(document.documentElement.scrollHeight, document.body ? "
                                    "document.body.scrollHeight : 0)")
        clip_height = max(height, min(int(full_height or height), options.max_height))
        return page.screenshot(full_page=True, clip={"x": 0, "y": 0, "width": width, "height": clip_height}, **shot)

    # ---- the route: the page and its own folder, nothing else ----------------------------

    def handle_route(self, route) -> None:
        if route.request.is_navigation_request() and route.request.frame.parent_frame is None:
            self.navigations += 1
        url = urlsplit(route.request.url)
        body = self.serve(unquote(url.path)) if url.scheme == "http" and url.hostname == HOST else None
        if body is None:
            self.blocked.append(route.request.url[:200])
            route.abort("blockedbyclient")
            return
        content_type = "text/html; charset=utf-8" if url.path == self.served[0] else guess_type(url.path)
        route.fulfill(status=200, body=body, headers={"content-type": content_type})

    def serve(self, path: str) -> bytes | None:
        doc_path, html, root = self.served
        if path == doc_path:
            return html
        found = file_inside(root, path.lstrip("/")) if root is not None else None
        if found is not None and found.stat().st_size <= MAX_ASSET_BYTES:
            return found.read_bytes()
        return None

    # ---- warm resources and their replacement -------------------------------------------

    def ensure_page(self, options: RenderOptions):
        if self.browser is None or not self.browser.is_connected() or options.memory_mb != self.memory_mb:
            self.restart_browser(options)  # which also drops the context and page
        if self.page is None or self.page.is_closed() or options.javascript != self.context_javascript or \
                self.renders_in_context >= CONTEXT_RECYCLE:
            self.reset_context()
            self.context = self.browser.new_context(
                offline=True, java_script_enabled=options.javascript, service_workers="block",
                reduced_motion="reduce", accept_downloads=False, device_scale_factor=1,
                viewport=dict(zip(("width", "height"), options.viewports[0])))
            self.context.add_init_script(SEEDED_RANDOM)
            self.context.route("**/*", self.handle_route)
            self.page = self.context.new_page()
            self.context_javascript, self.renders_in_context = options.javascript, 0
        return self.page

    def restart_browser(self, options: RenderOptions) -> None:
        self.stop_browser()
        if self.scratch is None:  # the first launch (or the first after close) sweeps what killed actors left
            remove_memory_cgroups()  # those of browsers whose actor was killed before its clean-up
            self.scratch = scratch_dir()
        self.playwright = self.playwright or start_playwright(self.scratch)
        self.uid = allocate_uid()
        launcher_dir = tempfile.mkdtemp(prefix="chromium-", dir=self.scratch)
        limits = replace(CHROMIUM_LIMITS, cgroup_memory_mb=options.memory_mb + BROWSER_BASE_MB)
        try:
            self.browser = self.launch(write_launcher(launcher_dir, self.uid, limits), options)
        finally:
            shutil.rmtree(launcher_dir, ignore_errors=True)  # the browser runs; nothing to leave in /tmp
        self.memory_mb = options.memory_mb

    def launch(self, launcher: str, options: RenderOptions):
        return self.playwright.chromium.launch(
            executable_path=launcher, headless=True,
            args=["--no-sandbox", "--host-resolver-rules=MAP * ~NOTFOUND", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--font-render-hinting=none",
                  "--disable-dev-shm-usage", f"--js-flags=--max-old-space-size={options.memory_mb}"])

    def abandon_page(self) -> None:
        """Drop a page that overran or went astray: its renderer killed first (closing a context
        whose renderer spins in JavaScript waits for it), then the context."""
        kill_renderers(self.uid)
        self.reset_context()

    def reset_context(self) -> None:
        context, self.context, self.page = self.context, None, None
        if context is not None:
            try:
                context.close()
            except Exception:  # noqa: BLE001 - a context that cannot close means a sick browser: replace it
                self.stop_browser()

    def stop_browser(self) -> None:
        browser, self.browser, self.context, self.page = self.browser, None, None, None
        if browser is not None:
            try:
                browser.close()
            except Exception:  # noqa: BLE001 - already dead; the uid sweep below finishes the job
                pass
        if self.uid is not None:
            kill_tree(None, self.uid)
            remove_memory_cgroups(cgroup_name(self.uid))

    def close(self) -> None:
        self.stop_browser()
        if self.playwright is not None:
            self.playwright.stop()
            self.playwright = None
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None


def remaining_ms(deadline: float) -> float:
    """What is left of the render's budget, for a Playwright timeout (0 would mean no timeout)."""
    return max(1.0, (deadline - time.monotonic()) * 1000)


def kill_renderers(uid: int | None) -> None:
    """SIGKILL the renderer processes (the pages) of the browser running as `uid`; the browser
    process lives on and reports the page as crashed. Without root (no uid) there is nothing to
    tell this browser's renderers from others': Playwright's timeouts alone apply."""
    if uid is None:
        return
    for pid in processes_of(uid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if b"--type=renderer" in cmdline.read():
                    os.kill(pid, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass  # exited meanwhile


def scratch_dir() -> str:
    """This process's temporary folder, which Playwright's driver also uses for browser profiles.

    Ray kills a finished actor without running its clean-up, which would leave a profile (~1.3
    MB) per browser in /tmp; so each renderer first removes the folders of processes gone."""
    root = Path(tempfile.gettempdir())
    for folder in root.glob("datapipe-web-*"):
        pid = folder.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)
    mine = root / f"datapipe-web-{os.getpid()}"
    mine.mkdir(mode=0o711, exist_ok=True)  # Chromium, under its own uid, must reach its profile inside
    return str(mine)


def start_playwright(scratch: str):
    """Playwright's driver, with its temporary files (profiles, artifacts) in `scratch` (scratch_dir())."""
    from playwright.sync_api import sync_playwright

    saved = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = scratch
    try:
        return sync_playwright().start()
    finally:
        os.environ.pop("TMPDIR") if saved is None else os.environ.update(TMPDIR=saved)


def write_launcher(folder: str, uid: int | None, limits: Limits = CHROMIUM_LIMITS) -> str:
    """A script Playwright runs as "the browser": Chromium confined by renderers.sandbox."""
    import renderers

    package_root = str(Path(renderers.__file__).resolve().parent.parent)
    path = Path(folder) / "chromium"
    path.write_text(f"#!/bin/sh\nPYTHONPATH='{package_root}' exec '{sys.executable}' -m renderers.sandbox exec "
                    f"'{limits.to_json()}' '{'' if uid is None else uid}' -- {CHROMIUM} \"$@\"\n")
    path.chmod(0o700)
    return str(path)


def guess_type(path: str) -> str:
    return mimetypes.guess_type(path)[0] or "application/octet-stream"


def png_size(png: bytes) -> list[int]:
    return [int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")]
