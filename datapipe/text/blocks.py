"""Blocks of a page's main text, and the rules that drop the boilerplate among them.

resiliparse's main-content pass keeps what sits around an article inside its container: bylines,
datelines, photo captions and gallery slides above it, "related stories", calls to action and
tag lists below it, chart labels inside it. Its `minimal_html` output marks paragraphs, list
items, headings, <pre> and links, which is enough to see each block's kind, length and link
density without walking the DOM in Python (a Python walk costs ~25 us a node, longer than the
whole extraction). Rules, after jusText (Pomikalek 2011) and Readability.js, none of them tuned
to a page:
- a block with no letter carries no text (chart axes, pagination "1 2 3", counters);
- a short block repeated on the page is a template (a gallery caption per slide): kept once;
- the article runs from its first to its last good block (80+ characters, at most half of them
  in links), with the short paragraphs, list items and headings right next to it; lines outside
  paragraphs and link-dense blocks beyond them are chrome. When paragraphs hold 70% of the
  text, the article is written in paragraphs, and lines outside them do not count as good.
On the 153 gold pages of bench/extract.py: news F1 0.916 -> 0.954, all pages 0.953 -> 0.960, at
~0.7 ms a page (resiliparse's extraction itself: ~2 ms).
"""
from __future__ import annotations

import html
import re
from collections import Counter
from dataclasses import dataclass

TAG = re.compile(r"<(/?)(h[1-6]|p|ul|ol|li|pre|br|a)\b[^>]*>")
LETTER = re.compile(r"[^\W\d_]")
# Scripts without spaces between words: one character carries about a word (~3 Latin characters more).
DENSE_SCRIPT = re.compile(r"[\u0e00-\u0e7f\u1000-\u109f\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af\uf900-\ufaff]")
# Link text is marked with two control characters (never in resiliparse's output) while blocks are cut.
LINK_OPEN, LINK_CLOSE = "\x01", "\x02"
LINKED = re.compile("\x01([^\x02]*)\x02")
CONTAINED = {"p", "li", "pre", "h1", "h2", "h3", "h4", "h5", "h6"}


@dataclass
class Block:
    kind: str  # "p", "li", "pre", "h1".."h6", or "line": text outside those (a div's line, a table row)
    text: str
    linked: int = 0  # characters of the text inside links

    @property
    def weight(self) -> int:
        """Length in Latin-character equivalents (a CJK/Thai character counts 3)."""
        text = self.text.strip()
        return len(text) + 2 * len(DENSE_SCRIPT.findall(text))

    @property
    def link_density(self) -> float:
        return self.linked / max(len(self.text.strip()), 1)


def parse_blocks(markup: str) -> list[Block]:
    """Blocks of resiliparse's `minimal_html` output, in page order."""
    blocks: list[Block] = []
    kind, parts, in_link, position = "line", [], False, 0
    tags = list(TAG.finditer(markup))
    closed = closed_links(tags)
    for i, tag in enumerate(tags):
        text = html.unescape(markup[position:tag.start()])
        parts.append(LINK_OPEN + text + LINK_CLOSE if in_link else text)
        position = tag.end()
        closing, name = tag.group(1) == "/", tag.group(2)
        if name == "a":
            in_link = not closing and i in closed
        elif name != "br":
            blocks.extend(to_blocks(kind, "".join(parts)))
            kind, parts = ("line" if closing or name not in CONTAINED else name), []
    parts.append(html.unescape(markup[position:]))
    blocks.extend(to_blocks(kind, "".join(parts)))
    return blocks


def closed_links(tags: list[re.Match]) -> set[int]:
    """Indexes of the <a> tags closed by the next link tag. resiliparse leaves an empty link
    (an image's, a skip link) open: `<a href="">` then paragraphs, and links cannot nest in HTML."""
    links = [i for i, tag in enumerate(tags) if tag.group(2) == "a"]
    return {i for i, j in zip(links, links[1:]) if not tags[i].group(1) and tags[j].group(1)}


def to_blocks(kind: str, marked: str) -> list[Block]:
    """One block, or one a line for text outside paragraphs; link text is marked in `marked`."""
    pieces = marked.split("\n") if kind == "line" else [marked]
    blocks = []
    for piece in pieces:
        linked = sum(len(run.strip()) for run in LINKED.findall(piece))
        text = piece.replace(LINK_OPEN, "").replace(LINK_CLOSE, "")
        if text.strip():
            blocks.append(Block(kind, text if kind == "pre" else text.strip(), linked))
    return blocks


@dataclass(frozen=True)
class Rules:
    good_weight: int = 80  # a good block: at least this long (jusText's LENGTH_LOW is 70 characters)
    max_link_density: float = 0.5  # and at most this share of it in links
    # When paragraphs hold this share of the text, the article is written in them: lines outside
    # paragraphs before the first and after the last are chrome (teasers, captions, bylines).
    paragraph_share: float = 0.7
    repeat: int = 3  # a short block seen this many times on the page is a template, kept once


def drop_boilerplate(blocks: list[Block], rules: Rules = Rules()) -> list[Block]:
    """The article's blocks: letterless blocks and repeated templates out, then the run from
    the first to the last good block, widened over the short blocks next to it."""
    blocks = [b for b in blocks if b.kind == "pre" or LETTER.search(b.text)]
    blocks = drop_repeats(blocks, rules)
    good = [i for i, b in enumerate(blocks) if is_good(b, rules)]
    in_paragraphs = sum(b.weight for b in blocks if b.kind != "line")
    if in_paragraphs >= rules.paragraph_share * sum(b.weight for b in blocks):
        good = [i for i in good if blocks[i].kind != "line"] or good
    if not good:
        return blocks
    first, last = good[0], good[-1]
    while first > 0 and is_near(blocks[first - 1], rules):
        first -= 1
    while last + 1 < len(blocks) and is_near(blocks[last + 1], rules):
        last += 1
    return blocks[first:last + 1]


def is_good(block: Block, rules: Rules) -> bool:
    return block.weight >= rules.good_weight and block.link_density <= rules.max_link_density


def is_near(block: Block, rules: Rules) -> bool:
    """A short paragraph, list item or heading next to the article's text belongs to it."""
    return block.kind != "line" and block.link_density <= rules.max_link_density


def drop_repeats(blocks: list[Block], rules: Rules) -> list[Block]:
    counts = Counter(b.text for b in blocks)
    seen: set[str] = set()
    kept = []
    for block in blocks:
        if block.text in seen and counts[block.text] >= rules.repeat and not is_good(block, rules):
            continue
        seen.add(block.text)
        kept.append(block)
    return kept


def render(blocks: list[Block]) -> str:
    """Plain text: a blank line between paragraphs, list items and lines one a line, bullets kept."""
    out = []
    for i, block in enumerate(blocks):
        if i and (block.kind not in ("li", "line") or blocks[i - 1].kind not in ("li", "line")):
            out.append("\n")
        out.append(("• " + block.text if block.kind == "li" else block.text).rstrip("\n") + "\n")
    return "".join(out).strip()
