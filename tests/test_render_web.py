"""The webpage renderer with real Chromium: pixels, isolation (no network, no files outside the
page's folder), a JS time budget, and crashes that cost one reject while the browser lives on."""
import http.server
import io
import os
import signal
import threading
import time

import numpy as np
import pytest
from PIL import Image

from renderers.base import RenderError, RenderOptions
from renderers.sandbox import cgroup_name, memory_cgroup_root, memory_cgroups_work, processes_of
from renderers.web import WebRenderer
from tests.conftest import rgb

OPTIONS = RenderOptions(viewports=[(320, 200)], timeout_s=5)
RED_BOX = '<html><body style="margin:0;background:#fff"><div style="width:100px;height:50px;background:#f00"></div></body></html>'


@pytest.fixture(scope="module")
def web():
    renderer = WebRenderer()
    yield renderer
    renderer.close()


def red_pixels(png: bytes) -> int:
    pixels = rgb(png).astype(int)
    return int(((pixels[..., 0] > 200) & (pixels[..., 1] < 60) & (pixels[..., 2] < 60)).sum())


def reject_reason(web, html: str, asset_dir=None, options=OPTIONS) -> str:
    with pytest.raises(RenderError) as caught:
        web.render(html, asset_dir, options)
    return caught.value.reason


def test_a_red_box_is_red_where_it_should_be(web):
    result = web.render(RED_BOX, None, OPTIONS)
    pixels = rgb(result.images[0])
    assert pixels.shape == (200, 320, 3)
    assert (pixels[5:45, 5:95] == [255, 0, 0]).all() and (pixels[100:190, 150:310] == [255, 255, 255]).all()
    assert result.meta["renderer"] == "chromium" and result.meta["sizes"] == [[320, 200]]


def test_several_viewports_and_full_page(web):
    tall = '<html><body style="margin:0"><div style="height:3000px;background:linear-gradient(#f00,#00f)"></div></body></html>'
    options = RenderOptions(viewports=[(320, 200), (200, 400)], full_page=True, max_height=1000, timeout_s=5)
    result = web.render(tall, None, options)
    assert result.meta["sizes"] == [[320, 1000], [200, 1000]]  # the whole page, capped at max_height
    for png in result.images:  # the top 1000 px of the 3000-px gradient, far below either viewport
        pixels = rgb(png).astype(int)
        for y in (5, 500, 990):
            blue = round(255 * (y + 0.5) / 3000)
            assert np.abs(pixels[y, 10] - [255 - blue, 0, blue]).max() <= 3, (y, pixels[y, 10])


def test_local_assets_in_the_page_folder_are_served(web, tmp_path):
    (tmp_path / "css").mkdir()
    (tmp_path / "css" / "site.css").write_text("body { background: #0000ff; margin: 0 }")
    result = web.render('<html><head><link rel="stylesheet" href="css/site.css"></head><body></body></html>',
                        tmp_path, OPTIONS)
    assert (rgb(result.images[0])[50, 50] == [0, 0, 255]).all()


def test_files_outside_the_page_folder_are_never_shown(web, tmp_path):
    folder = tmp_path / "site"
    folder.mkdir()
    red = io.BytesIO()
    Image.new("RGB", (200, 200), (255, 0, 0)).save(red, "PNG")
    (tmp_path / "secret.png").write_bytes(red.getvalue())
    (folder / "link.png").symlink_to(tmp_path / "secret.png")
    page = (f'<html><body style="margin:0"><img src="file://{tmp_path}/secret.png"><img src="../secret.png">'
            f'<img src="link.png"><iframe src="file://{tmp_path}/secret.png"></iframe>'
            f'<object data="file://{tmp_path}/secret.png"></object></body></html>')
    result = web.render(page, folder, OPTIONS)
    assert red_pixels(result.images[0]) == 0
    assert any("link.png" in url for url in result.meta["blocked_requests"])


def test_no_request_leaves_the_machine_even_to_a_local_server(web):
    hits = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        do_POST = do_GET

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_port}"
    page = (f'<html><body><img src="{base}/img"><link rel="stylesheet" href="{base}/css"><script>'
            f'fetch("{base}/fetch").catch(() => 0); navigator.sendBeacon("{base}/beacon", "x");'
            f'try {{ new WebSocket("ws://127.0.0.1:{server.server_port}/ws"); }} catch (e) {{}}'
            f'</script><iframe src="http://localhost:{server.server_port}/frame"></iframe></body></html>')
    try:
        result = web.render(page, None, OPTIONS)
        web.render(RED_BOX, None, OPTIONS)  # time for late requests to land, had any escaped
    finally:
        server.shutdown()
        thread.join()
        server.server_close()
    assert hits == []
    tried = {url.rsplit("/", 1)[-1] for url in result.meta["blocked_requests"]}
    assert tried >= {"img", "css", "fetch", "beacon", "frame"}  # the page did ask: the route refused each


def test_an_infinite_loop_ends_as_a_timeout_and_the_browser_stays_healthy(web):
    web.render(RED_BOX, None, OPTIONS)
    browser = web.browser
    assert reject_reason(web, "<html><body><script>while (true) {}</script></body></html>",
                         options=RenderOptions(viewports=[(320, 200)], timeout_s=2)) == "timeout"
    assert web.browser is browser and browser.is_connected()
    assert red_pixels(web.render(RED_BOX, None, OPTIONS).images[0]) == 100 * 50


def test_javascript_off_renders_the_static_markup(web):
    page = '<html><body style="margin:0;background:#fff"><script>document.body.style.background = "#f00"</script></body></html>'
    assert red_pixels(web.render(page, None, OPTIONS).images[0]) == 320 * 200
    static = RenderOptions(viewports=[(320, 200)], javascript=False, timeout_s=5)
    assert red_pixels(web.render(page, None, static).images[0]) == 0


def test_a_page_that_crashes_its_renderer_costs_one_reject(web):
    bomb = "<html><body><script>let a = []; while (true) a.push(new Array(1e6).fill(1.5));</script></body></html>"
    options = RenderOptions(viewports=[(320, 200)], timeout_s=30, memory_mb=128)
    assert reject_reason(web, bomb, options=options) == "crashed"  # the V8 heap cap, long before timeout_s
    assert red_pixels(web.render(RED_BOX, None, options).images[0]) == 100 * 50


@pytest.mark.skipif(not memory_cgroups_work(), reason="needs root and a writable /sys/fs/cgroup (the memory cap "
                    "is left out elsewhere); without the cap this page would take 2.5 GB")
def test_memory_outside_the_v8_heap_is_capped_by_the_browser_cgroup(web):
    """Typed arrays live outside V8's heap, so --max-old-space-size does not stop them; the browser's
    memory cgroup (memory_mb + BROWSER_BASE_MB = 1152 MB here) does, long before 2.5 GB."""
    hog = ("<html><body><script>const keep = []; for (let i = 0; i < 80; i++) "
           "{ const a = new Uint8Array(32 << 20); a.fill(7); keep.push(a); }</script></body></html>")
    options = RenderOptions(viewports=[(320, 200)], timeout_s=60, memory_mb=128)
    assert reject_reason(web, hog, options=options) == "crashed"
    cgroup = memory_cgroup_root()[0] / cgroup_name(web.uid)
    events = (cgroup / "memory.events").read_text() if (cgroup / "memory.events").exists() else \
        (cgroup / "memory.oom_control").read_text()
    assert int(events.split("oom_kill ")[1].split()[0]) >= 1  # the kernel's OOM killer acted inside the cgroup
    assert red_pixels(web.render(RED_BOX, None, options).images[0]) == 100 * 50
    web.stop_browser()
    assert not cgroup.exists()  # removed with its browser


@pytest.mark.skipif(os.geteuid() != 0, reason="Chromium runs under a uid of its own only when started as root")
def test_a_killed_browser_is_replaced_and_leaves_nothing_behind(web):
    web.render(RED_BOX, None, OPTIONS)
    uid = web.uid
    for pid in processes_of(uid):
        os.kill(pid, signal.SIGKILL)  # only Chromium's processes: the uid is this renderer's alone
    assert red_pixels(web.render(RED_BOX, None, OPTIONS).images[0]) == 100 * 50
    assert web.uid != uid and processes_of(uid) == []
    web.close()
    assert processes_of(web.uid) == []


def test_same_page_same_pixels(web):
    page = '<html><body><script>document.write(Math.random())</script><p style="font:20px serif">Ag</p></body></html>'
    first, second = (web.render(page, None, OPTIONS).images[0] for _ in range(2))
    assert first == second  # Math.random is seeded; fonts are the machine's own


SPIN_BEFORE_AND_AFTER_LOAD = """<html><body><p>x</p><script>
const start = Date.now(); while (Date.now() - start < 3000) {}
addEventListener("load", () => setTimeout(() => { while (true) {} }, 0));
</script></body></html>"""


def test_one_time_budget_covers_the_whole_render(web):
    """Navigation and screenshot each had all of timeout_s: 3 s to load, then 4 s waiting for a
    frame, then the clean-up (issue: 10-12 s with timeout_s=5). A full-page capture's height query
    has no timeout of its own and waited forever; the watchdog ends it."""
    for full_page in (False, True):
        options = RenderOptions(viewports=[(320, 200)], timeout_s=4, full_page=full_page)
        start = time.monotonic()
        assert reject_reason(web, SPIN_BEFORE_AND_AFTER_LOAD, options=options) == "timeout"
        assert time.monotonic() - start < options.timeout_s + 2  # loose: the grace and the kill, on a busy machine
    assert red_pixels(web.render(RED_BOX, None, OPTIONS).images[0]) == 100 * 50


@pytest.mark.parametrize("page, reason", [
    ('<meta http-equiv="refresh" content="0;url=http://example.com/">hi', "navigated_away"),
    ('<form id="f" action="http://example.com/post" method="post"></form><script>f.submit()</script>', "navigated_away"),
    # no request, another document all the same; on a loaded machine the navigation may be seen first
    ('<script>location.href = "about:blank"</script>hi', ("error_page", "navigated_away")),
])
def test_a_page_that_navigates_away_is_rejected_not_screenshotted(web, page, reason):
    """Before: a screenshot of Chromium's error page (or of a blank document), kept as a sample. (A
    timer that navigates after load races the screenshot, so no such case here: which one wins
    depends on the machine's load.)"""
    assert reject_reason(web, f"<html><body>{page}</body></html>") in (reason if isinstance(reason, tuple) else (reason,))
    assert red_pixels(web.render(RED_BOX, None, OPTIONS).images[0]) == 100 * 50


def test_history_and_fragments_stay_on_the_page(web):
    page = '<html><body style="margin:0;background:#f00"><script>history.pushState({}, "", "/app/home"); ' \
           'location.hash = "#top"</script></body></html>'
    assert red_pixels(web.render(page, None, OPTIONS).images[0]) == 320 * 200


def admin_template(root) -> None:
    """A template laid out as admin themes are: pages/ beside css/ and img/, linked with ../."""
    (root / "css").mkdir(parents=True)
    (root / "css" / "site.css").write_text("body { margin: 0; background: #0000ff } img { display: block }")
    (root / "img").mkdir()
    red = io.BytesIO()
    Image.new("RGB", (100, 50), (255, 0, 0)).save(red, "PNG")
    (root / "img" / "logo.png").write_bytes(red.getvalue())
    (root / "pages" / "admin").mkdir(parents=True)
    (root / "pages" / "admin" / "index.html").write_text(
        '<html><head><link rel="stylesheet" href="../../css/site.css"></head>'
        '<body><img src="../../img/logo.png"></body></html>')


def test_assets_beside_the_page_are_served_from_the_declared_root(web, tmp_path):
    """Before: ../ resolved inside the page's own folder, so the page rendered unstyled."""
    from datapipe.readers.files import read_files
    from renderers.gates import GateConfig
    from renderers.stage import render_document
    from tests.test_render_stages import files_source

    admin_template(tmp_path / "site")
    page = tmp_path / "site" / "pages" / "admin" / "index.html"
    doc = next(read_files(files_source(asset_root=str(tmp_path / "site")), str(page)))
    assert doc["asset_dir"] == str(tmp_path / "site") and doc["meta"]["page_path"] == "pages/admin/index.html"
    render_document(doc, web, OPTIONS, GateConfig())
    pixels = rgb(doc["media"][0])
    assert (pixels[10:40, 10:90] == [255, 0, 0]).all() and (pixels[100:190, 150:310] == [0, 0, 255]).all()
    own_folder = next(read_files(files_source(), str(page)))  # no asset_root: as before, the page's own folder
    assert own_folder["asset_dir"] == str(page.parent) and "page_path" not in own_folder["meta"]


def test_the_served_root_never_climbs_above_the_declared_one(tmp_path):
    from datapipe.readers.files import read_files
    from tests.test_render_stages import files_source

    admin_template(tmp_path / "site")
    page = tmp_path / "site" / "pages" / "admin" / "deep.html"
    page.write_text('<img src="../../../../../../etc/hostname"><a href="../index.html">up</a>')
    doc = next(read_files(files_source(asset_root=str(tmp_path / "site")), str(page)))
    assert doc["asset_dir"] == str(tmp_path / "site")  # six levels asked, two granted
    page.write_text('<link href="../x.css" rel="stylesheet">')  # one level: the nearest folder that holds it
    doc = next(read_files(files_source(asset_root=str(tmp_path / "site")), str(page)))
    assert doc["asset_dir"] == str(tmp_path / "site" / "pages") and doc["meta"]["page_path"] == "admin/deep.html"
    outside = tmp_path / "elsewhere.html"
    outside.write_text('<link href="../x.css">')
    assert next(read_files(files_source(asset_root=str(tmp_path / "site")), str(outside)))["asset_dir"] == str(tmp_path)
