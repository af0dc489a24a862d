"""What a run shows a person: the progress bar while it runs, the summary table at its end.

The figures come from datapipe.pipeline.stats (RunStats, stats.json)."""
from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from datapipe.pipeline.stats import RunStats

REFRESH_PER_S = 2  # rich's default 10 cost the driver 3 s of CPU over a 100-second run (py-spy)


def partition_progress(console: Console) -> Progress:
    """Partitions committed of all with the time left, and records and tokens with their rates (both plans)."""
    return Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[records]:,.0f} records ({task.fields[rps]:,.0f}/s)"),
                    TextColumn("{task.fields[tokens]:,} tokens ({task.fields[tps]:,.0f}/s)"),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=False,
                    refresh_per_second=REFRESH_PER_S)


def task_progress(console: Console) -> Progress:
    """A bar over a known number of tasks (pack groups, accounts): done of all, elapsed, remaining."""
    return Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=False,
                    refresh_per_second=REFRESH_PER_S)


def update_progress(progress: Progress, task: Any, stats: RunStats, partitions: int | None = None) -> None:
    """The bar's figures from the run's counters so far; `partitions` done, for a bar over partitions."""
    elapsed = max(time.monotonic() - stats.started, 1e-9)
    done = stats.written.total() + stats.rejected.total()
    figures = {"tokens": stats.tokens, "rps": done / elapsed, "tps": stats.tokens / elapsed}
    if partitions is None:
        progress.update(task, completed=done, **figures)
    else:
        progress.update(task, completed=partitions, records=done, **figures)


def megabytes(n_bytes: int) -> str:
    return f"{n_bytes / 1e6:,.2f} MB"


def summary_table(stats: dict[str, Any], title: str) -> Table:
    """The end-of-run table: what came in, what went out, and why anything was rejected."""
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    records_in, created = sum(stats["records_in"].values()), sum(stats["created"].values())
    table.add_row("records in", f"{records_in:,}")
    if created:
        table.add_row("records created by stages", f"{created:,}")
    table.add_row("records written", f"{sum(stats['written'].values()):,}")
    table.add_row("records rejected", f"{sum(stats['rejected'].values()):,}")
    for reason, n in stats["rejected"].items():
        table.add_row(f"  {reason}", f"{n:,} ({megabytes(stats.get('rejected_bytes', {}).get(reason, 0))})")
    for stage, counts in stats.get("stages", {}).items():
        if "bytes_in" in counts:
            size = f" ({megabytes(counts['bytes_in'])} in)" if counts["bytes_in"] else ""
            table.add_row(f"stage {stage}: in / kept / rejected",
                          f"{counts['in']:,} / {counts['kept']:,} / {counts['rejected']:,}{size}")
    for rule, counts in stats.get("rules", {}).items():
        table.add_row(f"  rule {rule}: in / kept / dropped", f"{counts['in']:,} / {counts['kept']:,} / {counts['dropped']:,}")
    if stats.get("pii_redactions"):
        table.add_row("PII redacted", ", ".join(f"{kind} {n:,}" for kind, n in stats["pii_redactions"].items()))
    if set(stats.get("languages", {})) - {"unknown"}:
        top = ", ".join(f"{lang} {n:,}" for lang, n in list(stats["languages"].items())[:6])
        table.add_row("languages written", top)
    table.add_row("tokens written", f"{stats['tokens']:,}")
    for phase, packed in phase_figures(stats).items():
        table.add_row(f"phase {phase}", phase_summary(packed))
        for source, use in packed.get("sources", {}).items():
            table.add_row(f"  {phase} {source}", f"{use['tokens']:,} tokens (target {use['target']:,})")
    table.add_row("accounting", "in + created = written + rejected" if stats["balanced"] else "[red]UNBALANCED")
    table.add_row("wall time", f"{stats['wall_s']:.1f} s")
    return table


def phase_figures(stats: dict[str, Any]) -> dict[str, Any]:
    """stats.json's figures per curriculum phase (runs before the rename to phases said "packing")."""
    return stats.get("phases", stats.get("packing", {}))


def phase_summary(packed: dict[str, Any]) -> str:
    """One curriculum phase in a line: samples, fill, what happened to long documents, tokens against budget."""
    line = (f"{packed['samples']:,} samples x {packed['seq_len']:,} in {packed['shards']} shards, "
            f"fill {packed['fill']:.2%}, {packed.get('docs', 0):,} docs ({packed.get('split_docs', 0):,} split")
    line += f", {packed['truncated_docs']:,} truncated" if packed.get("truncated_docs") else ""
    line += f", {packed['upsampled_copies']:,} upsampled copies" if packed.get("upsampled_copies") else ""
    budget = packed.get("budget", {})
    limit = f", [yellow]limited by {budget['limited_by']}[/yellow]" if budget.get("limited_by") else ""
    return line + f"), {packed['tokens']:,} tokens of {budget.get('target', packed['tokens']):,} target{limit}"
