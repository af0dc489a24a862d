"""`datapipe inspect OUT_DIR`: what a run wrote, read back from its files alone."""
from __future__ import annotations

import json
from itertools import islice
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from datapipe.loader.stream import stream
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
