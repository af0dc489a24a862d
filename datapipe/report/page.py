"""`out/<run>/report.html`: what a run did, in one self-contained page, rebuilt from its files alone.

It reads what every run writes: stats.json (the accounting), rejects/*.jsonl (every reject with
its reason, text head and notes), recipe.json, and each phase's shards (sampled: the first
MAX_SAMPLES samples a phase). Nothing else, so `datapipe report OUT_DIR` rebuilds it at any time.
Charts are inline SVG (charts.py), images inline PNG data URIs, styles inline: the page asks the
network for nothing. Sections carry an id each (tests/test_report.py checks them).
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from html import escape
from itertools import accumulate
from pathlib import Path
from typing import Any

from datapipe.pipeline.inspect import load_decoder, read_rejects
from datapipe.pipeline.stats import length_labels
from datapipe.report import charts
from datapipe.report.samples import Piece, gate_measures, phase_folders, pieces_of, png_size, png_uri, read_samples

REPORT = "report.html"
SECTIONS = ("flow", "text", "rephrase", "renders", "tokens", "sample", "time")  # ids, in page order
GALLERY = 8  # code-image pairs shown: enough to see each kind, small enough to open at once
LISTED = 12  # pieces of the drawn sample listed with their text (a 1M-token sample holds thousands)
STYLE = """body{font-family:sans-serif;margin:2em auto;max-width:1100px;color:#222}
section{border-top:1px solid #ccc;margin-top:2em}table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ddd;padding:3px 6px;vertical-align:top;text-align:left}
pre{white-space:pre-wrap;max-height:240px;overflow:auto;background:#f6f6f6;padding:6px;font-size:12px;margin:0}
.pair{display:grid;grid-template-columns:1fr 260px;gap:10px;margin:10px 0}.pair img{max-width:256px;border:1px solid #ccc}figure{margin:0 0 8px}figcaption{font-size:11px;color:#555}
.note{color:#666;font-size:13px}pre.short{max-height:110px}pre.scores{white-space:pre;max-height:none;font-size:11px}"""


def write_report(out_dir: Path | str) -> Path:
    """Build the page from the run's files and write it beside them; returns its path."""
    out_dir = Path(out_dir)
    stats_path = out_dir / "stats.json"
    if not stats_path.is_file():
        raise FileNotFoundError(f"{stats_path}: not a finished datapipe run (no stats.json); run `datapipe run` first")
    run = RunFiles(out_dir, json.loads(stats_path.read_text()))
    body = "".join(section(name, TITLES[name], build(run)) for name, build in BUILDERS.items())
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>datapipe run {escape(run.name)}</title>"
            f"<style>{STYLE}</style></head><body><h1>Run report: {escape(run.name)}</h1>"
            f"<p class='note'>{escape(str(out_dir))}: {summary_line(run.stats)}</p>{body}</body></html>")
    path = out_dir / REPORT
    path.write_text(page, encoding="utf-8")
    return path


class RunFiles:
    """The run's files, each read once: stats, rejects, recipe, sampled shards."""

    def __init__(self, out_dir: Path, stats: dict[str, Any]):
        self.stats, self.name = stats, stats.get("recipe", out_dir.name)
        self.rejects = list(read_rejects(out_dir))
        recipe_path = out_dir / "recipe.json"
        self.recipe = json.loads(recipe_path.read_text()) if recipe_path.is_file() else {}
        decode = load_decoder(out_dir)
        self.phases = {folder.name: read_samples(folder) for folder in phase_folders(out_dir, list(stats.get("phases", {})))}
        self.pieces = {phase: [p for s in samples for p in pieces_of(s, decode)] for phase, samples in self.phases.items()}

    def stage_sources(self, stage: str) -> list[str]:
        return [name for s in self.recipe.get("stages", []) if s.get("stage") == stage for name in s.get("sources") or []]


def summary_line(stats: dict[str, Any]) -> str:
    records = sum(stats.get("records_in", {}).values()) + sum(stats.get("created", {}).values())
    return (f"{records:,} records in (with those stages created), {sum(stats.get('written', {}).values()):,} written, "
            f"{sum(stats.get('rejected', {}).values()):,} rejected, {stats.get('tokens', 0):,} tokens, "
            f"{stats.get('wall_s', 0):.1f} s; accounting {'balanced' if stats.get('balanced') else 'NOT balanced'}")


def section(name: str, title: str, content: str) -> str:
    return f"<section id='{name}'><h2>{escape(title)}</h2>{content}</section>"


def flow(run: RunFiles) -> str:
    stages = run.stats.get("stages", {})
    read = stages.get("read") or {"kept": sum(run.stats.get("records_in", {}).values()), "rejected": 0}
    kept = charts.funnel("Records in, kept and rejected per stage, in pipeline order",
                         [("read", read["kept"], read["rejected"])]
                         + [(s, c["kept"], c["rejected"]) for s, c in stages.items() if s != "read"])
    kept += (f"<p class='note'>Stages created {sum(run.stats.get('created', {}).values()):,} records (rewrites, "
             "samples) beside those read; a stage that works on some sources passes the others by, counted as kept.</p>")
    dropped = charts.bar_chart("Records rejected per reason", list(run.stats.get("rejected", {}).items()), "records")
    examples = {}
    for record in run.rejects:
        examples.setdefault(record["reject"], record)
    rows = "".join(f"<tr><td>{escape(reason)}</td><td>{n:,}</td><td>{escape(examples[reason]['id'])}</td>"
                   f"<td><pre>{escape(example_text(examples[reason]))}</pre></td></tr>"
                   for reason, n in run.stats.get("rejected", {}).items() if reason in examples)
    return (kept + dropped + "<h3>One example of each reject reason</h3><table><tr><th>reason</th><th>records</th>"
            f"<th>example id</th><th>text head / error</th></tr>{rows}</table>")


def example_text(record: dict[str, Any]) -> str:
    return record.get("text", "")[:300] + (f"\nerror: {record['error'][:200]}" if record.get("error") else "")


def text_section(run: RunFiles) -> str:
    hist = run.stats.get("length_histogram", {})
    parts = [cleaning_histogram(hist)] if hist.get("before") else []
    parts += [charts.histogram(f"Text length of {side} documents", list(hist.get(side, {}).items()), "characters")
              for side in ("written", "rejected") if hist.get(side)]
    stages = run.stats.get("stages", {})
    parts.append(charts.bar_chart("Text through the stages: what each stage read (cleaning shrinks it)",
                                  [(name, round(c["bytes_in"] / 1e6, 3)) for name, c in stages.items() if c["bytes_in"]],
                                  "MB of UTF-8 text in"))
    parts.append(charts.bar_chart("Languages of written documents", list(run.stats.get("languages", {}).items()),
                                  "documents"))
    rules = run.stats.get("rules", {})
    parts.append(charts.bar_chart("Quality rule hits (documents dropped by each rule group)",
                                  [(rule, figures["dropped"]) for rule, figures in rules.items()], "documents"))
    parts.append(charts.bar_chart("PII redactions by kind", list(run.stats.get("pii_redactions", {}).items()),
                                  "redactions"))
    parts.append(dedup_table(run.rejects))
    return "".join(parts)


def cleaning_histogram(hist: dict[str, dict[str, int]]) -> str:
    """Lengths as read and as they left the stages: extraction and cleaning move documents left."""
    before, after = hist.get("before", {}), hist.get("after", {})
    labels = [label for label in length_labels() if label in before or label in after]
    return charts.histograms("Text length before and after the stages (records read; records that passed)",
                             {"before: as the first stage saw it": before, "after: as the last stage saw it": after},
                             labels, "UTF-8 bytes")


def dedup_table(rejects: list[dict[str, Any]]) -> str:
    """Duplicate clusters: each kept document with the copies the dedup stage dropped for it."""
    clusters = defaultdict(list)
    for record in rejects:
        if record["reject"].startswith("dedup."):
            note = record.get("notes", {}).get("dedup", {})
            clusters[note.get("survivor") or note.get("cluster") or record["reject"]].append(record)
    rows = "".join(f"<tr><td>{escape(str(lead))}</td><td>{len(members)}</td><td>"
                   f"{escape(', '.join(sorted({m['reject'] for m in members})))}</td>"
                   f"<td>{escape(', '.join(m['id'] for m in members[:4]))}</td></tr>" for lead, members in clusters.items())
    return (f"<h3>Duplicate clusters found: {len(clusters)}</h3><table><tr><th>kept document</th><th>copies dropped"
            f"</th><th>reason</th><th>dropped (first 4)</th></tr>{rows}</table>")


def rephrase_section(run: RunFiles) -> str:
    """Each rewrite beside its source, with its style and the fidelity gate's scores: passed ones from
    stats.json's sample (the shards keep tokens, not scores), rejected ones from the rejects with the
    scores of every attempt; the verdicts counted by style and by failed check."""
    failed = [r for r in run.rejects if r["reject"].startswith("rephrase.")]
    sources = set(run.stage_sources("rephrase")) or {r["source"] for r in failed}  # []: every source it saw
    pieces = unique([p for pieces in run.pieces.values() for p in pieces
                     if p.offset == 0 and (p.doc_id.split("/", 1)[0] in sources or "#rephrase" in p.doc_id)])
    texts = {p.doc_id: p.text for p in pieces}
    unchanged = {r["derived_from"] for r in failed if r["id"].endswith("#rephrase0")}  # no rewrite of it passed
    passed = [passed_row(r, r["source_head"] or texts.get(r["source_id"], "(source not in the sampled shards)"))
              for r in run.stats.get("rewrites", [])]
    rows = "".join(rephrase_row(r, r.get("notes", {}).get("rephrase", {}).get("source_head")
                                or texts.get(r["derived_from"], "(source not in the sampled shards)")) for r in failed)
    kept = "".join(f"<tr><td>{escape(p.doc_id)}</td><td>{written_role(p.doc_id, unchanged)}</td>"
                   f"<td><pre>{escape(p.text[:1500])}</pre></td></tr>" for p in pieces[:4])
    header = "<tr><th>id</th><th>style / verdict</th><th>source</th><th>rewrite</th><th>fidelity scores</th></tr>"
    return (verdicts(run.stats) + f"<h3>Rewrites that passed the gate, beside their source ({len(passed)} shown)</h3>"
            f"<table>{header}{''.join(passed) or NONE_PASSED}</table><h3>Rejected rewrites, beside their source</h3><table>{header}"
            f"{rows or NONE_REJECTED}</table><h3>Written documents of the rephrased sources</h3><table><tr><th>id</th><th>what</th>"
            f"<th>text (decoded from the shard)</th></tr>{kept}</table>")


NONE_PASSED = "<tr><td colspan='5'>none in this run: every rewrite failed a check (below)</td></tr>"
NONE_REJECTED = "<tr><td colspan='5'>none in this run: every rewrite passed</td></tr>"


def verdicts(stats: dict[str, Any]) -> str:
    """The gate's verdicts: passed rewrites by style, rejected ones by the check that failed."""
    styles = stats.get("rewrite_styles", {})
    rejected = {reason: n for reason, n in stats.get("rejected", {}).items() if reason.startswith("rephrase.")}
    share = sum(rejected.values()) / max(sum(rejected.values()) + sum(styles.values()), 1)
    chart = charts.bar_chart("Rewrites by verdict: passed (by style), rejected (by the check that failed)",
                             [(f"passed: {style}", n) for style, n in styles.items()]
                             + [(f"rejected: {reason.removeprefix('rephrase.')}", n) for reason, n in rejected.items()],
                             "rewrites")
    return (f"<p>{sum(styles.values())} rewrites passed the fidelity gate, {sum(rejected.values())} were rejected "
            f"({share:.0%}). With keep_originals off, a passing rewrite takes its original's id, and the original is "
            "written unchanged when none passes. Scores: shares 0-1 (loop, copied, repeats_context: lower is better; "
            "names_dropped is the share of names kept, cosine the similarity: higher is better), counts of facts "
            "dropped or invented, the length ratio; a multi-chunk rewrite's scores are its chunks' mean.</p>" + chart)


def passed_row(rewrite: dict[str, Any], source: str) -> str:
    return (f"<tr><td>{escape(rewrite['id'])}</td><td>{escape(rewrite['style'])}<br>passed "
            f"({rewrite['chunks']} chunk{'s' if rewrite['chunks'] > 1 else ''})</td><td><pre>{escape(source[:1200])}</pre></td><td><pre>{escape(rewrite['text_head'])}</pre>"
            f"</td><td><pre class='scores'>{escape(score_lines(rewrite['scores']))}</pre></td></tr>")


def score_lines(scores: dict[str, float]) -> str:
    return "\n".join(f"{check} {value:g}" for check, value in scores.items())


def written_role(doc_id: str, unchanged: set[str]) -> str:
    """A passing rewrite takes its original's id (keep_originals off), so a written document is the
    original only when its rewrite 0 was rejected: then none passed."""
    if doc_id in unchanged:
        return "the original, unchanged (no rewrite passed)"
    return "a created rewrite" if "#rephrase" in doc_id else "the rewrite that passed the gate, under its original's id"


def rephrase_row(record: dict[str, Any], source: str) -> str:
    note = record.get("notes", {}).get("rephrase", {})
    scores = "\n\n".join(f"{a.get('style')}: {a.get('detail', '')}\n{score_lines(a.get('scores') or {})}"
                         for a in note.get("attempts", []))
    return (f"<tr><td>{escape(record['id'])}</td><td>{escape(note.get('style', '?'))}<br>{escape(record['reject'])}"
            f"</td><td><pre>{escape(source[:1200])}</pre></td><td><pre>{escape(record.get('text', '')[:1200])}</pre>"
            f"</td><td><pre class='scores'>{escape(scores)}</pre></td></tr>")


def unique(pieces: list[Piece]) -> list[Piece]:
    return list({p.doc_id: p for p in pieces}.values())


def renders_section(run: RunFiles) -> str:
    pairs = unique([p for pieces in run.pieces.values() for p in pieces if p.images and p.offset == 0])
    by_source = defaultdict(list)
    for piece in pairs:
        by_source[piece.doc_id.split("/", 1)[0]].append(piece)
    shown = [p for group in zip_longest_sources(by_source) for p in group][:GALLERY]
    gates = next((s for s in run.recipe.get("stages", []) if s.get("stage") == "render"), {})
    gallery = "".join(gallery_pair(p, gates) for p in shown)
    rejects = Counter(r["reject"] for r in run.rejects if r["reject"].split(".")[0] in RENDER_STAGES)
    rows = "".join(f"<tr><td>{escape(reason)}</td><td>{n}</td></tr>" for reason, n in rejects.most_common()) or \
        "<tr><td>none: every render passed its gates</td><td>0</td></tr>"
    return (f"<p>{len(pairs)} code-image documents in the sampled shards; {len(shown)} shown, taking each source "
            f"in turn.</p>{gallery}<h3>Render rejects (the gates' verdicts)</h3><table><tr><th>reason</th>"
            f"<th>records</th></tr>{rows}</table>")


RENDER_STAGES = ("render", "render_dedup", "code_image_samples")


def gallery_pair(piece: Piece, gates: dict[str, Any]) -> str:
    """The sample's text (code and prompt) beside its images, each with its size and gate measures."""
    images = "".join(f"<figure><img alt='render of {escape(piece.doc_id)}' src='{png_uri(png)}'><figcaption>"
                     f"{'x'.join(map(str, png_size(png)))} px; {escape(gate_measures(png, gates))}</figcaption></figure>"
                     for png in piece.images)
    return (f"<div class='pair'><div><b>{escape(piece.doc_id)}</b> (sample {escape(piece.sample)}, "
            f"{len(piece.text):,} characters)<pre>{escape(piece.text[:2500])}</pre></div><div>{images}</div></div>")


def zip_longest_sources(by_source: dict[str, list[Piece]]) -> list[list[Piece]]:
    """Pieces taken one source at a time (svg, pages, svg, ...), so every kind shows."""
    lists = list(by_source.values())
    return [[group[i] for group in lists if i < len(group)] for i in range(max(map(len, lists), default=0))]


def tokens_section(run: RunFiles) -> str:
    parts = []
    phases = run.stats.get("phases", {})
    for name, phase in phases.items():
        sources = phase.get("sources", {})
        parts.append(charts.bar_chart(f"Phase {name} ({phase['seq_len']:,}-token sequences): tokens per source",
                                      [(s, f["tokens"]) for s, f in sources.items()], "tokens",
                                      {s: f["target"] for s, f in sources.items() if f.get("target") is not None}))
    parts.append(charts.bar_chart("Fill per phase (tokens that are not padding)",
                                  [(name, round(100 * p.get("fill", 0), 2)) for name, p in phases.items()], "percent"))
    for name, samples in run.phases.items():
        lens = [int(n) for s in samples for n in s["doc_lens"]]
        parts.append(charts.histogram(f"Phase {name}: document piece lengths ({len(samples)} samples read)",
                                      length_buckets(lens), "tokens per document piece", "pieces"))
    rows = "".join(f"<tr><td>{escape(n)}</td><td>{p.get('samples', 0):,}</td><td>{p.get('tokens', 0):,}</td>"
                   f"<td>{p.get('budget', {}).get('target') or 0:,}</td><td>{p.get('docs', 0):,}</td>"
                   f"<td>{p.get('split_docs', 0):,}</td><td>{p.get('truncated_docs', 0):,}</td></tr>"
                   for n, p in phases.items())
    return parts_table("".join(parts), rows)


def parts_table(charts_html: str, rows: str) -> str:
    return (charts_html + "<table><tr><th>phase</th><th>samples</th><th>tokens</th><th>token target</th><th>docs</th>"
            f"<th>docs split</th><th>docs truncated</th></tr>{rows}</table>")


def length_buckets(lens: list[int]) -> list[tuple[str, int]]:
    """Powers of two: <64, 64-128, ... tokens."""
    counts: Counter[int] = Counter(max(n, 1).bit_length() for n in lens)
    return [(f"<{2 ** b}" if b <= 6 else f"{2 ** (b - 1)}-{2 ** b}", counts[b])
            for b in range(min(counts, default=1), max(counts, default=1) + 1)]


def sample_section(run: RunFiles) -> str:
    candidates = [(phase, s) for phase, samples in run.phases.items() for s in samples]
    if not candidates:
        return "<p>No samples: the run wrote no shards.</p>"
    phase, sample = max(candidates, key=lambda item: (len(item[1]["media_spans"]) > 0, len(item[1]["doc_ids"]) > 1))
    starts = [0, *accumulate(sample["doc_lens"].tolist())]
    strip = charts.sample_strip(f"Packed sample {sample['key']} (phase {phase}, {len(sample['tokens']):,} tokens)",
                                list(zip(starts, sample["doc_lens"].tolist(), sample["doc_ids"])),
                                int(sample["num_pad"]), sample["media_spans"], sample["loss_mask"].tolist())
    pieces = [p for p in run.pieces[phase] if p.sample == sample["key"]]
    listing = "".join(f"<tr><td>{i}</td><td>{escape(p.doc_id)}</td><td><pre class='short'>{escape(p.text[:800])}</pre></td><td>"
                      + "".join(f"<img width='96' alt='image' src='{png_uri(png)}'>" for png in p.images) + "</td></tr>"
                      for i, p in enumerate(pieces[:LISTED]))
    more = f"<p class='note'>and {len(pieces) - LISTED} more pieces</p>" if len(pieces) > LISTED else ""
    return (f"{strip}<table><tr><th>piece</th><th>document</th><th>decoded text</th><th>images</th></tr>"
            f"{listing}</table>{more}")


def time_section(run: RunFiles) -> str:
    return time_lines(run.stats) + time_bars(run.stats)


def time_lines(stats: dict[str, Any]) -> str:
    """Records/s and tokens/s per stage over the run (stats.json `throughput`: timeline.throughput)."""
    timeline = stats.get("throughput")
    if not timeline:
        return "<p class='note'>This run's stats.json has no throughput over time (a run of an older version).</p>"
    step = timeline["bin_s"]
    return (charts.stage_lines("Records per second over time, per stage (each row scaled to its peak)",
                               timeline["records_per_s"], step, "records/s")
            + charts.line_chart("Tokens per second over time, per stage (stages from tokenize on)",
                                timeline["tokens_per_s"], step, "tokens/s")
            + f"<p class='note'>Each stage's records and tokens spread evenly over the time its batches took in "
            f"each partition, in {len(next(iter(timeline['records_per_s'].values()), []))} bins of {step:,.3g} s. "
            "\"pack PHASE\" is a curriculum phase's packing and shard writing.</p>")


def time_bars(stats: dict[str, Any]) -> str:
    wall = stats.get("wall_s", 0.0)
    records = sum(stats.get("records_in", {}).values())
    spans = charts.bar_chart("Wall time per stage: its first batch's start to its last batch's end",
                             [*stats.get("stage_wall_s", {}).items(), ("whole run", wall)], "seconds (stages overlap)")
    rates = charts.bar_chart("Throughput over the whole run",
                             [("records/s", round(records / wall, 1) if wall else 0),
                              ("tokens/s (thousands)", round(stats.get("tokens", 0) / wall / 1000, 1) if wall else 0)],
                             "per second")
    busy = stats.get("stage_busy_s", {})
    stages = stats.get("stages", {})
    per_stage = charts.bar_chart("Worker time per stage (summed over workers)", list(busy.items()), "seconds")
    speed = charts.bar_chart("Records per worker-second, per stage", [
        (stage, round(stages[stage]["in"] / seconds, 1)) for stage, seconds in busy.items() if seconds and stage in stages],
        "records per second of one worker")
    return (spans + rates + per_stage + speed + "<p class='note'>Worker time is each batch's time in a stage, summed "
            "over the workers that ran it: on N busy workers it runs N times faster than the wall clock. Stages that "
            "pass a source's documents by count them, and their time, too.</p>")


TITLES = {"flow": "Flow: records per stage and per reject reason", "text": "Text: lengths, languages, quality, "
          "duplicates, PII", "rephrase": "Rephrasing: rewrites and their fidelity", "renders": "Renders: code beside "
          "its image", "tokens": "Tokens: per source and phase, budgets, fill, lengths", "sample": "One packed sample",
          "time": "Time: throughput over time and wall time per stage"}
BUILDERS = {"flow": flow, "text": text_section, "rephrase": rephrase_section, "renders": renders_section,
            "tokens": tokens_section, "sample": sample_section, "time": time_section}
