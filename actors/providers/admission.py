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

    One task admits (`acquire`); each admitted request holds a `Ticket`,
    reports its chunks with `Ticket.progressed()`, runs `Ticket.watch()` in a
    task beside it and calls `Ticket.release()` when it ends.
    """

    max_in_flight: int
    policy: StallPolicy
    _progressing: int = attrs.field(default=0, init=False)
    _stalled: int = attrs.field(default=0, init=False)
    _stalls: int = attrs.field(default=0, init=False)
    _slot_freed: trio.lowlevel.ParkingLot = attrs.field(
        factory=trio.lowlevel.ParkingLot, init=False
    )
    _budget_waiters: set[Ticket] = attrs.field(factory=set, init=False)

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

    async def wait_slot(self) -> None:
        """Return once fewer than `max_in_flight` requests progress (admitting nothing).

        Cancellation: cancellable.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        while self._progressing >= self.max_in_flight:
            await self._slot_freed.park()
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def acquire(self) -> Ticket:
        """Wait until fewer than `max_in_flight` requests progress, then admit one.

        Cancellation: cancellable while waiting; nothing is admitted then.
        """
        await self.wait_slot()
        self._progressing += 1
        return Ticket(admission=self, last_progress=trio.current_time())

    def _free_slot(self) -> None:
        self._progressing -= 1
        if self._progressing < self.max_in_flight:
            self._slot_freed.unpark_all()

    def _free_budget(self) -> None:
        self._stalled -= 1
        waiters, self._budget_waiters = self._budget_waiters, set()
        for ticket in waiters:
            ticket._wake()

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
    """One admitted request's place: progressing, or set aside while it stalls."""

    admission: Admission
    last_progress: float
    stalled: bool = attrs.field(default=False, init=False)
    released: bool = attrs.field(default=False, init=False)
    _changed: trio.Event = attrs.field(factory=trio.Event, init=False)

    def progressed(self) -> None:
        """Note a chunk: restarts the stall clock; a set-aside request progresses again."""
        self.last_progress = trio.current_time()
        if self.stalled:
            self.stalled = False
            self.admission._resume()
            self._wake()

    async def watch(self) -> None:
        """Set the request aside whenever it goes `stall_after` seconds without a chunk.

        Runs until cancelled (the request's task cancels it as the request
        ends); it only sleeps until the stall would be due and then waits for
        a change, so it costs nothing per chunk.
        """
        admission = self.admission
        stall_after = admission.policy.stall_after
        while True:
            due = self.last_progress + stall_after
            if self.stalled or trio.current_time() < due:
                if self.stalled:
                    await self._wait_change()
                else:
                    await trio.sleep_until(due)
                continue
            if not admission._set_aside(self):
                # The budget is full: hold the slot until a place frees up or a chunk comes.
                await self._wait_change()
                admission._budget_waiters.discard(self)
                continue
            self.stalled = True

    def release(self) -> None:
        """The request ended: free its slot or its budget place. Idempotent."""
        if self.released:
            return
        self.released = True
        self.admission._budget_waiters.discard(self)
        if self.stalled:
            self.admission._free_budget()
        else:
            self.admission._free_slot()

    async def _wait_change(self) -> None:
        await self._changed.wait()
        self._changed = trio.Event()

    def _wake(self) -> None:
        self._changed.set()
