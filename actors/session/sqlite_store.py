"""`SQLiteStore`: the embedded, durable session store (SQLite in WAL mode, group commit).

One writer actor (`serve`, the group committer of
`actors/session/group_commit.py`) owns the write connection. `append` hands
events to it over a bounded memory channel; when the channel is full the
appender blocks (backpressure). The writer drains everything pending,
commits it in one transaction in a worker thread, then wakes every
`flush()` waiter whose appends are now durable. `create`, `exists`, `load`, `list_sessions` and the
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

import json
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path

import attrs
import trio

from actors.session.checksum import event_checksum
from actors.session.codec import event_from_json
from actors.session.durability import DurableChanges
from actors.session.errors import SessionError
from actors.session.events import Event
from actors.session.group_commit import (
    DEFAULT_MAX_PENDING_APPENDS,
    DEFAULT_SHUTDOWN_GRACE_SECONDS,
    GroupCommitter,
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
    WallClockMs,
    default_owner,
    describe_holder,
    wall_clock_ms,
)
from actors.session.store import SessionExistsError, UnknownSessionError

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


@attrs.frozen(kw_only=True)
class SQLiteStoreStatistics(WriterStatistics):
    """A snapshot of a `SQLiteStore`'s writer (the fields of `WriterStatistics`)."""


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
    lease_lost: Callable[[str], None] | None = attrs.field(default=None, kw_only=True)
    """Called with a session id, in the writer's task, when the writer learns that another
    writer took over this store's lease on it (a refused commit or renewal); the session's
    appends here fail from then on. It must not block: a node drops the session."""
    _schema_ready: bool = attrs.field(default=False, init=False)
    _writer: GroupCommitter = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._writer = GroupCommitter(
            self._label,
            self._stored_next_seq,
            self,
        )

    @property
    def running(self) -> bool:
        """True while the writer accepts appends (from `serve`'s start until its shutdown)."""
        return self._writer.running

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
        await self._writer.serve(self._open_writer, task_status=task_status)

    async def create(self, session_id: str) -> None:
        """Register a new, empty session; it is durable when this returns.

        Cancellation: once the insert started in its worker thread it
        completes (the session then exists) before the cancellation is seen.

        Raises:
            SessionExistsError: the store already holds `session_id`.
            SessionError: the database cannot be opened or written.
        """
        await trio.to_thread.run_sync(self._insert_session, session_id)
        self._writer.session_created(session_id)

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
        await self._writer.flush(session_id)
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
        self._writer.session_loaded(session_id, len(events))
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
        self._writer.lease_taken(lease)
        return lease

    async def release_lease(self, lease: Lease) -> None:
        """Give `lease` up so another writer may take the session at once.

        A lease that was already taken over is left alone. The epoch stays
        used: writes still carrying it are refused.

        Cancellation: takes effect before or after the write, never during it.

        Raises:
            SessionError: the database cannot be opened or written.
        """
        self._writer.lease_released(lease)
        await trio.to_thread.run_sync(self._drop_lease, lease)

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
            SessionError: the database cannot be opened or read.
        """
        return await trio.to_thread.run_sync(self._select_session_ids)

    def durable_seq(self, session_id: str) -> int:
        """The newest seq of `session_id` committed or loaded by this store; -1 when none."""
        return self._writer.durable_seq(session_id)

    async def wait_durable(self, session_id: str, seq: int) -> None:
        """Return once the writer committed `seq` of `session_id` (as `GroupCommitter`'s)."""
        await self._writer.wait_durable(session_id, seq)

    def durable_changes(self) -> DurableChanges:
        """A listener of every session's commits (as `GroupCommitter`'s)."""
        return self._writer.durable_changes()

    def statistics(self) -> SQLiteStoreStatistics:
        """The writer's queue, lease and commit counters, now."""
        return SQLiteStoreStatistics(**attrs.asdict(self._writer.statistics(), recurse=False))

    @property
    def _label(self) -> str:
        return f"SQLite store {str(self.path)!r}"

    async def _open_writer(self) -> WriterLink:
        connection = await trio.to_thread.run_sync(self._connect)
        return _WriterConnection(connection=connection, store=self)

    async def _stored_next_seq(self, session_id: str) -> int:
        return await trio.to_thread.run_sync(self._select_next_seq, session_id)

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
                        retry_after=(row[2] - now) / 1000,
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


@attrs.define(eq=False)
class _WriterConnection:
    """The writer's own connection to the file, driven by the group committer."""

    connection: sqlite3.Connection
    store: SQLiteStore

    @property
    def failures(self) -> tuple[type[Exception], ...]:
        return (sqlite3.Error,)

    async def prepare(self) -> None:
        """Nothing to do: a SQLite connection does not break between commits."""

    async def commit(self, groups: list[SessionRows]) -> dict[str, Refusal]:
        return await trio.to_thread.run_sync(
            _insert_batch, self.connection, groups, self.store.wall_clock()
        )

    async def renew(self, leases: list[Lease]) -> list[Lease]:
        expires_ms = self.store.wall_clock() + round(self.store.lease_ttl * 1000)
        return await trio.to_thread.run_sync(_renew_leases, self.connection, leases, expires_ms)

    async def commit_and_close(self, groups: list[SessionRows]) -> dict[str, Refusal]:
        return await trio.to_thread.run_sync(
            _insert_batch_and_close,
            self.connection,
            groups,
            self.store.wall_clock(),
            abandon_on_cancel=True,
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


def _insert_batch(
    connection: sqlite3.Connection, groups: list[SessionRows], now_ms: int
) -> dict[str, Refusal]:
    """Insert every admissible group in one immediate transaction; the refused ones, by session.

    The lease and seq checks run inside the transaction that holds the
    file's write lock, so nothing can change between a check and the insert.
    Any database error rolls the whole transaction back and propagates.
    """
    refused: dict[str, Refusal] = {}
    connection.execute("BEGIN IMMEDIATE")
    try:
        for group in groups:
            row = _lease_row(connection, group.session_id)
            lease = None if row is None else (*row, now_ms)
            stored = _next_stored_seq(connection, group.session_id)
            why = refusal(group, lease, stored)
            if why is not None:
                refused[group.session_id] = why
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
    connection: sqlite3.Connection, groups: list[SessionRows], now_ms: int
) -> dict[str, Refusal]:
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


def _decode(where: str, seq: int, text: str) -> Event:
    try:
        return event_from_json(json.loads(text))
    except json.JSONDecodeError as exc:
        raise SessionError(f"{where}: stored event seq {seq} is not valid JSON: {exc}") from exc
    except SessionError as exc:
        raise type(exc)(f"{where}: {exc}") from exc
