"""Font fallback for resvg, the way fontconfig gives it to Chromium and cairosvg.

resvg draws text only in a family that is installed under exactly the name the SVG gives:
`font-family="sans-serif"`, "Arial" or "Helvetica" drew nothing (on a reference suite, most of
the tests that missed). So, in the sandboxed worker, every font-family list (attribute, style
attribute, <style> sheet) gets the installed families fontconfig would pick appended after its
own names: the metric-compatible equivalent of a common name (Arial -> Liberation Sans, as
Debian's 30-metric-aliases.conf), the installed families of a generic name (sans-serif ->
Noto Sans, DejaVu Sans), and at the end the list's generic family, sans-serif when it names
none. A family that is installed still wins, since it comes first; resvg itself falls back per
character for scripts the chosen font lacks (CJK, Arabic, Devanagari, emoji).

Not rewritten: the `font` shorthand (`font: 12px Arial`), and SVG images embedded as data:
URIs (their text falls back to the worker's default family only when they name none).

The markup is scanned once, linearly: start tags and their quoted attributes (a value holds no
`<`), and the text of <style> elements up to the next `</`. Markup without "font-family" is
returned as it is, so icons pay nothing.
"""
from __future__ import annotations

import html
import re

from renderers.css_refs import NextIndex

GENERIC_FAMILIES = {  # installed families in fontconfig's order of preference (fc-match on Debian 12)
    "sans-serif": ["Noto Sans", "DejaVu Sans", "Liberation Sans"],
    "serif": ["Noto Serif", "DejaVu Serif", "Liberation Serif"],
    "monospace": ["DejaVu Sans Mono", "Noto Sans Mono", "Liberation Mono"],
}
GENERIC_ALIASES = {"cursive": "sans-serif", "fantasy": "sans-serif", "system-ui": "sans-serif",  # none installed
                   "ui-sans-serif": "sans-serif", "ui-serif": "serif", "ui-monospace": "monospace",
                   "-apple-system": "sans-serif", "blinkmacsystemfont": "sans-serif"}
METRIC_ALIASES = {  # same advance widths, so text runs as long as the author saw it
    "arial": "Liberation Sans", "helvetica": "Liberation Sans", "helvetica neue": "Liberation Sans",
    "arimo": "Liberation Sans", "arial narrow": "Liberation Sans Narrow",
    "times new roman": "Liberation Serif", "times": "Liberation Serif", "tinos": "Liberation Serif",
    "courier new": "Liberation Mono", "courier": "Liberation Mono", "cousine": "Liberation Mono",
    "verdana": "DejaVu Sans", "bitstream vera sans": "DejaVu Sans", "bitstream vera serif": "DejaVu Serif",
    "bitstream vera sans mono": "DejaVu Sans Mono", "georgia": "DejaVu Serif", "consolas": "DejaVu Sans Mono",
}
CSS_KEYWORDS = {"inherit", "initial", "unset", "revert", "revert-layer"}  # not families: a list would be invalid
MAX_FAMILY_LIST = 1000  # characters of one font-family value we rewrite; real ones are < 100

TAG_START = re.compile(r"<([A-Za-z_][\w:.-]*)")
ATTRIBUTE = re.compile(r"""\s+([\w:.-]+)\s*=\s*("[^"<]*"|'[^'<]*')""")
CSS_FAMILY = re.compile(r"(font-family\s*:\s*)([^;}]{1,%d})" % MAX_FAMILY_LIST, re.IGNORECASE)


def resolve_families(families: str, installed: set[str]) -> str:
    """`families` (a CSS font-family list) followed by the installed fallbacks fontconfig would add."""
    names = [name.strip().strip("'\"").strip() for name in html.unescape(families).split(",")]  # &quot; too
    if names[0].lower() in CSS_KEYWORDS:
        return families
    important = names and names[-1].endswith("!important")
    generic, added = "sans-serif", []
    for name in names:
        key = name.lower().removesuffix("!important").strip()
        key = GENERIC_ALIASES.get(key, key)
        if key in GENERIC_FAMILIES:
            generic = key
            added += GENERIC_FAMILIES[key]
        elif key in METRIC_ALIASES:
            added.append(METRIC_ALIASES[key])
    added += GENERIC_FAMILIES[generic]
    fallbacks = [name for name in dict.fromkeys(added) if name in installed]
    if not fallbacks:
        return families
    base = families.strip().removesuffix("!important").rstrip()
    return f"{base}, " + ", ".join(f"'{name}'" for name in fallbacks) + (" !important" if important else "")


def with_font_fallbacks(markup: str, installed: set[str]) -> str:
    """`markup` with every font-family list extended by resolve_families."""
    if "font-family" not in markup:
        return markup
    out, position, next_index = [], 0, NextIndex(markup)
    for tag in TAG_START.finditer(markup):
        if tag.start() < position:
            continue  # inside a <style> sheet already rewritten
        cursor = tag.end()
        while (attribute := ATTRIBUTE.match(markup, cursor)) is not None:
            name, quoted = attribute.group(1), attribute.group(2)
            if name in ("font-family", "style"):
                value = resolve_families(quoted[1:-1], installed) if name == "font-family" \
                    else rewrite_sheet(quoted[1:-1], installed)
                out += [markup[position:attribute.start(2)], quoted[0], value.replace(quoted[0], ""), quoted[0]]
                position = attribute.end()
            cursor = attribute.end()
        if tag.group(1).rsplit(":", 1)[-1] == "style" and not markup.startswith("/>", cursor):
            sheet_start = next_index(">", cursor) + 1
            sheet_end = next_index("</", sheet_start)
            if sheet_start <= sheet_end:
                out += [markup[position:sheet_start], rewrite_sheet(markup[sheet_start:sheet_end], installed)]
                position = sheet_end
    out.append(markup[position:])
    return "".join(out)


def rewrite_sheet(css: str, installed: set[str]) -> str:
    return CSS_FAMILY.sub(lambda m: m.group(1) + resolve_families(m.group(2), installed), css)
