"""`_harness/sessions/watch`: session changes, followed for every watch and paced per watch.

Two parts:

- `StatusWatch` (one per gateway). While at least one watch is open
  (`open()` … the returned close), every live session of the directory,
  and every session started or attached later, has a status subscriber on
  its fan-out feed: each durable `turn/start` is announced as "running"
  and each `turn/end` as "idle" (`SessionDirectory.announce_status`,
  change `"status"`): the status as the log has it at that seq, not as the
  agent is by the time it is announced. The feeds read the durable log, so
  the agents never wait for it, and with no watch open nothing follows the
  sessions at all. A session that is closed ("removed") stops being
  followed. The batches it sees also keep the directory's summary figures
  current (`SessionDirectory.note_durable`), so a session that hibernates
  right after its turn is summarised without reading the store.
- `WatchCursor` (one per watch). It is a cursor, not a queue of frames.
  A change of a session the watch covers (the token's session filter and
  the watch's `filter`) is written into the connection's log lane at once
  while the lane has room and nothing of the watch is pending, so a
  watcher that keeps up sees every change as it happens. Otherwise it is
  recorded as *pending* for that session, and the watch's task (`serve`,
  owned by the connection) writes the pending changes at the pace the
  socket drains, blocking only itself when the lane is full
  (`Outbox.put_log`). Pending changes are coalesced, so a watch holds at
  most three per session, however far its socket is behind; the socket is
  closed with 4008 only when a write stalls past the deadline.

What a watcher is told (what "nothing is lost" means for a watch): for
each session it covers, every "added" and every "removed" (never coalesced
away: a session added and removed before the watcher read either still
shows both, in that order), every status change while it keeps up, and
its *latest* status when it falls behind: consecutive pending status
changes are coalesced into the newest (carried by an
unwritten "added", which then shows it), so a watcher that falls behind
skips intermediate statuses but never sees an older status after a newer
one, and changes of one session arrive in the order they happened.
Sessions' changes are written in the order each session's oldest
unwritten change arrived. A change carries the session's `SessionSummary`
as it is when it is written (its `status` the change's own); a "removed"
carries `{sessionId, agent, parentSessionId?}`. The watch's `filter`
(`agent`, `parentSessionId`, `status`, as in `_harness/sessions/list`)
selects sessions by agent and parent; with `status`, a change is written
when the session has that status after it, or had it in the last change
written (so the watcher also sees it leave that status). Changes are not
replayable: a reconnecting watcher watches first, then lists the sessions.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Any, Literal

import attrs
import trio

from actors.session import SessionError
from actors.session.events import TurnEnd, TurnStart
from supervision.gateway.auth import Principal
from supervision.gateway.connection import CLOSE_INTERNAL, Connection
from supervision.gateway.cursors import EventBatch
from supervision.gateway.fanout import Fanout
from supervision.gateway.messages import SessionFilter
from supervision.gateway.outbox import OutboxClosed
from supervision.gateway.protocol import encode, notification
from supervision.gateway.sessions import SessionDirectory

log = logging.getLogger(__name__)

WATCH_BATCH = 256
"""Most sessions whose pending changes a watch writes in one pass (the rest keep coalescing)."""

Change = Literal["added", "status", "removed"]


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
        self.directory.note_durable(self.session_id, batch.events)
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


@attrs.define(eq=False)
class _Pending:
    """One unwritten change of a session; `status` is the status it reports (None: none)."""

    change: Change
    status: str | None


@attrs.define(eq=False)
class WatchCursor:
    """One `_harness/sessions/watch`: its pending changes, coalesced per session, and the task
    that writes them (see the module docstring).

    `record` is the directory's change listener; `serve` is the writing task.
    """

    subscription: str
    directory: SessionDirectory
    principal: Principal
    filter: SessionFilter | None = None
    _pending: dict[str, list[_Pending]] = attrs.field(factory=dict, init=False)
    _ready: trio.Event = attrs.field(factory=trio.Event, init=False)
    _matching: set[str] = attrs.field(factory=set, init=False)
    """With a `status` filter: the sessions whose last written change had that status."""
    _connection: Connection | None = attrs.field(default=None, init=False)
    """The connection `serve` writes to (None until it starts)."""
    _writing: bool = attrs.field(default=False, init=False)
    """`serve` holds changes it took and has not queued yet: none may be written ahead."""

    @property
    def pending(self) -> int:
        """Unwritten changes (at most three per session)."""
        return sum(len(changes) for changes in self._pending.values())

    def record(self, session_id: str, change: str, status: str | None) -> None:
        """Note a change of `session_id` for the watch, when the watch covers the session.

        Never blocks. With nothing of the watch pending or being written by
        `serve`, and room in the log lane, the change is written at once.
        Otherwise it is pending: a "status" replaces the session's pending
        status (or updates its pending "added"); a "removed" drops the
        pending statuses before it (its session is gone) and is noted once.
        """
        directory, wanted = self.directory, self.filter
        if not directory.visible(self.principal, session_id):
            return
        if wanted is not None and (
            (wanted.agent is not None and directory.agent_of(session_id) != wanted.agent)
            or (
                wanted.parent_session_id is not None
                and directory.parent_of(session_id) != wanted.parent_session_id
            )
        ):
            return
        if change == "added":
            kind: Change = "added"
            if status is None:
                agent = directory.live_agent(session_id)
                status = None if agent is None else agent.status
        elif change == "status":
            kind = "status"
        else:
            kind = "removed"
        changes = self._pending.get(session_id)
        if changes is None:
            pending = _Pending(change=kind, status=status)
            if not self._pending and not self._writing and self._write_now(session_id, pending):
                return
            self._pending[session_id] = [pending]
        elif kind == "status" and changes[-1].change != "removed":
            changes[-1].status = status
        elif kind == "removed":
            while changes and changes[-1].change == "status":
                changes.pop()
            if not changes or changes[-1].change != "removed":
                changes.append(_Pending(change="removed", status=None))
        else:
            changes.append(_Pending(change=kind, status=status))
        self._ready.set()

    def take(self, limit: int = WATCH_BATCH) -> list[tuple[str, list[_Pending]]]:
        """The unwritten changes of the first `limit` sessions, removed, oldest first."""
        taken = [
            (session_id, self._pending[session_id])
            for session_id in itertools.islice(self._pending, limit)
        ]
        for session_id, _ in taken:
            del self._pending[session_id]
        return taken

    async def serve(self, connection: Connection) -> None:
        """Write the pending changes as `_harness/sessions/changed` into the connection's log lane
        until the connection ends, waiting while the lane is full.

        Cancellation: the connection's end cancels it; changes not written are dropped with
        the watch. A bug in writing closes the connection (1011).
        """
        self._connection = connection
        try:
            while True:
                while not self._pending:
                    if self._ready.is_set():
                        self._ready = trio.Event()
                    await self._ready.wait()
                frames = []
                self._writing = True
                try:
                    for session_id, changes in self.take():
                        for pending in changes:
                            session = await self._describe(session_id, pending)
                            if session is not None:
                                frames.append(self._frame(connection, pending, session))
                    if frames:
                        await connection.outbox.put_log(frames)
                finally:
                    self._writing = False
        except OutboxClosed:
            return
        except Exception:
            log.exception("watch %s failed", self.subscription)
            connection.close(CLOSE_INTERNAL, f"watch {self.subscription} failed")

    def _frame(self, connection: Connection, pending: _Pending, session: dict[str, Any]) -> bytes:
        params = {"subscription": self.subscription, "change": pending.change, "session": session}
        return connection.transport.framing.frame(
            encode(notification("_harness/sessions/changed", params))
        )

    def _write_now(self, session_id: str, pending: _Pending) -> bool:
        """Write `pending` into the log lane now; False (nothing written) when the lane is
        full, the watch is not served yet, or the session's summary needs the store."""
        connection = self._connection
        if connection is None or not connection.outbox.log_has_room:
            return False
        summary = None
        if pending.change != "removed":
            summary = self.directory.summary_now(session_id)
            if summary is None:
                return False
        session = self._finish(session_id, pending, summary)
        if session is not None:
            frame = self._frame(connection, pending, session)
            connection.outbox.offer_log([frame], len(frame))
        return True

    async def _describe(self, session_id: str, pending: _Pending) -> dict[str, Any] | None:
        """The `session` of a change, or None when the watch's status filter leaves it out."""
        directory = self.directory
        session: dict[str, Any] | None = None
        if pending.change != "removed":
            session = directory.summary_now(session_id)
            if session is None:
                try:
                    session = await directory.summary(session_id)
                except SessionError:
                    session = None  # not stored (yet): named only
        return self._finish(session_id, pending, session)

    def _finish(
        self, session_id: str, pending: _Pending, session: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        """The `session` of a change from its summary (None: named only), or None when the
        watch's status filter leaves it out."""
        directory = self.directory
        if session is None:
            session = {"sessionId": session_id, "agent": directory.agent_of(session_id)}
            parent = directory.parent_of(session_id)
            if parent is not None:
                session["parentSessionId"] = parent
        if pending.status is not None:
            session["status"] = pending.status  # as the log had it, not as the agent is by now
        wanted = None if self.filter is None else self.filter.status
        if wanted is not None:
            if session.get("status") == wanted:
                self._matching.add(session_id)
            elif session_id in self._matching:
                self._matching.discard(session_id)
            else:
                return None
        return session
