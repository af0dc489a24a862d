"""Throughput over time: partitions' stage spans spread into fixed time bins, nothing gained or lost."""
import pytest

from datapipe.pipeline.timeline import add_times, throughput


def test_spans_spread_evenly_and_every_record_lies_in_the_bins():
    entries = [("read", [0, 10_000, 100, 0]), ("read", [5_000, 5_000, 7, 0]),  # a span, then an instant
               ("tokenize", [10_000, 20_000, 50, 4_000])]
    timeline = throughput(entries, 0, 20_000, bins=4)
    assert timeline["bin_s"] == 5.0
    assert timeline["records_per_s"]["read"] == [10.0, 11.4, 0.0, 0.0]  # 50 a bin, the instant's 7 in its bin
    assert timeline["records_per_s"]["tokenize"] == [0.0, 0.0, 5.0, 5.0]
    assert timeline["tokens_per_s"] == {"tokenize": [0.0, 0.0, 400.0, 400.0]}  # stages with tokens only
    in_bins = sum(timeline["records_per_s"]["read"]) * timeline["bin_s"]
    assert in_bins == pytest.approx(107)


def test_what_falls_before_the_run_is_left_out():
    """A resumed run's partitions from an earlier attempt lie before its start."""
    timeline = throughput([("read", [-10_000, 0, 10, 0]), ("read", [-4_000, 4_000, 8, 0])], 0, 8_000, bins=2)
    assert timeline["records_per_s"]["read"] == [1.0, 0.0]  # half of the second span, in the first 4 s


def test_stage_times_merge_their_spans_and_add_their_counts():
    times = {}
    add_times(times, "pii", [50, 60, 3, 0])
    add_times(times, "pii", [10, 40, 2, 5])
    assert times == {"pii": [10, 60, 5, 5]}
