"""`SQLiteStore`: the embedded, durable session store (SQLite in WAL mode, group commit).

One writer actor (`serve`) owns the write connection. `append` hands events
to it over a bounded memory channel; when the channel is full the appender
blocks (backpressure). The writer drains everything pending, commits it in
one transaction in a worker thread, then wakes every `flush()` waiter whose
appends are now durable. `create`, `exists`, `load` and `list_sessions`
open a short-lived connection of their own per call in a worker thread, so
no connection is ever used by two threads at once.

Each event is stored as its compact JSON text under the primary key
`(session_id, seq)`, so loading restores exactly what was appended.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from contextlib import closing
from pathlib import Path

import attrs
import trio

from actors.session.codec import event_from_json, event_to_json
from actors.session.durability import DurableMarks
from actors.session.errors import SessionError
from actors.session.events import Event
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
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
"""

_Row = tuple[str, int, str]
"""`(session_id, seq, event JSON text)`: one row of the events table."""


@attrs.frozen(kw_only=True)
class SQLiteStoreStatistics:
    """A snapshot of a `SQLiteStore`'s writer.

    Attributes:
        pending_appends: accepted appends not yet committed (nor failed).
        blocked_appenders: tasks waiting in `append` for room in the full channel.
        failed_appends: accepted appends a failed commit did not write.
        commits: transactions committed by the writer.
        events_written: events committed by the writer.
        largest_batch: the most appends committed in one transaction.
    """

    pending_appends: int
    blocked_appenders: int
    failed_appends: int
    commits: int
    events_written: int
    largest_batch: int


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


@attrs.define(eq=False)
class SQLiteStore:
    """A `SessionStore` in one SQLite file (WAL mode), written by one group-committing actor.

    `create`, `exists`, `load` and `list_sessions` work whether or not the
    writer runs; `append` needs `serve` running (start it with
    `await nursery.start(store.serve)`). The file and its parent directories
    are created on first use.

    Args:
        path: the database file.
        max_pending_appends: capacity of the writer's channel; a full
            channel blocks `append` until the writer takes a batch.
        shutdown_grace: seconds a cancelled writer spends committing what it
            had already accepted.
    """

    path: Path = attrs.field(converter=Path)
    max_pending_appends: int = attrs.field(
        default=DEFAULT_MAX_PENDING_APPENDS, kw_only=True, validator=attrs.validators.ge(0)
    )
    shutdown_grace: float = attrs.field(
        default=DEFAULT_SHUTDOWN_GRACE_SECONDS, kw_only=True, validator=attrs.validators.gt(0)
    )
    _send: trio.MemorySendChannel[_Append] | None = attrs.field(default=None, init=False)
    _serving: bool = attrs.field(default=False, init=False)
    _schema_ready: bool = attrs.field(default=False, init=False)
    _next_seq: dict[str, int] = attrs.field(factory=dict, init=False)
    _unconfirmed: set[_Append] = attrs.field(factory=set, init=False)
    _marks: DurableMarks = attrs.field(factory=DurableMarks, init=False)
    _commits: int = attrs.field(default=0, init=False)
    _events_written: int = attrs.field(default=0, init=False)
    _largest_batch: int = attrs.field(default=0, init=False)

    @property
    def running(self) -> bool:
        """True while the writer accepts appends (from `serve`'s start until its shutdown)."""
        return self._send is not None

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the writer until cancelled; `task_status.started()` once appends are accepted.

        Each round takes every pending append, commits them in one
        transaction and wakes the `flush()` waiters they satisfy. A store
        may be served again after its writer stopped, but by one task at a
        time.

        Cancellation: a commit already running finishes first (SQLite's busy
        timeout bounds its wait for the lock). Then the writer stops
        accepting appends and commits everything it had accepted, including
        the appenders blocked on the full channel, in a shielded scope
        bounded by `shutdown_grace`. Only then does `serve` return; `running`
        is False from the start of this shutdown.

        Raises:
            SessionError: the writer is already running, the database cannot
                be opened, or a commit failed or missed the shutdown grace;
                the message names the store and the sessions and seqs that
                are not durable. Appends queued behind a failed commit are
                not written, and every later `flush()` raises.
        """
        if self._serving:
            raise SessionError(f"{self._label}: serve() is already running; one writer per store")
        self._serving = True
        try:
            connection = await trio.to_thread.run_sync(self._connect)
            send, receive = trio.open_memory_channel[_Append](self.max_pending_appends)
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
        session are durable, so a load sees this store's own writes.

        Cancellation: abandons the load; the store is unchanged.

        Raises:
            UnknownSessionError: the store has no such session.
            UnknownEventError: a stored event has an unknown, non-ignorable type.
            SessionError: a stored event cannot be decoded (the message names
                the session and seq), an accepted append failed, or the
                database cannot be read.
        """
        await self._wait_durable([r for r in self._unconfirmed if r.session_id == session_id])
        rows = await trio.to_thread.run_sync(self._select_events, session_id)
        events = [_decode(session_id, seq, text) for seq, text in rows]
        self._next_seq.setdefault(session_id, len(events))
        self._marks.advance(session_id, len(events) - 1)
        return events

    async def append(self, session_id: str, events: Sequence[Event]) -> None:
        """Hand `events` (contiguous seqs, continuing the session) to the writer.

        Returns once the writer accepted them, usually before they are
        durable: call `flush()` for that. A full channel blocks the caller
        until the writer takes a batch (backpressure). Appends to one session
        must not overlap (as with `Session`, which appends one at a time).

        Cancellation: before the writer accepted the events, cancellation
        leaves the store unchanged and the same seqs may be appended again;
        after, the events are committed like any other.

        Raises:
            SessionError: the writer is not running (start it with
                `await nursery.start(store.serve)`), a seq does not continue
                the session, or an event cannot be written as JSON.
            UnknownSessionError: the store has no such session.
        """
        self._writer_channel(session_id)
        start = await self._expected_seq(session_id)
        send = self._writer_channel(session_id)
        if not events:
            await trio.lowlevel.checkpoint()
            return
        request = _Append(session_id=session_id, rows=_encode(session_id, start, events))
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

    async def flush(self) -> None:
        """Return once every append accepted before this call is durable.

        Waiters are woken by the commit that makes their appends durable;
        with nothing pending this returns at once.

        Cancellation: abandons the wait; the appends are committed regardless.

        Raises:
            SessionError: an accepted append was not committed (a failed
                commit or a missed shutdown grace); the message names the
                sessions and seqs.
        """
        await self._wait_durable(list(self._unconfirmed))

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
        """The writer's queue and commit counters, now."""
        send = self._send
        return SQLiteStoreStatistics(
            pending_appends=sum(1 for r in self._unconfirmed if not r.done.is_set()),
            blocked_appenders=0 if send is None else send.statistics().tasks_waiting_send,
            failed_appends=sum(1 for r in self._unconfirmed if r.error is not None),
            commits=self._commits,
            events_written=self._events_written,
            largest_batch=self._largest_batch,
        )

    @property
    def _label(self) -> str:
        return f"SQLite store {str(self.path)!r}"

    def _writer_channel(self, session_id: str) -> trio.MemorySendChannel[_Append]:
        send = self._send
        if send is None:
            raise SessionError(
                f"{self._label} is not running; start it with `await nursery.start(store.serve)` "
                f"before appending to session {session_id!r}"
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
            raise SessionError(
                f"{len(failed)} accepted append(s) are not durable; first failure: {failed[0]}"
            ) from failed[0]

    # The writer actor.

    async def _write_until_cancelled(
        self,
        connection: sqlite3.Connection,
        receive: trio.MemoryReceiveChannel[_Append],
        task_status: trio.TaskStatus[None],
    ) -> None:
        failure: SessionError | None = None
        try:
            task_status.started()
            while failure is None:
                batch = [await receive.receive(), *_drain(receive)]
                # A taken batch is always written: the thread cannot be
                # interrupted anyway, and dropping it would lose accepted events.
                with trio.CancelScope(shield=True):
                    failure = await self._commit(connection, batch)
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
                self._resolve(
                    leftover,
                    SessionError(
                        f"{self._label}: {_describe(leftover)} not written "
                        f"because an earlier commit failed: {failure}"
                    ),
                )

    async def _commit(
        self, connection: sqlite3.Connection, batch: list[_Append]
    ) -> SessionError | None:
        """Write `batch` in one transaction; resolve its appends; return the failure, if any."""
        try:
            await trio.to_thread.run_sync(_insert_rows, connection, _rows_of(batch))
        except sqlite3.Error as exc:
            error = SessionError(f"{self._label}: could not commit {_describe(batch)}: {exc}")
            error.__cause__ = exc
            self._resolve(batch, error)
            return error
        self._resolve(batch, None)
        return None

    async def _commit_at_shutdown(
        self, connection: sqlite3.Connection, batch: list[_Append]
    ) -> None:
        """Commit `batch` and close the connection, shielded and bounded by `shutdown_grace`.

        When the grace runs out the worker thread is abandoned: it finishes
        (or fails) on its own and closes the connection itself, so the
        connection is never used by two threads.
        """
        error: SessionError | None = None
        with trio.move_on_after(self.shutdown_grace, shield=True) as grace:
            try:
                await trio.to_thread.run_sync(
                    _insert_rows_and_close, connection, _rows_of(batch), abandon_on_cancel=True
                )
            except sqlite3.Error as exc:
                error = SessionError(
                    f"{self._label}: could not commit {_describe(batch)} at shutdown: {exc}"
                )
                error.__cause__ = exc
        if grace.cancelled_caught and batch:
            error = SessionError(
                f"{self._label}: committing {_describe(batch)} at shutdown took longer than "
                f"{self.shutdown_grace} s; they may not be durable"
            )
        self._resolve(batch, error)
        if error is not None:
            raise error

    def _resolve(self, batch: list[_Append], error: SessionError | None) -> None:
        """Mark `batch` committed (or failed with `error`) and wake the flushes waiting on it."""
        for request in batch:
            request.error = error
            request.done.set()
            if error is None:
                self._unconfirmed.discard(request)
                if request.rows:
                    self._marks.advance(request.session_id, request.rows[-1][1])
            else:
                self._unconfirmed.add(request)
                self._marks.fail(request.session_id, error)
        if error is None and batch:
            self._commits += 1
            self._events_written += sum(len(request.rows) for request in batch)
            self._largest_batch = max(self._largest_batch, len(batch))

    async def _expected_seq(self, session_id: str) -> int:
        """The seq the next event of `session_id` must have, counting accepted appends."""
        if session_id not in self._next_seq:
            stored = await trio.to_thread.run_sync(self._select_next_seq, session_id)
            self._next_seq.setdefault(session_id, stored)
        return self._next_seq[session_id]

    # Blocking database work; each runs in a worker thread on its own connection.

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
                self._schema_ready = True
        except sqlite3.Error as exc:
            connection.close()
            raise SessionError(f"{self._label}: cannot prepare the database: {exc}") from exc
        except SessionError:
            connection.close()
            raise
        return connection

    def _insert_session(self, session_id: str) -> None:
        with closing(self._connect()) as connection:
            try:
                connection.execute("INSERT INTO sessions (id) VALUES (?)", (session_id,))
            except sqlite3.IntegrityError:
                raise SessionExistsError(f"session {session_id!r} already exists") from None
            except sqlite3.Error as exc:
                raise SessionError(
                    f"{self._label}: cannot create session {session_id!r}: {exc}"
                ) from exc

    def _session_exists(self, session_id: str) -> bool:
        with closing(self._connect()) as connection:
            return _has_session(connection, session_id)

    def _select_session_ids(self) -> list[str]:
        with closing(self._connect()) as connection:
            rows = connection.execute("SELECT id FROM sessions ORDER BY position").fetchall()
        return [session_id for (session_id,) in rows]

    def _select_events(self, session_id: str) -> list[tuple[int, str]]:
        with closing(self._connect()) as connection:
            connection.execute("BEGIN")  # one snapshot for the check and the read
            try:
                if not _has_session(connection, session_id):
                    raise UnknownSessionError(f"session {session_id!r} is not in {self._label}")
                rows: list[tuple[int, str]] = connection.execute(
                    "SELECT seq, event FROM events WHERE session_id = ? ORDER BY seq",
                    (session_id,),
                ).fetchall()
            finally:
                connection.execute("COMMIT")
        return rows

    def _select_next_seq(self, session_id: str) -> int:
        with closing(self._connect()) as connection:
            if not _has_session(connection, session_id):
                raise UnknownSessionError(f"session {session_id!r} is not in {self._label}")
            (next_seq,) = connection.execute(
                "SELECT COALESCE(MAX(seq) + 1, 0) FROM events WHERE session_id = ?", (session_id,)
            ).fetchone()
        return int(next_seq)


def _has_session(connection: sqlite3.Connection, session_id: str) -> bool:
    row = connection.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone()
    return row is not None


def _insert_rows(connection: sqlite3.Connection, rows: list[_Row]) -> None:
    """Insert `rows` in one immediate transaction; roll back on any failure."""
    connection.execute("BEGIN IMMEDIATE")
    try:
        connection.executemany("INSERT INTO events (session_id, seq, event) VALUES (?, ?, ?)", rows)
        connection.execute("COMMIT")
    except Exception:
        connection.execute("ROLLBACK")
        raise


def _insert_rows_and_close(connection: sqlite3.Connection, rows: list[_Row]) -> None:
    with closing(connection):
        if rows:
            _insert_rows(connection, rows)


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
        rows.append((session_id, event.seq, text))
    return rows


def _decode(session_id: str, seq: int, text: str) -> Event:
    try:
        return event_from_json(json.loads(text))
    except json.JSONDecodeError as exc:
        raise SessionError(
            f"session {session_id!r}: stored event seq {seq} is not valid JSON: {exc}"
        ) from exc
    except SessionError as exc:
        raise type(exc)(f"session {session_id!r}: {exc}") from exc


def _describe(batch: Iterable[_Append]) -> str:
    """`session 'a' seq 3..5, session 'b' seq 0..0`: what a batch holds, per session."""
    spans: dict[str, tuple[int, int]] = {}
    for request in batch:
        for session_id, seq, _ in request.rows:
            low, high = spans.get(session_id, (seq, seq))
            spans[session_id] = (min(low, seq), max(high, seq))
    if not spans:
        return "no events"
    return ", ".join(f"session {sid!r} seq {low}..{high}" for sid, (low, high) in spans.items())
