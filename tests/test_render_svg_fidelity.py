"""SVG renders that match what a browser draws (issue 20): text in any font-family through
fontconfig-style fallback, blend modes over a background composited afterwards, deep but
finite <use> chains."""
import io

import numpy as np
import pytest
from PIL import Image

from renderers.base import RenderError, RenderOptions
from renderers.svg import SvgRenderer, under_background
from renderers.svg_fonts import resolve_families, with_font_fallbacks
from tests.conftest import rgb

SVG = 'xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink"'
INSTALLED = {"Noto Sans", "DejaVu Sans", "DejaVu Serif", "Liberation Sans", "Liberation Mono"}


@pytest.fixture(scope="module")
def renderer():
    svg = SvgRenderer()
    yield svg
    svg.close()


def ink(png: bytes) -> int:
    """Pixels darker than mid-grey: the glyphs, on the white background."""
    return int((rgb(png).astype(int).sum(axis=2) < 384).sum())


def text_svg(family_markup: str, text: str = "Hello") -> str:
    return f'<svg {SVG} width="200" height="50"><text x="5" y="38" font-size="32" {family_markup}>{text}</text></svg>'


@pytest.mark.parametrize("family_markup", [
    'font-family="sans-serif"', 'font-family="serif"', 'font-family="monospace"', 'font-family="cursive"',
    'font-family="Arial"', 'font-family="Helvetica"', "font-family=\"'Times New Roman', Times\"",
    'font-family="Courier New"', 'font-family="Some Font Nobody Installed"', "style=\"font-family: Arial; fill: #000\"",
])
def test_text_is_drawn_whatever_family_it_names(renderer, family_markup):
    """resvg drew nothing unless the family was installed under exactly that name."""
    assert ink(renderer.render(text_svg(family_markup), None, RenderOptions(size=200)).images[0]) > 300


def test_text_in_a_style_sheet_and_in_cjk_is_drawn(renderer):
    sheet = f'<svg {SVG} width="200" height="50"><style><![CDATA[ .t {{ font-family: Helvetica, sans-serif }} ]]>' \
            '</style><text class="t" x="5" y="38" font-size="32">文字 نص</text></svg>'
    assert ink(renderer.render(sheet, None, RenderOptions(size=200)).images[0]) > 300


def test_an_installed_family_still_wins(renderer):
    """The fallbacks come after the document's own names: DejaVu Serif stays DejaVu Serif."""
    named = renderer.render(text_svg('font-family="DejaVu Serif"'), None, RenderOptions(size=200)).images[0]
    listed = renderer.render(text_svg('font-family="DejaVu Serif, serif"'), None, RenderOptions(size=200)).images[0]
    sans = renderer.render(text_svg('font-family="DejaVu Sans"'), None, RenderOptions(size=200)).images[0]
    assert (rgb(named) == rgb(listed)).all() and not (rgb(named) == rgb(sans)).all()


def test_family_lists_gain_fontconfig_fallbacks():
    assert resolve_families("Arial", INSTALLED) == "Arial, 'Liberation Sans', 'Noto Sans', 'DejaVu Sans'"
    assert resolve_families("'Times', serif !important", INSTALLED) == "'Times', serif, 'DejaVu Serif' !important"
    assert resolve_families("inherit", INSTALLED) == "inherit"  # a keyword, not a family
    markup = ("<svg a='1' font-family='Arial'><!-- <x style='font-family:y'> --><style>t { font-family: serif; }"
              "</style><text style=\"fill:red;font-family:monospace\">font-family: x</text></svg>")
    rewritten = with_font_fallbacks(markup, INSTALLED)
    assert "font-family='Arial, Liberation Sans, Noto Sans, DejaVu Sans'" in rewritten  # no quote of the attribute's kind
    assert "t { font-family: serif, 'DejaVu Serif'; }" in rewritten
    assert "font-family:monospace, 'Liberation Mono'\"" in rewritten
    assert rewritten.endswith(">font-family: x</text></svg>")  # text content is not CSS


def test_a_recipe_font_folder_is_loaded(renderer, tmp_path):
    """A font only in font_dirs, under a family name no system font has, draws as itself."""
    ttLib = pytest.importorskip("fontTools.ttLib")
    font = ttLib.TTFont("/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf")
    for record in font["name"].names:
        if record.nameID in (1, 4, 16):
            record.string = "Datapipe Test Mono"
    font.save(tmp_path / "test-mono.ttf")
    options = RenderOptions(size=200, font_dirs=[str(tmp_path)])
    mine = renderer.render(text_svg('font-family="Datapipe Test Mono"'), None, options).images[0]
    system = renderer.render(text_svg('font-family="DejaVu Sans Mono"'), None, RenderOptions(size=200)).images[0]
    assert (rgb(mine) == rgb(system)).all()
    with pytest.raises(ValueError, match="font_dirs"):
        RenderOptions(font_dirs=[str(tmp_path / "absent")])


@pytest.mark.parametrize("backend", ["resvg", "cairosvg"])
def test_blend_modes_blend_with_the_drawing_not_the_background(renderer, backend):
    """difference with blue over the white background would be yellow; Chromium draws the
    SVG on nothing, so blue over nothing stays blue, and is then laid on white."""
    svg = (f'<svg {SVG} width="20" height="10"><rect width="10" height="10" fill="blue" style="mix-blend-mode:difference"/>'
           '<g style="isolation:isolate"><rect x="10" width="10" height="10" fill="red"/>'
           '<rect x="10" width="10" height="10" fill="white" style="mix-blend-mode:multiply"/></g></svg>')
    pixels = rgb(renderer.render(svg, None, RenderOptions(size=20, svg_backend=backend)).images[0])
    assert (pixels[5, 5] == [0, 0, 255]).all()
    if backend == "resvg":  # cairosvg ignores blend modes: red under white stays white
        assert (pixels[5, 15] == [255, 0, 0]).all()


def test_drawing_on_the_background_equals_compositing_afterwards(renderer):
    """The fast path (no blend mode: the background filled first) against the reference."""
    svg = (f'<svg {SVG} width="40" height="40"><circle cx="20" cy="20" r="15" fill="teal" opacity="0.5"/>'
           '<rect x="5" y="5" width="20" height="20" fill="orange" fill-opacity="0.3"/></svg>')
    filled = renderer.render(svg, None, RenderOptions(size=40, background="#336699")).images[0]
    bare = renderer.render(svg, None, RenderOptions(size=40, background="transparent")).images[0]
    reference = under_background(bare, (0x33, 0x66, 0x99, 255))
    assert np.abs(rgb(filled).astype(int) - rgb(reference).astype(int)).max() <= 1  # rounding only


def use_chain(length: int) -> str:
    """A group using a group using ... a rect, `length` deep, the deepest defined first (so a
    depth-first count descends the whole chain at once): finite, and drawn by browsers."""
    groups = "".join(f'<g id="u{i}"><use xlink:href="#u{i - 1}"/></g>' for i in range(length - 1, 0, -1))
    return (f'<svg {SVG} width="10" height="10"><defs>{groups}<rect id="u0" width="10" height="10" fill="#f00"/>'
            f'</defs><use xlink:href="#u{length - 1}"/></svg>')


def test_a_deep_but_finite_use_chain_is_drawn(renderer):
    result = renderer.render(use_chain(340), None, RenderOptions(size=20))  # was render.too_large (RecursionError)
    assert (rgb(result.images[0]) == [255, 0, 0]).all()
    with pytest.raises(RenderError) as caught:  # past resvg's own node limit (about 350 here): too large, not invalid
        renderer.render(use_chain(600), None, RenderOptions(size=20))
    assert caught.value.reason == "too_large"


@pytest.mark.parametrize("cycle", [
    '<g id="a"><rect width="5" height="5"/><use xlink:href="#a"/></g>',  # a use inside what it draws
    '<use id="a" xlink:href="#b"/><use id="b" xlink:href="#a"/>',  # two uses drawing each other
])
def test_a_use_cycle_is_rejected(renderer, cycle):
    with pytest.raises(RenderError) as caught:
        renderer.render(f'<svg {SVG} width="10" height="10">{cycle}</svg>', None, RenderOptions(size=20))
    assert caught.value.reason == "invalid" and "<use> cycle" in caught.value.detail


def test_transparent_blend_render_keeps_its_alpha(renderer):
    svg = f'<svg {SVG} width="16" height="16"><rect width="8" height="16" fill="blue" style="mix-blend-mode:screen"/></svg>'
    png = renderer.render(svg, None, RenderOptions(size=16, background="transparent")).images[0]
    with Image.open(io.BytesIO(png)) as image:
        alpha = np.asarray(image.convert("RGBA"))[..., 3]
    assert alpha[8, 4] == 255 and alpha[8, 12] == 0
