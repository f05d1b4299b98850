"""`SQLiteStore`: the embedded, durable session store (SQLite in WAL mode, group commit).

One writer actor (`serve`) owns the write connection. `append` hands events
to it over a bounded memory channel; when the channel is full the appender
blocks (backpressure). The writer drains everything pending, commits it in
one transaction in a worker thread, then wakes every `flush()` waiter whose
appends are now durable. `create`, `exists`, `load`, `list_sessions` and the
lease calls open a short-lived connection of their own per call in a worker
thread, so no connection is ever used by two threads at once.

Each event is stored as its compact JSON text under the primary key
`(session_id, seq)` with a checksum of it (`actors/session/checksum.py`), so
loading restores exactly what was appended or says which seq is damaged.

One writer per session (`actors/session/lease.py`): a `leases` table holds
each session's owner, epoch and wall-clock expiry. Inside each commit's
transaction, and per session, the writer checks the batch's epoch against
the table and that the first seq continues what is stored; a session that
fails either check is refused (its appends fail, that session is broken in
this store object) and the rest of the batch commits. The writer renews the
leases this store holds every third of `lease_ttl`, on its own connection,
between commits. A failed commit never stops the writer: the sessions whose
appends it held are broken, every other session carries on.

Every failure is a `SessionError` naming the store's path and the session
(and the seq where it applies); no raw `sqlite3` error escapes. What SQLite
itself cannot detect is described in the README's "Crash consistency"
section: a WAL cut at a frame boundary loses its last transactions without
a trace, and a page replaced by an older valid copy of itself reads as valid.
"""

from __future__ import annotations

import contextlib
import json
import math
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Literal

import attrs
import trio

from actors.latency import LatencySummary, LatencyWindow
from actors.session.checksum import event_checksum
from actors.session.codec import event_from_json, event_to_json
from actors.session.durability import DurableMarks
from actors.session.errors import SessionError
from actors.session.events import Event
from actors.session.lease import (
    DEFAULT_LEASE_TTL_SECONDS,
    Lease,
    SessionBusyError,
    SessionFencedError,
    WallClockMs,
    default_owner,
    describe_holder,
    wall_clock_ms,
)
from actors.session.store import SessionExistsError, UnknownSessionError

DEFAULT_MAX_PENDING_APPENDS = 1024
"""Appends the writer's channel buffers before `append` blocks."""

DEFAULT_SHUTDOWN_GRACE_SECONDS = 10.0
"""How long a cancelled writer keeps trying to commit what it already accepted."""

BUSY_TIMEOUT_MS = 5_000
"""How long a connection waits for another connection's write lock before failing."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    position INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    event TEXT NOT NULL,
    checksum INTEGER NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS leases (
    session_id TEXT PRIMARY KEY,
    owner TEXT,
    epoch INTEGER NOT NULL,
    expires_ms INTEGER NOT NULL
) WITHOUT ROWID;
"""

_Row = tuple[str, int, str, int]
"""`(session_id, seq, event JSON text, checksum)`: one row of the events table."""

_Refusal = tuple[Literal["fenced", "busy", "conflict"], str, str]
"""Why a commit refused a session: the kind, a sentence, and the holder (or "")."""


@attrs.frozen(kw_only=True)
class SQLiteStoreStatistics:
    """A snapshot of a `SQLiteStore`'s writer.

    Attributes:
        pending_appends: accepted appends not yet committed (nor failed).
        blocked_appenders: tasks waiting in `append` for room in the full channel.
        failed_appends: accepted appends that were refused or whose commit failed.
        broken_sessions: sessions this store refuses to write (a failed or
            fenced append) until their lease is acquired again.
        leases_held: write leases this store object holds and renews.
        renewal_failures: lease renewals that could not be written (each is
            retried at the next period; a lease that expires meanwhile can
            be taken over, and fencing then refuses this store's writes).
        commits: transactions committed by the writer.
        events_written: events committed by the writer.
        largest_batch: the most appends committed in one transaction.
        commit_latency: how long the recent commits' transactions took (the
            last 1,024, bounded memory).
    """

    pending_appends: int
    blocked_appenders: int
    failed_appends: int
    broken_sessions: int
    leases_held: int
    renewal_failures: int
    commits: int
    events_written: int
    largest_batch: int
    commit_latency: LatencySummary


@attrs.define(eq=False)
class _Append:
    """One accepted `append` call; `done` is set once it is committed or has failed."""

    session_id: str
    epoch: int | None
    rows: list[_Row]
    done: trio.Event = attrs.field(factory=trio.Event)
    error: SessionError | None = None


@attrs.frozen(kw_only=True)
class _Group:
    """One session's share of a batch, as the commit thread sees it."""

    session_id: str
    epoch: int | None
    rows: list[_Row]


@attrs.define(eq=False)
class SQLiteStore:
    """A `SessionStore` in one SQLite file (WAL mode), written by one group-committing actor.

    `create`, `exists`, `load`, `list_sessions` and the lease calls work
    whether or not the writer runs; `append` needs `serve` running (start it
    with `await nursery.start(store.serve)`), and leases are renewed only
    while it runs. The file and its parent directories are created on first
    use.

    Args:
        path: the database file.
        max_pending_appends: capacity of the writer's channel; a full
            channel blocks `append` until the writer takes a batch.
        shutdown_grace: seconds a cancelled writer spends committing what it
            had already accepted.
        lease_ttl: seconds a write lease outlives its holder's last renewal
            (a crashed holder's session can be taken over after this).
        wall_clock: epoch milliseconds for lease expiry; every process on
            the file must share it (the system clock).
    """

    path: Path = attrs.field(converter=Path)
    max_pending_appends: int = attrs.field(
        default=DEFAULT_MAX_PENDING_APPENDS, kw_only=True, validator=attrs.validators.ge(0)
    )
    shutdown_grace: float = attrs.field(
        default=DEFAULT_SHUTDOWN_GRACE_SECONDS, kw_only=True, validator=attrs.validators.gt(0)
    )
    lease_ttl: float = attrs.field(
        default=DEFAULT_LEASE_TTL_SECONDS, kw_only=True, validator=attrs.validators.gt(0)
    )
    wall_clock: WallClockMs = attrs.field(default=wall_clock_ms, kw_only=True)
    _send: trio.MemorySendChannel[_Append | None] | None = attrs.field(default=None, init=False)
    _serving: bool = attrs.field(default=False, init=False)
    _schema_ready: bool = attrs.field(default=False, init=False)
    _next_seq: dict[str, int] = attrs.field(factory=dict, init=False)
    _unconfirmed: set[_Append] = attrs.field(factory=set, init=False)
    _broken: dict[str, SessionError] = attrs.field(factory=dict, init=False)
    _held: dict[str, Lease] = attrs.field(factory=dict, init=False)
    _failed_appends: int = attrs.field(default=0, init=False)
    _renewal_failures: int = attrs.field(default=0, init=False)
    _marks: DurableMarks = attrs.field(factory=DurableMarks, init=False)
    _commits: int = attrs.field(default=0, init=False)
    _events_written: int = attrs.field(default=0, init=False)
    _largest_batch: int = attrs.field(default=0, init=False)
    _commit_latency: LatencyWindow = attrs.field(factory=LatencyWindow, init=False)

    @property
    def running(self) -> bool:
        """True while the writer accepts appends (from `serve`'s start until its shutdown)."""
        return self._send is not None

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the writer until cancelled; `task_status.started()` once appends are accepted.

        Each round takes every pending append, commits them in one
        transaction and wakes the `flush()` waiters they satisfy; between
        rounds the writer renews the leases this store holds. A store may be
        served again after its writer stopped, but by one task at a time.

        A refused or failed commit breaks the sessions whose appends it held
        (their `flush` raises) and the writer goes on with the next batch.

        Cancellation: a commit already running finishes first (SQLite's busy
        timeout bounds its wait for the lock). Then the writer stops
        accepting appends and commits everything it had accepted, including
        the appenders blocked on the full channel, in a shielded scope
        bounded by `shutdown_grace`. Only then does `serve` return; `running`
        is False from the start of this shutdown.

        Raises:
            SessionError: the writer is already running, the database cannot
                be opened, or the shutdown commit failed or missed its grace;
                the message names the store and the sessions and seqs that
                are not durable.
        """
        if self._serving:
            raise SessionError(f"{self._label}: serve() is already running; one writer per store")
        self._serving = True
        try:
            connection = await trio.to_thread.run_sync(self._connect)
            send, receive = trio.open_memory_channel[_Append | None](self.max_pending_appends)
            self._send = send
            await self._write_until_cancelled(connection, receive, task_status)
        finally:
            self._serving = False

    async def create(self, session_id: str) -> None:
        """Register a new, empty session; it is durable when this returns.

        Cancellation: once the insert started in its worker thread it
        completes (the session then exists) before the cancellation is seen.

        Raises:
            SessionExistsError: the store already holds `session_id`.
            SessionError: the database cannot be opened or written.
        """
        await trio.to_thread.run_sync(self._insert_session, session_id)
        self._next_seq[session_id] = 0

    async def exists(self, session_id: str) -> bool:
        """True when the store holds `session_id`.

        Cancellation: takes effect before or after the read, never during it.

        Raises:
            SessionError: the database cannot be opened or read.
        """
        return await trio.to_thread.run_sync(self._session_exists, session_id)

    async def load(self, session_id: str) -> list[Event]:
        """Every event of `session_id`, in seq order, restored exactly as appended.

        First waits until the appends this store already accepted for the
        session are durable, so a load sees this store's own writes. Every
        row's checksum is verified and the seqs must run 0, 1, 2, ...

        Cancellation: abandons the load; the store is unchanged.

        Raises:
            UnknownSessionError: the store has no such session.
            UnknownEventError: a stored event has an unknown, non-ignorable type.
            SessionError: a stored event fails its checksum, cannot be
                decoded or breaks the seq order (the message names the store,
                session and seq), an accepted append failed, or the database
                cannot be read (a damaged file: the message names it).
        """
        await self._wait_durable(session_id)
        rows = await trio.to_thread.run_sync(self._select_events, session_id)
        events: list[Event] = []
        for expected, (seq, text, checksum) in enumerate(rows):
            where = f"{self._label}: session {session_id!r}"
            if seq != expected:
                raise SessionError(f"{where}: stored seqs jump from {expected - 1} to {seq}")
            if checksum != event_checksum(session_id, seq, text):
                raise SessionError(
                    f"{where}: stored event seq {seq} fails its checksum (the file is damaged)"
                )
            events.append(_decode(where, seq, text))
        self._next_seq.setdefault(session_id, len(events))
        self._marks.advance(session_id, len(events) - 1)
        return events

    async def acquire_lease(self, session_id: str, *, owner: str | None = None) -> Lease:
        """Take the write lease of `session_id`; it is durable when this returns.

        The store then renews it while `serve` runs, and appends under it
        carry its epoch. A session this store object had broken is usable
        again under the new lease (its next seq is read from the file).

        Cancellation: once the transaction started in its worker thread it
        completes (the lease is then held) before the cancellation is seen.

        Raises:
            SessionBusyError: another live lease holds the session; the
                message names the session and the holder.
            SessionError: the database cannot be opened or written.
        """
        lease = await trio.to_thread.run_sync(
            self._take_lease, session_id, owner or default_owner()
        )
        self._held[session_id] = lease
        self._next_seq.pop(session_id, None)
        self._broken.pop(session_id, None)
        self._marks.recover(session_id)
        if self._send is not None:
            # Wake a writer that waits without a renewal deadline; a full
            # channel means it is busy and will see the lease anyway.
            with contextlib.suppress(trio.WouldBlock):
                self._send.send_nowait(None)
        return lease

    async def release_lease(self, lease: Lease) -> None:
        """Give `lease` up so another writer may take the session at once.

        A lease that was already taken over is left alone. The epoch stays
        used: writes still carrying it are refused.

        Cancellation: takes effect before or after the write, never during it.

        Raises:
            SessionError: the database cannot be opened or written.
        """
        if self._held.get(lease.session_id) == lease:
            del self._held[lease.session_id]
        await trio.to_thread.run_sync(self._drop_lease, lease)

    async def append(
        self, session_id: str, events: Sequence[Event], *, lease: Lease | None = None
    ) -> None:
        """Hand `events` (contiguous seqs, continuing the session) to the writer.

        Returns once the writer accepted them, usually before they are
        durable: call `flush()` for that. A full channel blocks the caller
        until the writer takes a batch (backpressure). Appends to one session
        must not overlap (as with `Session`, which appends one at a time).
        The commit refuses them if `lease` was taken over by then (or, with
        no lease, if someone holds a live one).

        Cancellation: before the writer accepted the events, cancellation
        leaves the store unchanged and the same seqs may be appended again;
        after, the events are committed like any other.

        Raises:
            SessionFencedError: `lease` is no longer this store's lease on the
                session (released, or taken over by another writer).
            SessionBusyError: no `lease` was given but this store holds one.
            SessionError: the writer is not running (start it with
                `await nursery.start(store.serve)`), the session is broken by
                an earlier failed append, a seq does not continue the
                session, or an event cannot be written as JSON.
            UnknownSessionError: the store has no such session.
        """
        self._writer_channel(session_id)
        self._check_writable(session_id, lease)
        start = await self._expected_seq(session_id)
        send = self._writer_channel(session_id)
        self._check_writable(session_id, lease)
        if not events:
            await trio.lowlevel.checkpoint()
            return
        request = _Append(
            session_id=session_id,
            epoch=None if lease is None else lease.epoch,
            rows=_encode(session_id, start, events),
        )
        end = start + len(events)
        self._next_seq[session_id] = end
        accepted = False
        try:
            await send.send(request)
            accepted = True
        except trio.BrokenResourceError:
            raise SessionError(
                f"{self._label} stopped before accepting session {session_id!r} "
                f"seq {start}..{end - 1}"
            ) from None
        finally:
            if not accepted and self._next_seq.get(session_id) == end:
                self._next_seq[session_id] = start
        if not request.done.is_set():
            self._unconfirmed.add(request)

    async def flush(self, session_id: str | None = None) -> None:
        """Return once every append accepted before this call is durable.

        With `session_id`, waits for that session's appends only, and raises
        only for that session. Waiters are woken by the commit that makes
        their appends durable; with nothing pending this returns at once.

        Cancellation: abandons the wait; the appends are committed regardless.

        Raises:
            SessionFencedError: the session's lease was taken over.
            SessionError: an accepted append was not committed (a refused or
                failed commit, or a missed shutdown grace); the message names
                the store, the sessions and the seqs.
        """
        await self._wait_durable(session_id)

    async def list_sessions(self) -> list[str]:
        """Ids of every stored session, in creation order.

        Cancellation: takes effect before or after the read, never during it.

        Raises:
            SessionError: the database cannot be opened or read.
        """
        return await trio.to_thread.run_sync(self._select_session_ids)

    def durable_seq(self, session_id: str) -> int:
        """The newest seq of `session_id` committed or loaded by this store; -1 when none."""
        return self._marks.seq(session_id)

    async def wait_durable(self, session_id: str, seq: int) -> None:
        """Return once the writer committed `seq` of `session_id`.

        Woken by the commit itself (no polling). Cancellation: cancellable;
        the append is committed regardless.

        Raises:
            SessionError: an accepted append of the session failed to commit.
        """
        await self._marks.wait(session_id, seq)

    def statistics(self) -> SQLiteStoreStatistics:
        """The writer's queue, lease and commit counters, now."""
        send = self._send
        return SQLiteStoreStatistics(
            pending_appends=sum(1 for r in self._unconfirmed if not r.done.is_set()),
            blocked_appenders=0 if send is None else send.statistics().tasks_waiting_send,
            failed_appends=self._failed_appends,
            broken_sessions=len(self._broken),
            leases_held=len(self._held),
            renewal_failures=self._renewal_failures,
            commits=self._commits,
            events_written=self._events_written,
            largest_batch=self._largest_batch,
            commit_latency=self._commit_latency.summary(),
        )

    @property
    def _label(self) -> str:
        return f"SQLite store {str(self.path)!r}"

    def _writer_channel(self, session_id: str) -> trio.MemorySendChannel[_Append | None]:
        send = self._send
        if send is None:
            raise SessionError(
                f"{self._label} is not running; start it with `await nursery.start(store.serve)` "
                f"before appending to session {session_id!r}"
            )
        return send

    def _check_writable(self, session_id: str, lease: Lease | None) -> None:
        broken = self._broken.get(session_id)
        if broken is not None:
            raise broken.with_traceback(None)
        held = self._held.get(session_id)
        if lease is not None and held != lease:
            raise SessionFencedError(
                f"{self._label}: session {session_id!r}: the write lease of epoch "
                f"{lease.epoch} is no longer held by this store (released or taken over)",
                session_id=session_id,
                epoch=lease.epoch,
            )
        if lease is None and held is not None:
            raise SessionBusyError(
                f"{self._label}: session {session_id!r} is busy: this store holds its write "
                f"lease for {held.owner} (epoch {held.epoch}); write through that lease",
                session_id=session_id,
                holder=held.owner,
            )

    async def _wait_durable(self, session_id: str | None) -> None:
        """Wait for the pending appends (of `session_id`, or all); raise if any session broke."""
        pending = [r for r in self._unconfirmed if session_id is None or r.session_id == session_id]
        waited = False
        for request in pending:
            if not request.done.is_set():
                await request.done.wait()
                waited = True
        if not waited:
            await trio.lowlevel.checkpoint()
        if session_id is not None:
            broken = self._broken.get(session_id)
            if broken is not None:
                raise broken.with_traceback(None)
        elif self._broken:
            first = next(iter(self._broken.values()))
            raise SessionError(
                f"{self._label}: {len(self._broken)} session(s) hold accepted appends that are "
                f"not durable; first failure: {first}"
            ) from first

    # The writer actor.

    async def _write_until_cancelled(
        self,
        connection: sqlite3.Connection,
        receive: trio.MemoryReceiveChannel[_Append | None],
        task_status: trio.TaskStatus[None],
    ) -> None:
        # The channel carries appends, and None when a lease was taken (so a
        # writer waiting without a renewal deadline sets one).
        renew_every = self.lease_ttl / 3
        next_renewal = trio.current_time() + renew_every
        try:
            task_status.started()
            while True:
                with trio.move_on_at(next_renewal if self._held else math.inf):
                    first = await receive.receive()
                    batch = [r for r in (first, *_drain(receive)) if r is not None]
                    # A taken batch is always written: the thread cannot be
                    # interrupted anyway, and dropping it would lose accepted events.
                    if batch:
                        with trio.CancelScope(shield=True):
                            await self._commit(connection, batch)
                if self._held and trio.current_time() >= next_renewal:
                    with trio.CancelScope(shield=True):
                        await self._renew(connection)
                    next_renewal = trio.current_time() + renew_every
        finally:
            # Stop accepting first: taking what is left also admits the
            # appenders blocked on the full channel, and closing makes later
            # sends fail instead of queueing events nobody will write.
            leftover = _drain(receive)
            receive.close()
            self._send = None
            await self._commit_at_shutdown(connection, leftover)

    async def _commit(self, connection: sqlite3.Connection, batch: list[_Append]) -> None:
        """Write `batch` in one transaction and resolve its appends, session by session."""
        started = trio.current_time()
        try:
            refusals = await trio.to_thread.run_sync(
                _insert_batch, connection, _groups_of(batch), self.wall_clock()
            )
            self._commit_latency.record(trio.current_time() - started)
        except sqlite3.Error as exc:
            error = SessionError(f"{self._label}: could not commit {_describe(batch)}: {exc}")
            error.__cause__ = exc
            self._resolve(batch, {request.session_id: error for request in batch})
            return
        self._resolve(
            batch, {sid: self._refusal_error(sid, batch, r) for sid, r in refusals.items()}
        )

    def _refusal_error(
        self, session_id: str, batch: list[_Append], refusal: _Refusal
    ) -> SessionError:
        kind, reason, holder = refusal
        requests = [request for request in batch if request.session_id == session_id]
        message = f"{self._label}: refused {_describe(requests)}: {reason}"
        if kind == "fenced":
            epoch = requests[0].epoch
            return SessionFencedError(message, session_id=session_id, epoch=epoch or 0)
        if kind == "busy":
            return SessionBusyError(message, session_id=session_id, holder=holder)
        return SessionError(message)

    async def _commit_at_shutdown(
        self, connection: sqlite3.Connection, batch: list[_Append]
    ) -> None:
        """Commit `batch` and close the connection, shielded and bounded by `shutdown_grace`.

        When the grace runs out the worker thread is abandoned: it finishes
        (or fails) on its own and closes the connection itself, so the
        connection is never used by two threads.
        """
        errors: dict[str, SessionError] = {}
        failure: SessionError | None = None
        with trio.move_on_after(self.shutdown_grace, shield=True) as grace:
            try:
                refusals = await trio.to_thread.run_sync(
                    _insert_batch_and_close,
                    connection,
                    _groups_of(batch),
                    self.wall_clock(),
                    abandon_on_cancel=True,
                )
            except sqlite3.Error as exc:
                failure = SessionError(
                    f"{self._label}: could not commit {_describe(batch)} at shutdown: {exc}"
                )
                failure.__cause__ = exc
            else:
                errors = {sid: self._refusal_error(sid, batch, r) for sid, r in refusals.items()}
        if grace.cancelled_caught and batch:
            failure = SessionError(
                f"{self._label}: committing {_describe(batch)} at shutdown took longer than "
                f"{self.shutdown_grace} s; they may not be durable"
            )
        if failure is not None:
            errors = {request.session_id: failure for request in batch}
        self._resolve(batch, errors)
        if failure is not None:
            raise failure

    def _resolve(self, batch: list[_Append], errors: dict[str, SessionError]) -> None:
        """Mark `batch` committed (or failed per `errors`) and wake the flushes waiting on it."""
        committed = 0
        for request in batch:
            error = errors.get(request.session_id)
            request.error = error
            request.done.set()
            self._unconfirmed.discard(request)
            if error is None:
                committed += 1
                self._events_written += len(request.rows)
                if request.rows:
                    self._marks.advance(request.session_id, request.rows[-1][1])
            else:
                self._failed_appends += 1
                self._broken.setdefault(request.session_id, error)
                self._marks.fail(request.session_id, error)
        if committed:
            self._commits += 1
            self._largest_batch = max(self._largest_batch, committed)

    async def _renew(self, connection: sqlite3.Connection) -> None:
        """Extend every held lease; a lease found taken over breaks its session here.

        A renewal that cannot be written (the file is locked for longer than
        the busy timeout, or damaged) is retried at the next period: missing
        renewals can only let another writer take over, and fencing refuses
        this store's writes from then on.
        """
        held = list(self._held.values())
        expires_ms = self.wall_clock() + round(self.lease_ttl * 1000)
        try:
            lost = await trio.to_thread.run_sync(_renew_leases, connection, held, expires_ms)
        except sqlite3.Error:
            self._renewal_failures += 1
            return
        for lease in lost:
            if self._held.get(lease.session_id) == lease:
                del self._held[lease.session_id]
                self._broken.setdefault(
                    lease.session_id,
                    SessionFencedError(
                        f"{self._label}: session {lease.session_id!r}: the write lease of epoch "
                        f"{lease.epoch} was taken over by another writer; this store's writes "
                        "to it are refused",
                        session_id=lease.session_id,
                        epoch=lease.epoch,
                    ),
                )

    async def _expected_seq(self, session_id: str) -> int:
        """The seq the next event of `session_id` must have, counting accepted appends."""
        if session_id not in self._next_seq:
            stored = await trio.to_thread.run_sync(self._select_next_seq, session_id)
            self._next_seq.setdefault(session_id, stored)
        return self._next_seq[session_id]

    # Blocking database work; each runs in a worker thread on its own connection.

    @contextmanager
    def _connection(self, doing: str) -> Iterator[sqlite3.Connection]:
        """A fresh connection for `doing`, closed after; a raw `sqlite3.Error` becomes a
        `SessionError` naming the store and the work."""
        try:
            opened = self._connect()
        except SessionError as exc:
            raise SessionError(f"{exc} (to {doing})") from exc
        with closing(opened) as connection:
            try:
                yield connection
            except sqlite3.Error as exc:
                raise SessionError(f"{self._label}: cannot {doing}: {exc}") from exc

    def _connect(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Every connection is used by one thread at a time, but the
            # writer's successive commits may run on different worker threads.
            connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise SessionError(f"{self._label}: cannot open the database: {exc}") from exc
        try:
            connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            # Durable means on disk: every commit syncs the WAL (group commit
            # amortises the sync over a batch).
            connection.execute("PRAGMA synchronous = FULL")
            # A benign race: two first connections may both run the idempotent setup.
            if not self._schema_ready:
                (mode,) = connection.execute("PRAGMA journal_mode = WAL").fetchone()
                if mode != "wal":
                    raise SessionError(
                        f"{self._label}: SQLite refused WAL mode (journal mode is {mode!r})"
                    )
                connection.executescript(_SCHEMA)
                _add_checksums(connection)
                self._schema_ready = True
        except sqlite3.Error as exc:
            connection.close()
            raise SessionError(f"{self._label}: cannot prepare the database: {exc}") from exc
        except SessionError:
            connection.close()
            raise
        return connection

    def _insert_session(self, session_id: str) -> None:
        with self._connection(f"create session {session_id!r}") as connection:
            try:
                connection.execute("INSERT INTO sessions (id) VALUES (?)", (session_id,))
            except sqlite3.IntegrityError:
                raise SessionExistsError(
                    f"session {session_id!r} already exists in {self._label}"
                ) from None

    def _session_exists(self, session_id: str) -> bool:
        with self._connection(f"look up session {session_id!r}") as connection:
            return _has_session(connection, session_id)

    def _select_session_ids(self) -> list[str]:
        with self._connection("list the sessions") as connection:
            rows = connection.execute("SELECT id FROM sessions ORDER BY position").fetchall()
        return [session_id for (session_id,) in rows]

    def _select_events(self, session_id: str) -> list[tuple[int, str, int]]:
        with self._connection(f"load session {session_id!r}") as connection:
            connection.execute("BEGIN")  # one snapshot for the check and the read
            try:
                if not _has_session(connection, session_id):
                    raise UnknownSessionError(f"session {session_id!r} is not in {self._label}")
                rows: list[tuple[int, str, int]] = connection.execute(
                    "SELECT seq, event, checksum FROM events WHERE session_id = ? ORDER BY seq",
                    (session_id,),
                ).fetchall()
            finally:
                connection.execute("COMMIT")
        return rows

    def _select_next_seq(self, session_id: str) -> int:
        with self._connection(f"read the last seq of session {session_id!r}") as connection:
            if not _has_session(connection, session_id):
                raise UnknownSessionError(f"session {session_id!r} is not in {self._label}")
            return _next_stored_seq(connection, session_id)

    def _take_lease(self, session_id: str, owner: str) -> Lease:
        with self._connection(f"take the write lease of session {session_id!r}") as connection:
            connection.execute("BEGIN IMMEDIATE")
            try:
                now = self.wall_clock()
                row = _lease_row(connection, session_id)
                if row is not None and row[0] is not None and row[2] > now:
                    holder = describe_holder(row[0], row[1], row[2], now)
                    raise SessionBusyError(
                        f"{self._label}: session {session_id!r} is busy: another live "
                        f"writer holds it: {holder}",
                        session_id=session_id,
                        holder=row[0],
                    )
                lease = Lease(
                    session_id=session_id,
                    owner=owner,
                    epoch=(0 if row is None else row[1]) + 1,
                    expires_ms=now + round(self.lease_ttl * 1000),
                )
                connection.execute(
                    "INSERT INTO leases (session_id, owner, epoch, expires_ms) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT (session_id) DO UPDATE SET "
                    "owner = excluded.owner, epoch = excluded.epoch, "
                    "expires_ms = excluded.expires_ms",
                    (session_id, owner, lease.epoch, lease.expires_ms),
                )
                connection.execute("COMMIT")
            except Exception:
                connection.execute("ROLLBACK")
                raise
        return lease

    def _drop_lease(self, lease: Lease) -> None:
        with self._connection(
            f"release the write lease of session {lease.session_id!r}"
        ) as connection:
            connection.execute(
                "UPDATE leases SET owner = NULL, expires_ms = 0 WHERE session_id = ? AND epoch = ?",
                (lease.session_id, lease.epoch),
            )


def _has_session(connection: sqlite3.Connection, session_id: str) -> bool:
    row = connection.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone()
    return row is not None


def _next_stored_seq(connection: sqlite3.Connection, session_id: str) -> int:
    (next_seq,) = connection.execute(
        "SELECT COALESCE(MAX(seq) + 1, 0) FROM events WHERE session_id = ?", (session_id,)
    ).fetchone()
    return int(next_seq)


def _lease_row(
    connection: sqlite3.Connection, session_id: str
) -> tuple[str | None, int, int] | None:
    row: tuple[str | None, int, int] | None = connection.execute(
        "SELECT owner, epoch, expires_ms FROM leases WHERE session_id = ?", (session_id,)
    ).fetchone()
    return row


def _add_checksums(connection: sqlite3.Connection) -> None:
    """Give an events table written before checksums existed its checksum column, filled in."""
    columns = {row[1] for row in connection.execute("PRAGMA table_info(events)")}
    if "checksum" in columns:
        return
    connection.create_function("event_checksum", 3, event_checksum, deterministic=True)
    connection.execute("BEGIN IMMEDIATE")
    try:
        connection.execute("ALTER TABLE events ADD COLUMN checksum INTEGER")
        connection.execute("UPDATE events SET checksum = event_checksum(session_id, seq, event)")
        connection.execute("COMMIT")
    except Exception:
        connection.execute("ROLLBACK")
        raise


def _refusal(connection: sqlite3.Connection, group: _Group, now_ms: int) -> _Refusal | None:
    """Why `group` may not be committed now (the lease, then the seq check), or None."""
    row = _lease_row(connection, group.session_id)
    if group.epoch is not None:
        if row is None or row[1] != group.epoch or row[0] is None:
            if row is None or row[0] is None:
                now_held = "nobody holds it now"
            else:
                now_held = f"it is held by {describe_holder(row[0], row[1], row[2], now_ms)}"
            return (
                "fenced",
                f"the write lease of epoch {group.epoch} was taken over or released ({now_held})",
                "" if row is None or row[0] is None else row[0],
            )
    elif row is not None and row[0] is not None and row[2] > now_ms:
        return (
            "busy",
            f"another live writer holds the session: "
            f"{describe_holder(row[0], row[1], row[2], now_ms)}",
            row[0],
        )
    stored = _next_stored_seq(connection, group.session_id)
    first = group.rows[0][1]
    if stored != first:
        return (
            "conflict",
            f"the store's next seq for the session is {stored}, not {first} "
            "(another writer appended to it)",
            "",
        )
    return None


def _insert_batch(
    connection: sqlite3.Connection, groups: list[_Group], now_ms: int
) -> dict[str, _Refusal]:
    """Insert every admissible group in one immediate transaction; the refused ones, by session.

    The lease and seq checks run inside the transaction that holds the
    file's write lock, so nothing can change between a check and the insert.
    Any database error rolls the whole transaction back and propagates.
    """
    refused: dict[str, _Refusal] = {}
    connection.execute("BEGIN IMMEDIATE")
    try:
        for group in groups:
            refusal = _refusal(connection, group, now_ms)
            if refusal is not None:
                refused[group.session_id] = refusal
                continue
            connection.executemany(
                "INSERT INTO events (session_id, seq, event, checksum) VALUES (?, ?, ?, ?)",
                group.rows,
            )
        connection.execute("COMMIT")
    except Exception:
        connection.execute("ROLLBACK")
        raise
    return refused


def _insert_batch_and_close(
    connection: sqlite3.Connection, groups: list[_Group], now_ms: int
) -> dict[str, _Refusal]:
    with closing(connection):
        return _insert_batch(connection, groups, now_ms) if groups else {}


def _renew_leases(
    connection: sqlite3.Connection, leases: list[Lease], expires_ms: int
) -> list[Lease]:
    """Extend `leases` to `expires_ms` in one transaction; the ones found taken over."""
    lost: list[Lease] = []
    connection.execute("BEGIN IMMEDIATE")
    try:
        for lease in leases:
            cursor = connection.execute(
                "UPDATE leases SET expires_ms = ? "
                "WHERE session_id = ? AND epoch = ? AND owner IS NOT NULL",
                (expires_ms, lease.session_id, lease.epoch),
            )
            if cursor.rowcount == 0:
                lost.append(lease)
        connection.execute("COMMIT")
    except Exception:
        connection.execute("ROLLBACK")
        raise
    return lost


def _groups_of(batch: Iterable[_Append]) -> list[_Group]:
    """The batch's rows per session, in first-append order (a session's appends are contiguous)."""
    groups: dict[str, _Group] = {}
    for request in batch:
        group = groups.get(request.session_id)
        if group is None:
            groups[request.session_id] = _Group(
                session_id=request.session_id, epoch=request.epoch, rows=list(request.rows)
            )
        else:
            group.rows.extend(request.rows)
    return list(groups.values())


def _drain(receive: trio.MemoryReceiveChannel[_Append | None]) -> list[_Append]:
    """Every append the channel holds now, including those of blocked senders."""
    taken: list[_Append] = []
    while True:
        try:
            request = receive.receive_nowait()
        except trio.WouldBlock:
            return taken
        if request is not None:
            taken.append(request)


def _encode(session_id: str, start: int, events: Sequence[Event]) -> list[_Row]:
    rows: list[_Row] = []
    for expected, event in enumerate(events, start):
        if event.seq != expected:
            raise SessionError(
                f"session {session_id!r}: event {event.type} has seq {event.seq}, "
                f"expected {expected}"
            )
        try:
            text = json.dumps(event_to_json(event), separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise SessionError(
                f"session {session_id!r}: event seq {event.seq} ({event.type}) "
                f"cannot be stored as JSON: {exc}"
            ) from exc
        rows.append((session_id, event.seq, text, event_checksum(session_id, event.seq, text)))
    return rows


def _decode(where: str, seq: int, text: str) -> Event:
    try:
        return event_from_json(json.loads(text))
    except json.JSONDecodeError as exc:
        raise SessionError(f"{where}: stored event seq {seq} is not valid JSON: {exc}") from exc
    except SessionError as exc:
        raise type(exc)(f"{where}: {exc}") from exc


def _describe(batch: Iterable[_Append]) -> str:
    """`session 'a' seq 3..5, session 'b' seq 0..0`: what a batch holds, per session."""
    spans: dict[str, tuple[int, int]] = {}
    for request in batch:
        for session_id, seq, _, _ in request.rows:
            low, high = spans.get(session_id, (seq, seq))
            spans[session_id] = (min(low, seq), max(high, seq))
    if not spans:
        return "no events"
    return ", ".join(f"session {sid!r} seq {low}..{high}" for sid, (low, high) in spans.items())
