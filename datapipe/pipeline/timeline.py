"""Throughput over time per stage, from spans the workers recorded, in a fixed number of time bins.

Every batch a stage runs stamps its records with the batch's start and end (Document.stage_ms,
set by datapipe.pipeline.apply; reading by partitions.numbered_blocks). The commit folds them
into four numbers a stage per partition (RunStats.stage_times: first start, last end, records,
tokens), so a partition marker, and what the driver holds, stays the same size however many
documents the partition has. At the end of the run the driver spreads each partition's records
and tokens evenly over its span into BINS bins between the run's start and end (plus each pack
group's span): records/s and tokens/s per stage over time, for stats.json's `throughput`.

The trade-off: inside one partition the rate is taken as flat, so a run of a few large
partitions draws a few plateaus; a run of many partitions (the usual case: a partition is a
file) draws its real curve. A resumed run's partitions from an earlier attempt fall before this
attempt's start and are left out of the curve (their figures stay in every other count).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

BINS = 60  # a minute's run in seconds, a day's in 24-minute steps: fine enough to see a stall, and 60 numbers a stage


def add_times(times: dict[str, list[int]], stage: str, more: list[int]) -> None:
    """Merge `more` ([start ms, end ms, records, tokens]) into a stage's times: the span widens, counts add."""
    if stage not in times:
        times[stage] = list(more)
        return
    start, end, records, tokens = times[stage]
    times[stage] = [min(start, more[0]), max(end, more[1]), records + more[2], tokens + more[3]]


def throughput(entries: Iterable[tuple[str, list[int]]], start_ms: int, end_ms: int, bins: int = BINS) -> dict[str, Any]:
    """Records/s and tokens/s per stage in `bins` equal bins over [start_ms, end_ms], from
    (stage, [start ms, end ms, records, tokens]) entries; tokens/s only for stages that passed tokens."""
    width = max(end_ms - start_ms, 1) / bins
    records: dict[str, np.ndarray] = {}
    tokens: dict[str, np.ndarray] = {}
    for stage, (start, end, n_records, n_tokens) in entries:
        share = bin_shares(start, end, start_ms, width, bins)
        records[stage] = records.get(stage, np.zeros(bins)) + share * n_records
        tokens[stage] = tokens.get(stage, np.zeros(bins)) + share * n_tokens
    seconds = width / 1000
    return {"start_unix_s": round(start_ms / 1000, 3), "bin_s": round(seconds, 3),
            "records_per_s": {stage: rounded(counts / seconds) for stage, counts in records.items()},
            "tokens_per_s": {stage: rounded(counts / seconds) for stage, counts in tokens.items() if counts.any()}}


def bin_shares(start: int, end: int, origin: int, width: float, bins: int) -> np.ndarray:
    """The share of the span [start, end] that falls in each bin (an instant: all of it in its bin);
    what falls outside the bins is dropped."""
    edges = origin + width * np.arange(bins + 1)
    if end <= start:
        share = np.zeros(bins)
        index = int((start - origin) // width)
        if 0 <= index < bins:
            share[index] = 1.0
        return share
    overlap = np.clip(np.minimum(edges[1:], end) - np.maximum(edges[:-1], start), 0, None)
    return overlap / (end - start)


def rounded(values: np.ndarray) -> list[float]:
    """Three significant digits: stats.json stays small, and a plot needs no more."""
    return [float(f"{value:.3g}") for value in values]
