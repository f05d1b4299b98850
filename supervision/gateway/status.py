"""Status changes for `_harness/sessions/watch`: turn starts and ends of every live session.

While at least one watch is open (`open()` … the returned close), every
live session of the directory, and every session started or attached
later, has a status subscriber on its fan-out feed: each durable
`turn/start` is announced as "running" and each `turn/end` as "idle"
(`SessionDirectory.announce_status`, change `"status"`): the status as the
log has it at that seq, not as the agent is by the time it is announced
(it may already have started its next turn, which is announced next).
The feeds read the durable log, so the agents never wait for it, and
with no watch open nothing follows the sessions at all. A session that
is closed ("removed") stops being followed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs

from actors.session.events import TurnEnd, TurnStart
from supervision.gateway.cursors import EventBatch
from supervision.gateway.fanout import Fanout
from supervision.gateway.sessions import SessionDirectory

log = logging.getLogger(__name__)


@attrs.define(eq=False)
class _StatusSubscriber:
    """Announces the status change of each turn start and end of one session."""

    directory: SessionDirectory
    session_id: str

    def deliver(self, batch: EventBatch) -> bool:
        """Announce "running" per `turn/start` and "idle" per `turn/end` in the batch.

        A failing watcher is logged and skipped: it never ends the session's
        feed (which the session's log subscribers share).
        """
        for event in batch.events:
            if isinstance(event.data, TurnStart | TurnEnd):
                status = "running" if isinstance(event.data, TurnStart) else "idle"
                try:
                    self.directory.announce_status(self.session_id, status)
                except Exception:
                    log.exception("announcing the status of session %r failed", self.session_id)
        return True

    def fail(self, reason: str) -> None:
        """Nothing to close: the session's status simply stops being followed."""


@attrs.define(eq=False)
class StatusWatch:
    """Follows every live session's status while at least one watch is open."""

    directory: SessionDirectory
    fanout: Fanout
    _watches: int = attrs.field(default=0, init=False)
    _followed: dict[str, _StatusSubscriber] = attrs.field(factory=dict, init=False)
    _stop_listening: list[Callable[[], None]] = attrs.field(factory=list, init=False)

    def open(self) -> Callable[[], None]:
        """Open one watch; returns the function that closes it (idempotent)."""
        self._watches += 1
        if self._watches == 1:
            self._stop_listening = [
                self.directory.on_change(self._changed),
                self.directory.on_start(self._follow),
            ]
            for session_id in self.directory.live_session_ids():
                self._follow(session_id)
        closed = False

        def close() -> None:
            nonlocal closed
            if closed:
                return
            closed = True
            self._watches -= 1
            if self._watches == 0:
                self._stop_all()

        return close

    def _changed(self, session_id: str, change: str, status: str | None) -> None:
        if change == "removed":
            subscriber = self._followed.pop(session_id, None)
            if subscriber is not None:
                self.fanout.detach(session_id, subscriber)

    def _follow(self, session_id: str) -> None:
        if session_id in self._followed:
            return
        session = self.directory.live_session(session_id)
        start = 0 if session is None else session.durable_seq + 1
        subscriber = _StatusSubscriber(directory=self.directory, session_id=session_id)
        self._followed[session_id] = subscriber
        self.fanout.join(session_id, start, subscriber)

    def _stop_all(self) -> None:
        stops, self._stop_listening = self._stop_listening, []
        for stop in stops:
            stop()
        followed, self._followed = self._followed, {}
        for session_id, subscriber in followed.items():
            self.fanout.detach(session_id, subscriber)
