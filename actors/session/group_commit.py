"""The group-committing writer that `SQLiteStore` and `PostgresStore` share.

A `GroupCommitter` is one store's write side: the bounded channel that
carries appends to the writer actor, the next seq of each session counting
accepted appends, the appends not yet durable, the sessions broken by a
refused or failed commit, the write leases the store holds and renews, and
the durability marks readers wait on (`actors/session/durability.py`).

Its `serve` is the writer actor. Each round takes every pending append,
commits them in one transaction and wakes the `flush()` waiters they
satisfy; between rounds it renews the held leases every third of the lease
length. A refused session fails alone (its appends raise, the session is
broken in this store object until its lease is acquired again), a failed
commit fails only the sessions whose appends it held, and the writer goes
on with the next batch.

What differs between databases stays behind `WriterLink`: how the writer
connection is opened, checked and replaced, and the SQL of a batch and a
renewal. Each store also supplies the per-session checks of a batch as a
lease row and a stored seq, judged here by `refusal`, so both databases
refuse for the same reasons with the same messages.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Literal, Protocol

import attrs
import trio

from actors.latency import LatencySummary, LatencyWindow
from actors.session.checksum import event_checksum
from actors.session.codec import event_to_json
from actors.session.durability import DurableChanges, DurableMarks
from actors.session.errors import SessionError
from actors.session.events import Event
from actors.session.lease import Lease, SessionBusyError, SessionFencedError, describe_holder

DEFAULT_MAX_PENDING_APPENDS = 1024
"""Appends the writer's channel buffers before `append` blocks."""

DEFAULT_SHUTDOWN_GRACE_SECONDS = 10.0
"""How long a cancelled writer keeps trying to commit what it already accepted."""

Row = tuple[str, int, str, int]
"""`(session_id, seq, event JSON text, checksum)`: one stored event."""

Refusal = tuple[Literal["fenced", "busy", "conflict"], str, str]
"""Why a commit refused a session: the kind, a sentence, and the holder (or "")."""

LeaseRow = tuple[str | None, int, int, int]
"""A session's stored lease as a commit sees it: `(owner or None, epoch, expires_ms, now_ms)`."""


@attrs.frozen(kw_only=True)
class WriterStatistics:
    """A snapshot of a store's writer.

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
        fenced_appends: appends refused because this store's lease on their
            session was taken over (by the database's epoch check, or here
            once that was learnt), or because another writer had taken
            their seqs (a stale writer's late writes).
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
    fenced_appends: int


@attrs.define(eq=False)
class PendingAppend:
    """One accepted `append` call; `done` is set once it is committed or has failed."""

    session_id: str
    epoch: int | None
    rows: list[Row]
    done: trio.Event = attrs.field(factory=trio.Event)
    error: SessionError | None = None


@attrs.frozen(kw_only=True)
class SessionRows:
    """One session's share of a batch, as the commit thread sees it."""

    session_id: str
    epoch: int | None
    rows: list[Row]


class WriterSettings(Protocol):
    """The tunables of a store's writer (the store's own validated fields)."""

    @property
    def max_pending_appends(self) -> int:
        """Capacity of the writer's channel; a full channel blocks `append`."""
        ...

    @property
    def shutdown_grace(self) -> float:
        """Seconds a cancelled writer spends committing what it had already accepted."""
        ...

    @property
    def lease_ttl(self) -> float:
        """Seconds a lease outlives its last renewal; the writer renews every third of it."""
        ...

    @property
    def lease_lost(self) -> Callable[[str], None] | None:
        """Called with a session id, in the writer's task, when the writer learns that
        another writer took over this store's lease on it (a refused commit or renewal)."""
        ...


class WriterLink(Protocol):
    """A store's writer connection, as the writer actor drives it: one call at a time.

    `failures` are the exceptions a database call may raise for a failed
    commit or renewal (the writer turns them into `SessionError`s naming
    the batch); anything else is a bug and propagates.
    """

    @property
    def failures(self) -> tuple[type[Exception], ...]:
        """The exception types a failed database call raises."""
        ...

    async def prepare(self) -> None:
        """Make the connection usable before a call (replace it if it broke)."""
        ...

    async def commit(self, groups: list[SessionRows]) -> dict[str, Refusal]:
        """Insert every admissible group in one transaction; the refused ones, by session."""
        ...

    async def renew(self, leases: list[Lease]) -> list[Lease]:
        """Extend `leases` by the lease length in one transaction; the ones found taken over."""
        ...

    async def commit_and_close(self, groups: list[SessionRows]) -> dict[str, Refusal]:
        """`commit` (nothing to insert is fine), then close the connection.

        Cancellation abandons the worker thread, which then finishes and
        closes the connection on its own, so the connection is never used by
        two threads.
        """
        ...


def refusal(group: SessionRows, lease: LeaseRow | None, stored: int) -> Refusal | None:
    """Why `group` may not be committed (the lease, then the seq check), or None.

    `lease` is the session's stored lease (None when it never had one) and
    `stored` the next seq the database holds for it, both read inside the
    transaction that would insert the group.
    """
    if group.epoch is not None:
        if lease is None or lease[0] is None or lease[1] != group.epoch:
            if lease is None or lease[0] is None:
                now_held = "nobody holds it now"
            else:
                now_held = f"it is held by {describe_holder(lease[0], *lease[1:])}"
            return (
                "fenced",
                f"the write lease of epoch {group.epoch} was taken over or released ({now_held})",
                "" if lease is None or lease[0] is None else lease[0],
            )
    elif lease is not None and lease[0] is not None and lease[2] > lease[3]:
        return (
            "busy",
            f"another live writer holds the session: {describe_holder(lease[0], *lease[1:])}",
            lease[0],
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


@attrs.define(eq=False)
class GroupCommitter:
    """One store's write side and its writer actor (`serve`).

    `read_next_seq(session_id)` reads the next seq the database holds for a
    session (raising `UnknownSessionError` for a session it lacks); it is
    used the first time this store appends to a session it has neither
    created nor loaded.

    Args:
        label: the store as errors name it.
        read_next_seq: the store's read of a session's next stored seq.
        settings: the store's tunables, read when they are needed (so a
            change to the store's fields takes effect at the next `serve`,
            shutdown or renewal).
    """

    label: str
    read_next_seq: Callable[[str], Awaitable[int]]
    settings: WriterSettings
    _send: trio.MemorySendChannel[PendingAppend | None] | None = attrs.field(
        default=None, init=False
    )
    _serving: bool = attrs.field(default=False, init=False)
    _next_seq: dict[str, int] = attrs.field(factory=dict, init=False)
    _unconfirmed: set[PendingAppend] = attrs.field(factory=set, init=False)
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

    @property
    def running(self) -> bool:
        """True while the writer accepts appends (from `serve`'s start until its shutdown)."""
        return self._send is not None

    @property
    def serving(self) -> bool:
        """True from `serve`'s start until it returns (including its shutdown commit)."""
        return self._serving

    async def serve(
        self,
        open_link: Callable[[], Awaitable[WriterLink]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Open the writer connection and run the writer until cancelled.

        `task_status.started()` once appends are accepted. A committer may be
        served again after its writer stopped, but by one task at a time.

        Cancellation: a commit already running finishes first. Then the
        writer stops accepting appends and commits everything it had
        accepted, including the appenders blocked on the full channel, in a
        shielded scope bounded by `shutdown_grace`; only then does `serve`
        return. `running` is False from the start of this shutdown.

        Raises:
            SessionError: the writer is already running, `open_link` failed
                (its own `SessionError`), or the shutdown commit failed or
                missed its grace; the message names the store and the
                sessions and seqs that are not durable.
        """
        if self._serving:
            raise SessionError(f"{self.label}: serve() is already running; one writer per store")
        self._serving = True
        try:
            link = await open_link()
            send, receive = trio.open_memory_channel[PendingAppend | None](
                self.settings.max_pending_appends
            )
            self._send = send
            await self._write_until_cancelled(link, receive, task_status)
        finally:
            self._serving = False

    async def append(self, session_id: str, events: Sequence[Event], lease: Lease | None) -> None:
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
        request = PendingAppend(
            session_id=session_id,
            epoch=None if lease is None else lease.epoch,
            rows=encode_rows(session_id, start, events),
        )
        end = start + len(events)
        self._next_seq[session_id] = end
        accepted = False
        try:
            await send.send(request)
            accepted = True
        except trio.BrokenResourceError:
            raise SessionError(
                f"{self.label} stopped before accepting session {session_id!r} "
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
            failed = next((r.error for r in pending if r.error is not None), None)
            if failed is not None:  # refused under a lease given up meanwhile
                raise failed.with_traceback(None)
        elif self._broken:
            first = next(iter(self._broken.values()))
            raise SessionError(
                f"{self.label}: {len(self._broken)} session(s) hold accepted appends that are "
                f"not durable; first failure: {first}"
            ) from first

    def durable_seq(self, session_id: str) -> int:
        """The newest seq of `session_id` committed or loaded by this store; -1 when none."""
        return self._marks.seq(session_id)

    async def wait_durable(self, session_id: str, seq: int) -> None:
        """Return once the writer committed (or the store loaded) `seq` of `session_id`.

        Woken by the commit itself (no polling). Cancellation: cancellable.

        Raises:
            SessionError: an accepted append of the session failed to commit.
        """
        await self._marks.wait(session_id, seq)

    def durable_changes(self) -> DurableChanges:
        """A listener of every session's commits and failed commits (`DurableMarks.changes`)."""
        return self._marks.changes()

    def session_created(self, session_id: str) -> None:
        """Record that the store created `session_id` empty: its next seq is 0."""
        self._next_seq[session_id] = 0

    def session_loaded(self, session_id: str, count: int) -> None:
        """Record that the store loaded `count` durable events of `session_id`."""
        self._next_seq.setdefault(session_id, count)
        self._marks.advance(session_id, count - 1)

    def lease_taken(self, lease: Lease) -> None:
        """Hold and renew `lease`; its session is writable again (next seq read afresh)."""
        self._held[lease.session_id] = lease
        self._next_seq.pop(lease.session_id, None)
        self._broken.pop(lease.session_id, None)
        self._marks.recover(lease.session_id)
        if self._send is not None:
            # Wake a writer that waits without a renewal deadline; a full
            # channel means it is busy and will see the lease anyway.
            with contextlib.suppress(trio.WouldBlock):
                self._send.send_nowait(None)

    def lease_released(self, lease: Lease) -> None:
        """Stop holding and renewing `lease` (a no-op when it is not the held one).

        A session this store learnt it lost (fenced) stops counting as broken:
        its refused writes were reported to its writer, which gives it up now.
        """
        if self._held.get(lease.session_id) == lease:
            del self._held[lease.session_id]
        if isinstance(self._broken.get(lease.session_id), SessionFencedError):
            del self._broken[lease.session_id]

    def statistics(self) -> WriterStatistics:
        """The writer's queue, lease and commit counters, now."""
        send = self._send
        return WriterStatistics(
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
            fenced_appends=self._fenced_appends,
        )

    def _writer_channel(self, session_id: str) -> trio.MemorySendChannel[PendingAppend | None]:
        send = self._send
        if send is None:
            raise SessionError(
                f"{self.label} is not running; start it with `await nursery.start(store.serve)` "
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
                f"{self.label}: session {session_id!r}: the write lease of epoch "
                f"{lease.epoch} is no longer held by this store (released or taken over)",
                session_id=session_id,
                epoch=lease.epoch,
            )
        if lease is None and held is not None:
            raise SessionBusyError(
                f"{self.label}: session {session_id!r} is busy: this store holds its write "
                f"lease for {held.owner} (epoch {held.epoch}); write through that lease",
                session_id=session_id,
                holder=held.owner,
            )

    async def _expected_seq(self, session_id: str) -> int:
        """The seq the next event of `session_id` must have, counting accepted appends."""
        if session_id not in self._next_seq:
            stored = await self.read_next_seq(session_id)
            self._next_seq.setdefault(session_id, stored)
        return self._next_seq[session_id]

    # The writer actor.

    async def _write_until_cancelled(
        self,
        link: WriterLink,
        receive: trio.MemoryReceiveChannel[PendingAppend | None],
        task_status: trio.TaskStatus[None],
    ) -> None:
        # The channel carries appends, and None when a lease was taken (so a
        # writer waiting without a renewal deadline sets one).
        renew_every = self.settings.lease_ttl / 3
        next_renewal = trio.current_time() + renew_every
        try:
            task_status.started()
            while True:
                batch: list[PendingAppend] = []
                with trio.move_on_at(next_renewal if self._held else math.inf):
                    first = await receive.receive()
                    batch = [r for r in (first, *_drain(receive)) if r is not None]
                if self._held and trio.current_time() >= next_renewal:
                    # Renewals come before a commit that is due with them: a writer
                    # that did not run for a while (stopped, starved) learns which
                    # leases it lost before it writes anything more.
                    with trio.CancelScope(shield=True):
                        await self._renew(link)
                    next_renewal = trio.current_time() + renew_every
                # A taken batch is always written: the thread cannot be
                # interrupted anyway, and dropping it would lose accepted events.
                if batch:
                    with trio.CancelScope(shield=True):
                        await self._commit(link, batch)
        finally:
            # Stop accepting first: taking what is left also admits the
            # appenders blocked on the full channel, and closing makes later
            # sends fail instead of queueing events nobody will write.
            leftover = _drain(receive)
            receive.close()
            self._send = None
            await self._commit_at_shutdown(link, leftover)

    async def _commit(self, link: WriterLink, batch: list[PendingAppend]) -> None:
        """Write `batch` in one transaction and resolve its appends, session by session."""
        try:
            await link.prepare()
            started = trio.current_time()
            refusals = await link.commit(_groups_of(batch))
            self._commit_latency.record(trio.current_time() - started)
        except link.failures as exc:
            error = SessionError(f"{self.label}: could not commit {_describe(batch)}: {exc}")
            error.__cause__ = exc
            if self._held:
                # Which of these sessions did this writer lose meanwhile (it may have
                # stalled in the commit)? Those fail as fenced, not as lost events.
                await self._renew(link)
            failures: dict[str, SessionError] = {}
            for request in batch:
                known = self._broken.get(request.session_id)
                lost = isinstance(known, SessionFencedError) and request.epoch is not None
                failures[request.session_id] = known if lost and known is not None else error
            self._resolve(batch, failures)
            return
        self._resolve(
            batch, {sid: self._refusal_error(sid, batch, r) for sid, r in refusals.items()}
        )

    def _refusal_error(
        self, session_id: str, batch: list[PendingAppend], refused: Refusal
    ) -> SessionError:
        kind, reason, holder = refused
        requests = [request for request in batch if request.session_id == session_id]
        message = f"{self.label}: refused {_describe(requests)}: {reason}"
        if kind == "fenced":
            epoch = requests[0].epoch
            return SessionFencedError(message, session_id=session_id, epoch=epoch or 0)
        if kind == "busy":
            return SessionBusyError(message, session_id=session_id, holder=holder)
        if requests and requests[0].epoch is not None:
            # A writer with a lease whose seqs another writer took: a stale writer, refused.
            self._fenced_appends += len(requests)
        return SessionError(message)

    async def _commit_at_shutdown(self, link: WriterLink, batch: list[PendingAppend]) -> None:
        """Commit `batch` and close the connection, shielded and bounded by `shutdown_grace`."""
        errors: dict[str, SessionError] = {}
        failure: SessionError | None = None
        with trio.move_on_after(self.settings.shutdown_grace, shield=True) as grace:
            try:
                if batch:
                    await link.prepare()
                refusals = await link.commit_and_close(_groups_of(batch))
            except link.failures as exc:
                failure = SessionError(
                    f"{self.label}: could not commit {_describe(batch)} at shutdown: {exc}"
                )
                failure.__cause__ = exc
            else:
                errors = {sid: self._refusal_error(sid, batch, r) for sid, r in refusals.items()}
        if grace.cancelled_caught and batch:
            failure = SessionError(
                f"{self.label}: committing {_describe(batch)} at shutdown took longer than "
                f"{self.settings.shutdown_grace} s; they may not be durable"
            )
        if failure is not None:
            errors = {request.session_id: failure for request in batch}
        self._resolve(batch, errors)
        if failure is not None and batch:
            raise failure

    def _resolve(self, batch: list[PendingAppend], errors: dict[str, SessionError]) -> None:
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
                    # `_lost` breaks the session while this lease is the one held. A
                    # lease already released (its writer gave up waiting for this
                    # commit) or replaced is left alone: a stale writer's refused
                    # writes are no undurable data (as in `lease_released`), and a
                    # newer lease's writes are not this one's.
                    self._lost(request.session_id, request.epoch, error)
                else:
                    self._broken.setdefault(request.session_id, error)
                self._marks.fail(request.session_id, error)
        if committed:
            self._commits += 1
            self._largest_batch = max(self._largest_batch, committed)

    async def _renew(self, link: WriterLink) -> None:
        """Extend every held lease; a lease found taken over breaks its session here.

        A renewal that cannot be written is retried at the next period:
        missing renewals can only let another writer take over, and fencing
        refuses this store's writes from then on.
        """
        held = list(self._held.values())
        try:
            await link.prepare()
            lost = await link.renew(held)
        except link.failures:
            self._renewal_failures += 1
            return
        for lease in lost:
            if self._held.get(lease.session_id) == lease:
                fenced = SessionFencedError(
                    f"{self.label}: session {lease.session_id!r}: the write lease of epoch "
                    f"{lease.epoch} was taken over by another writer; this store's writes "
                    "to it are refused",
                    session_id=lease.session_id,
                    epoch=lease.epoch,
                )
                self._lost(lease.session_id, lease.epoch, fenced)
                self._marks.fail(lease.session_id, fenced)

    def _lost(self, session_id: str, epoch: int | None, error: SessionFencedError) -> None:
        """The held lease of `epoch` on `session_id` was taken over: stop holding it,
        break the session as fenced and tell the store's owner (once per lease).

        A failed commit before (one the server ended while this writer
        stalled) was a stale writer's too: the session counts as fenced.
        """
        held = self._held.get(session_id)
        if held is None or held.epoch != epoch:
            return  # not the lease held now (released, or an older one's late refusal)
        del self._held[session_id]
        self._broken[session_id] = error
        lease_lost = self.settings.lease_lost
        if lease_lost is not None:
            lease_lost(session_id)

    def holds_lease(self, lease: Lease) -> bool:
        """True while this store holds `lease`: taken, not released, not known lost."""
        return self._held.get(lease.session_id) == lease


_encode_row = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
"""`json.dumps(obj, separators=(",", ":"), allow_nan=False)`, without a new encoder per call."""


def encode_rows(session_id: str, start: int, events: Sequence[Event]) -> list[Row]:
    """`events` as stored rows (compact JSON and its checksum), their seqs checked from `start`.

    Raises:
        SessionError: a seq does not continue from `start`, or an event
            cannot be written as JSON; the message names the session and seq.
    """
    rows: list[Row] = []
    for expected, event in enumerate(events, start):
        if event.seq != expected:
            raise SessionError(
                f"session {session_id!r}: event {event.type} has seq {event.seq}, "
                f"expected {expected}"
            )
        try:
            text = _encode_row(event_to_json(event))
        except (TypeError, ValueError) as exc:
            raise SessionError(
                f"session {session_id!r}: event seq {event.seq} ({event.type}) "
                f"cannot be stored as JSON: {exc}"
            ) from exc
        rows.append((session_id, event.seq, text, event_checksum(session_id, event.seq, text)))
    return rows


def _groups_of(batch: Iterable[PendingAppend]) -> list[SessionRows]:
    """The batch's rows per session, in first-append order (a session's appends are contiguous)."""
    groups: dict[str, SessionRows] = {}
    for request in batch:
        group = groups.get(request.session_id)
        if group is None:
            groups[request.session_id] = SessionRows(
                session_id=request.session_id, epoch=request.epoch, rows=list(request.rows)
            )
        else:
            group.rows.extend(request.rows)
    return list(groups.values())


def _drain(receive: trio.MemoryReceiveChannel[PendingAppend | None]) -> list[PendingAppend]:
    """Every append the channel holds now, including those of blocked senders."""
    taken: list[PendingAppend] = []
    while True:
        try:
            request = receive.receive_nowait()
        except trio.WouldBlock:
            return taken
        if request is not None:
            taken.append(request)


def _describe(batch: Iterable[PendingAppend]) -> str:
    """`session 'a' seq 3..5, session 'b' seq 0..0`: what a batch holds, per session."""
    spans: dict[str, tuple[int, int]] = {}
    for request in batch:
        for session_id, seq, _, _ in request.rows:
            low, high = spans.get(session_id, (seq, seq))
            spans[session_id] = (min(low, seq), max(high, seq))
    if not spans:
        return "no events"
    return ", ".join(f"session {sid!r} seq {low}..{high}" for sid, (low, high) in spans.items())
