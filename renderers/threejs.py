"""three.js scenes: the program in a page, `three` from the venv, rendered by the web renderer.

`make install` runs `python -m renderers.threejs`, which fetches the `three` npm package
(0.170.0, sha256-pinned) from registry.npmjs.org and keeps build/three.module.js (1.2 MB,
standalone) and its licence in the venv; a render never touches the network (the browser is
offline anyway). The page maps the bare specifier "three" to that module with an import map
(a data: URL, so the web renderer's route needs nothing new) and runs the program as a module
script. The program makes its own WebGLRenderer, scene and camera and appends the canvas, as
three.js examples do; Chromium draws it with SwiftShader (software WebGL) at size x size.
"""
from __future__ import annotations

import base64
import io
import sys
import tarfile
from functools import lru_cache
from pathlib import Path

from renderers.base import Render, RenderError, RenderOptions

PACKAGE_URL = "https://registry.npmjs.org/three/-/three-0.170.0.tgz"
PACKAGE_SHA256 = "4a608a355dcaba72e0e5383cdc814303f5b6060b43c238cdf6932dceb699238d"
INSTALLED = Path(sys.prefix) / "share" / "datapipe" / "three"
MODULE = "three.module.js"
PAGE = """<!doctype html><html><head><meta charset="utf-8">
<style>html, body {{ margin: 0; background: {background}; overflow: hidden }} canvas {{ display: block }}</style>
<script type="importmap">{{"imports": {{"three": "data:text/javascript;base64,{three}"}}}}</script>
</head><body><script type="module">
{code}
</script></body></html>"""


@lru_cache(maxsize=1)
def three_base64(folder: Path = INSTALLED) -> str:
    path = folder / MODULE
    if not path.is_file():
        raise RenderError("crashed", f"three.js is not installed ({path}): run `python -m renderers.threejs` "
                                     "(make install does)")
    return base64.b64encode(path.read_bytes()).decode("ascii")


def page(code: str, background: str) -> str:
    """The program as a module script; `</script` inside it would end the element early, so it is escaped."""
    return PAGE.format(background=background, three=three_base64(), code=code.replace("</script", "<\\/script"))


def render_threejs(web, code: str, asset_dir: Path | None, options: RenderOptions, language: tuple[str, str]
                   ) -> Render:
    square = options.model_copy(update={"viewports": [(options.size, options.size)], "full_page": False,
                                        "javascript": True})
    result = web.render(page(code, options.background), asset_dir, square, name="scene.html")
    result.meta.update(language=language, three=PACKAGE_URL.rsplit("-", 1)[-1].removesuffix(".tgz"))
    return Render(result.images, result.meta)


def install(folder: Path = INSTALLED) -> Path:
    """Fetch the `three` npm package, check its sha256, keep the module build and the licence."""
    from datapipe.storage import fetch_pinned

    data = fetch_pinned(PACKAGE_URL, PACKAGE_SHA256, f"put build/{MODULE} of three 0.170.0 in {folder} by hand, "
                        "or render no three.js scenes")
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        for member, target in (("package/build/three.module.js", MODULE), ("package/LICENSE", "LICENSE")):
            (folder / target).write_bytes(archive.extractfile(member).read())
    return folder


if __name__ == "__main__":
    if (INSTALLED / MODULE).is_file() and "--force" not in sys.argv:
        print(f"three.js already in {INSTALLED}")
    else:
        print(f"three.js written to {install()}")
