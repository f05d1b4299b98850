"""Durability marks: the newest durable seq of each session, and waiting for it to advance.

A store records here what its commits made durable (`advance`) or failed
to write (`fail`); readers ask `seq()` without blocking, or wait with
`wait()`. Waking is one `trio.Event` per session, created only while a task
waits and replaced on each advance, so a store that nobody watches pays one
dict update per commit and never blocks on its readers.

A reader of many sessions (the gateway's fan-out) opens one
`DurableChanges` instead (`changes()`): every advance and failure of any
session adds that session to its set, and one wakeup covers all the
sessions that advanced since it last looked, however many commits that was.
"""

from __future__ import annotations

import attrs
import trio

from actors.session.errors import SessionError


@attrs.define(eq=False)
class DurableMarks:
    """Per session: the newest seq known durable (-1 when none) and its waiters."""

    _seqs: dict[str, int] = attrs.field(factory=dict, init=False)
    _wakeups: dict[str, trio.Event] = attrs.field(factory=dict, init=False)
    _failures: dict[str, SessionError] = attrs.field(factory=dict, init=False)
    _listeners: list[DurableChanges] = attrs.field(factory=list, init=False)

    def seq(self, session_id: str) -> int:
        """The newest durable seq of `session_id`; -1 when none is known."""
        return self._seqs.get(session_id, -1)

    def advance(self, session_id: str, seq: int) -> None:
        """Record that every event of `session_id` up to `seq` is durable; wake its waiters.

        Never moves a mark backwards (a lower `seq` is ignored).
        """
        if seq <= self._seqs.get(session_id, -1):
            return
        self._seqs[session_id] = seq
        self._wake(session_id)
        for listener in self._listeners:
            listener.note(session_id)

    def fail(self, session_id: str, error: SessionError) -> None:
        """Record that an accepted append of `session_id` will never be durable.

        Current and later waiters beyond the mark raise `error`.
        """
        self._failures[session_id] = error
        self._wake(session_id)
        for listener in self._listeners:
            listener.note(session_id)

    def failure(self, session_id: str) -> SessionError | None:
        """The recorded failure of `session_id` (its later seqs will not become durable), if any."""
        return self._failures.get(session_id)

    def changes(self) -> DurableChanges:
        """A new listener of every session's advances and failures; `close()` it when done."""
        listener = DurableChanges(marks=self)
        self._listeners.append(listener)
        return listener

    def recover(self, session_id: str) -> None:
        """Forget a recorded failure of `session_id` (its writer took a new lease)."""
        self._failures.pop(session_id, None)

    async def wait(self, session_id: str, seq: int) -> None:
        """Return once `seq(session_id) >= seq`.

        Cancellation: cancellable; nothing is affected by cancelling it.

        Raises:
            SessionError: an append of the session failed before the mark
                reached `seq` (the store's failure, naming the session and seqs).
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        while self._seqs.get(session_id, -1) < seq:
            failure = self._failures.get(session_id)
            if failure is not None:
                raise SessionError(
                    f"session {session_id!r}: seq {seq} will not become durable: {failure}"
                ) from failure
            wakeup = self._wakeups.get(session_id)
            if wakeup is None:
                wakeup = self._wakeups[session_id] = trio.Event()
            await wakeup.wait()

    def _wake(self, session_id: str) -> None:
        wakeup = self._wakeups.pop(session_id, None)
        if wakeup is not None:
            wakeup.set()


@attrs.define(eq=False)
class DurableChanges:
    """The sessions whose durable mark advanced (or whose appends failed) since the last `take`.

    Sessions come out in the order they were first reported since then, so
    a reader handling them in turn follows the order of their commits.

    Opened with `DurableMarks.changes()` (or a store's `durable_changes()`).
    Advances are never lost between a `take` and the next `wait`: they
    accumulate in the set. A session may be reported although its mark did
    not move past what the reader already has (a failure, a load), so a
    reader compares `seq()` with its own position.
    """

    marks: DurableMarks
    notes: int = attrs.field(default=0, init=False)
    """Reports so far (each `note`, repeats of a session included): a reader compares two
    readings to learn whether anything was committed in between."""
    _changed: dict[str, None] = attrs.field(factory=dict, init=False)
    _wakeup: trio.Event | None = attrs.field(default=None, init=False)

    def note(self, session_id: str) -> None:
        """Report `session_id` as changed (the marks do this; a reader may too, to re-check it)."""
        self.notes += 1
        self._changed[session_id] = None
        wakeup = self._wakeup
        if wakeup is not None:
            self._wakeup = None
            wakeup.set()

    def take(self) -> list[str]:
        """The sessions reported since the last `take`, removed, in the order first reported."""
        changed, self._changed = self._changed, {}
        return list(changed)

    async def wait(self) -> None:
        """Return once a session was reported (without taking it).

        Cancellation: cancellable; nothing is affected.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        while not self._changed:
            if self._wakeup is None:
                self._wakeup = trio.Event()
            await self._wakeup.wait()

    def seq(self, session_id: str) -> int:
        """The newest durable seq of `session_id`; -1 when none is known."""
        return self.marks.seq(session_id)

    def failure(self, session_id: str) -> SessionError | None:
        """The store's recorded failure of `session_id`, if any."""
        return self.marks.failure(session_id)

    def close(self) -> None:
        """Stop listening (idempotent)."""
        if self in self.marks._listeners:
            self.marks._listeners.remove(self)
