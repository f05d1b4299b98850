"""The runtime's garbage-collector policy: CPython's cyclic collector thresholds while it runs.

CPython collects its youngest generation every 700 net allocations of
container objects (`gc.get_threshold()` is `(700, 10, 10)` by default), the
middle one every 10 young collections, and the whole heap every 10 middle
ones once the heap grew by a quarter since the last full collection. A burst
of many concurrent turns keeps hundreds of thousands of objects alive (awake
logs, requests in flight, connections), so at those thresholds the
collector keeps walking them, and a heap that grows through the burst gets
walked whole again and again: at 1,000 concurrent sessions
(`benchmarks/parallel_sessions.py`) about a third of the client's CPU went
to collections, most of it to five full ones, against almost nothing at 100
sessions. A young threshold of 100,000 leaves the steady state's memory
alone (only cyclic garbage waits longer; reference counting still frees
everything else at once, and a turn of the runtime's own leaves no cyclic
garbage: `tests/agent/test_no_cycles.py`), takes those full collections out
of a burst, and leaves one or two young collections in a 1,000-session burst
(10,000 left about forty and three or four middle ones, 0.15 to 0.25 ms of CPU
per step).

`applied_thresholds` sets thresholds for as long as a runtime is open
(`open_runtime(gc_thresholds=...)`) and restores the process's own when the
last runtime that set any closes, so runtimes opened side by side (or one
inside another, in any order of closing) leave the collector as they found it.
"""

from __future__ import annotations

import gc
import itertools
from collections.abc import Iterator
from contextlib import contextmanager

GcThresholds = tuple[int, int, int]
"""The three `gc.set_threshold` values: young, middle and old generation."""

DEFAULT_GC_THRESHOLDS: GcThresholds = (100_000, 10, 10)
"""What `open_runtime` sets by default: CPython's own, but a young threshold of 100,000."""


class GcPolicyError(ValueError):
    """A garbage-collector threshold is out of range; the message names it."""


_tokens = itertools.count()
_active: dict[int, GcThresholds] = {}
"""The thresholds of every open `applied_thresholds`, by entry order (latest last)."""
_saved: list[GcThresholds] = []
"""The process's thresholds from before the first open `applied_thresholds` (while any is)."""


def check_thresholds(thresholds: GcThresholds) -> GcThresholds:
    """`thresholds` if each is a positive integer.

    Raises:
        GcPolicyError: one is not (a young threshold of 0 would turn the
            collector off, which is not a policy the runtime applies).
    """
    if len(thresholds) != 3:
        raise GcPolicyError(
            f"gc thresholds are three numbers (young, middle, old), got {thresholds!r}"
        )
    for name, value in zip(("young", "middle", "old"), thresholds, strict=True):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise GcPolicyError(f"gc threshold {name} must be an integer >= 1, got {value!r}")
    return thresholds


@contextmanager
def applied_thresholds(thresholds: GcThresholds | None) -> Iterator[None]:
    """Collect garbage at `thresholds` inside the block (None: leave the collector alone).

    While blocks are open the collector uses the thresholds of the latest
    one opened that is still open; when the last closes, the thresholds in
    effect before the first opened are restored (a change made by hand in
    between is overwritten). Nothing else of the collector changes (it is
    never disabled, frozen or run).

    Raises:
        GcPolicyError: a threshold is out of range (nothing is changed).
    """
    if thresholds is None:
        yield
        return
    check_thresholds(thresholds)
    token = next(_tokens)
    if not _active:
        _saved[:] = [gc.get_threshold()]
    _active[token] = thresholds
    gc.set_threshold(*thresholds)
    try:
        yield
    finally:
        del _active[token]
        if _active:
            gc.set_threshold(*next(reversed(_active.values())))
        else:
            gc.set_threshold(*_saved.pop())
