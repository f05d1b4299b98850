"""`PostgresStore`: the session store many node processes share (PostgreSQL, psycopg 3).

The same contract as `SQLiteStore` (`actors/session/store.py`), on a
database that many processes write at once. psycopg's async API needs
asyncio, so every database call is a blocking psycopg call in a
`trio.to_thread` worker, and a connection runs one call at a time.

- **Group commit.** One writer actor (`serve`) owns the writer connection.
  `append` hands events to it over a bounded memory channel (a full channel
  blocks the appender). The writer drains everything pending and commits it
  in one transaction: the batch's lease rows are read under a share lock,
  each session is checked (lease epoch, seq continuity) and the admissible
  rows go in as one `INSERT … SELECT FROM unnest(…) ON CONFLICT DO NOTHING
  RETURNING`. Then it wakes the `flush()` waiters it satisfied.
- **Lease and fencing** (`actors/session/lease.py`). `harness_leases`
  holds each session's owner, epoch and expiry; expiry is judged by the
  database's clock, so the nodes' clocks may disagree. Acquisition is one
  upsert that succeeds only on a free or expired lease. A commit holds a
  share lock on the lease rows it checked, so a takeover either waits for
  the batch (and then reads its events) or the batch sees the new epoch.
  A session that fails a check, or whose rows conflict with rows another
  writer committed, is refused as a whole (rows it got in are taken back
  before the commit, so two writers never interleave); the batch's other
  sessions commit. The writer renews this store's leases every third of
  `lease_ttl`; a lease found taken over breaks its session here. A writer
  stalled inside a commit (SIGSTOP, a paused VM) would hold its share locks
  and so every takeover; the server ends such a transaction after one
  lease length (`idle_in_transaction_session_timeout`).
- **Exact events, checked.** Each event is stored as its compact JSON text
  with its checksum (`actors/session/checksum.py`). Loading fetches the text
  as text (no driver-side JSON parsing); the worker thread verifies every
  checksum and parses the JSON, and each event is decoded once.
- **Failures stay local.** A failed commit breaks the sessions whose appends
  it held; the writer reconnects for the next batch and carries on.

Reads (`create`, `exists`, `load`, `list_sessions`, the lease calls) use at
most `MAX_READ_CONNECTIONS` connections at once (more callers wait their
turn), kept open between calls while the writer runs and closed after each
call otherwise. The schema is created or migrated on the first
connection (`actors/session/postgres_schema.py`).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, TypeVar

import attrs
import psycopg
import psycopg.conninfo
import trio
from psycopg.rows import TupleRow

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
    default_owner,
    describe_holder,
)
from actors.session.postgres_schema import ensure_schema
from actors.session.store import SessionExistsError, UnknownSessionError

DEFAULT_MAX_PENDING_APPENDS = 1024
"""Appends the writer's channel buffers before `append` blocks."""

DEFAULT_SHUTDOWN_GRACE_SECONDS = 10.0
"""How long a cancelled writer keeps trying to commit what it already accepted."""

CONNECT_TIMEOUT_SECONDS = 10
"""How long opening a connection may take before it fails."""

MAX_READ_CONNECTIONS = 4
"""Read connections a store uses at once (more callers wait their turn), and keeps
open between calls while the writer runs: a node resuming hundreds of sessions at
once must not exhaust the server's `max_connections`."""

_Connection = psycopg.Connection[TupleRow]
_Row = tuple[str, int, str, int]
"""`(session_id, seq, event JSON text, checksum)`: one row of `harness_events`."""

_Refusal = tuple[Literal["fenced", "busy", "conflict"], str, str]
"""Why a commit refused a session: the kind, a sentence, and the holder (or "")."""

_T = TypeVar("_T")

_NOW_MS = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"

_TAKE_LEASE = """
INSERT INTO harness_leases AS l (session_id, owner, epoch, expires_at)
VALUES (%(session_id)s, %(owner)s, 1, clock_timestamp() + make_interval(secs => %(ttl)s))
ON CONFLICT (session_id) DO UPDATE
    SET owner = excluded.owner, epoch = l.epoch + 1, expires_at = excluded.expires_at
    WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp()
RETURNING epoch, (extract(epoch FROM expires_at) * 1000)::bigint
"""

_LEASE_ROWS = f"""
SELECT session_id, owner, epoch, (extract(epoch FROM expires_at) * 1000)::bigint, {_NOW_MS}
FROM harness_leases WHERE session_id = ANY(%s::text[])
"""

_NEXT_SEQS = """
SELECT session_id, MAX(seq) + 1 FROM harness_events
WHERE session_id = ANY(%s::text[]) GROUP BY session_id
"""

_INSERT_ROWS = """
INSERT INTO harness_events (session_id, seq, event, checksum)
SELECT * FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::bigint[])
ON CONFLICT DO NOTHING
RETURNING session_id, seq
"""

_TAKE_BACK = """
DELETE FROM harness_events AS e
USING unnest(%s::text[], %s::bigint[]) AS r (session_id, seq)
WHERE e.session_id = r.session_id AND e.seq = r.seq
"""

_RENEW_LEASES = """
UPDATE harness_leases AS l
SET expires_at = clock_timestamp() + make_interval(secs => %s)
FROM unnest(%s::text[], %s::bigint[]) AS r (session_id, epoch)
WHERE l.session_id = r.session_id AND l.epoch = r.epoch AND l.owner IS NOT NULL
RETURNING l.session_id
"""

_DROP_LEASE = """
UPDATE harness_leases SET owner = NULL, expires_at = clock_timestamp()
WHERE session_id = %s AND epoch = %s
"""


@attrs.frozen(kw_only=True)
class PostgresStoreStatistics:
    """A snapshot of a `PostgresStore`'s writer.

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
        reconnects: writer connections replaced after they broke.
        fenced_appends: appends refused because this store's lease on their
            session was taken over (by the database's epoch check, or here
            once that was learnt).
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
    reconnects: int
    fenced_appends: int = 0


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
class PostgresStore:
    """A `SessionStore` in a PostgreSQL database, safe to share between processes.

    `create`, `exists`, `load`, `list_sessions` and the lease calls work
    whether or not the writer runs; `append` needs `serve` running (start it
    with `await nursery.start(store.serve)`), and leases are renewed only
    while it runs. The schema is created on first use; a database with a
    newer schema is refused with `SchemaVersionError` (a `SessionError`).

    Args:
        dsn: a libpq connection string or `postgresql://` URL.
        max_pending_appends: capacity of the writer's channel; a full
            channel blocks `append` until the writer takes a batch.
        shutdown_grace: seconds a cancelled writer spends committing what it
            had already accepted.
        lease_ttl: seconds a write lease outlives its holder's last renewal
            (a crashed or stalled holder's session can be taken over after
            this), measured by the database's clock.
    """

    dsn: str
    max_pending_appends: int = attrs.field(
        default=DEFAULT_MAX_PENDING_APPENDS, kw_only=True, validator=attrs.validators.ge(0)
    )
    shutdown_grace: float = attrs.field(
        default=DEFAULT_SHUTDOWN_GRACE_SECONDS, kw_only=True, validator=attrs.validators.gt(0)
    )
    lease_ttl: float = attrs.field(
        default=DEFAULT_LEASE_TTL_SECONDS, kw_only=True, validator=attrs.validators.gt(0)
    )
    _send: trio.MemorySendChannel[_Append | None] | None = attrs.field(default=None, init=False)
    _serving: bool = attrs.field(default=False, init=False)
    _schema_ready: bool = attrs.field(default=False, init=False)
    _idle: list[_Connection] = attrs.field(factory=list, init=False)
    _readers: trio.CapacityLimiter = attrs.field(
        factory=lambda: trio.CapacityLimiter(MAX_READ_CONNECTIONS), init=False
    )
    _next_seq: dict[str, int] = attrs.field(factory=dict, init=False)
    _unconfirmed: set[_Append] = attrs.field(factory=set, init=False)
    _broken: dict[str, SessionError] = attrs.field(factory=dict, init=False)
    _held: dict[str, Lease] = attrs.field(factory=dict, init=False)
    _marks: DurableMarks = attrs.field(factory=DurableMarks, init=False)
    _failed_appends: int = attrs.field(default=0, init=False)
    _fenced_appends: int = attrs.field(default=0, init=False)
    _renewal_failures: int = attrs.field(default=0, init=False)
    _commits: int = attrs.field(default=0, init=False)
    _events_written: int = attrs.field(default=0, init=False)
    _largest_batch: int = attrs.field(default=0, init=False)
    _commit_latency: LatencyWindow = attrs.field(factory=LatencyWindow, init=False)
    _reconnects: int = attrs.field(default=0, init=False)

    @property
    def running(self) -> bool:
        """True while the writer accepts appends (from `serve`'s start until its shutdown)."""
        return self._send is not None

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the writer until cancelled; `task_status.started()` once appends are accepted.

        Each round takes every pending append, commits them in one
        transaction and wakes the `flush()` waiters they satisfy; between
        rounds the writer renews the leases this store holds. A refused or
        failed commit breaks the sessions whose appends it held (their
        `flush` raises) and the writer goes on with the next batch, on a new
        connection if the old one broke. A store may be served again after
        its writer stopped, but by one task at a time.

        Cancellation: a commit already running finishes first. Then the
        writer stops accepting appends and commits everything it had
        accepted, including the appenders blocked on the full channel, in a
        shielded scope bounded by `shutdown_grace`. Only then does `serve`
        return; `running` is False from the start of this shutdown.

        Raises:
            SessionError: the writer is already running, the database cannot
                be reached at start or has a newer schema
                (`SchemaVersionError`), or the shutdown commit failed or
                missed its grace; the message names the store and the
                sessions and seqs that are not durable.
        """
        if self._serving:
            raise SessionError(f"{self._label}: serve() is already running; one writer per store")
        self._serving = True
        try:
            connection = await trio.to_thread.run_sync(self._connect, "writer")
            send, receive = trio.open_memory_channel[_Append | None](self.max_pending_appends)
            self._send = send
            await self._write_until_cancelled(connection, receive, task_status)
        finally:
            self._serving = False
            idle, self._idle = self._idle, []
            for pooled in idle:
                pooled.close()

    async def create(self, session_id: str) -> None:
        """Register a new, empty session; it is durable when this returns.

        Cancellation: once the insert started in its worker thread it
        completes (the session then exists) before the cancellation is seen.

        Raises:
            SessionExistsError: the store already holds `session_id`.
            SessionError: the database cannot be reached or written.
        """

        def insert(connection: _Connection) -> None:
            try:
                connection.execute("INSERT INTO harness_sessions (id) VALUES (%s)", (session_id,))
            except psycopg.errors.UniqueViolation:
                raise SessionExistsError(
                    f"session {session_id!r} already exists in {self._label}"
                ) from None

        await self._run(insert, f"create session {session_id!r}")
        self._next_seq[session_id] = 0

    async def exists(self, session_id: str) -> bool:
        """True when the store holds `session_id`.

        Cancellation: takes effect before or after the read, never during it.

        Raises:
            SessionError: the database cannot be reached or read.
        """

        def select(connection: _Connection) -> bool:
            return _has_session(connection, session_id)

        return await self._run(select, f"look up session {session_id!r}")

    async def load(self, session_id: str) -> list[Event]:
        """Every event of `session_id`, in seq order, restored exactly as appended.

        First waits until the appends this store already accepted for the
        session are durable, so a load sees this store's own writes. Every
        row's checksum is verified and the seqs must run 0, 1, 2, ... Needs
        no lease: any process may read any session.

        Cancellation: abandons the load; the store is unchanged.

        Raises:
            UnknownSessionError: the store has no such session.
            UnknownEventError: a stored event has an unknown, non-ignorable type.
            SessionError: a stored event fails its checksum, is not JSON or
                breaks the seq order (the message names the store, session
                and seq), an accepted append failed, or the database cannot
                be read.
        """
        await self._wait_durable(session_id)
        where = f"{self._label}: session {session_id!r}"

        def select(connection: _Connection) -> list[tuple[int, Any]]:
            return _select_events(connection, session_id, self._label)

        rows = await self._run(select, f"load session {session_id!r}")
        events = [_decode(where, seq, obj) for seq, obj in rows]
        self._next_seq.setdefault(session_id, len(events))
        self._marks.advance(session_id, len(events) - 1)
        return events

    async def acquire_lease(self, session_id: str, *, owner: str | None = None) -> Lease:
        """Take the write lease of `session_id`; it is durable when this returns.

        A lease nobody holds, or one whose holder let it expire (by the
        database's clock), is taken with the next epoch; that fences off the
        old holder's later writes. The store then renews it while `serve`
        runs, and appends under it carry its epoch. A session this store
        object had broken is usable again under the new lease (its next seq
        is read from the database).

        Cancellation: once the upsert started in its worker thread it
        completes (the lease is then held) before the cancellation is seen.

        Raises:
            SessionBusyError: another live lease holds the session; the
                message names the session and the holder.
            SessionError: the database cannot be reached or written.
        """
        holder = owner or default_owner()

        def take(connection: _Connection) -> Lease:
            params = {"session_id": session_id, "owner": holder, "ttl": self.lease_ttl}
            row = connection.execute(_TAKE_LEASE.encode(), params).fetchone()
            if row is None:
                raise self._busy_error(connection, session_id)
            return Lease(
                session_id=session_id, owner=holder, epoch=int(row[0]), expires_ms=int(row[1])
            )

        lease = await self._run(take, f"take the write lease of session {session_id!r}")
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
        used: writes still carrying it are refused. A session this store
        learnt it lost (fenced) stops counting as broken here: its refused
        writes were reported to its writer, which gives it up now.

        Cancellation: takes effect before or after the update, never during it.

        Raises:
            SessionError: the database cannot be reached or written.
        """
        if self._held.get(lease.session_id) == lease:
            del self._held[lease.session_id]
        if isinstance(self._broken.get(lease.session_id), SessionFencedError):
            # Its writer was told its writes were refused, and now gives the session up:
            # they are the stale writer's, never durable, and no longer this store's concern.
            del self._broken[lease.session_id]

        def drop(connection: _Connection) -> None:
            connection.execute(_DROP_LEASE.encode(), (lease.session_id, lease.epoch))

        await self._run(drop, f"release the write lease of session {lease.session_id!r}")

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
            SessionError: the database cannot be reached or read.
        """

        def select(connection: _Connection) -> list[str]:
            rows = connection.execute("SELECT id FROM harness_sessions ORDER BY position")
            return [str(session_id) for (session_id,) in rows]

        return await self._run(select, "list the sessions")

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

    def statistics(self) -> PostgresStoreStatistics:
        """The writer's queue, lease and commit counters, now."""
        send = self._send
        return PostgresStoreStatistics(
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
            reconnects=self._reconnects,
            fenced_appends=self._fenced_appends,
        )

    @property
    def _label(self) -> str:
        try:
            params = psycopg.conninfo.conninfo_to_dict(self.dsn)
        except psycopg.ProgrammingError:
            return "PostgreSQL store (unparsable connection string)"
        where = f"{params.get('host', 'localhost')}:{params.get('port', 5432)}"
        return f"PostgreSQL store '{where}/{params.get('dbname', '')}'"

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
            if isinstance(broken, SessionFencedError):
                self._fenced_appends += 1
            raise broken.with_traceback(None)
        held = self._held.get(session_id)
        if lease is not None and held != lease:
            self._fenced_appends += 1
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

    async def _expected_seq(self, session_id: str) -> int:
        """The seq the next event of `session_id` must have, counting accepted appends."""
        if session_id not in self._next_seq:

            def select(connection: _Connection) -> int:
                if not _has_session(connection, session_id):
                    raise UnknownSessionError(f"session {session_id!r} is not in {self._label}")
                return _next_stored_seq(connection, session_id)

            stored = await self._run(select, f"read the last seq of session {session_id!r}")
            self._next_seq.setdefault(session_id, stored)
        return self._next_seq[session_id]

    async def _run(self, work: Callable[[_Connection], _T], doing: str) -> _T:
        """Run `work` in a thread on a pooled (or, when the writer is stopped, a new) connection.

        At most `MAX_READ_CONNECTIONS` calls run at once; the others wait for
        a turn. A raw `psycopg.Error` becomes a `SessionError` naming the
        store and `doing`.
        """
        async with self._readers:
            connection = self._idle.pop() if self._idle else None

            def call() -> _T:
                nonlocal connection
                if connection is None:
                    connection = self._connect("reader")
                return work(connection)

            try:
                return await trio.to_thread.run_sync(call)
            except psycopg.Error as exc:
                raise SessionError(f"{self._label}: cannot {doing}: {exc}") from exc
            finally:
                if connection is not None:
                    reusable = not connection.closed and not connection.broken
                    if reusable and self._serving:
                        self._idle.append(connection)
                    else:
                        connection.close()

    def _busy_error(self, connection: _Connection, session_id: str) -> SessionError:
        rows = connection.execute(_LEASE_ROWS.encode(), ([session_id],)).fetchall()
        if not rows:
            return SessionError(
                f"{self._label}: the lease of session {session_id!r} changed hands while "
                "being taken; try again"
            )
        _, owner, epoch, expires_ms, now_ms = rows[0]
        return SessionBusyError(
            f"{self._label}: session {session_id!r} is busy: another live writer holds it: "
            f"{describe_holder(str(owner), int(epoch), int(expires_ms), int(now_ms))}",
            session_id=session_id,
            holder=str(owner),
        )

    # The writer actor.

    async def _write_until_cancelled(
        self,
        connection: _Connection,
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
                            connection = await self._commit(connection, batch)
                if self._held and trio.current_time() >= next_renewal:
                    with trio.CancelScope(shield=True):
                        connection = await self._renew(connection)
                    next_renewal = trio.current_time() + renew_every
        finally:
            # Stop accepting first: taking what is left also admits the
            # appenders blocked on the full channel, and closing makes later
            # sends fail instead of queueing events nobody will write.
            leftover = _drain(receive)
            receive.close()
            self._send = None
            await self._commit_at_shutdown(connection, leftover)

    async def _usable(self, connection: _Connection) -> _Connection:
        """`connection`, or a new writer connection when it broke (raises `SessionError`)."""
        if not connection.closed and not connection.broken:
            return connection
        connection.close()
        replacement = await trio.to_thread.run_sync(self._connect, "writer")
        self._reconnects += 1
        return replacement

    async def _commit(self, connection: _Connection, batch: list[_Append]) -> _Connection:
        """Write `batch` in one transaction and resolve its appends, session by session.

        Returns the connection to use next (a new one when this one broke).
        """
        try:
            connection = await self._usable(connection)
            started = trio.current_time()
            refusals = await trio.to_thread.run_sync(_insert_batch, connection, _groups_of(batch))
            self._commit_latency.record(trio.current_time() - started)
        except (psycopg.Error, SessionError) as exc:
            error = SessionError(f"{self._label}: could not commit {_describe(batch)}: {exc}")
            error.__cause__ = exc
            self._resolve(batch, {request.session_id: error for request in batch})
            return connection
        self._resolve(
            batch, {sid: self._refusal_error(sid, batch, r) for sid, r in refusals.items()}
        )
        return connection

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

    async def _commit_at_shutdown(self, connection: _Connection, batch: list[_Append]) -> None:
        """Commit `batch` and close the connection, shielded and bounded by `shutdown_grace`.

        When the grace runs out the worker thread is abandoned: it finishes
        (or fails) on its own and closes the connection itself, so the
        connection is never used by two threads.
        """
        errors: dict[str, SessionError] = {}
        failure: SessionError | None = None
        with trio.move_on_after(self.shutdown_grace, shield=True) as grace:
            try:
                if batch:
                    connection = await self._usable(connection)
                refusals = await trio.to_thread.run_sync(
                    _insert_batch_and_close,
                    connection,
                    _groups_of(batch),
                    abandon_on_cancel=True,
                )
            except (psycopg.Error, SessionError) as exc:
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
        if failure is not None and batch:
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
                if isinstance(error, SessionFencedError):
                    self._fenced_appends += 1
                self._broken.setdefault(request.session_id, error)
                self._marks.fail(request.session_id, error)
        if committed:
            self._commits += 1
            self._largest_batch = max(self._largest_batch, committed)

    async def _renew(self, connection: _Connection) -> _Connection:
        """Extend every held lease; a lease found taken over breaks its session here.

        A renewal that cannot be written (the database is unreachable) is
        retried at the next period: missing renewals can only let another
        writer take over, and fencing refuses this store's writes from then on.
        Returns the connection to use next.
        """
        held = list(self._held.values())
        try:
            connection = await self._usable(connection)
            lost = await trio.to_thread.run_sync(_renew_leases, connection, held, self.lease_ttl)
        except (psycopg.Error, SessionError):
            self._renewal_failures += 1
            return connection
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
        return connection

    # Blocking database work; each runs in a worker thread.

    def _connect(self, role: str) -> _Connection:
        """A new autocommit connection, shown as `harness <role>` in `pg_stat_activity`."""
        try:
            connection = psycopg.connect(
                self.dsn,
                autocommit=True,
                connect_timeout=CONNECT_TIMEOUT_SECONDS,
                application_name=f"harness {role}",
            )
        except psycopg.Error as exc:
            raise SessionError(f"{self._label}: cannot connect: {exc}") from exc
        try:
            if role == "writer":
                # A writer stalled inside a commit (SIGSTOP, a paused VM) holds share
                # locks on lease rows, which would hold up every takeover until it
                # resumed; the server ends such a transaction after one lease length.
                connection.execute(
                    "SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
                    (str(max(1, round(self.lease_ttl * 1000))),),
                )
            # A benign race: two first connections may both run the (locked) setup.
            if not self._schema_ready:
                ensure_schema(connection, self._label)
                self._schema_ready = True
        except psycopg.Error as exc:
            connection.close()
            raise SessionError(f"{self._label}: cannot prepare the schema: {exc}") from exc
        except SessionError:
            connection.close()
            raise
        return connection


def _has_session(connection: _Connection, session_id: str) -> bool:
    row = connection.execute(
        "SELECT 1 FROM harness_sessions WHERE id = %s", (session_id,)
    ).fetchone()
    return row is not None


def _next_stored_seq(connection: _Connection, session_id: str) -> int:
    row = connection.execute(
        "SELECT COALESCE(MAX(seq) + 1, 0) FROM harness_events WHERE session_id = %s",
        (session_id,),
    ).fetchone()
    return 0 if row is None else int(row[0])


def _select_events(connection: _Connection, session_id: str, label: str) -> list[tuple[int, Any]]:
    """The session's `(seq, parsed JSON)` pairs, each row checked against its checksum and seq."""
    where = f"{label}: session {session_id!r}"
    with connection.transaction():  # one snapshot for the check and the read
        if not _has_session(connection, session_id):
            raise UnknownSessionError(f"session {session_id!r} is not in {label}")
        rows = connection.execute(
            "SELECT seq, event, checksum FROM harness_events WHERE session_id = %s ORDER BY seq",
            (session_id,),
        ).fetchall()
    parsed: list[tuple[int, Any]] = []
    for expected, (seq, text, checksum) in enumerate(rows):
        if seq != expected:
            raise SessionError(f"{where}: stored seqs jump from {expected - 1} to {seq}")
        if checksum != event_checksum(session_id, seq, text):
            raise SessionError(
                f"{where}: stored event seq {seq} fails its checksum (the row is damaged)"
            )
        try:
            parsed.append((seq, json.loads(text)))
        except json.JSONDecodeError as exc:
            raise SessionError(f"{where}: stored event seq {seq} is not valid JSON: {exc}") from exc
    return parsed


def _refusal(group: _Group, lease: tuple[Any, ...] | None, stored: int) -> _Refusal | None:
    """Why `group` may not be committed (the lease, then the seq check), or None.

    `lease` is the session's `(owner, epoch, expires_ms, now_ms)` row, read
    under a share lock; `stored` the next seq the database holds.
    """
    if group.epoch is not None:
        if lease is None or lease[0] is None or lease[1] != group.epoch:
            if lease is None or lease[0] is None:
                now_held = "nobody holds it now"
            else:
                now_held = f"it is held by {describe_holder(*lease)}"
            return (
                "fenced",
                f"the write lease of epoch {group.epoch} was taken over or released ({now_held})",
                "" if lease is None or lease[0] is None else str(lease[0]),
            )
    elif lease is not None and lease[0] is not None and lease[2] > lease[3]:
        return (
            "busy",
            f"another live writer holds the session: {describe_holder(*lease)}",
            str(lease[0]),
        )
    first = group.rows[0][1]
    if stored != first:
        return (
            "conflict",
            f"the store's next seq for the session is {stored}, not {first} "
            "(another writer appended to it)",
            "",
        )
    return None


def _insert_batch(connection: _Connection, groups: list[_Group]) -> dict[str, _Refusal]:
    """Insert every admissible group in one transaction; the refused ones, by session.

    The lease rows are read `FOR SHARE`, so no takeover commits between the
    check and the insert. Rows that conflict with rows another writer
    committed meanwhile refuse their whole session (its inserted rows are
    deleted again before the commit). Any database error rolls the whole
    transaction back and propagates.
    """
    if not groups:
        return {}
    refused: dict[str, _Refusal] = {}
    session_ids = [group.session_id for group in groups]
    with connection.transaction():
        leases = {
            str(row[0]): tuple(row[1:])
            for row in connection.execute(
                (_LEASE_ROWS + " ORDER BY session_id FOR SHARE").encode(), (session_ids,)
            )
        }
        stored = {
            str(sid): int(next_seq)
            for sid, next_seq in connection.execute(_NEXT_SEQS.encode(), (session_ids,))
        }
        admitted: list[_Group] = []
        for group in groups:
            refusal = _refusal(group, leases.get(group.session_id), stored.get(group.session_id, 0))
            if refusal is None:
                admitted.append(group)
            else:
                refused[group.session_id] = refusal
        rows = [row for group in admitted for row in group.rows]
        if rows:
            columns = [list(column) for column in zip(*rows, strict=True)]
            written = {
                (str(sid), int(seq))
                for sid, seq in connection.execute(_INSERT_ROWS.encode(), columns)
            }
            taken_back: list[tuple[str, int]] = []
            for group in admitted:
                inserted = [(sid, seq) for sid, seq, *_ in group.rows if (sid, seq) in written]
                if len(inserted) < len(group.rows):
                    taken_back.extend(inserted)
                    refused[group.session_id] = (
                        "conflict",
                        "another writer committed some of these seqs meanwhile",
                        "",
                    )
            if taken_back:
                sids, seqs = zip(*taken_back, strict=True)
                connection.execute(_TAKE_BACK.encode(), (list(sids), list(seqs)))
    return refused


def _insert_batch_and_close(connection: _Connection, groups: list[_Group]) -> dict[str, _Refusal]:
    with connection:
        return _insert_batch(connection, groups)


def _renew_leases(connection: _Connection, leases: list[Lease], ttl: float) -> list[Lease]:
    """Extend `leases` by `ttl` seconds from the database's now; the ones found taken over."""
    renewed = {
        str(sid)
        for (sid,) in connection.execute(
            _RENEW_LEASES.encode(),
            (ttl, [lease.session_id for lease in leases], [lease.epoch for lease in leases]),
        )
    }
    return [lease for lease in leases if lease.session_id not in renewed]


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


def _decode(where: str, seq: int, obj: Any) -> Event:
    try:
        return event_from_json(obj)
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
