"""Recent latencies in bounded memory: a fixed-size ring, summarised on demand.

Recording is one store into a preallocated array of C doubles (the hot
path); percentiles are computed only when a snapshot is asked for
(`summary()`), over the last `size` samples, so memory never grows with
the number of requests or commits. A sample is not kept as a Python
`float`: a ring of float objects would leave the last `size` of them
alive after a burst of requests, scattered over the small-object
allocator's arenas that burst used, so those arenas could never be given
back (see benchmarks/README.md, "Parallel sessions").
"""

from __future__ import annotations

import math
from array import array

import attrs

DEFAULT_WINDOW = 1024
"""Samples kept: the latest 1,024 (older ones fall off the ring)."""


@attrs.frozen(kw_only=True)
class LatencySummary:
    """Percentiles of the recent samples, in milliseconds; None while there is no sample.

    Attributes:
        samples: how many samples the percentiles are over (at most the window size).
        p50_ms: the median (nearest-rank).
        p99_ms: the 99th percentile (nearest-rank).
    """

    samples: int
    p50_ms: float | None
    p99_ms: float | None


@attrs.define(eq=False)
class LatencyWindow:
    """The last `size` latencies recorded (in seconds); older samples are dropped, never summed."""

    size: int = DEFAULT_WINDOW
    _samples: array[float] = attrs.field(init=False)
    _next: int = attrs.field(default=0, init=False)  # where the next sample goes
    _count: int = attrs.field(default=0, init=False)  # samples held, at most `size`

    def __attrs_post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"latency window size must be >= 1, got {self.size}")
        self._samples = array("d", bytes(8 * self.size))

    def record(self, seconds: float) -> None:
        """Add one sample (seconds); the oldest is overwritten once the window is full."""
        index = self._next
        self._samples[index] = seconds
        self._next = 0 if index + 1 == self.size else index + 1
        if self._count < self.size:
            self._count += 1

    def summary(self) -> LatencySummary:
        """p50 and p99 (nearest-rank) of the samples in the window, in milliseconds."""
        ordered = sorted(self._samples[: self._count])
        if not ordered:
            return NO_SAMPLES
        return LatencySummary(
            samples=len(ordered),
            p50_ms=_rank(ordered, 0.50) * 1000.0,
            p99_ms=_rank(ordered, 0.99) * 1000.0,
        )


def _rank(ordered: list[float], fraction: float) -> float:
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


NO_SAMPLES = LatencySummary(samples=0, p50_ms=None, p99_ms=None)
"""The summary of a window that has no sample yet."""
