"""The `svg_programs` source: random but valid SVG programs, seeded and reproducible.

Each document is a small illustration on a 256x256 (or wider/taller) canvas: a background,
then 3-10 elements drawn from rectangles (some rounded), circles, ellipses, lines, polylines,
regular polygons and stars, cubic/quadratic/arc paths and text, with linear or radial
gradients, dash patterns, opacity, and groups carrying rotate/scale/skew transforms. Colours
come from one of a few palettes, so a picture has a coherent look and enough contrast to pass
the render gates. Everything derives from (seed, source name, index), so any split of the index
range over Ray tasks gives the same files.
"""
from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from typing import Any

from datapipe.readers.generators import seeded_rngs
from datapipe.schema import Document, new_document

PALETTES = [
    ["#264653", "#2a9d8f", "#e9c46a", "#f4a261", "#e76f51"],
    ["#03071e", "#6a040f", "#d00000", "#f48c06", "#ffba08"],
    ["#0b132b", "#1c2541", "#3a506b", "#5bc0be", "#6fffe9"],
    ["#5f0f40", "#9a031e", "#fb8b24", "#e36414", "#0f4c5c"],
    ["#2b2d42", "#8d99ae", "#edf2f4", "#ef233c", "#d90429"],
]
WORDS = ["data", "pipe", "render", "shape", "code", "image", "vector", "path", "layer", "grid", "signal", "north", "river", "atlas", "prism", "orbit"]
FONTS = ["DejaVu Sans", "DejaVu Serif", "Liberation Sans", "Liberation Serif", "Liberation Mono"]


def svg_programs(cfg: Any, seed: int, start: int, stop: int) -> Iterator[Document]:
    for index, rng in seeded_rngs(cfg.name, seed, start, stop):
        yield new_document(cfg.name, str(index), make_svg(rng), kind="svg", meta={"generator": "svg_programs"})


def make_svg(rng: random.Random) -> str:
    width, height = rng.choice([(256, 256), (320, 240), (240, 320), (400, 200)])
    palette = by_luminance(rng.choice(PALETTES))
    palette = palette if rng.random() < 0.5 else palette[::-1]  # the background is the lightest or darkest colour
    defs = [make_gradient(rng, f"g{i}", palette) for i in range(rng.randint(0, 2))]
    fills = palette[1:] + [f"url(#g{i})" for i in range(len(defs))]
    body = [f'<rect width="{width}" height="{height}" fill="{palette[0]}"/>'] if rng.random() < 0.7 else []
    for _ in range(rng.randint(3, 10)):
        body.append(make_element(rng, width, height, fills))
    if rng.random() < 0.4:
        body = body[:-3] + [wrap_group(rng, body[-3:], width, height)]
    lines = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}">']
    lines += ["  <defs>", *(f"    {d}" for d in defs), "  </defs>"] if defs else []
    lines += [f"  {element}" for element in body]
    return "\n".join(lines + ["</svg>"]) + "\n"


def by_luminance(colors: list[str]) -> list[str]:
    return sorted(colors, key=lambda c: sum(w * int(c[i:i + 2], 16) for w, i in ((0.3, 1), (0.59, 3), (0.11, 5))))


def make_gradient(rng: random.Random, gid: str, palette: list[str]) -> str:
    a, b = rng.sample(palette, 2)
    stops = f'<stop offset="0" stop-color="{a}"/><stop offset="1" stop-color="{b}"/>'
    if rng.random() < 0.5:
        return f'<linearGradient id="{gid}" x1="0" y1="0" x2="{rng.choice([0, 1])}" y2="1">{stops}</linearGradient>'
    return f'<radialGradient id="{gid}" cx="0.5" cy="0.5" r="{rng.choice([0.5, 0.7])}">{stops}</radialGradient>'


def make_element(rng: random.Random, width: int, height: int, fills: list[str]) -> str:
    make = rng.choice(list(SHAPES.values()))
    style = paint(rng, fills)
    return make(rng, width, height, style)


def paint(rng: random.Random, fills: list[str]) -> str:
    style = f'fill="{rng.choice(fills)}"'
    if rng.random() < 0.4:
        style += f' stroke="{rng.choice(fills[:4])}" stroke-width="{rng.choice([1, 2, 3, 5])}"'
        style += f' stroke-dasharray="{rng.randint(2, 8)} {rng.randint(2, 6)}"' if rng.random() < 0.3 else ""
    style += f' opacity="{rng.choice([0.6, 0.8, 0.9])}"' if rng.random() < 0.25 else ""
    return style


def rect(rng: random.Random, w: int, h: int, style: str) -> str:
    x, y = rng.randint(0, w * 2 // 3), rng.randint(0, h * 2 // 3)
    rw, rh = rng.randint(16, w - x), rng.randint(16, h - y)
    corner = f' rx="{rng.randint(2, 20)}"' if rng.random() < 0.4 else ""
    return f'<rect x="{x}" y="{y}" width="{rw}" height="{rh}"{corner} {style}/>'


def circle(rng: random.Random, w: int, h: int, style: str) -> str:
    r = rng.randint(8, min(w, h) // 3)
    return f'<circle cx="{rng.randint(r, w - r)}" cy="{rng.randint(r, h - r)}" r="{r}" {style}/>'


def ellipse(rng: random.Random, w: int, h: int, style: str) -> str:
    rx, ry = rng.randint(10, w // 3), rng.randint(8, h // 4)
    return f'<ellipse cx="{rng.randint(rx, w - rx)}" cy="{rng.randint(ry, h - ry)}" rx="{rx}" ry="{ry}" {style}/>'


def line(rng: random.Random, w: int, h: int, style: str) -> str:
    color = style.split('"')[1]
    x1, y1, x2, y2 = rng.randint(0, w), rng.randint(0, h), rng.randint(0, w), rng.randint(0, h)
    cap = rng.choice(["butt", "round", "square"])
    return (f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{color if "url" not in color else "#000"}" '
            f'stroke-width="{rng.randint(2, 8)}" stroke-linecap="{cap}"/>')


def polygon(rng: random.Random, w: int, h: int, style: str) -> str:
    """A regular polygon or a star, around a random centre."""
    sides, star = rng.randint(3, 8), rng.random() < 0.4
    r = rng.randint(16, min(w, h) // 3)
    cx, cy = rng.randint(r, w - r), rng.randint(r, h - r)
    points = []
    for i in range(sides * (2 if star else 1)):
        radius = r if not star or i % 2 == 0 else r * 0.45
        angle = math.pi * 2 * i / (sides * (2 if star else 1)) - math.pi / 2
        points.append(f"{cx + radius * math.cos(angle):.1f},{cy + radius * math.sin(angle):.1f}")
    tag = "polyline" if rng.random() < 0.15 else "polygon"
    return f'<{tag} points="{" ".join(points)}" {style}/>'


def path(rng: random.Random, w: int, h: int, style: str) -> str:
    def point() -> str:
        return f"{rng.randint(0, w)} {rng.randint(0, h)}"

    commands = [f"M {point()}"]
    for _ in range(rng.randint(2, 5)):
        kind = rng.choice("CQAL")
        if kind == "C":
            commands.append(f"C {point()} {point()} {point()}")
        elif kind == "Q":
            commands.append(f"Q {point()} {point()}")
        elif kind == "A":
            commands.append(f"A {rng.randint(10, 80)} {rng.randint(10, 80)} 0 {rng.randint(0, 1)} 1 {point()}")
        else:
            commands.append(f"L {point()}")
    return f'<path d="{" ".join(commands)}{" Z" if rng.random() < 0.6 else ""}" {style}/>'


def text(rng: random.Random, w: int, h: int, style: str) -> str:
    size = rng.randint(14, 40)
    words = " ".join(rng.sample(WORDS, rng.randint(1, 3)))
    weight = ' font-weight="bold"' if rng.random() < 0.3 else ""
    return (f'<text x="{rng.randint(4, w // 3)}" y="{rng.randint(size, h - 4)}" font-family="{rng.choice(FONTS)}" '
            f'font-size="{size}"{weight} {style}>{words}</text>')


def wrap_group(rng: random.Random, elements: list[str], w: int, h: int) -> str:
    transform = rng.choice([f"rotate({rng.randint(-45, 45)} {w // 2} {h // 2})",
                            f"translate({w // 2} {h // 2}) scale({rng.choice([0.5, 0.75])}) translate({-w // 2} {-h // 2})",
                            f"skewX({rng.randint(-20, 20)})"])
    return f'<g transform="{transform}">' + "".join(elements) + "</g>"


SHAPES: dict[str, Callable[[random.Random, int, int, str], str]] = {
    "rect": rect, "circle": circle, "ellipse": ellipse, "line": line,
    "polygon": polygon, "path": path, "text": text,
}
