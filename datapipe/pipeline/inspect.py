"""`datapipe inspect OUT_DIR`: what a run wrote, read back from its files alone."""
from __future__ import annotations

import json
from itertools import islice
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from datapipe.loader.stream import stream
from datapipe.pipeline.partitions import DOCUMENTS
from datapipe.pipeline.report import phase_figures, summary_table
from datapipe.shardformat import MANIFEST, phase_name, read_manifest


def inspect_run(out_dir: Path, n_samples: int, console: Console) -> None:
    stats_path = out_dir / "stats.json"
    if not stats_path.is_file():
        raise FileNotFoundError(f"{stats_path}: not a datapipe output folder (no stats.json); run `datapipe run` first")
    stats = json.loads(stats_path.read_text())
    console.print(summary_table(stats, f"run {out_dir}"))
    decode = load_decoder(out_dir)
    for folder in sorted(p.parent for p in out_dir.glob(f"*/{MANIFEST}")):
        console.print(phase_table(folder, phase_figures(stats).get(folder.name, {})))
        for sample in islice(stream(folder), n_samples):
            console.print(describe_sample(sample, decode), highlight=False)
    files = sorted(out_dir.glob(f"{DOCUMENTS}/*.jsonl.zst"))
    if files:  # a run without phases: its documents are the output
        console.print(f"documents: {sum(stats['written'].values()):,} in {len(files):,} files under "
                      f"{escape(str(out_dir / DOCUMENTS))}/ (JSON lines, zstd)", highlight=False)
    show_reject_examples(out_dir, console)


def describe_sample(sample: dict, decode) -> str:
    """A sample's key, pieces, padding, images and loss tokens, then its first document decoded."""
    first_len = int(sample["doc_lens"][0])
    text = decode(sample["tokens"][:first_len].tolist()) if decode else "(no tokenizer to decode)"
    loss = int(sample["loss_mask"].sum()) if "loss_mask" in sample else "-"
    return (f"[bold]{sample['key']}[/bold] docs={len(sample['doc_lens'])} pad={sample['num_pad']} "
            f"images={len(sample.get('images', []))} loss_tokens={loss} first={escape(sample['doc_ids'][0])}:\n"
            f"{escape(repr(text[:400]))}")  # decoded text is data: "[target_list]" is not rich markup


def phase_table(folder: Path, packed: dict) -> Table:
    """A phase's shards from its manifest, with the curriculum figures of stats.json beside them
    (metric and value rows, like the run summary: nine columns do not fit 80 characters)."""
    manifest = read_manifest(folder)
    table = Table(title=f"phase {phase_name(manifest, str(folder))} ({folder})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    capacity = manifest["samples"] * manifest.get("seq_len", 0)
    target = packed.get("budget", {}).get("target")
    figures = {"docs": "docs", "docs split": "split_docs", "docs truncated": "truncated_docs"}
    rows = {"shards": f"{len(manifest['shards']):,}", "samples": f"{manifest['samples']:,}",
            "seq_len": f"{manifest.get('seq_len', 0):,}", "tokens": f"{manifest['tokens']:,}",
            "fill": f"{manifest['tokens'] / capacity:.2%}" if capacity else "-"}
    rows.update({name: f"{packed[key]:,}" if key in packed else "-" for name, key in figures.items()})
    rows["token target"] = f"{target:,}" if target is not None else "-"
    for name, value in rows.items():
        table.add_row(name, value)
    return table


def load_decoder(out_dir: Path):
    """The run's tokenizer (from recipe.json) as a decode function, or None."""
    from tokenizer.bpe import load_tokenizer

    recipe_path = out_dir / "recipe.json"
    if not recipe_path.is_file():
        return None
    stages = json.loads(recipe_path.read_text()).get("stages", [])
    names = [s["tokenizer"] for s in stages if s.get("stage") == "tokenize"]
    try:
        return load_tokenizer(names[0]).decode if names else None
    except FileNotFoundError:
        return None


def read_rejects(out_dir: Path | str):
    """Every rejected record of a finished run, in run order: the lines of out/rejects/p*.jsonl (one
    file a partition, written by the workers)."""
    for path in sorted(Path(out_dir, "rejects").glob("*.jsonl")):
        with open(path, encoding="utf-8") as lines:
            yield from map(json.loads, lines)


def show_reject_examples(out_dir: Path, console: Console) -> None:
    """One example line per reject reason, so a user sees what each reason looks like."""
    seen: dict[str, dict] = {}
    for record in read_rejects(out_dir):
        seen.setdefault(record["reject"], record)
    for reason, record in seen.items():
        example = escape(f"{record['source_id']}: {record['text'][:120]!r}")
        if record.get("error"):  # late rejects (pack.*) carry no error: their reason says it all
            example += escape(f" error: {record['error'][:200]}")
        console.print(f"[yellow]{escape(reason)}[/yellow] e.g. {example}", highlight=False)


STRIP_WIDTH = 100  # characters at most (fewer in a narrower terminal): a cell is seq_len / 100 tokens, 82 at 8K
PIECE_STYLES = ("cyan", "magenta", "green", "yellow", "blue", "red")


def show_sample(out_dir: Path, index: int, phase: str | None, console: Console) -> None:
    """`inspect --sample N`: one packed sample drawn as a strip, then its pieces decoded."""
    folders = sorted(p.parent for p in out_dir.glob(f"*/{MANIFEST}"))
    if not folders:
        raise FileNotFoundError(f"{out_dir}: no phase folder with a {MANIFEST}; run `datapipe run` first")
    folder = next((f for f in folders if f.name == phase), None) if phase else folders[0]
    if folder is None:
        raise FileNotFoundError(f"{out_dir}: no phase {phase!r}; phases: {', '.join(f.name for f in folders)}")
    sample = next(islice(stream(folder), index, None), None)
    if sample is None:
        raise FileNotFoundError(f"{folder}: no sample {index}; it holds {read_manifest(folder)['samples']} (from 0)")
    console.print(draw_sample(sample, min(STRIP_WIDTH, console.width - 2)), highlight=False)
    decode = load_decoder(out_dir)
    start = 0
    for i, (doc_id, length) in enumerate(zip(sample["doc_ids"], sample["doc_lens"].tolist())):
        text = decode(sample["tokens"][start:start + length].tolist()) if decode else "(no tokenizer to decode)"
        console.print(f"[{PIECE_STYLES[i % len(PIECE_STYLES)]}]{i}[/] {escape(doc_id)} tokens {start}-{start + length}: "
                      f"{escape(repr(text[:160]))}", highlight=False)
        start += length


def draw_sample(sample: dict, width: int = STRIP_WIDTH) -> str:
    """Rich markup: a row of cells, one per seq_len/STRIP_WIDTH tokens, lettered by document piece
    (a new letter at each boundary), '#' where a media span is, '.' padding; under it the loss mask."""
    seq_len = len(sample["tokens"])
    owner = np.repeat(np.arange(len(sample["doc_lens"])), sample["doc_lens"])  # piece index per token
    media = np.zeros(seq_len, bool)
    for start, stop in sample["media_spans"]:
        media[start:stop] = True
    loss = sample["loss_mask"] if "loss_mask" in sample else np.ones(seq_len, np.uint8)
    cells, mask = [], []
    for cell in np.array_split(np.arange(seq_len), min(width, seq_len)):
        first = int(cell[0])
        if first >= len(owner):
            cells.append("[dim].[/dim]")
        else:
            piece = int(owner[first])
            char = "#" if media[cell].any() else chr(ord("A") + piece % 26)
            cells.append(f"[{PIECE_STYLES[piece % len(PIECE_STYLES)]}]{char}[/]")
        mask.append("▀" if loss[cell].mean() >= 0.5 else " ")
    return (f"[bold]{sample['key']}[/bold] seq_len={seq_len:,} pieces={len(sample['doc_lens'])} pad={sample['num_pad']} "
            f"media spans={len(sample['media_spans'])}\n(a cell = {seq_len / len(cells):.0f} tokens; letters: pieces, "
            f"#: image tokens, .: padding)\n|{''.join(cells)}|\n|{''.join(mask)}| loss mask (▀: loss applies)")
