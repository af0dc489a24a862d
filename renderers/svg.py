"""SVG to PNG: resvg (default) or cairosvg, always in a sandboxed worker process.

Measured on ../shared/data/svg/ (bench/render_svg.py, README): resvg renders about 2.2x as
many files per CPU-second as cairosvg at the same output size and agrees with Chromium on more
files, so it is the default; `backend: cairosvg` stays available as the named baseline.

The parent (a Ray actor) runs the hostile-input checks (svg_safety) and gives the worker only
markup that passed them, local files inlined, so the worker opens no file; the worker keeps the backend and its font database warm across
renders (the system fonts and the folders in `font_dirs`, loaded before it drops privileges).
In the worker, every font-family list gets fontconfig-style fallbacks (svg_fonts). Output: the
longer side is `size` px, the aspect ratio kept, the background laid under the drawing unless
"transparent". The background is composited *after* the render, as a browser composites an
<img>: drawn first, it is the backdrop that mix-blend-mode blends with (7 of 22 blend and
isolation cases matched Chromium). Without a blend mode the two orders give the same pixels, so
only markup that names one pays the extra PNG decode and encode.
"""
from __future__ import annotations

import io
import json
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from renderers.base import Render, RenderError, RenderOptions
from renderers.sandbox import Limits, Sandbox
from renderers.svg_fonts import with_font_fallbacks
from renderers.svg_safety import check_svg

NO_ASSETS = "/nonexistent-datapipe-assets"  # resvg wants a resources folder; this one resolves nothing
WORKER_NPROC = 16  # resvg and cairo are single-threaded; Python adds a few threads
FONT_DIRS_ENV = "DATAPIPE_FONT_DIRS"  # a JSON list of folders the worker loads fonts from, while trusted
FONT_SUFFIXES = (".ttf", ".otf", ".ttc", ".otc")
BLEND_MODE = re.compile(r"mix-blend-mode", re.IGNORECASE)  # the only thing that reads the backdrop


class SvgRenderer:
    """One sandboxed worker; Ray gives each actor its own, so actors render in parallel."""

    name = "svg"

    def __init__(self):
        self.sandbox = Sandbox("renderers.svg:render_request", Limits(memory_mb=1024, nproc=WORKER_NPROC))
        self.sandbox.env = {FONT_DIRS_ENV: "[]"}

    def render(self, code: str, asset_dir: Path | None, options: RenderOptions) -> Render:
        checked = check_svg(code, asset_dir, options)
        self.configure_worker(options)
        header = {"backend": options.svg_backend, "size": options.size, "background": rgba(options.background)}
        reply, png = self.sandbox.call(header, checked.markup.encode("utf-8", "surrogatepass"), options.timeout_s)
        meta = {"renderer": options.svg_backend, "version": reply["version"], "sizes": [reply["size"]],
                "options": {"size": options.size, "background": options.background,
                                                     "external_refs": options.external_refs}}
        if checked.stripped:
            meta["stripped_refs"] = checked.stripped
        if checked.local_files:
            meta["local_files"] = list(checked.local_files)
        return Render([png], meta, checked.code)

    def configure_worker(self, options: RenderOptions) -> None:
        """The next worker starts with the new memory cap and font folders (fonts cannot be unloaded)."""
        font_dirs = json.dumps(options.font_dirs)
        if options.memory_mb != self.sandbox.limits.memory_mb or font_dirs != self.sandbox.env[FONT_DIRS_ENV]:
            self.sandbox.stop()
            self.sandbox.limits = replace(self.sandbox.limits, memory_mb=options.memory_mb)
            self.sandbox.env = {FONT_DIRS_ENV: font_dirs}

    def close(self) -> None:
        self.sandbox.stop()


def rgba(color: str) -> list[int]:
    from PIL import ImageColor

    if color == "transparent":
        return [0, 0, 0, 0]
    try:
        return list(ImageColor.getcolor(color, "RGBA"))
    except ValueError:
        raise ValueError(f"background {color!r} is not a CSS colour; use e.g. '#ffffff' or 'transparent'") from None


# ---- in the worker process ----------------------------------------------------------------

_resvg_options = None
_installed_families: set[str] = set()  # what resvg can draw with, for the font-family fallbacks


def render_request(header: dict[str, Any], markup: bytes) -> tuple[dict[str, Any], bytes]:
    """The worker's entry point: one render, in the sandbox."""
    render = render_resvg if header["backend"] == "resvg" else render_cairosvg
    text, background = markup.decode("utf-8"), tuple(header["background"])
    if background[3] and BLEND_MODE.search(text):
        png, size, version = render(text, header["size"], (0, 0, 0, 0))
        png = under_background(png, background)
    else:  # the same pixels as drawing on nothing and compositing (src-over is associative), one encode fewer
        png, size, version = render(text, header["size"], background)
    return {"size": size, "version": version}, png


def under_background(png: bytes, background: tuple) -> bytes:
    """The image composited over a background colour, as a browser lays an <img> over its page."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        flat = Image.new("RGBA", image.size, background)
        flat.alpha_composite(image.convert("RGBA"))
    out = io.BytesIO()
    flat.save(out, "PNG")
    return out.getvalue()


def fit(width: float, height: float, size: int) -> tuple[float, int, int]:
    if width <= 0 or height <= 0:
        raise RenderError("invalid", f"SVG size {width}x{height}")
    scale = size / max(width, height)
    return scale, max(1, round(width * scale)), max(1, round(height * scale))


def render_resvg(markup: str, size: int, background: tuple) -> tuple[bytes, list[int], str]:
    import resvg

    options = resvg_options()
    try:
        tree = resvg.usvg.Tree.from_str(with_font_fallbacks(markup, _installed_families), options)
    except BaseException as err:  # the binding panics (a BaseException) on a parse error; parsing holds no state
        if type(err).__name__ != "PanicException" and not isinstance(err, ValueError):
            raise
        reason = "too_large" if "NodesLimitReached" in str(err) else "invalid"  # <use> copies past resvg's limit
        raise RenderError(reason, f"resvg: {str(err).splitlines()[0][:300]}") from None
    scale, width, height = fit(*tree.int_size(), size)
    bg = {"bg_color": background} if background[3] else {}
    png = resvg.render(tree, (scale, 0, 0, 0, scale, 0), bg_size=(width, height), **bg)
    return bytes(png), [width, height], f"resvg {resvg.__version__}"


def resvg_options():
    """Built once per worker: loading the system fonts is the expensive, warm part."""
    global _resvg_options, _installed_families
    if _resvg_options is None:
        import resvg

        _resvg_options = resvg.usvg.Options.default()
        _resvg_options.load_system_fonts()
        for font in font_files(json.loads(os.environ.get(FONT_DIRS_ENV, "[]"))):  # a recipe's own fonts
            _resvg_options.load_font_data(font.read_bytes())  # read now: the folder may be closed to the worker's uid
        _resvg_options.font_family = "DejaVu Sans"  # Debian's default sans; resvg's own default is absent
        _resvg_options.resources_dir = NO_ASSETS  # local files arrive inlined as data: URIs
        _installed_families = set(_resvg_options.list_fonts())
    return _resvg_options


def font_files(folders: list[str]) -> list[Path]:
    return sorted(path for folder in folders for path in Path(folder).rglob("*")
                  if path.suffix.lower() in FONT_SUFFIXES and path.is_file())


def render_cairosvg(markup: str, size: int, background: tuple) -> tuple[bytes, list[int], str]:
    """cairosvg scales to output_width keeping the aspect ratio; a tall image is redone by height."""
    import cairosvg
    from PIL import Image

    bg = "rgba({},{},{},{})".format(*background[:3], background[3] / 255) if background[3] else None
    try:
        png = cairosvg.svg2png(bytestring=markup.encode(), output_width=size, background_color=bg)
        with Image.open(io.BytesIO(png)) as image:
            width, height = image.size
        if height > size:
            png = cairosvg.svg2png(bytestring=markup.encode(), output_height=size, background_color=bg)
            width, height = round(width * size / height), size
    except (ValueError, TypeError, ZeroDivisionError, AttributeError, IndexError, KeyError) as err:
        raise RenderError("invalid", f"cairosvg: {type(err).__name__}: {err}") from None
    return png, [width, height], f"cairosvg {cairosvg.__version__}"


PRELOADED_CODECS = ("latin-1", "cp1252", "ascii", "utf-16", "utf-8-sig", "iso8859-15")  # SVGs declare these


def preload() -> None:
    """Import everything a render needs while the worker is still trusted (see sandbox.serve):
    after the uid drop the interpreter may not be able to read its own library (here it lives
    under /root, mode 0700), so nothing may be imported lazily, codecs included."""
    import codecs

    import cairosvg  # noqa: F401
    import resvg  # noqa: F401
    from PIL import Image

    Image.init()
    resvg_options()
    for name in PRELOADED_CODECS:
        codecs.lookup(name)
