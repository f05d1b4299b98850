"""`PostgresStore`: the session store many node processes share (PostgreSQL, psycopg 3).

The same contract as `SQLiteStore` (`actors/session/store.py`), on a
database that many processes write at once. psycopg's async API needs
asyncio, so every database call is a blocking psycopg call in a
`trio.to_thread` worker, and a connection runs one call at a time.

- **Group commit.** One writer actor (`serve`, the group committer of
  `actors/session/group_commit.py`, shared with `SQLiteStore`) owns the writer connection.
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

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import attrs
import psycopg
import psycopg.conninfo
import trio
from psycopg.rows import TupleRow

from actors.session.checksum import event_checksum
from actors.session.codec import event_from_json
from actors.session.durability import DurableChanges
from actors.session.errors import SessionError
from actors.session.events import Event
from actors.session.group_commit import (
    DEFAULT_MAX_PENDING_APPENDS,
    DEFAULT_SHUTDOWN_GRACE_SECONDS,
    GroupCommitter,
    LeaseRow,
    Refusal,
    SessionRows,
    WriterLink,
    WriterStatistics,
    refusal,
)
from actors.session.lease import (
    DEFAULT_LEASE_TTL_SECONDS,
    Lease,
    SessionBusyError,
    default_owner,
    describe_holder,
)
from actors.session.postgres_schema import ensure_schema
from actors.session.store import SessionExistsError, UnknownSessionError

CONNECT_TIMEOUT_SECONDS = 10
"""How long opening a connection may take before it fails."""

LEASE_LOCK_WAIT_SECONDS = 0.2
"""How long taking a lease waits for its row's lock (`lock_timeout`): a lease whose row a
commit holds is then refused as busy, so a writer stalled inside a commit never holds up
the read connections of another process."""

BUSY_LOCKED_RETRY_SECONDS = 0.5
"""The `retry_after` of a lease refused because a commit held its row."""

MAX_READ_CONNECTIONS = 4
"""Read connections a store uses at once (more callers wait their turn), and keeps
open between calls while the writer runs: a node resuming hundreds of sessions at
once must not exhaust the server's `max_connections`."""

_Connection = psycopg.Connection[TupleRow]

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

_STORED_ROWS = """
SELECT e.session_id, e.seq, e.checksum FROM harness_events AS e
JOIN unnest(%s::text[], %s::bigint[]) AS r (session_id, seq)
    ON e.session_id = r.session_id AND e.seq = r.seq
"""

_DROP_LEASE = """
UPDATE harness_leases SET owner = NULL, expires_at = clock_timestamp()
WHERE session_id = %s AND epoch = %s
"""


@attrs.frozen(kw_only=True)
class PostgresStoreStatistics(WriterStatistics):
    """A snapshot of a `PostgresStore`'s writer: the fields of `WriterStatistics`, and

    Attributes:
        reconnects: writer connections replaced after they broke.
    """

    reconnects: int


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
    lease_owner: str | None = attrs.field(default=None, kw_only=True)
    """Who this store's leases name when `acquire_lease` is given no owner (default: the
    process, `pid N on host 'H'`); a cluster node names itself, so callers refused as busy
    learn which node holds the session."""
    lease_lost: Callable[[str], None] | None = attrs.field(default=None, kw_only=True)
    """Called with a session id, in the writer's task, when the writer learns that another
    writer took over this store's lease on it (a refused commit or renewal); the session's
    appends here fail from then on. It must not block: a node drops the session."""
    _schema_ready: bool = attrs.field(default=False, init=False)
    _idle: list[_Connection] = attrs.field(factory=list, init=False)
    _readers: trio.CapacityLimiter = attrs.field(
        factory=lambda: trio.CapacityLimiter(MAX_READ_CONNECTIONS), init=False
    )
    _reconnects: int = attrs.field(default=0, init=False)
    _writer: GroupCommitter = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._writer = GroupCommitter(self._label, self._stored_next_seq, self)

    @property
    def running(self) -> bool:
        """True while the writer accepts appends (from `serve`'s start until its shutdown)."""
        return self._writer.running

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
        try:
            await self._writer.serve(self._open_writer, task_status=task_status)
        finally:
            if not self._writer.serving:  # a refused second `serve` leaves the pool alone
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
        self._writer.session_created(session_id)

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
        await self._writer.flush(session_id)
        where = f"{self._label}: session {session_id!r}"

        def select(connection: _Connection) -> list[tuple[int, Any]]:
            return _select_events(connection, session_id, self._label)

        rows = await self._run(select, f"load session {session_id!r}")
        events = [_decode(where, seq, obj) for seq, obj in rows]
        self._writer.session_loaded(session_id, len(events))
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
        holder = owner or self.lease_owner or default_owner()

        def take(connection: _Connection) -> Lease:
            params = {"session_id": session_id, "owner": holder, "ttl": self.lease_ttl}
            try:
                with connection.transaction():
                    # The holder's commit in flight share-locks the row (a stalled one
                    # until the server ends it): wait `LEASE_LOCK_WAIT_SECONDS` at most.
                    connection.execute(
                        "SELECT set_config('lock_timeout', %s, true)",
                        (str(max(1, round(LEASE_LOCK_WAIT_SECONDS * 1000))),),
                    )
                    row = connection.execute(_TAKE_LEASE.encode(), params).fetchone()
            except psycopg.errors.LockNotAvailable:
                raise self._busy_error(connection, session_id, locked=True) from None
            if row is None:
                raise self._busy_error(connection, session_id)
            return Lease(
                session_id=session_id, owner=holder, epoch=int(row[0]), expires_ms=int(row[1])
            )

        lease = await self._run(take, f"take the write lease of session {session_id!r}")
        self._writer.lease_taken(lease)
        return lease

    def holds_lease(self, lease: Lease) -> bool:
        """True while this store holds `lease`: taken, not released, and not found taken
        over by a refused commit or a renewal."""
        return self._writer.holds_lease(lease)

    async def release_lease(self, lease: Lease) -> None:
        """Give `lease` up so another writer may take the session at once.

        A lease that was already taken over is left alone. The epoch stays
        used: writes still carrying it are refused.

        Cancellation: takes effect before or after the update, never during it.

        Raises:
            SessionError: the database cannot be reached or written.
        """
        self._writer.lease_released(lease)

        def drop(connection: _Connection) -> None:
            connection.execute(_DROP_LEASE.encode(), (lease.session_id, lease.epoch))

        await self._run(drop, f"release the write lease of session {lease.session_id!r}")

    async def append(
        self, session_id: str, events: Sequence[Event], *, lease: Lease | None = None
    ) -> None:
        """Hand `events` (contiguous seqs, continuing the session) to the writer.

        The contract of `GroupCommitter.append`: returns once the writer
        accepted them (a full channel blocks: backpressure), usually before
        they are durable (`flush()`); refused if `lease` was taken over.
        """
        await self._writer.append(session_id, events, lease)

    async def flush(self, session_id: str | None = None) -> None:
        """Return once every append accepted before this call is durable.

        The contract of `GroupCommitter.flush`: with `session_id`, waits for
        and raises for that session only.
        """
        await self._writer.flush(session_id)

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
        return self._writer.durable_seq(session_id)

    async def wait_durable(self, session_id: str, seq: int) -> None:
        """Return once the writer committed `seq` of `session_id` (as `GroupCommitter`'s)."""
        await self._writer.wait_durable(session_id, seq)

    def durable_changes(self) -> DurableChanges:
        """A listener of every session's commits (as `GroupCommitter`'s)."""
        return self._writer.durable_changes()

    def statistics(self) -> PostgresStoreStatistics:
        """The writer's queue, lease and commit counters, now."""
        return PostgresStoreStatistics(
            **attrs.asdict(self._writer.statistics(), recurse=False), reconnects=self._reconnects
        )

    @property
    def _label(self) -> str:
        try:
            params = psycopg.conninfo.conninfo_to_dict(self.dsn)
        except psycopg.ProgrammingError:
            return "PostgreSQL store (unparsable connection string)"
        where = f"{params.get('host', 'localhost')}:{params.get('port', 5432)}"
        return f"PostgreSQL store '{where}/{params.get('dbname', '')}'"

    async def _open_writer(self) -> WriterLink:
        connection = await trio.to_thread.run_sync(self._connect, "writer")
        return _WriterConnection(connection=connection, store=self)

    async def _stored_next_seq(self, session_id: str) -> int:
        def select(connection: _Connection) -> int:
            if not _has_session(connection, session_id):
                raise UnknownSessionError(f"session {session_id!r} is not in {self._label}")
            return _next_stored_seq(connection, session_id)

        return await self._run(select, f"read the last seq of session {session_id!r}")

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
                    if reusable and self._writer.serving:
                        self._idle.append(connection)
                    else:
                        connection.close()

    def _busy_error(
        self, connection: _Connection, session_id: str, *, locked: bool = False
    ) -> SessionError:
        rows = connection.execute(_LEASE_ROWS.encode(), ([session_id],)).fetchall()
        if not rows and locked:
            return SessionBusyError(
                f"{self._label}: session {session_id!r} is busy: another writer is taking "
                "its lease at this moment; try again",
                session_id=session_id,
                holder="another writer taking the lease",
                retry_after=BUSY_LOCKED_RETRY_SECONDS,
            )
        if not rows:
            return SessionError(
                f"{self._label}: the lease of session {session_id!r} changed hands while "
                "being taken; try again"
            )
        _, owner, epoch, expires_ms, now_ms = rows[0]
        holder = describe_holder(str(owner), int(epoch), int(expires_ms), int(now_ms))
        if locked:
            return SessionBusyError(
                f"{self._label}: session {session_id!r} is busy: a commit of its writer "
                f"holds the lease row ({holder}); try again",
                session_id=session_id,
                holder=str(owner),
                retry_after=BUSY_LOCKED_RETRY_SECONDS,
            )
        return SessionBusyError(
            f"{self._label}: session {session_id!r} is busy: another live writer holds it: "
            f"{holder}",
            session_id=session_id,
            holder=str(owner),
            retry_after=max(0.0, (int(expires_ms) - int(now_ms)) / 1000),
        )

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
            # A process stalled inside a transaction (SIGSTOP, a paused VM) holds its
            # locks (a writer's share locks on lease rows would hold up every takeover)
            # until it resumed; the server ends such a transaction after one lease length.
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


@attrs.define(eq=False)
class _WriterConnection:
    """The writer's own connection, driven by the group committer; replaced when it breaks."""

    connection: _Connection
    store: PostgresStore

    @property
    def failures(self) -> tuple[type[Exception], ...]:
        return (psycopg.Error, SessionError)

    async def prepare(self) -> None:
        """Open a new writer connection when this one broke (raises `SessionError`)."""
        if not self.connection.closed and not self.connection.broken:
            return
        self.connection.close()
        self.connection = await trio.to_thread.run_sync(self.store._connect, "writer")
        self.store._reconnects += 1

    async def commit(self, groups: list[SessionRows]) -> dict[str, Refusal]:
        """`_insert_batch`, once more on a new connection when the old one broke under it.

        That is the server ending a transaction left idle while this process
        stalled (`idle_in_transaction_session_timeout`). When it broke before
        the commit was sent, nothing was written (the transaction is gone
        with it): the batch runs again, its checks too, so a session taken
        over meanwhile is refused as fenced. When it broke as the commit was
        sent or answered, whether the commit took is unknown: the new
        connection reads which sessions' rows are stored (each row checked
        against its checksum); those committed, and the others run again (a
        refusal comes again, for the same reason).
        """
        try:
            return await trio.to_thread.run_sync(_insert_batch, self.connection, groups)
        except (_RolledBack, _CommitUnknown) as exc:
            if not self.connection.broken and not self.connection.closed:
                raise exc.error from None
            unknown = isinstance(exc, _CommitUnknown)
        await self.prepare()
        if unknown:
            stored = await trio.to_thread.run_sync(_stored_sessions, self.connection, groups)
            groups = [group for group in groups if group.session_id not in stored]
        try:
            return await trio.to_thread.run_sync(_insert_batch, self.connection, groups)
        except (_RolledBack, _CommitUnknown) as exc:
            raise exc.error from None

    async def renew(self, leases: list[Lease]) -> list[Lease]:
        return await trio.to_thread.run_sync(
            _renew_leases, self.connection, leases, self.store.lease_ttl
        )

    async def commit_and_close(self, groups: list[SessionRows]) -> dict[str, Refusal]:
        return await trio.to_thread.run_sync(
            _insert_batch_and_close, self.connection, groups, abandon_on_cancel=True
        )


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


class _RolledBack(Exception):
    """A batch failed before its commit was sent: nothing of it was written."""

    def __init__(self, error: psycopg.Error) -> None:
        super().__init__(str(error))
        self.error = error


class _CommitUnknown(Exception):
    """A batch's commit failed: whether it took is unknown (the connection broke)."""

    def __init__(self, error: psycopg.Error) -> None:
        super().__init__(str(error))
        self.error = error


def _insert_batch(connection: _Connection, groups: list[SessionRows]) -> dict[str, Refusal]:
    """Insert every admissible group in one transaction; the refused ones, by session.

    The lease rows are read `FOR SHARE`, so no takeover commits between the
    check and the insert. Rows that conflict with rows another writer
    committed meanwhile refuse their whole session (its inserted rows are
    deleted again before the commit). Any database error rolls the whole
    transaction back and propagates: as `_RolledBack` when it came before
    the commit was sent, as `_CommitUnknown` when it came with the commit.
    """
    if not groups:
        return {}
    refused: dict[str, Refusal] = {}
    session_ids = [group.session_id for group in groups]
    body_done = False
    try:
        with connection.transaction():
            _insert_groups(connection, groups, session_ids, refused)
            body_done = True
    except psycopg.Error as exc:
        if body_done:
            raise _CommitUnknown(exc) from exc
        raise _RolledBack(exc) from exc
    return refused


def _stored_sessions(connection: _Connection, groups: list[SessionRows]) -> set[str]:
    """The sessions of `groups` whose rows are all stored, each with its own checksum."""
    sessions = [row[0] for group in groups for row in group.rows]
    seqs = [row[1] for group in groups for row in group.rows]
    stored = {
        (str(sid), int(seq)): int(checksum)
        for sid, seq, checksum in connection.execute(_STORED_ROWS.encode(), (sessions, seqs))
    }
    return {
        group.session_id
        for group in groups
        if all(stored.get((sid, seq)) == checksum for sid, seq, _, checksum in group.rows)
    }


def _insert_groups(
    connection: _Connection,
    groups: list[SessionRows],
    session_ids: list[str],
    refused: dict[str, Refusal],
) -> None:
    """The body of `_insert_batch`'s transaction: check, insert, take back; `refused` filled."""
    leases: dict[str, LeaseRow] = {
        str(sid): (None if owner is None else str(owner), int(epoch), int(expires), int(now))
        for sid, owner, epoch, expires, now in connection.execute(
            (_LEASE_ROWS + " ORDER BY session_id FOR SHARE").encode(), (session_ids,)
        )
    }
    stored = {
        str(sid): int(next_seq)
        for sid, next_seq in connection.execute(_NEXT_SEQS.encode(), (session_ids,))
    }
    admitted: list[SessionRows] = []
    for group in groups:
        why = refusal(group, leases.get(group.session_id), stored.get(group.session_id, 0))
        if why is None:
            admitted.append(group)
        else:
            refused[group.session_id] = why
    rows = [row for group in admitted for row in group.rows]
    if rows:
        columns = [list(column) for column in zip(*rows, strict=True)]
        written = {
            (str(sid), int(seq)) for sid, seq in connection.execute(_INSERT_ROWS.encode(), columns)
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


def _insert_batch_and_close(
    connection: _Connection, groups: list[SessionRows]
) -> dict[str, Refusal]:
    with connection:
        try:
            return _insert_batch(connection, groups)
        except (_RolledBack, _CommitUnknown) as exc:
            raise exc.error from None


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


def _decode(where: str, seq: int, obj: Any) -> Event:
    try:
        return event_from_json(obj)
    except SessionError as exc:
        raise type(exc)(f"{where}: {exc}") from exc
