"""Admission of a provider's requests: a cap on progressing requests, plus a stall budget.

A provider actor caps its requests in flight (`max_in_flight`), because a
provider limits concurrency per account. A plain cap lets a few stalled
requests starve everyone: 16 stalled streams, each waiting out its read
timeout, hold all 16 slots, and every healthy session queues behind them.

So a request that has produced no chunk for `StallPolicy.stall_after`
seconds is *set aside*: it keeps its stream (nothing is cancelled, it may
still answer) but gives its slot back, and counts against a separate budget
of `StallPolicy.max_stalled` set-aside requests. A set-aside request that
produces a chunk again goes on at once (it is never paused mid-stream) and
counts as progressing again, even if that briefly puts the progressing
count above the cap; new requests wait until it is back under the cap.
When the budget is full, a stalled request keeps its slot until a budget
place frees up or it progresses. Hence at most `max_in_flight +
max_stalled` requests are ever open, and a stall costs healthy traffic at
most `stall_after` seconds of one slot. The stalled request itself is
bounded by the adapter's own clocks (read-idle, no-data, deadline).
"""

from __future__ import annotations

import heapq
import itertools
import math

import attrs
import trio


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value > 0:  # also refuses NaN
        raise ValueError(f"{attribute.name} must be a positive number of seconds, got {value!r}")


def _non_negative(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value}")


@attrs.frozen(kw_only=True)
class StallPolicy:
    """When a request in flight counts as stalled, and how many may be set aside.

    Attributes:
        stall_after: Seconds without a chunk (from admission, then from the
            last chunk) after which a request is set aside.
        max_stalled: The most requests set aside at once; 0 turns setting
            aside off (a plain cap).
    """

    stall_after: float = attrs.field(default=2.0, validator=_positive)
    max_stalled: int = attrs.field(default=16, validator=_non_negative)


@attrs.define(eq=False)
class Admission:
    """Admits requests under a cap on progressing ones, with a budget for stalled ones.

    Any number of tasks may wait in `acquire` at once: they are admitted
    one by one in the order they came, each slot freed being handed to the
    longest waiter (so a freed slot never wakes more waiters than it can
    admit). Each admitted request holds a `Ticket`, reports its chunks with
    `Ticket.progressed()` and calls `Ticket.release()` when it ends; one task
    beside them all runs `watch()`, which sets requests aside as they stall.
    `close()` ends every wait: `acquire` admits nothing afterwards.
    """

    max_in_flight: int
    policy: StallPolicy
    _progressing: int = attrs.field(default=0, init=False)
    _stalled: int = attrs.field(default=0, init=False)
    _stalls: int = attrs.field(default=0, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    # Waiters, oldest first; those woken by `_admit_waiters` were handed their slot (`_handed`).
    _waiters: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot, init=False)
    _handed: set[trio.lowlevel.Task] = attrs.field(factory=set, init=False)
    _budget_waiters: set[Ticket] = attrs.field(factory=set, init=False)
    # When each progressing ticket is next due a stall check: (due, tie-break, ticket).
    _due: list[tuple[float, int, Ticket]] = attrs.field(factory=list, init=False)
    _pushes: itertools.count[int] = attrs.field(factory=itertools.count, init=False)
    _wait: trio.CancelScope | None = attrs.field(default=None, init=False)

    @property
    def progressing(self) -> int:
        """Admitted requests not set aside (may briefly exceed the cap, see the module)."""
        return self._progressing

    @property
    def stalled(self) -> int:
        """Requests set aside now."""
        return self._stalled

    @property
    def stalls(self) -> int:
        """Times a request was set aside, in total."""
        return self._stalls

    @property
    def waiting(self) -> int:
        """Tasks waiting in `acquire`."""
        return len(self._waiters)

    async def acquire(self) -> Ticket | None:
        """Admit one request once fewer than `max_in_flight` progress; None once closed.

        Admission is in arrival order: a freed slot goes straight to the
        longest waiter, so a slot is never free while anyone waits.

        Cancellation: a checkpoint only when it has to wait, and cancellable
        then; a cancelled waiter is admitted to nothing (its place passes on).
        """
        if self._closed:
            return None
        if self._progressing >= self.max_in_flight:
            await self._waiters.park()
            task = trio.lowlevel.current_task()
            handed = task in self._handed
            self._handed.discard(task)
            if self._closed:
                if handed:
                    self._progressing -= 1
                return None
        else:
            self._progressing += 1
        now = trio.current_time()
        ticket = Ticket(admission=self, last_progress=now)
        self._schedule(ticket, now + self.policy.stall_after)
        return ticket

    def close(self) -> None:
        """Admit nothing more: every waiting `acquire` returns None, as does every later one.

        Requests already admitted keep their tickets (release them as usual).
        """
        self._closed = True
        self._waiters.unpark_all()

    async def watch(self) -> None:
        """Set each admitted request aside whenever it goes `stall_after` seconds without a chunk.

        Runs until cancelled, in one task beside the requests (see the
        module docstring for what setting aside does). It sleeps until the
        earliest check is due, so it costs nothing per chunk and one heap
        entry per admitted request.
        """
        while True:
            self._expire(trio.current_time())
            with trio.CancelScope(deadline=self._due[0][0] if self._due else math.inf) as wait:
                self._wait = wait
                try:
                    await trio.sleep_forever()
                finally:
                    self._wait = None

    def _schedule(self, ticket: Ticket, due: float) -> None:
        """Check `ticket` for a stall at `due` (waking the watcher earlier if need be)."""
        heapq.heappush(self._due, (due, next(self._pushes), ticket))
        wait = self._wait
        if wait is not None and due < wait.deadline:
            wait.deadline = due

    def _expire(self, now: float) -> None:
        """Run the checks due by `now`."""
        due = self._due
        while due and due[0][0] <= now:
            heapq.heappop(due)[2]._check(now)

    def _forget_released(self) -> None:
        """Drop released tickets' checks from the front, so the watcher does not wake for them."""
        due = self._due
        while due and due[0][2].released:
            heapq.heappop(due)
        wait = self._wait
        if wait is not None:
            wait.deadline = due[0][0] if due else math.inf

    def _free_slot(self) -> None:
        self._progressing -= 1
        self._admit_waiters()

    def _admit_waiters(self) -> None:
        """Hand the free slots to the longest waiters (counted as progressing from now)."""
        free = self.max_in_flight - self._progressing
        if free > 0 and self._waiters and not self._closed:
            woken = self._waiters.unpark(count=free)
            self._progressing += len(woken)
            self._handed.update(woken)

    def _free_budget(self) -> None:
        self._stalled -= 1
        waiters, self._budget_waiters = self._budget_waiters, set()
        now = trio.current_time()
        for ticket in waiters:
            # Checked again at once: the first to be checked takes the free place.
            self._schedule(ticket, now)

    def _set_aside(self, ticket: Ticket) -> bool:
        if self._stalled >= self.policy.max_stalled:
            self._budget_waiters.add(ticket)
            return False
        self._stalled += 1
        self._stalls += 1
        self._free_slot()
        return True

    def _resume(self) -> None:
        self._progressing += 1
        self._free_budget()


@attrs.define(eq=False)
class Ticket:
    """One admitted request's place: progressing, or set aside while it stalls.

    A progressing ticket has one stall check due in its admission's watcher
    (at `last_progress + stall_after`, or later); a stalled one, or one
    waiting for a place in the full stall budget, has none until it
    progresses or a place frees up.
    """

    admission: Admission
    last_progress: float
    stalled: bool = attrs.field(default=False, init=False)
    released: bool = attrs.field(default=False, init=False)

    def progressed(self) -> None:
        """Note a chunk: restarts the stall clock; a set-aside request progresses again."""
        now = self.last_progress = trio.current_time()
        admission = self.admission
        if self.stalled:
            self.stalled = False
            admission._resume()
            admission._schedule(self, now + admission.policy.stall_after)
        elif self in admission._budget_waiters:
            admission._budget_waiters.discard(self)
            admission._schedule(self, now + admission.policy.stall_after)

    def release(self) -> None:
        """The request ended: free its slot or its budget place. Idempotent."""
        if self.released:
            return
        self.released = True
        admission = self.admission
        admission._budget_waiters.discard(self)
        if self.stalled:
            admission._free_budget()
        else:
            admission._free_slot()
        admission._forget_released()

    def _check(self, now: float) -> None:
        """The watcher's check, due now: set the request aside if it stalled."""
        admission = self.admission
        if self.released or self.stalled or self in admission._budget_waiters:
            return
        due = self.last_progress + admission.policy.stall_after
        if due > now:
            admission._schedule(self, due)
        elif admission._set_aside(self):
            self.stalled = True
        # Otherwise the budget is full: it waits among `_budget_waiters`, holding its slot.
