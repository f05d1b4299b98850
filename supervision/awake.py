"""Awake agents: how many of a runtime's hosted agents run at once, and memory given back after.

An idle hosted agent holds no task; `AwakeAgents` (the runtime's
`actors.agent.awake_slots.AwakeSlots`) admits it when input wakes it, and
its loop task holds a slot from before its session wakes until it went idle
again. The runtime shares one `AwakeAgents` between its hosted agents: it
bounds how many are awake at once (`limit`; agents beyond it wait in a
queue as one reference each, with no task), and once a burst of them has gone back
to sleep it asks the C allocator to give the freed memory back to the
operating system (`trim`, glibc's `malloc_trim` where there is one).

Why trimming is needed at all: a burst of turns allocates per awake
session (the loaded log, the assembled request, the HTTP exchange), and
glibc keeps the pages of what was freed mapped for reuse, so after the
burst the process's RSS stays near its high-water mark while idle
sessions keep a fraction of it. Trimming runs only when no agent is awake,
after at least `trim_after` agents went to sleep since the last trim and
`quiet` seconds passed with no wake, so never per step or per turn, and
never while a burst is still running (its pages would be faulted in again
at once).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections import deque
from collections.abc import Callable

import attrs
import trio

TRIM_QUIET_SECONDS = 0.5
"""How long no agent may wake before freed memory is given back."""
TRIM_AFTER_SLEEPS = 64
"""How many agents must have gone to sleep since the last trim for another to be worth it."""


def find_malloc_trim() -> Callable[[], object] | None:
    """glibc's `malloc_trim(0)` through ctypes, or None where the C library has none.

    Looked up in the process's own C library on Linux (glibc has it; musl,
    macOS and Windows do not), so elsewhere trimming is simply not done.
    The function returned releases the free memory at the top of the heap
    and the free pages inside it, of every malloc arena (threads' too); it
    blocks for as long as that takes.
    """
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def malloc_trim() -> object:
        return trim(0)

    return malloc_trim


def _limit(instance: object, attribute: attrs.Attribute[int | None], value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"max_awake must be at least 1, got {value}")


@attrs.frozen(kw_only=True)
class AwakeStatistics:
    """A snapshot of `AwakeAgents`: agents awake now, admissions waiting for a slot (an agent
    closed while it waited counts until its turn comes and it declines), the bound, and the
    trims started."""

    awake: int
    waiting: int
    limit: int | None
    trims: int
    trim_supported: bool


@attrs.define(eq=False)
class AwakeAgents:
    """Counts (and optionally bounds) awake agents; gives memory back once they all slept.

    Each awake period begins with `admit` (the agent's start callback runs
    at once when fewer than `limit` agents are awake and none waits, else
    once a slot frees, first come first served) and ends with `release`.
    `serve` (a service of the runtime) trims the allocator as the module
    docstring says; without `trim` (no `malloc_trim` here, or trimming
    turned off) it only counts.
    """

    limit: int | None = attrs.field(default=None, validator=_limit)
    trim: Callable[[], object] | None = attrs.field(factory=find_malloc_trim)
    quiet: float = TRIM_QUIET_SECONDS
    trim_after: int = TRIM_AFTER_SLEEPS
    _waiting: deque[Callable[[], bool]] = attrs.field(factory=deque, init=False)
    _awake: int = attrs.field(default=0, init=False)
    _wakes: int = attrs.field(default=0, init=False)
    _slept: int = attrs.field(default=0, init=False)  # awake periods ended since the last trim
    _asleep_since: float = attrs.field(default=0.0, init=False)  # when the last one slept
    _all_asleep: trio.Event | None = attrs.field(default=None, init=False)  # while waited for
    _trims: int = attrs.field(default=0, init=False)

    def admit(self, start: Callable[[], bool], /) -> None:
        """Run `start` holding a slot: now if one is free and nobody waits, else once one frees.

        If `start` returns False (the agent closed while it waited) its slot
        is freed at once. Never blocks; `start` runs in the task that calls
        `admit` or `release`.
        """
        if self._waiting or not self._slot_free():
            self._waiting.append(start)
            return
        self._start(start)

    def release(self) -> None:
        """Free the slot of an agent that went idle, and admit those waiting while slots are free.

        Never raises, never blocks.
        """
        self._asleep()
        while self._waiting and self._slot_free():
            self._start(self._waiting.popleft())

    def _start(self, start: Callable[[], bool]) -> None:
        """Give `start` a slot and run it; a declined slot is freed at once."""
        self._awake += 1
        self._wakes += 1
        if not start():
            self._asleep()

    def _slot_free(self) -> bool:
        return self.limit is None or self._awake < self.limit

    def _asleep(self) -> None:
        self._awake -= 1
        self._slept += 1
        if self._awake == 0:
            self._asleep_since = trio.current_time()
            if self._all_asleep is not None and self._trim_due():
                self._all_asleep.set()

    def statistics(self) -> AwakeStatistics:
        """Agents awake now, the bound and how many trims were started."""
        return AwakeStatistics(
            awake=self._awake,
            waiting=len(self._waiting),
            limit=self.limit,
            trims=self._trims,
            trim_supported=self.trim is not None,
        )

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Give freed memory back after each burst of awake agents; runs until cancelled.

        Waits until no agent is awake and at least `trim_after` went to
        sleep since the last trim, and `quiet` seconds have passed since
        the last one slept with no wake in between, then runs `trim` in a
        worker thread (it blocks while it walks the heap).
        Without `trim` it only waits to be cancelled.

        Cancellation: prompt, also while trimming (the trim's thread
        finishes on its own; it changes no Python state).
        """
        task_status.started()
        if self.trim is None:
            await trio.sleep_forever()
        trim = self.trim
        while True:
            await self._quiet_after_burst()
            self._slept = 0
            self._trims += 1
            await trio.to_thread.run_sync(trim, abandon_on_cancel=True)

    def _trim_due(self) -> bool:
        return self._awake == 0 and self._slept >= self.trim_after

    async def _quiet_after_burst(self) -> None:
        while True:
            if not self._trim_due():
                self._all_asleep = trio.Event()
                try:
                    await self._all_asleep.wait()
                finally:
                    self._all_asleep = None
            wakes = self._wakes
            await trio.sleep_until(self._asleep_since + self.quiet)
            if self._wakes == wakes:
                return
