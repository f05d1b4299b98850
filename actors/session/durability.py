"""Durability marks: the newest durable seq of each session, and waiting for it to advance.

A store records here what its commits made durable (`advance`) or failed
to write (`fail`); readers ask `seq()` without blocking, or wait with
`wait()`. Waking is one `trio.Event` per session, created only while a task
waits and replaced on each advance, so a store that nobody watches pays one
dict update per commit and never blocks on its readers.
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

    def fail(self, session_id: str, error: SessionError) -> None:
        """Record that an accepted append of `session_id` will never be durable.

        Current and later waiters beyond the mark raise `error`.
        """
        self._failures[session_id] = error
        self._wake(session_id)

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
