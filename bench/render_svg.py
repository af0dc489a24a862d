"""Benchmark: SVG renders per CPU-second, our path (checks + sandboxed resvg) vs cairosvg.

    .venv/bin/python bench/render_svg.py [--files 300] [--per-collection 20] [--size 512]

On the same seeded samples of ../shared/data/svg/ (a uniform sample of the corpus, the headline;
then as many files from each collection), in the same run:
- ours: SvgRenderer as the render stage uses it: hostile-input checks in this process, resvg
  in a sandboxed worker, PNG encode included; CPU = this process + the worker (/proc);
- cairosvg: cairosvg.svg2png in this process, the way a script would call it (no checks, no
  sandbox: the peer at its cheapest); CPU = this process;
- both at the same output size (longer side --size), compared pixel for pixel;
- per collection (--per-collection files of each), the same comparison, since a uniform sample
  is 90% single-path icons; and quality: each output is compared with Chromium's rendering of the
  same SVG (an <img> at the same size): "agrees" = at most 2% of pixels differ by more than
  48 levels in a channel (anti-aliasing differences stay below that; a lost shape does not).
- text: every SVG of the corpus that has <text> (the manifest's "text" feature; of an svgo
  fixture, `.svg.txt`, its input: the part before the first "@@@"), rendered as is
  and with its <text> elements removed (both re-serialized the same way), by ours and by
  cairosvg and Chromium: its text is drawn when the two pictures differ (a pixel off by more than
  48 levels); the share counts the files whose text Chromium draws. The corpus has few such
  files, so the same is measured on one line of Latin, CJK, Arabic and Devanagari text in each
  of FAMILY_LISTS, the font-family values SVG exports and web pages commonly carry.
  resvg drew no text in a family not installed under exactly its name (sans-serif, Arial).
The machine is shared: CPU seconds, not wall time, and ratios are what to read. The last line
is the summary.
"""
from __future__ import annotations

import argparse
import base64
import io
import json
import os
import random
import statistics
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from renderers.base import RenderError, RenderOptions
from renderers.svg import SvgRenderer, render_cairosvg
from renderers.web import WebRenderer, png_size

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "svg"
WARM_UP = '<svg xmlns="http://www.w3.org/2000/svg" width="24" height="24"><circle cx="12" cy="12" r="9"/></svg>'
MISMATCH_LEVELS = 48  # a pixel differs when a channel is off by more than this (anti-aliasing stays below)
AGREE_SHARE = 0.02  # a render agrees with Chromium when at most 2% of its pixels differ


FAMILY_LISTS = [
    "sans-serif", "serif", "monospace", "cursive", "fantasy", "system-ui", "Arial", "Helvetica",
    "'Helvetica Neue', Helvetica, Arial, sans-serif", "'Times New Roman', Times, serif", "Georgia, serif",
    "Verdana, Geneva, sans-serif", "'Courier New', monospace", "Roboto, 'Segoe UI', sans-serif", "'Open Sans'",
    "-apple-system, BlinkMacSystemFont, 'Segoe UI'", "Lato", "Montserrat", "MyriadPro-Regular", "'Noto Sans'",
    "'DejaVu Sans'", "'Liberation Serif'", "inherit", "Impact",
]
LINE = "Hamburgefonstiv 漢字かな 한글 نص عربي देवनागरी"


def family_texts() -> list[tuple[str, None]]:
    """For each of FAMILY_LISTS: an SVG with LINE in it, then the same without the text."""
    texts = []
    for families in FAMILY_LISTS:
        text = f'<text x="8" y="60" font-size="28" font-family="{families}">{LINE}</text>'
        for body in (text, ""):
            texts.append((f'<svg xmlns="http://www.w3.org/2000/svg" width="720" height="100">{body}</svg>', None))
    return texts


def text_bearing() -> list[Path]:
    rows = map(json.loads, (DATA / "manifest.jsonl").open())
    return [DATA / row["file"] for row in rows if "text" in row["features"]]


def with_and_without_text(path: Path) -> tuple[str, str] | None:
    """The SVG re-serialized, and the same with every <text> removed; None when it does not parse."""
    try:
        root = ET.fromstring(path.read_bytes().split(b"@@@", 1)[0].strip())
    except ET.ParseError:
        return None
    whole = ET.tostring(root, encoding="unicode")
    for parent in list(root.iter()):
        for child in [c for c in parent if isinstance(c.tag, str) and c.tag.rsplit("}", 1)[-1] == "text"]:
            parent.remove(child)
    return whole, ET.tostring(root, encoding="unicode")


def text_drawn(options: RenderOptions, web: WebRenderer) -> dict[str, float]:
    """Of the text-bearing SVGs whose text Chromium draws, the share whose text ours (and cairosvg)
    draws too: "drawn" when removing the <text> elements changes the picture. Text in <defs>,
    empty or transparent draws nothing anywhere; those files do not count."""
    pairs = [pair for pair in map(with_and_without_text, text_bearing()) if pair]
    corpus = drawn_shares([(svg, None) for pair in pairs for svg in pair], options, web)
    families = drawn_shares(family_texts(), options, web)
    return {"text_files": corpus[0], "text_drawn": corpus[1], "cairosvg_text_drawn": corpus[2],
            "family_lists": families[0], "family_text_drawn": families[1], "cairosvg_family_text_drawn": families[2]}


def drawn_shares(texts: list[tuple[str, None]], options: RenderOptions, web: WebRenderer) -> tuple[int, float, float]:
    """(pairs whose text Chromium draws, the share of those ours draws, cairosvg's share)."""
    ours, _ = run_ours(texts, options)
    theirs, _ = run_cairosvg(texts, options)
    visible = [index for index, shown in enumerate(drawn(chromium_references(web, texts, ours))) if shown]

    def share(outputs: list) -> float:
        return sum(drawn(outputs)[index] for index in visible) / max(len(visible), 1)

    return len(visible), share(ours), share(theirs)


def drawn(outputs: list) -> list[bool]:
    """For each (with text, without text) pair of renders in `outputs`: does the text change the picture?"""
    return [isinstance(a, bytes) and isinstance(b, bytes) and mismatch(a, b) > 0 for a, b in zip(outputs[::2], outputs[1::2])]


def collections() -> dict[str, list[Path]]:
    """Files by collection (icons/feather, ..., flags/flag-icons, svgo_fixtures)."""
    groups: dict[str, list[Path]] = {}
    for row in map(json.loads, (DATA / "manifest.jsonl").open()):
        if row["file"].endswith(".svg"):
            name = "/".join(row["file"].split("/")[:2]) if not row["file"].startswith("svgo") else "svgo_fixtures"
            groups.setdefault(name, []).append(DATA / row["file"])
    return groups


def sample(files: list[Path], count: int, seed: int = 0) -> list[tuple[str, Path]]:
    chosen = sorted(random.Random(seed).sample(files, min(count, len(files))))
    return [(f.read_bytes().decode("utf-8", "replace"), f.parent) for f in chosen]


def worker_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_ours(texts: list[tuple[str, Path]], options: RenderOptions) -> tuple[list, float]:
    renderer = SvgRenderer()
    renderer.render(WARM_UP, None, options)  # start the worker and fill its buffers before timing
    start_self, pid = time.process_time(), renderer.sandbox.process.pid
    start_worker = worker_cpu(pid)
    outputs = []
    for code, folder in texts:
        try:
            outputs.append(renderer.render(code, folder, options).images[0])
        except RenderError as err:
            outputs.append(err.reason)
        if renderer.sandbox.process is None or renderer.sandbox.process.pid != pid:
            return outputs, float("nan")  # a restart would hide the dead worker's CPU; not seen on this data
    cpu = time.process_time() - start_self + worker_cpu(pid) - start_worker
    renderer.close()
    return outputs, cpu


def run_cairosvg(texts: list[tuple[str, Path]], options: RenderOptions) -> tuple[list, float]:
    render_cairosvg(WARM_UP, options.size, (255, 255, 255, 255))  # same warm start as ours
    start, outputs = time.process_time(), []
    for code, _ in texts:
        try:
            outputs.append(render_cairosvg(code, options.size, (255, 255, 255, 255))[0])
        except RenderError as err:
            outputs.append(err.reason)
        except Exception as err:  # noqa: BLE001 - the peer's own failures count against its success rate
            outputs.append(type(err).__name__)
    return outputs, time.process_time() - start


def pixels(png: bytes, size: tuple[int, int] | None = None) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        flat = Image.new("RGBA", image.size, (255, 255, 255, 255))
        flat.alpha_composite(image.convert("RGBA"))
        rgb = flat.convert("RGB")
        return np.asarray(rgb.resize(size) if size and rgb.size != size else rgb, dtype=np.float32)


def mismatch(a: bytes, b: bytes) -> float:
    """Share of pixels whose colour differs by more than MISMATCH_LEVELS in some channel."""
    first = pixels(a)
    second = pixels(b, (first.shape[1], first.shape[0]))
    return float((np.abs(first - second).max(axis=2) > MISMATCH_LEVELS).mean())


def chromium_references(web, texts: list[tuple[str, Path]], ours: list) -> list[bytes | None]:
    """Chromium's rendering of each SVG as an <img> at the size resvg produced."""
    references = []
    for (code, _), png in zip(texts, ours):
        if not isinstance(png, bytes):
            references.append(None)
            continue
        width, height = png_size(png)
        data = base64.b64encode(code.encode()).decode()
        page = (f'<html><body style="margin:0;background:#fff"><img style="display:block;width:{width}px;'
                f'height:{height}px" src="data:image/svg+xml;base64,{data}"></body></html>')
        try:
            references.append(web.render(page, None, RenderOptions(viewports=[(width, height)], javascript=False)).images[0])
        except RenderError:
            references.append(None)
    return references


def agreement(outputs: list, references: list) -> tuple[float, float]:
    """(share of files within AGREE_SHARE of Chromium, median mismatch) over files Chromium rendered."""
    errors = [mismatch(out, ref) if isinstance(out, bytes) else 1.0 for out, ref in zip(outputs, references) if ref]
    return sum(e <= AGREE_SHARE for e in errors) / max(len(errors), 1), statistics.median(errors) if errors else 0.0


def compare(texts: list[tuple[str, Path]], options: RenderOptions) -> dict:
    ours, ours_cpu = run_ours(texts, options)
    theirs, theirs_cpu = run_cairosvg(texts, options)
    ok_ours, ok_theirs = sum(isinstance(o, bytes) for o in ours), sum(isinstance(o, bytes) for o in theirs)
    both = [(a, b) for a, b in zip(ours, theirs) if isinstance(a, bytes) and isinstance(b, bytes)]
    return {"ours": ours, "theirs": theirs, "rate": ok_ours / ours_cpu, "peer_rate": ok_theirs / theirs_cpu,
            "success": ok_ours / len(texts), "peer_success": ok_theirs / len(texts),
            "same_size": sum(png_size(a) == png_size(b) for a, b in both) / max(len(both), 1),
            "failures": {name: sorted(o for o in outs if not isinstance(o, bytes))
                         for name, outs in (("ours", ours), ("cairosvg", theirs))}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=300, help="uniform sample of the whole corpus")
    parser.add_argument("--per-collection", type=int, default=20, help="files from each collection, also vs Chromium")
    parser.add_argument("--size", type=int, default=512)
    args = parser.parse_args()
    if not DATA.exists():
        raise SystemExit(f"{DATA} is absent: this benchmark reads the shared SVG corpus")
    options, groups = RenderOptions(size=args.size), collections()
    uniform = compare(sample([f for files in groups.values() for f in files], args.files), options)
    print(f"uniform sample: {args.files} of {sum(map(len, groups.values()))} files (seed 0), {args.size} px")
    print(f"  ours (checks + sandboxed resvg): {uniform['rate']:.1f} renders per CPU-s, success {uniform['success']:.1%}")
    print(f"  cairosvg (in process):           {uniform['peer_rate']:.1f} renders per CPU-s, "
          f"success {uniform['peer_success']:.1%}; failures {uniform['failures']}")
    strata, agree, agree_peer, web = {}, [], [], WebRenderer()
    for name, files in sorted(groups.items()):
        texts = sample(files, args.per_collection)
        result = compare(texts, options)
        references = chromium_references(web, texts, result["ours"])
        strata[name] = result | {"agree": agreement(result["ours"], references),
                                 "peer_agree": agreement(result["theirs"], references)}
        agree.append(strata[name]["agree"][0])
        agree_peer.append(strata[name]["peer_agree"][0])
    text = text_drawn(options, web)
    web.close()
    print(f"text: {text['text_files']} SVGs whose <text> Chromium draws; drawn by ours {text['text_drawn']:.1%}, "
          f"by cairosvg {text['cairosvg_text_drawn']:.1%}; {text['family_lists']} common font-family lists: "
          f"drawn by ours {text['family_text_drawn']:.1%}, by cairosvg {text['cairosvg_family_text_drawn']:.1%}")
    print(f"per collection ({args.per_collection} files each): renders per CPU-s ours / cairosvg, and the share of "
          f"files within {AGREE_SHARE:.0%} of Chromium's pixels")
    for name, r in strata.items():
        print(f"  {name:24s} {r['rate']:6.1f} / {r['peer_rate']:6.1f} = {r['rate'] / r['peer_rate']:.2f}x   "
              f"agree {r['agree'][0]:.0%} / {r['peer_agree'][0]:.0%}   failures {r['failures']}")
    print(f"bench render_svg: files={args.files} size={args.size} renders_per_cpu_s={uniform['rate']:.1f} "
          f"cairosvg_renders_per_cpu_s={uniform['peer_rate']:.1f} success={uniform['success']:.3f} "
          f"cairosvg_success={uniform['peer_success']:.3f} same_size={uniform['same_size']:.3f} "
          f"chromium_agree={statistics.mean(agree):.3f} cairosvg_chromium_agree={statistics.mean(agree_peer):.3f} "
          f"text_files={text['text_files']} text_drawn={text['text_drawn']:.3f} "
          f"cairosvg_text_drawn={text['cairosvg_text_drawn']:.3f} family_lists={text['family_lists']} "
          f"family_text_drawn={text['family_text_drawn']:.3f} "
          f"cairosvg_family_text_drawn={text['cairosvg_family_text_drawn']:.3f} "
          f"x_vs_cairosvg={uniform['rate'] / uniform['peer_rate']:.2f}")


if __name__ == "__main__":
    main()
