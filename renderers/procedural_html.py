"""The `html_pages` source: random but valid HTML/CSS pages, seeded and reproducible.

A page is a header with navigation, a main area of 2-5 blocks and a footer, laid out by
flexbox, CSS grid or a plain column (sometimes with a sidebar). Blocks are drawn from
headings and paragraphs, lists, quotes and code, tables (striped, with a header row), forms
(inputs, selects, checkboxes, buttons), and card grids. One <style> sets a palette, a font
stack, spacing, radii and borders. No scripts and no external files: the page renders the
same offline, every time. Everything derives from (seed, source name, index).
"""
from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

from datapipe.readers.generators import seeded_rngs
from datapipe.schema import Document, new_document
from renderers.procedural_svg import PALETTES

WORDS = ["pipeline", "render", "shard", "token", "packing", "stream", "record", "source", "stage", "sample", "curriculum", "browser", "vector", "layout", "grid", "table", "form", "field", "value", "report", "summary", "metric", "chart", "release", "build", "cache"]
FONT_STACKS = ['"DejaVu Sans", sans-serif', '"Liberation Serif", serif', '"Liberation Sans", Arial, sans-serif',
               '"DejaVu Serif", Georgia, serif', '"Liberation Mono", monospace']


def html_pages(cfg: Any, seed: int, start: int, stop: int) -> Iterator[Document]:
    for index, rng in seeded_rngs(cfg.name, seed, start, stop):
        yield new_document(cfg.name, str(index), make_page(rng), kind="html", meta={"generator": "html_pages"})


def make_page(rng: random.Random) -> str:
    palette = rng.sample(rng.choice(PALETTES), 5)
    title = phrase(rng, 2, 4).title()
    layout = rng.choice(["flex", "grid", "column"])
    blocks = [rng.choice(list(BLOCKS.values()))(rng) for _ in range(rng.randint(2, 5))]
    aside = f"<aside>{heading(rng, 3)}{bullet_list(rng)}</aside>" if layout != "column" and rng.random() < 0.5 else ""
    nav = "".join(f'<a href="#{w}">{w.title()}</a>' for w in rng.sample(WORDS, rng.randint(3, 5)))
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">', f"<title>{title}</title>",
        f"<style>\n{stylesheet(rng, palette, layout)}\n</style>", "</head>", "<body>",
        f"<header><h1>{title}</h1><nav>{nav}</nav></header>",
        f'<div class="page">{aside}<main>{"".join(blocks)}</main></div>',
        f"<footer>{sentence(rng)}</footer>", "</body>", "</html>",
    ]) + "\n"


def stylesheet(rng: random.Random, palette: list[str], layout: str) -> str:
    background, ink, accent, soft, edge = palette
    radius, gap = rng.choice([0, 4, 8, 14]), rng.choice([12, 16, 24, 32])
    page = {"flex": f"display: flex; gap: {gap}px;", "grid": f"display: grid; grid-template-columns: "
            f"{rng.choice(['1fr 3fr', '240px 1fr', '1fr 2fr'])}; gap: {gap}px;", "column": "max-width: 860px;"}[layout]
    return "\n".join([
        f"body {{ margin: 0; font-family: {rng.choice(FONT_STACKS)}; font-size: {rng.choice([14, 15, 16, 18])}px; "
        f"line-height: {rng.choice([1.3, 1.5, 1.7])}; color: {ink}; background: {background}; }}",
        f"header {{ background: {accent}; color: {background}; padding: {gap}px; }}",
        f"header h1 {{ margin: 0 0 8px; font-size: {rng.choice([28, 34, 42])}px; }}",
        f"nav a {{ color: inherit; margin-right: {gap}px; text-decoration: {rng.choice(['none', 'underline'])}; }}",
        f".page {{ {page} padding: {gap}px; margin: 0 auto; }}",
        f"main {{ flex: 3; }} aside {{ flex: 1; background: {soft}; padding: {gap // 2}px; border-radius: {radius}px; }}",
        f"section {{ margin-bottom: {gap}px; }} h2 {{ color: {accent}; border-bottom: 2px solid {edge}; }}",
        f"table {{ border-collapse: collapse; width: 100%; }} th {{ background: {accent}; color: {background}; }}",
        f"th, td {{ padding: 6px 10px; border: 1px solid {edge}; }} tr:nth-child(even) td {{ background: {soft}; }}",
        f"input, select, button {{ font: inherit; padding: 6px; margin: 4px 0; border-radius: {radius}px; "
        f"border: 1px solid {edge}; }} button {{ background: {accent}; color: {background}; }}",
        f".cards {{ display: grid; grid-template-columns: repeat({rng.randint(2, 4)}, 1fr); gap: {gap // 2}px; }}",
        f".card {{ background: {soft}; padding: 12px; border-radius: {radius}px; border: 1px solid {edge}; }}",
        f"blockquote {{ border-left: 4px solid {accent}; margin: 0; padding-left: 12px; font-style: italic; }}",
        f"pre {{ background: {ink}; color: {background}; padding: 10px; border-radius: {radius}px; }}",
        f"footer {{ padding: {gap}px; border-top: 1px solid {edge}; font-size: 0.85em; }}",
    ])


def phrase(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def sentence(rng: random.Random) -> str:
    return phrase(rng, 6, 14).capitalize() + "."


def heading(rng: random.Random, level: int) -> str:
    return f"<h{level}>{phrase(rng, 1, 4).title()}</h{level}>"


def bullet_list(rng: random.Random) -> str:
    tag = rng.choice(["ul", "ol"])
    return f"<{tag}>" + "".join(f"<li>{phrase(rng, 2, 6)}</li>" for _ in range(rng.randint(2, 6))) + f"</{tag}>"


def prose(rng: random.Random) -> str:
    paragraphs = "".join(f"<p>{' '.join(sentence(rng) for _ in range(rng.randint(1, 4)))}</p>"
                         for _ in range(rng.randint(1, 3)))
    extra = rng.choice(["", bullet_list(rng), f"<blockquote>{sentence(rng)}</blockquote>",
                        f"<pre><code>{rng.choice(WORDS)} = {rng.randint(0, 999)}</code></pre>"])
    return f"<section>{heading(rng, 2)}{paragraphs}{extra}</section>"


def table(rng: random.Random) -> str:
    columns = rng.sample(WORDS, rng.randint(2, 5))
    head = "".join(f"<th>{c.title()}</th>" for c in columns)
    rows = "".join("<tr>" + "".join(f"<td>{rng.randint(0, 9999)}</td>" for _ in columns) + "</tr>"
                   for _ in range(rng.randint(2, 8)))
    return f"<section>{heading(rng, 2)}<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></section>"


def form(rng: random.Random) -> str:
    fields = []
    for name in rng.sample(WORDS, rng.randint(2, 5)):
        control = rng.choice([f'<input type="text" name="{name}" placeholder="{name}">',
                              f'<input type="checkbox" name="{name}" checked> {name}',
                              f'<select name="{name}">' + "".join(f"<option>{w}</option>" for w in
                                                                  rng.sample(WORDS, 3)) + "</select>"])
        fields.append(f"<p><label>{name.title()} {control}</label></p>")
    return f"<section>{heading(rng, 2)}<form>{''.join(fields)}<button>{rng.choice(WORDS).title()}</button></form></section>"


def cards(rng: random.Random) -> str:
    items = "".join(f'<div class="card"><h3>{phrase(rng, 1, 2).title()}</h3><p>{sentence(rng)}</p></div>'
                    for _ in range(rng.randint(2, 6)))
    return f'<section>{heading(rng, 2)}<div class="cards">{items}</div></section>'


BLOCKS: dict[str, Callable[[random.Random], str]] = {"prose": prose, "table": table, "form": form, "cards": cards}
