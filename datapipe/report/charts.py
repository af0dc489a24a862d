"""Inline SVG charts: bar charts, histograms and a packed-sample strip, as strings.

Hand-written SVG, not a plotting library: a chart is a few hundred bytes of markup with its
title, axis labels and units, renders in any browser with no script, and the report stays one
file of a few hundred KB with nothing fetched (a Plotly page inlines 3.5 MB of JavaScript).
"""
from __future__ import annotations

from html import escape

COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"]
WIDTH, BAR_H, LEFT = 640, 18, 210  # px: chart width, one bar's height, room for the labels


def bar_chart(title: str, rows: list[tuple[str, float]], unit: str, marks: dict[str, float] | None = None) -> str:
    """Horizontal bars, one a row (label, value), the value printed at the bar's end; `marks`
    draws a target line on the rows it names (a token budget)."""
    marks = marks or {}
    top = max([value for _, value in rows] + list(marks.values()) + [1])
    scale = (WIDTH - LEFT - 90) / top
    height = 40 + BAR_H * 1.4 * len(rows) + 30
    parts = [svg_open(title, height), text(WIDTH / 2, 18, title, "middle", bold=True)]
    for i, (label, value) in enumerate(rows):
        y = 32 + i * BAR_H * 1.4
        parts.append(text(LEFT - 6, y + 13, label[:34], "end"))
        parts.append(f'<rect x="{LEFT}" y="{y}" width="{max(value * scale, 1):.1f}" height="{BAR_H}" '
                     f'fill="{COLORS[i % len(COLORS)]}"><title>{escape(label)}: {value:,.6g} {unit}</title></rect>')
        parts.append(text(LEFT + value * scale + 4, y + 13, f"{value:,.6g}"))
        if label in marks:
            x = LEFT + marks[label] * scale
            parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y - 2}" y2="{y + BAR_H + 2}" stroke="#000" '
                         f'stroke-width="2" stroke-dasharray="3 2"><title>target {marks[label]:,.0f}</title></line>')
    parts.append(text(LEFT + (WIDTH - LEFT) / 2, height - 6, unit + (" (dashed: target)" if marks else ""), "middle"))
    return "".join(parts) + "</svg>"


def funnel(title: str, rows: list[tuple[str, int, int]]) -> str:
    """One bar a stage, in pipeline order: what it kept (blue) and what it rejected (red) side by side,
    so the bar's length is what came in and the narrowing from row to row is the funnel."""
    top = max([kept + rejected for _, kept, rejected in rows] + [1])
    scale = (WIDTH - LEFT - 150) / top
    height = 40 + BAR_H * 1.4 * len(rows) + 30
    parts = [svg_open(title, height), text(WIDTH / 2, 18, title, "middle", bold=True)]
    for i, (label, kept, rejected) in enumerate(rows):
        y = 32 + i * BAR_H * 1.4
        parts += [text(LEFT - 6, y + 13, label[:34], "end"),
                  f'<rect x="{LEFT}" y="{y}" width="{kept * scale:.1f}" height="{BAR_H}" fill="{COLORS[0]}">'
                  f"<title>{escape(label)}: kept {kept:,}</title></rect>",
                  f'<rect x="{LEFT + kept * scale:.1f}" y="{y}" width="{rejected * scale:.1f}" height="{BAR_H}" '
                  f'fill="{COLORS[3]}"><title>{escape(label)}: rejected {rejected:,}</title></rect>',
                  text(LEFT + (kept + rejected) * scale + 4, y + 13, f"{kept + rejected:,} in: {kept:,} kept, "
                       f"{rejected:,} rejected", size=11)]
    parts.append(text(LEFT + (WIDTH - LEFT) / 2, height - 6, "records (blue: kept, red: rejected)", "middle"))
    return "".join(parts) + "</svg>"


def histogram(title: str, counts: list[tuple[str, int]], x_label: str, y_label: str = "documents") -> str:
    """Vertical bars over ordered buckets (their labels under them), with both axes named."""
    return histograms(title, {"": dict(counts)}, [label for label, _ in counts], x_label, y_label)


def line_chart(title: str, series: dict[str, list[float]], step_s: float, y_label: str) -> str:
    """One line a series over time bins of `step_s` seconds (a point at each bin's middle), with the
    time axis in seconds from the run's start, the value axis from 0, and a legend of the series."""
    bins = max((len(values) for values in series.values()), default=0)
    top = max([value for values in series.values() for value in values] + [1e-9])
    plot_w, plot_h, x0, y0 = WIDTH - 100, 180, 70, 210  # px: the plot area and its bottom-left corner
    rows = (len(series) + 3) // 4  # legend: four series a row
    height = 270 + 18 * rows
    parts = [svg_open(title, height), text(WIDTH / 2, 18, title, "middle", bold=True), axes(x0, y0, plot_w, plot_h),
             text(16, y0 - plot_h / 2, y_label, "middle", rotate=True),
             text(x0 + plot_w / 2, y0 + 32, "seconds since the run started", "middle")]
    for tick in range(5):  # 0, 1/4, ... of the value and time ranges
        y, x = y0 - plot_h * tick / 4, x0 + plot_w * tick / 4
        parts += [text(x0 - 4, y + 4, f"{top * tick / 4:,.3g}", "end", size=10),
                  text(x, y0 + 14, f"{bins * step_s * tick / 4:,.3g}", "middle", size=10)]
    for i, (name, values) in enumerate(series.items()):
        # 8 colours, then the same dashed: a dozen stages stay told apart
        stroke = f'stroke="{COLORS[i % len(COLORS)]}" stroke-width="2"' + (' stroke-dasharray="5 3"' if i >= len(COLORS) else "")
        points = " ".join(f"{x0 + plot_w * (j + 0.5) / bins:.1f},{y0 - plot_h * v / top:.1f}" for j, v in enumerate(values))
        parts.append(f'<polyline points="{points}" fill="none" {stroke}>'
                     f"<title>{escape(name)}: peak {max(values, default=0):,.3g} {escape(y_label)}</title></polyline>")
        lx, ly = 20 + (i % 4) * 155, 262 + 18 * (i // 4)
        parts += [f'<line x1="{lx}" x2="{lx + 14}" y1="{ly - 4}" y2="{ly - 4}" {stroke}/>', text(lx + 18, ly, name[:22])]
    return "".join(parts) + "</svg>"


def stage_lines(title: str, series: dict[str, list[float]], step_s: float, unit: str) -> str:
    """Small multiples: a row a series over the same time bins, each scaled to its own peak (printed at
    its end), so a stage doing 3 records/s reads as well as one doing 3,000 beside it."""
    bins = max((len(values) for values in series.values()), default=0) or 1
    x0, plot_w, row_h, top = 170, WIDTH - 290, 30, 30  # px: labels' room, plot width, a row's height, title
    bottom = top + row_h * len(series)
    parts = [svg_open(title, bottom + 44), text(WIDTH / 2, 18, title, "middle", bold=True),
             axes(x0, bottom, plot_w, bottom - top), text(x0 + plot_w / 2, bottom + 36, "seconds since the run started",
                                                           "middle")]
    for tick in range(5):
        parts.append(text(x0 + plot_w * tick / 4, bottom + 14, f"{bins * step_s * tick / 4:,.3g}", "middle", size=10))
    for i, (name, values) in enumerate(series.items()):
        base, peak = top + row_h * (i + 1), max(values, default=0) or 1e-9
        points = " ".join(f"{x0 + plot_w * (j + 0.5) / bins:.1f},{base - (row_h - 6) * v / peak:.1f}"
                          for j, v in enumerate(values))
        parts += [f'<line x1="{x0}" x2="{x0 + plot_w}" y1="{base}" y2="{base}" stroke="#ddd"/>',
                  f'<polyline points="{points}" fill="none" stroke="{COLORS[i % len(COLORS)]}" stroke-width="1.8">'
                  f"<title>{escape(name)}: peak {max(values, default=0):,.3g} {escape(unit)}</title></polyline>",
                  text(x0 - 6, base - 8, name[:26], "end"),
                  text(x0 + plot_w + 6, base - 8, f"peak {max(values, default=0):,.3g} {unit}", size=10)]
    return "".join(parts) + "</svg>"


def axes(x0: float, y0: float, width: float, height: float) -> str:
    return (f'<line x1="{x0}" x2="{x0 + width}" y1="{y0}" y2="{y0}" stroke="#333"/>'
            f'<line x1="{x0}" x2="{x0}" y1="{y0 - height}" y2="{y0}" stroke="#333"/>')


def histograms(title: str, series: dict[str, dict[str, int]], labels: list[str], x_label: str,
               y_label: str = "documents") -> str:
    """Histograms over the same ordered buckets (`labels`), their bars side by side; a legend when
    there are two or more."""
    top = max([count for counts in series.values() for count in counts.values()] + [1])
    step, width = (WIDTH - 80) / max(len(labels), 1), 0.8 / max(len(series), 1)
    parts = [svg_open(title, 280 if len(series) > 1 else 260), text(WIDTH / 2, 18, title, "middle", bold=True),
             axes(60, 210, 570, 180), text(16, 120, y_label, "middle", rotate=True), text(WIDTH / 2, 252, x_label, "middle"),
             text(56, 34, f"{top:,}", "end"), text(56, 210, "0", "end")]
    for k, (name, counts) in enumerate(series.items()):
        for i, label in enumerate(labels):
            h, x = 175 * counts.get(label, 0) / top, 64 + i * step + k * width * step
            parts.append(f'<rect x="{x:.1f}" y="{210 - h:.1f}" width="{width * step:.1f}" height="{h:.1f}" '
                         f'fill="{COLORS[k]}"><title>{escape(name + ", " if name else "")}{escape(label)}: '
                         f"{counts.get(label, 0):,}</title></rect>")
        if len(series) > 1:
            parts += [f'<rect x="{70 + k * 260}" y="262" width="12" height="10" fill="{COLORS[k]}"/>',
                      text(86 + k * 260, 271, name)]
    parts += [text(64 + (i + 0.4) * step, 226, label, "middle", size=10) for i, label in enumerate(labels)]
    return "".join(parts) + "</svg>"


def sample_strip(title: str, pieces: list[tuple[int, int, str]], num_pad: int, spans: list[list[int]],
                 loss_mask: list[int]) -> str:
    """One packed sample left to right: a coloured block per document piece (start, length, id),
    grey padding, hatched media spans, and under it the loss mask (dark = loss applies)."""
    seq_len = len(loss_mask)
    scale = (WIDTH - 20) / max(seq_len, 1)
    parts = [svg_open(title, 150), text(WIDTH / 2, 18, title, "middle", bold=True),
             '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
             'patternTransform="rotate(45)"><rect width="3" height="6" fill="#222"/></pattern></defs>']
    for i, (start, length, doc_id) in enumerate(pieces):
        parts.append(f'<rect x="{10 + start * scale:.2f}" y="30" width="{length * scale:.2f}" height="40" '
                     f'fill="{COLORS[i % len(COLORS)]}" stroke="#fff"><title>{escape(doc_id)}: tokens {start}-'
                     f'{start + length} ({length:,})</title></rect>')
    if num_pad:
        parts.append(f'<rect x="{10 + (seq_len - num_pad) * scale:.2f}" y="30" width="{num_pad * scale:.2f}" '
                     f'height="40" fill="#ccc"><title>padding: {num_pad:,} tokens</title></rect>')
    for start, stop in spans:
        parts.append(f'<rect x="{10 + start * scale:.2f}" y="30" width="{(stop - start) * scale:.2f}" height="40" '
                     f'fill="url(#hatch)" opacity="0.6"><title>media span {start}-{stop}</title></rect>')
    parts.append(loss_line(loss_mask, scale))
    parts.append(text(10, 100, "loss mask (dark: next-token loss applies)", size=11))
    parts.append(text(WIDTH / 2, 140, f"token position, 0 to {seq_len:,} (blocks: documents; grey: padding; "
                      "hatched: image tokens)", "middle", size=11))
    return "".join(parts) + "</svg>"


def loss_line(loss_mask: list[int], scale: float) -> str:
    """Runs of equal mask values as rectangles (a run, not a rect a token: 64K tokens stay small)."""
    runs, start = [], 0
    for i in range(1, len(loss_mask) + 1):
        if i == len(loss_mask) or loss_mask[i] != loss_mask[start]:
            color = "#222" if loss_mask[start] else "#eee"
            runs.append(f'<rect x="{10 + start * scale:.2f}" y="76" width="{(i - start) * scale:.2f}" height="10" '
                        f'fill="{color}"/>')
            start = i
    return "".join(runs)


def svg_open(title: str, height: float) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" aria-label="{escape(title)}" '
            f'width="{WIDTH}" height="{height:.0f}" viewBox="0 0 {WIDTH} {height:.0f}" font-family="sans-serif" '
            'font-size="12">')


def text(x: float, y: float, content: str, anchor: str = "start", bold: bool = False, size: int = 12,
         rotate: bool = False) -> str:
    weight = ' font-weight="bold"' if bold else ""
    turn = f' transform="rotate(-90 {x} {y})"' if rotate else ""
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}"{weight}{turn}>'
            f"{escape(str(content))}</text>")
