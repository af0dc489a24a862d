"""The SVG renderer with real resvg and cairosvg: pixels where they belong, hostile input rejected."""
import base64
import gzip
import io
import itertools
import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from renderers.base import RenderError, RenderOptions
from renderers.svg import SvgRenderer
from renderers.svg_safety import MAX_ENTITY_EXPANSION
from tests.conftest import rgb

SHARED_SVG = Path(__file__).resolve().parents[2] / "shared" / "data" / "svg"
SVG = 'xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink"'
RED_SQUARE = f'<svg {SVG} width="100" height="50"><rect x="0" y="0" width="50" height="50" fill="#f00"/></svg>'


@pytest.fixture(scope="module")
def renderer():
    svg = SvgRenderer()
    yield svg
    svg.close()


def reject_error(renderer, code: str, asset_dir=None, **options) -> RenderError:
    with pytest.raises(RenderError) as caught:
        renderer.render(code, asset_dir, RenderOptions(**options))
    return caught.value


def reject_reason(renderer, code: str, asset_dir=None, **options) -> str:
    return reject_error(renderer, code, asset_dir, **options).reason


@pytest.mark.parametrize("backend", ["resvg", "cairosvg"])
def test_a_red_square_is_red_where_it_should_be(renderer, backend):
    result = renderer.render(RED_SQUARE, None, RenderOptions(size=200, svg_backend=backend))
    pixels = rgb(result.images[0])
    assert pixels.shape == (100, 200, 3)  # longer side = size, aspect ratio kept
    assert (pixels[10:90, 10:90] == [255, 0, 0]).all()  # the square, scaled x2
    assert (pixels[10:90, 110:190] == [255, 255, 255]).all()  # the white background beside it
    assert result.meta["renderer"] == backend and result.meta["sizes"] == [[200, 100]]


def test_same_input_same_pixels(renderer):
    svg = f'<svg {SVG} viewBox="0 0 10 10"><circle cx="5" cy="5" r="4" fill="teal"/><text x="1" y="9">Ag</text></svg>'
    first, second = (renderer.render(svg, None, RenderOptions(size=128)).images[0] for _ in range(2))
    assert first == second


def test_transparent_background(renderer):
    pixels = rgb(renderer.render(RED_SQUARE, None, RenderOptions(size=100, background="transparent")).images[0], "RGBA")
    assert pixels[25, 75, 3] == 0 and pixels[25, 25, 3] == 255


def billion_laughs(levels: int = 9) -> str:
    entities = ['<!ENTITY lol "lol">'] + [
        f'<!ENTITY lol{i} "{("&lol%s;" % (i - 1 if i > 1 else "")) * 10}">' for i in range(1, levels + 1)]
    return f'<?xml version="1.0"?><!DOCTYPE svg [{"".join(entities)}]><svg {SVG}><text>&lol{levels};</text></svg>'


def test_billion_laughs_is_rejected_from_its_declarations(renderer):
    error = reject_error(renderer, billion_laughs())  # expanded it is 3 GB
    assert error.reason == "entity_bomb" and "refers to other entities" in error.detail  # the DTD pass, no expansion


def test_flat_quadratic_entity_expansion_is_rejected(renderer):
    big = "x" * 50_000
    svg = f'<!DOCTYPE svg [<!ENTITY big "{big}">]><svg {SVG}><text>{"&big;" * 100}</text></svg>'
    error = reject_error(renderer, svg)
    assert error.reason == "entity_bomb" and f"expand to {50_000 * 100:,} characters" in error.detail  # counted


def test_many_small_entities_are_counted_in_one_pass(renderer):
    """20,000 declared entities, entity i (i % 7 + 10 characters) referenced i % 5 + 3 times: one scan
    of the file per entity took 17 s on 40,000; the count is exact, and stops at the first entity that
    takes the total (1.3 M in all) past MAX_ENTITY_EXPANSION."""
    count = 20_000
    declared = "".join(f'<!ENTITY e{i} "{"x" * (i % 7 + 10)}">' for i in range(count))
    text = "".join(f"&e{i};" * (i % 5 + 3) for i in range(count))
    noise = f"&amp;e0;&e{count};"  # text that only looks like e0, and an undeclared entity: they add nothing
    svg = f'<!DOCTYPE svg [{declared}]><svg {SVG}><text>{noise}{text}</text></svg>'
    error = reject_error(renderer, svg)
    expansion = next(total for total in itertools.accumulate((i % 7 + 10) * (i % 5 + 3) for i in range(count))
                     if total > MAX_ENTITY_EXPANSION)
    assert error.reason == "entity_bomb" and f"expand to {expansion:,} characters" in error.detail


def test_plain_entities_as_illustrator_writes_them_still_render(renderer):
    svg = (f'<!DOCTYPE svg [<!ENTITY red "#ff0000">]><svg {SVG} width="10" height="10">'
           '<rect width="10" height="10" fill="&red;"/></svg>')
    assert (rgb(renderer.render(svg, None, RenderOptions(size=16)).images[0]) == [255, 0, 0]).all()


def test_external_entity_xxe_is_rejected(renderer):
    svg = f'<!DOCTYPE svg [<!ENTITY xxe SYSTEM "file:///etc/hostname">]><svg {SVG}><text>&xxe;</text></svg>'
    assert reject_reason(renderer, svg) == "external_reference"


@pytest.mark.skipif(not (SHARED_SVG / "svgo_fixtures").exists(), reason="../shared/data/svg is absent")
@pytest.mark.parametrize("name", ["billion-laughs.svg", "billion-laughs-flat.svg"])
def test_shared_billion_laughs_fixtures_are_rejected_before_expansion(renderer, name):
    error = reject_error(renderer, (SHARED_SVG / "svgo_fixtures" / "svgo" / name).read_text())
    assert error.reason == "entity_bomb" and "refers to other entities" in error.detail  # the DTD pass, no expansion


def use_bomb(levels: int = 9) -> str:
    defs = '<rect id="l0" width="1" height="1"/>' + "".join(
        f'<g id="l{i}">' + "".join(f'<use xlink:href="#l{i - 1}" x="{j}"/>' for j in range(10)) + "</g>"
        for i in range(1, levels))
    return f'<svg {SVG} width="100" height="100"><defs>{defs}</defs><use xlink:href="#l{levels - 1}"/></svg>'


def test_use_amplification_bomb_is_rejected_by_counting(renderer):
    error = reject_error(renderer, use_bomb())  # 10^8 elements once expanded
    assert error.reason == "too_large" and "<use> expands to more than 200,000 elements" in error.detail


def test_deep_nesting_is_rejected_before_it_reaches_resvg(renderer):
    deep = f'<svg {SVG}>' + "<g>" * 20_000 + "<rect/>" + "</g>" * 20_000 + "</svg>"
    assert reject_reason(renderer, deep) == "too_large"


@pytest.mark.parametrize("reference", [
    "file:///etc/hostname", "/etc/hostname", "http://127.0.0.1:9/x.png", "//example.com/x.png", "../outside.png",
])
def test_external_references_are_rejected(renderer, tmp_path, reference):
    folder = tmp_path / "assets"
    folder.mkdir()
    (tmp_path / "outside.png").write_bytes(red_png())
    svg = f'<svg {SVG} width="10" height="10"><image href="{reference}" width="10" height="10"/></svg>'
    assert reject_reason(renderer, svg, folder) == "external_reference"


def test_references_in_css_and_stylesheets_are_rejected(renderer):
    for svg in [f'<svg {SVG}><style>@import url("http://x/a.css");</style></svg>',
                f'<svg {SVG}><rect fill="url(file:///etc/passwd#x)" width="5" height="5"/></svg>',
                f'<?xml-stylesheet href="http://x/a.css"?><svg {SVG}/>']:
        assert reject_reason(renderer, svg) == "external_reference"


def test_a_symlink_out_of_the_asset_folder_is_rejected(renderer, tmp_path):
    folder = tmp_path / "assets"
    folder.mkdir()
    (tmp_path / "secret.png").write_bytes(red_png())
    (folder / "link.png").symlink_to(tmp_path / "secret.png")
    svg = f'<svg {SVG} width="10" height="10"><image href="link.png" width="10" height="10"/></svg>'
    assert reject_reason(renderer, svg, folder) == "external_reference"


def test_a_local_asset_inside_the_folder_is_drawn(renderer, tmp_path):
    (tmp_path / "red.png").write_bytes(red_png())
    svg = f'<svg {SVG} width="10" height="10"><image href="red.png" width="10" height="10"/></svg>'
    pixels = rgb(renderer.render(svg, tmp_path, RenderOptions(size=20)).images[0])
    assert (pixels[5:15, 5:15] == [255, 0, 0]).all()


def test_strip_mode_removes_references_and_renders_the_rest(renderer):
    svg = (f'<svg {SVG} width="10" height="10"><rect width="10" height="10" fill="#00f"/>'
           '<image href="file:///etc/hostname" width="10" height="10"/></svg>')
    result = renderer.render(svg, None, RenderOptions(size=20, external_refs="strip"))
    assert result.meta["stripped_refs"] == ["file:///etc/hostname"]
    assert "/etc/hostname" not in result.code and "<image" in result.code  # the markup the sample will show
    assert (rgb(result.images[0]) == [0, 0, 255]).all()


def test_an_embedded_svg_image_gets_the_same_checks(renderer):
    inner = f'<svg {SVG}><image href="file:///etc/hostname" width="5" height="5"/></svg>'
    data = base64.b64encode(inner.encode()).decode()
    svg = f'<svg {SVG} width="10" height="10"><image href="data:image/svg+xml;base64,{data}" width="9" height="9"/></svg>'
    assert reject_reason(renderer, svg) == "external_reference"
    bomb = base64.b64encode(billion_laughs().encode()).decode()
    svg = f'<svg {SVG} width="10" height="10"><image href="data:image/svg+xml;base64,{bomb}" width="9" height="9"/></svg>'
    assert reject_reason(renderer, svg) == "entity_bomb"


def test_malformed_and_oversized_inputs(renderer):
    assert reject_reason(renderer, "<svg><rect></svg>") == "invalid"
    assert reject_reason(renderer, "<html><body/></html>") == "invalid"
    assert reject_reason(renderer, RED_SQUARE + " " * 5000, max_input_bytes=4096) == "too_large"


def red_png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (10, 10), (255, 0, 0)).save(buffer, "PNG")
    return buffer.getvalue()


FULL_SIZE = 4 << 20  # max_input_bytes' default: a hostile input gets all of it


def full_size(head: str, unit: str, tail: str) -> str:
    """head + unit repeated + tail, as close under FULL_SIZE as whole units allow."""
    return head + unit * ((FULL_SIZE - len(head) - len(tail)) // len(unit)) + tail


HOSTILE_AT_FULL_SIZE = {
    # a 512 KiB entity referenced once (under MAX_ENTITY_EXPANSION), in an attribute default that
    # applies to 900,000 <g/>: 470 GB once the parser expands it
    "attlist_default": lambda: full_size(f'<!DOCTYPE svg [<!ENTITY a "{"A" * (512 << 10)}">'
                                         f'<!ATTLIST g class CDATA "&a;">]><svg {SVG}>', "<g/>", "</svg>"),
    # the same without an entity: a literal default, so only counting elements catches it
    "attlist_literal": lambda: full_size(f'<!DOCTYPE svg [<!ATTLIST g class CDATA "{"A" * (2 << 20)}">]><svg {SVG}>',
                                         "<g/>", "</svg>"),
    # url( a million times with no ): a regex that retries the rest at each one is quadratic (48 KB took 24.6 s)
    "css_url": lambda: full_size(f"<svg {SVG}><style>", "url(", "</style></svg>"),
    # @import, then 4 MiB of spaces and no reference: quadratic backtracking in \\s+ ... \\s*
    "css_import": lambda: full_size(f"<svg {SVG}><style>@import", " ", ";</style></svg>"),
    # 700 svgz images, each inflating to 4 MiB and checked: 3 GB of parsing in the caller (7 CPU-minutes)
    "svgz_images": lambda: full_size(f"<svg {SVG}>", f'<image href="data:image/svg+xml;base64,{svgz_comment()}"/>',
                                     "</svg>"),
    # 144,000 spellings of one 1 MiB local image, each read and base64-encoded: 200 GB
    "local_spellings": lambda: (f"<svg {SVG}>" + "".join(f'<image href="big.png?{i:06d}"/>' for i in range(
        (FULL_SIZE - 200) // 30)) + "</svg>"),
}


def svgz_comment() -> str:
    """A 4 MiB SVG (a comment, mostly) gzipped to about 4 KB, base64."""
    inner = f"<svg {SVG}><!--{'A' * ((4 << 20) - 200)}--></svg>".encode()
    return base64.b64encode(gzip.compress(inner)).decode()
MEASURE_CALLER = """
import json, resource, sys, time
from pathlib import Path
from renderers.base import RenderError, RenderOptions
from renderers.svg import SvgRenderer
code = sys.stdin.read()
renderer = SvgRenderer()
before, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.process_time()
try:
    renderer.render(code, Path(sys.argv[1]), RenderOptions(timeout_s=2))
    reason = "rendered"
except RenderError as err:
    reason = err.reason
cpu, after = time.process_time() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
renderer.close()
print(json.dumps({"reason": reason, "cpu_s": cpu, "grew_mb": (after - before) / 1024}))
"""


def limit_child() -> None:
    """Old code spent 800 GB or hours here: a cap turns that into a failed test, not a dead machine."""
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    resource.setrlimit(resource.RLIMIT_CPU, (60, 60))


@pytest.mark.parametrize("case", sorted(HOSTILE_AT_FULL_SIZE))
def test_hostile_markup_at_full_size_leaves_the_caller_flat(case, tmp_path):
    """The checks that run in the caller (outside the sandbox) are linear and bounded: at the 4 MiB
    limit, memory grows by what parsing plain markup of that size takes, CPU stays around timeout_s."""
    code = HOSTILE_AT_FULL_SIZE[case]()
    assert FULL_SIZE - (64 << 10) < len(code.encode()) <= FULL_SIZE
    (tmp_path / "big.png").write_bytes(bytes(1 << 20))  # what local_spellings names
    child = subprocess.run([sys.executable, "-c", MEASURE_CALLER, str(tmp_path)], input=code, capture_output=True,
                           text=True,
                           cwd=Path(__file__).resolve().parents[1], preexec_fn=limit_child, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
    measured = json.loads(child.stdout.splitlines()[-1])
    assert measured["reason"] in ("entity_bomb", "external_reference", "too_large"), measured
    # loose: linear code takes 0.1-1 s; memory is the tree (144,000 elements: 70 MB), as for plain markup
    assert measured["grew_mb"] < 160 and measured["cpu_s"] < 5, measured
