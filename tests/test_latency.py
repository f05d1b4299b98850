"""The latency ring: nearest-rank percentiles over the latest samples, bounded memory."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.latency import LatencySummary, LatencyWindow


def test_an_empty_window_has_no_percentiles() -> None:
    assert LatencyWindow().summary() == LatencySummary(samples=0, p50_ms=None, p99_ms=None)


def test_percentiles_are_nearest_rank_in_milliseconds() -> None:
    window = LatencyWindow()
    for ms in range(1, 101):
        window.record(ms / 1000)
    summary = window.summary()
    assert (summary.samples, summary.p50_ms, summary.p99_ms) == (100, 50.0, 99.0)


def test_only_the_latest_samples_are_kept() -> None:
    window = LatencyWindow(size=4)
    for seconds in (9.0, 9.0, 9.0, 0.001, 0.002, 0.003, 0.004):
        window.record(seconds)
    summary = window.summary()
    assert summary.samples == 4
    assert summary.p99_ms == pytest.approx(4.0)


def test_a_window_needs_room_for_one_sample() -> None:
    with pytest.raises(ValueError, match="size must be >= 1, got 0"):
        LatencyWindow(size=0)


@given(st.lists(st.floats(min_value=0, max_value=100), min_size=1, max_size=300))
def test_percentiles_are_samples_in_order(samples: list[float]) -> None:
    window = LatencyWindow(size=128)
    for seconds in samples:
        window.record(seconds)
    summary = window.summary()
    kept = [s * 1000.0 for s in samples[-128:]]
    assert summary.samples == len(kept)
    assert summary.p50_ms in kept and summary.p99_ms in kept
    assert summary.p50_ms is not None and summary.p99_ms is not None
    assert min(kept) <= summary.p50_ms <= summary.p99_ms <= max(kept)


def test_recording_keeps_no_object_per_sample() -> None:
    window = LatencyWindow(size=64)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for n in range(1000):
            window.record(n / 1000)  # a new float each: the window must not keep them
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    kept = sum(stat.count_diff for stat in after.compare_to(before, "filename"))
    assert kept < 8  # the loop's last `n`, not one block per sample in the window
    assert window.summary().samples == 64
