"""`PostgresStore`: the session store many node processes share (PostgreSQL, psycopg 3).

The same contract as `SQLiteStore`, plus the single-writer lease that makes
sharing safe. psycopg's async API needs asyncio, so every database call is a
blocking psycopg call in a `trio.to_thread` worker; one call runs on a
connection at a time.

- **Group commit.** One writer actor (`serve`) owns the writer connection.
  `append` hands events to it over a bounded memory channel (a full channel
  blocks the appender). The writer drains everything pending and commits it
  as one `INSERT … SELECT FROM unnest(…) ON CONFLICT DO NOTHING RETURNING`
  transaction, then wakes the `flush()` waiters it satisfied.
- **Lease and fencing.** A session is written only under a lease: its row
  in `harness_sessions` names the `owner` and an `epoch` that grows at every
  change of owner, with an expiry judged by the database's clock. The
  writer renews this store's leases every third of `lease_seconds`.
  `acquire_lease` (or the first `append` of a session this store does not
  hold: takeover on first touch) takes a free, own or expired lease and
  refuses a live one with `SessionBusyError`. Each event row is inserted
  only while its session's lease still has this store's owner and epoch,
  checked under a share lock on the lease row, so a takeover either waits
  for the batch to commit (and then reads its events) or the batch sees the
  new epoch. A session whose rows are refused is fenced: its appends in the
  batch fail with `SessionFencedError`, its later appends are refused at
  once, and the batch's other sessions commit.
- **Exact events, checked.** Each event is stored as its compact JSON text
  with a CRC-32 checksum, under the primary key `(session_id, seq)`.
  Loading fetches the text as text (no driver-side JSON parsing), verifies
  every checksum, and decodes each event once.

Reads (`create`, `exists`, `load`, `list_sessions`, lease calls) use a few
pooled connections while the writer runs and a connection of their own per
call otherwise; the schema is created or migrated on the first connection
(`actors.session.postgres_schema`).
"""

from __future__ import annotations

import json
import os
import socket
import uuid
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import attrs
import psycopg
import psycopg.conninfo
import trio
from psycopg.rows import TupleRow

from actors.session.codec import event_from_json, event_to_json
from actors.session.errors import SessionBusyError, SessionError, SessionFencedError
from actors.session.events import Event
from actors.session.postgres_schema import ensure_schema
from actors.session.store import SessionExistsError, UnknownSessionError

DEFAULT_MAX_PENDING_APPENDS = 1024
"""Appends the writer's channel buffers before `append` blocks."""

DEFAULT_SHUTDOWN_GRACE_SECONDS = 10.0
"""How long a cancelled writer keeps trying to commit what it already accepted."""

DEFAULT_LEASE_SECONDS = 5.0
"""How long a lease lasts without renewal; the writer renews every third of it."""

CONNECT_TIMEOUT_SECONDS = 10
"""How long opening a connection may take before it fails."""

MAX_IDLE_CONNECTIONS = 4
"""Read connections kept open between calls while the writer runs."""

_Connection = psycopg.Connection[TupleRow]
_Row = tuple[str, int, int, int, str]
"""`(session_id, seq, epoch, checksum, event JSON text)`: one row of `harness_events`."""

_T = TypeVar("_T")

_INSERT_BATCH = """
INSERT INTO harness_events (session_id, seq, epoch, checksum, event)
SELECT r.session_id, r.seq, r.epoch, r.checksum, r.event
FROM unnest(%s::text[], %s::bigint[], %s::bigint[], %s::bigint[], %s::text[])
    AS r (session_id, seq, epoch, checksum, event)
JOIN harness_sessions AS s ON s.id = r.session_id AND s.epoch = r.epoch AND s.owner = %s
FOR SHARE OF s
ON CONFLICT DO NOTHING
RETURNING session_id, seq
"""

_TAKE_LEASE = """
UPDATE harness_sessions
SET owner = %(owner)s,
    epoch = CASE WHEN owner IS NOT DISTINCT FROM %(owner)s THEN epoch ELSE epoch + 1 END,
    lease_expires = clock_timestamp() + make_interval(secs => %(seconds)s)
WHERE id = %(session_id)s
    AND (owner IS NULL OR owner = %(owner)s OR lease_expires < clock_timestamp())
RETURNING epoch
"""

_RENEW_LEASES = """
UPDATE harness_sessions AS s
SET lease_expires = clock_timestamp() + make_interval(secs => %s)
FROM unnest(%s::text[], %s::bigint[]) AS r (id, epoch)
WHERE s.id = r.id AND s.epoch = r.epoch AND s.owner = %s
RETURNING s.id
"""

_RELEASE_LEASES = """
UPDATE harness_sessions AS s
SET owner = NULL, lease_expires = NULL
FROM unnest(%s::text[], %s::bigint[]) AS r (id, epoch)
WHERE s.id = r.id AND s.epoch = r.epoch AND s.owner = %s
"""

_HOLDERS = "SELECT id, owner, epoch FROM harness_sessions WHERE id = ANY(%s::text[])"


def default_owner() -> str:
    """A writer identity unique to this store object: host, process id and a random tag."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@attrs.frozen(kw_only=True)
class Lease:
    """This store's right to write a session.

    Attributes:
        session_id: the session.
        owner: the store's writer identity.
        epoch: the lease epoch; every row written under the lease carries it.
    """

    session_id: str
    owner: str
    epoch: int


@attrs.frozen(kw_only=True)
class PostgresStoreStatistics:
    """A snapshot of a `PostgresStore`'s writer.

    Attributes:
        pending_appends: accepted appends not yet committed (nor failed).
        blocked_appenders: tasks waiting in `append` for room in the full channel.
        failed_appends: accepted appends a failed commit did not write.
        fenced_appends: accepted appends refused because their lease was lost.
        commits: transactions committed by the writer.
        events_written: events committed by the writer.
        largest_batch: the most appends committed in one transaction.
        leases_held: sessions this store holds the lease of.
        fenced_sessions: sessions whose lease this store lost and has not re-acquired.
    """

    pending_appends: int
    blocked_appenders: int
    failed_appends: int
    fenced_appends: int
    commits: int
    events_written: int
    largest_batch: int
    leases_held: int
    fenced_sessions: int


@attrs.define(eq=False)
class _Append:
    """One accepted `append` call; `done` is set once it is committed or has failed."""

    session_id: str
    rows: list[_Row]
    done: trio.Event = attrs.field(factory=trio.Event)
    error: SessionError | None = None

    @property
    def durable(self) -> bool:
        return self.done.is_set() and self.error is None


@attrs.frozen
class _Holder:
    """Who holds a session's lease now, as the database said when a write was refused."""

    owner: str | None
    epoch: int


@attrs.define(eq=False)
class PostgresStore:
    """A `SessionStore` in a PostgreSQL database, safe to share between processes.

    `create`, `exists`, `load` and `list_sessions` work whether or not the
    writer runs; `append` and the lease calls need `serve` running (start it
    with `await nursery.start(store.serve)`). The schema is created on first
    use; a database with a newer schema is refused with `SchemaVersionError`.

    Args:
        dsn: a libpq connection string or `postgresql://` URL.
        owner: this writer's identity in the lease table (default: host,
            process id and a random tag, unique to the object). Two stores
            with the same owner count as one writer: give each its own.
        lease_seconds: how long a lease lasts unrenewed; the writer renews
            every third of it, so a stalled or dead process loses its
            sessions that long after its last renewal.
        max_pending_appends: capacity of the writer's channel; a full
            channel blocks `append` until the writer takes a batch.
        shutdown_grace: seconds a cancelled writer spends committing what it
            had already accepted and releasing its leases.
    """

    dsn: str
    owner: str = attrs.field(factory=default_owner, kw_only=True)
    lease_seconds: float = attrs.field(
        default=DEFAULT_LEASE_SECONDS, kw_only=True, validator=attrs.validators.gt(0)
    )
    max_pending_appends: int = attrs.field(
        default=DEFAULT_MAX_PENDING_APPENDS, kw_only=True, validator=attrs.validators.ge(0)
    )
    shutdown_grace: float = attrs.field(
        default=DEFAULT_SHUTDOWN_GRACE_SECONDS, kw_only=True, validator=attrs.validators.gt(0)
    )
    _send: trio.MemorySendChannel[_Append] | None = attrs.field(default=None, init=False)
    _serving: bool = attrs.field(default=False, init=False)
    _schema_ready: bool = attrs.field(default=False, init=False)
    _idle: list[_Connection] = attrs.field(factory=list, init=False)
    _leases: dict[str, Lease] = attrs.field(factory=dict, init=False)
    _fenced: dict[str, SessionFencedError] = attrs.field(factory=dict, init=False)
    _next_seq: dict[str, int] = attrs.field(factory=dict, init=False)
    _unconfirmed: set[_Append] = attrs.field(factory=set, init=False)
    _commits: int = attrs.field(default=0, init=False)
    _events_written: int = attrs.field(default=0, init=False)
    _largest_batch: int = attrs.field(default=0, init=False)
    _fenced_appends: int = attrs.field(default=0, init=False)

    @property
    def running(self) -> bool:
        """True while the writer accepts appends (from `serve`'s start until its shutdown)."""
        return self._send is not None

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the writer until cancelled; `task_status.started()` once appends are accepted.

        Each round takes every pending append, commits them in one
        transaction and wakes the `flush()` waiters they satisfy; between
        rounds it renews this store's leases every third of `lease_seconds`.
        A store may be served again after its writer stopped, but by one task
        at a time.

        Cancellation: a commit already running finishes first. Then the
        writer stops accepting appends, commits everything it had accepted
        (including the appenders blocked on the full channel) and releases
        its leases, in a shielded scope bounded by `shutdown_grace`. Only
        then does `serve` return; `running` is False from the start of this
        shutdown.

        Raises:
            SessionError: the writer is already running, the database cannot
                be reached or has a newer schema (`SchemaVersionError`), or a
                commit failed or missed the shutdown grace; the message names
                the store and the sessions and seqs that are not durable.
                Appends queued behind a failed commit are not written, and
                every later `flush()` raises. A fenced session is not a
                failure of the writer.
        """
        if self._serving:
            raise SessionError(f"{self._label}: serve() is already running; one writer per store")
        self._serving = True
        try:
            connection = await trio.to_thread.run_sync(self._connect, "writer")
            send, receive = trio.open_memory_channel[_Append](self.max_pending_appends)
            self._send = send
            await self._write_until_cancelled(connection, receive, task_status)
        finally:
            self._serving = False
            idle, self._idle = self._idle, []
            for pooled in idle:
                pooled.close()

    async def create(self, session_id: str) -> None:
        """Register a new, empty session with a free lease; it is durable when this returns.

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
                raise SessionExistsError(f"session {session_id!r} already exists") from None

        await self._run(insert, f"create session {session_id!r}")

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
        session are resolved, so a load sees this store's own writes. Needs
        no lease: any process may read any session.

        Cancellation: abandons the load; the store is unchanged.

        Raises:
            UnknownSessionError: the store has no such session.
            UnknownEventError: a stored event has an unknown, non-ignorable type.
            SessionError: a stored event fails its checksum or cannot be
                decoded (the message names the session and seq), an accepted
                append of the session failed, or the database cannot be read.
        """
        await self._wait_durable([r for r in self._unconfirmed if r.session_id == session_id])

        def select(connection: _Connection) -> list[tuple[int, Any]]:
            return self._select_events(connection, session_id)

        rows = await self._run(select, f"load session {session_id!r}")
        return [_decode(session_id, seq, obj) for seq, obj in rows]

    async def acquire_lease(self, session_id: str) -> Lease:
        """Take the lease of `session_id` for this store's owner, or return the one it holds.

        A free lease, this owner's own, or one whose holder let it expire is
        taken; taking it from another owner starts a new epoch, which fences
        off that owner's later writes. Acquiring again after this store was
        fenced starts a new epoch too (the session's next seq is then read
        from the database). The writer renews the lease until
        `release_lease` or the end of `serve`.

        Cancellation: once the update started in its worker thread it
        completes; a lease taken then is held as if this returned.

        Raises:
            SessionBusyError: another owner holds a live lease; the message
                names the session, the holder and when its lease expires.
            UnknownSessionError: the store has no such session.
            SessionError: the writer is not running, or the database cannot
                be reached.
        """
        self._writer_channel(session_id)
        held = self._leases.get(session_id)
        if held is not None:
            await trio.lowlevel.checkpoint()
            return held

        def take(connection: _Connection) -> tuple[int, int]:
            with connection.transaction():
                row = connection.execute(
                    _TAKE_LEASE,
                    {"owner": self.owner, "seconds": self.lease_seconds, "session_id": session_id},
                ).fetchone()
                if row is None:
                    raise self._busy_error(connection, session_id)
                # A new statement, so a new snapshot: the update waited for
                # any batch of the previous owner, whose rows are now visible.
                (next_seq,) = _one(
                    connection,
                    "SELECT COALESCE(MAX(seq) + 1, 0) FROM harness_events WHERE session_id = %s",
                    (session_id,),
                )
            return int(row[0]), int(next_seq)

        epoch, next_seq = await self._run(take, f"take the lease of session {session_id!r}")
        lease = Lease(session_id=session_id, owner=self.owner, epoch=epoch)
        if not self.running:
            # The writer stopped (and released its leases) while this one was taken.
            def release(connection: _Connection) -> None:
                _release(connection, [lease], self.owner)

            with trio.CancelScope(shield=True):
                await self._run(release, f"release the lease of session {session_id!r}")
            self._writer_channel(session_id)
        held = self._leases.get(session_id)
        if held is not None and held.epoch == epoch:
            return held
        self._leases[session_id] = lease
        self._fenced.pop(session_id, None)
        self._next_seq[session_id] = next_seq
        return lease

    async def release_lease(self, session_id: str) -> None:
        """Wait for this store's appends to `session_id`, then give its lease up.

        Another owner may take the session at once. Releasing a lease this
        store does not hold (or lost) only forgets the session's fence.

        Cancellation: during the wait for pending appends, the lease is kept
        (releasing it would fence them); once the update started it completes.

        Raises:
            SessionFencedError: the lease was lost before the appends committed.
            SessionError: an accepted append of the session failed (the lease
                is kept until it expires unrenewed), or the database cannot
                be reached.
        """
        self._fenced.pop(session_id, None)
        lease = self._leases.get(session_id)
        if lease is None:
            await trio.lowlevel.checkpoint()
            return
        await self.flush(session_id)
        if self._leases.get(session_id) is not lease:
            return
        del self._leases[session_id]
        self._next_seq.pop(session_id, None)

        def release(connection: _Connection) -> None:
            _release(connection, [lease], self.owner)

        await self._run(release, f"release the lease of session {session_id!r}")

    def lease(self, session_id: str) -> Lease | None:
        """The lease this store holds on `session_id`, if any (None when never taken or lost)."""
        return self._leases.get(session_id)

    async def append(self, session_id: str, events: Sequence[Event]) -> None:
        """Hand `events` (contiguous seqs, continuing the session) to the writer.

        Takes the session's lease first when this store does not hold it
        (takeover on first touch). Returns once the writer accepted the
        events, usually before they are durable: call `flush()` for that. A
        full channel blocks the caller until the writer takes a batch
        (backpressure). Appends to one session must not overlap (as with
        `Session`, which appends one at a time).

        Cancellation: before the writer accepted the events, cancellation
        leaves the store unchanged and the same seqs may be appended again;
        after, the events are committed like any other.

        Raises:
            SessionFencedError: this store lost the session's lease (it is
                refused until `acquire_lease` takes the lease again).
            SessionBusyError: another owner holds a live lease.
            SessionError: the writer is not running (start it with
                `await nursery.start(store.serve)`), a seq does not continue
                the session, or an event cannot be written as JSON.
            UnknownSessionError: the store has no such session.
        """
        self._writer_channel(session_id)
        fenced = self._fenced.get(session_id)
        if fenced is not None:
            raise SessionFencedError(f"{fenced}; append refused") from fenced
        lease = self._leases.get(session_id) or await self.acquire_lease(session_id)
        send = self._writer_channel(session_id)
        start = self._next_seq.get(session_id)
        if start is None or self._leases.get(session_id) is not lease:
            raise self._fenced.get(session_id) or SessionFencedError(
                f"session {session_id!r}: {self._label} lost the lease while appending"
            )
        if not events:
            await trio.lowlevel.checkpoint()
            return
        request = _Append(
            session_id=session_id, rows=_encode(session_id, lease.epoch, start, events)
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
        if not request.durable:
            self._unconfirmed.add(request)

    async def flush(self, session_id: str | None = None) -> None:
        """Return once every append accepted before this call is durable.

        With `session_id`, only that session's appends are waited for (and
        only their failures raise), so one fenced session does not fail the
        flushes of the others. Waiters are woken by the commit that makes
        their appends durable; with nothing pending this returns at once.

        Cancellation: abandons the wait; the appends are committed regardless.

        Raises:
            SessionFencedError: `session_id` was fenced (its lease was lost).
            SessionError: an accepted append was not committed (a failed
                commit, a fenced session, or a missed shutdown grace); the
                message names the sessions and seqs.
        """
        if session_id is None:
            await self._wait_durable(list(self._unconfirmed))
            return
        await self._wait_durable([r for r in self._unconfirmed if r.session_id == session_id])
        fenced = self._fenced.get(session_id)
        if fenced is not None:
            raise SessionFencedError(str(fenced)) from fenced

    async def list_sessions(self) -> list[str]:
        """Ids of every stored session, in creation order.

        Cancellation: takes effect before or after the read, never during it.

        Raises:
            SessionError: the database cannot be reached or read.
        """

        def select(connection: _Connection) -> list[str]:
            rows = connection.execute("SELECT id FROM harness_sessions ORDER BY position")
            return [str(session_id) for (session_id,) in rows]

        return await self._run(select, "list sessions")

    def statistics(self) -> PostgresStoreStatistics:
        """The writer's queue, commit and lease counters, now."""
        send = self._send
        return PostgresStoreStatistics(
            pending_appends=sum(1 for r in self._unconfirmed if not r.done.is_set()),
            blocked_appenders=0 if send is None else send.statistics().tasks_waiting_send,
            failed_appends=sum(1 for r in self._unconfirmed if r.error is not None),
            fenced_appends=self._fenced_appends,
            commits=self._commits,
            events_written=self._events_written,
            largest_batch=self._largest_batch,
            leases_held=len(self._leases),
            fenced_sessions=len(self._fenced),
        )

    @property
    def _label(self) -> str:
        try:
            params = psycopg.conninfo.conninfo_to_dict(self.dsn)
        except psycopg.ProgrammingError:
            return "PostgreSQL store (unparsable connection string)"
        where = f"{params.get('host', 'localhost')}:{params.get('port', 5432)}"
        return f"PostgreSQL store '{where}/{params.get('dbname', '')}'"

    def _writer_channel(self, session_id: str) -> trio.MemorySendChannel[_Append]:
        send = self._send
        if send is None:
            raise SessionError(
                f"{self._label} is not running; start it with `await nursery.start(store.serve)` "
                f"before writing to session {session_id!r}"
            )
        return send

    async def _wait_durable(self, pending: list[_Append]) -> None:
        """Wait until every request in `pending` is resolved; raise if one failed."""
        waited = False
        for request in pending:
            if not request.done.is_set():
                await request.done.wait()
                waited = True
        if not waited:
            await trio.lowlevel.checkpoint()
        failed = [request.error for request in pending if request.error is not None]
        if failed:
            kind = SessionFencedError if isinstance(failed[0], SessionFencedError) else SessionError
            raise kind(
                f"{len(failed)} accepted append(s) are not durable; first failure: {failed[0]}"
            ) from failed[0]

    async def _run(self, work: Callable[[_Connection], _T], what: str) -> _T:
        """Run `work` on a pooled (or, when the writer is stopped, a new) connection in a thread."""
        connection = self._idle.pop() if self._idle else None

        def call() -> _T:
            nonlocal connection
            if connection is None:
                connection = self._connect()
            return work(connection)

        try:
            return await trio.to_thread.run_sync(call)
        except psycopg.Error as exc:
            raise SessionError(f"{self._label}: cannot {what}: {exc}") from exc
        finally:
            if connection is not None:
                reusable = not connection.closed and not connection.broken
                if reusable and self._serving and len(self._idle) < MAX_IDLE_CONNECTIONS:
                    self._idle.append(connection)
                else:
                    connection.close()

    # The writer actor.

    async def _write_until_cancelled(
        self,
        connection: _Connection,
        receive: trio.MemoryReceiveChannel[_Append],
        task_status: trio.TaskStatus[None],
    ) -> None:
        failure: SessionError | None = None
        try:
            task_status.started()
            renew_at = trio.current_time() + self.lease_seconds / 3
            while failure is None:
                batch: list[_Append] = []
                with trio.move_on_at(renew_at):
                    batch.append(await receive.receive())
                batch.extend(_drain(receive))
                # A taken batch is always written: the thread cannot be
                # interrupted anyway, and dropping it would lose accepted events.
                with trio.CancelScope(shield=True):
                    if trio.current_time() >= renew_at:
                        failure = await self._renew(connection)
                        renew_at = trio.current_time() + self.lease_seconds / 3
                    if failure is None and batch:
                        failure = await self._commit(connection, batch)
                    elif failure is not None:
                        self._fail(batch, failure)
            raise failure
        finally:
            # Stop accepting first: taking what is left also admits the
            # appenders blocked on the full channel, and closing makes later
            # sends fail instead of queueing events nobody will write.
            leftover = _drain(receive)
            receive.close()
            self._send = None
            if failure is None:
                await self._commit_at_shutdown(connection, leftover)
            else:
                connection.close()
                self._fail(leftover, failure)

    def _fail(self, batch: list[_Append], failure: SessionError) -> None:
        if batch:
            self._resolve(
                batch,
                set(),
                SessionError(
                    f"{self._label}: {_describe(batch)} not written "
                    f"because an earlier commit failed: {failure}"
                ),
            )

    async def _commit(self, connection: _Connection, batch: list[_Append]) -> SessionError | None:
        """Write `batch` in one transaction; resolve its appends; return the failure, if any."""
        try:
            written, holders = await trio.to_thread.run_sync(
                _insert_rows, connection, _rows_of(batch), self.owner
            )
        except psycopg.Error as exc:
            error = SessionError(f"{self._label}: could not commit {_describe(batch)}: {exc}")
            error.__cause__ = exc
            self._resolve(batch, set(), error)
            return error
        self._fence_sessions(holders)
        self._resolve(batch, written, None)
        return None

    async def _renew(self, connection: _Connection) -> SessionError | None:
        """Extend every lease this store holds; fence the sessions whose lease was lost."""
        leases = list(self._leases.values())
        if not leases:
            return None
        try:
            holders = await trio.to_thread.run_sync(
                _renew_leases, connection, leases, self.owner, self.lease_seconds
            )
        except psycopg.Error as exc:
            error = SessionError(f"{self._label}: could not renew {len(leases)} lease(s): {exc}")
            error.__cause__ = exc
            return error
        self._fence_sessions(holders)
        return None

    async def _commit_at_shutdown(self, connection: _Connection, batch: list[_Append]) -> None:
        """Commit `batch`, release the leases and close, shielded and bounded by `shutdown_grace`.

        When the grace runs out the worker thread is abandoned: it finishes
        (or fails) on its own and closes the connection itself, so the
        connection is never used by two threads.
        """
        error: SessionError | None = None
        leases = list(self._leases.values())
        self._leases.clear()
        self._next_seq.clear()
        written: set[tuple[str, int]] = set()
        holders: dict[str, _Holder] = {}
        with trio.move_on_after(self.shutdown_grace, shield=True) as grace:
            try:
                written, holders = await trio.to_thread.run_sync(
                    _insert_release_and_close,
                    connection,
                    _rows_of(batch),
                    leases,
                    self.owner,
                    abandon_on_cancel=True,
                )
            except psycopg.Error as exc:
                error = SessionError(
                    f"{self._label}: could not commit {_describe(batch)} at shutdown: {exc}"
                )
                error.__cause__ = exc
        if grace.cancelled_caught:
            error = SessionError(
                f"{self._label}: committing {_describe(batch)} and releasing {len(leases)} "
                f"lease(s) at shutdown took longer than {self.shutdown_grace} s; the events "
                "may not be durable"
            )
        self._fence_sessions(holders)
        self._resolve(batch, written, error)
        if error is not None and (batch or leases):
            raise error

    def _fence_sessions(self, holders: dict[str, _Holder]) -> None:
        """Record that this store lost the lease of every session in `holders`."""
        for session_id, holder in holders.items():
            lease = self._leases.pop(session_id, None)
            self._next_seq.pop(session_id, None)
            lost = f"epoch {lease.epoch}" if lease is not None else "its lease"
            if holder.owner is None:
                now = "the lease is free"
            elif lease is not None and (holder.owner, holder.epoch) == (self.owner, lease.epoch):
                now = "its seqs were taken by a writer that bypassed the lease"
            else:
                now = f"{holder.owner!r} holds it at epoch {holder.epoch}"
            self._fenced[session_id] = SessionFencedError(
                f"session {session_id!r}: {self._label} (owner {self.owner!r}) lost {lost} "
                f"of the session's lease; {now}"
            )

    def _resolve(
        self, batch: list[_Append], written: set[tuple[str, int]], error: SessionError | None
    ) -> None:
        """Settle `batch`: durable where written, fenced where refused, or all failed with `error`.

        Wakes the flushes waiting on it.
        """
        committed = 0
        for request in batch:
            request.done.set()
            if error is not None:
                request.error = error
                self._unconfirmed.add(request)
            elif all((sid, seq) in written for sid, seq, *_ in request.rows):
                committed += 1
                self._unconfirmed.discard(request)
            else:
                fenced = self._fenced.get(request.session_id)
                request.error = SessionFencedError(
                    f"{_describe([request])} refused: "
                    f"{fenced or 'the seqs were already taken by another writer'}"
                )
                self._fenced_appends += 1
                self._unconfirmed.discard(request)
        if committed:
            self._commits += 1
            self._events_written += sum(
                len(request.rows) for request in batch if request.error is None
            )
            self._largest_batch = max(self._largest_batch, committed)

    def _busy_error(self, connection: _Connection, session_id: str) -> SessionError:
        row = connection.execute(
            "SELECT owner, epoch, EXTRACT(EPOCH FROM lease_expires - clock_timestamp()) "
            "FROM harness_sessions WHERE id = %s",
            (session_id,),
        ).fetchone()
        if row is None:
            return UnknownSessionError(f"session {session_id!r} is not in {self._label}")
        owner, epoch, remaining = row
        return SessionBusyError(
            f"session {session_id!r} is being written by {owner!r} (lease epoch {epoch}, "
            f"expires in {float(remaining):.1f} s); {self._label} refuses a second writer"
        )

    # Blocking database work; each runs in a worker thread.

    def _connect(self, role: str = "reader") -> _Connection:
        """A new autocommit connection, named `harness <role> <owner>` in `pg_stat_activity`."""
        try:
            connection = psycopg.connect(
                self.dsn,
                autocommit=True,
                connect_timeout=CONNECT_TIMEOUT_SECONDS,
                application_name=f"harness {role} {self.owner}"[:63],
            )
        except psycopg.Error as exc:
            raise SessionError(f"{self._label}: cannot connect: {exc}") from exc
        try:
            # A benign race: two first connections may both run the idempotent setup.
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

    def _select_events(self, connection: _Connection, session_id: str) -> list[tuple[int, Any]]:
        """The session's `(seq, decoded JSON)` pairs, each checked against its checksum."""
        with connection.transaction():  # one snapshot for the check and the read
            if not _has_session(connection, session_id):
                raise UnknownSessionError(f"session {session_id!r} is not in {self._label}")
            rows = connection.execute(
                "SELECT seq, checksum, event FROM harness_events "
                "WHERE session_id = %s ORDER BY seq",
                (session_id,),
            ).fetchall()
        return [
            (int(seq), _parse(session_id, int(seq), int(sum_), text)) for seq, sum_, text in rows
        ]


def _one(connection: _Connection, query: str, params: Sequence[object]) -> tuple[Any, ...]:
    row = connection.execute(query.encode(), params).fetchone()
    if row is None:
        raise SessionError(f"query returned no row: {query}")
    return row


def _has_session(connection: _Connection, session_id: str) -> bool:
    row = connection.execute(
        "SELECT 1 FROM harness_sessions WHERE id = %s", (session_id,)
    ).fetchone()
    return row is not None


def _insert_rows(
    connection: _Connection, rows: list[_Row], owner: str
) -> tuple[set[tuple[str, int]], dict[str, _Holder]]:
    """Insert the rows whose lease still matches, in one transaction.

    Returns the `(session_id, seq)` pairs written and, for every session
    with a row refused, who holds its lease now. A session is written whole
    or not at all: rows of a partly refused session are taken back before
    the commit, so a log never interleaves two writers.
    """
    if not rows:
        return set(), {}
    with connection.transaction():
        columns = [list(column) for column in zip(*rows, strict=True)]
        written = {
            (str(sid), int(seq))
            for sid, seq in connection.execute(_INSERT_BATCH.encode(), [*columns, owner])
        }
        refused = {sid for sid, seq, *_ in rows if (sid, seq) not in written}
        if not refused:
            return written, {}
        taken_back = [(sid, seq) for sid, seq in written if sid in refused]
        if taken_back:
            sids, seqs = zip(*taken_back, strict=True)
            connection.execute(
                "DELETE FROM harness_events AS e USING unnest(%s::text[], %s::bigint[]) "
                "AS r (session_id, seq) WHERE e.session_id = r.session_id AND e.seq = r.seq",
                (list(sids), list(seqs)),
            )
        holders = _holders(connection, refused)
    return {pair for pair in written if pair[0] not in refused}, holders


def _renew_leases(
    connection: _Connection, leases: list[Lease], owner: str, seconds: float
) -> dict[str, _Holder]:
    """Extend `leases`; return who holds each lease that could not be renewed."""
    with connection.transaction():
        renewed = {
            str(sid)
            for (sid,) in connection.execute(
                _RENEW_LEASES.encode(),
                (
                    seconds,
                    [lease.session_id for lease in leases],
                    [lease.epoch for lease in leases],
                    owner,
                ),
            )
        }
        lost = {lease.session_id for lease in leases} - renewed
        return _holders(connection, lost) if lost else {}


def _release(connection: _Connection, leases: list[Lease], owner: str) -> None:
    if leases:
        connection.execute(
            _RELEASE_LEASES.encode(),
            ([lease.session_id for lease in leases], [lease.epoch for lease in leases], owner),
        )


def _insert_release_and_close(
    connection: _Connection, rows: list[_Row], leases: list[Lease], owner: str
) -> tuple[set[tuple[str, int]], dict[str, _Holder]]:
    with connection:
        written, holders = _insert_rows(connection, rows, owner)
        _release(connection, leases, owner)
    return written, holders


def _holders(connection: _Connection, session_ids: Iterable[str]) -> dict[str, _Holder]:
    rows = connection.execute(_HOLDERS.encode(), (list(session_ids),)).fetchall()
    return {
        str(sid): _Holder(None if owner is None else str(owner), int(epoch))
        for sid, owner, epoch in rows
    }


def _rows_of(batch: Iterable[_Append]) -> list[_Row]:
    return [row for request in batch for row in request.rows]


def _drain(receive: trio.MemoryReceiveChannel[_Append]) -> list[_Append]:
    """Everything the channel holds now, including values of blocked senders."""
    taken: list[_Append] = []
    while True:
        try:
            taken.append(receive.receive_nowait())
        except trio.WouldBlock:
            return taken


def _checksum(text: str) -> int:
    return zlib.crc32(text.encode())


def _encode(session_id: str, epoch: int, start: int, events: Sequence[Event]) -> list[_Row]:
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
        rows.append((session_id, event.seq, epoch, _checksum(text), text))
    return rows


def _parse(session_id: str, seq: int, checksum: int, text: str) -> Any:
    """The stored JSON text of one event, checked and parsed (no cattrs: thread-safe)."""
    actual = _checksum(text)
    if actual != checksum:
        raise SessionError(
            f"session {session_id!r}: stored event seq {seq} fails its checksum "
            f"(stored {checksum:08x}, computed {actual:08x}); the row was altered or damaged"
        )
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SessionError(
            f"session {session_id!r}: stored event seq {seq} is not valid JSON: {exc}"
        ) from exc


def _decode(session_id: str, seq: int, obj: Any) -> Event:
    try:
        return event_from_json(obj)
    except SessionError as exc:
        raise type(exc)(f"session {session_id!r}: {exc}") from exc


def _describe(batch: Iterable[_Append]) -> str:
    """`session 'a' seq 3..5, session 'b' seq 0..0`: what a batch holds, per session."""
    spans: dict[str, tuple[int, int]] = {}
    for request in batch:
        for session_id, seq, *_ in request.rows:
            low, high = spans.get(session_id, (seq, seq))
            spans[session_id] = (min(low, seq), max(high, seq))
    if not spans:
        return "no events"
    return ", ".join(f"session {sid!r} seq {low}..{high}" for sid, (low, high) in spans.items())
