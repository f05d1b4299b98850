"""Cluster membership in PostgreSQL: node heartbeats, and a live view woken by NOTIFY.

A node process registers itself in `harness_nodes` (its id, the endpoint
gateways reach it on, and a fresh *incarnation* per start), renews its
heartbeat every `heartbeat_interval`, and deletes its row when it stops. A
node is live while its last heartbeat is younger than `dead_after`, judged
by the database's clock (so the machines' clocks may disagree). Joining,
restarting and leaving send `NOTIFY harness_nodes`, so a `MembershipView`
learns of them at once; a node that dies without leaving is noticed when
its heartbeat runs out (the view re-reads the table at the moment the
oldest heartbeat would expire).

A database outage does not stop a node or a gateway: both reconnect with
bounded, jittered backoff. A node fails (`MembershipError`) only once it has
gone `dead_after` without a heartbeat, when its liveness has run out anyway;
a view keeps its last nodes while it reconnects. Every database call is
bounded (`connect_timeout`, `statement_timeout`, TCP keepalives, and a
deadline on the call itself), so a blackholed database cannot freeze them.

This is liveness only, for placement: whether a node may write a session is
decided by the session's lease in the store, never by membership.
"""

from __future__ import annotations

import logging
import random
import threading
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import psycopg
import psycopg.conninfo
import trio
from psycopg.rows import TupleRow

from actors.session.postgres_schema import ensure_schema
from supervision.supervisor import SupervisionError

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 1.0
"""How often a node renews its heartbeat."""

DEAD_AFTER_SECONDS = 5.0
"""How long after its last heartbeat a node counts as dead."""

LEAVE_GRACE_SECONDS = 5.0
"""How long a stopping node spends deleting its row."""

STALL_SLACK_SECONDS = 1.0
"""A heartbeat that fails this long after its own deadline was stalled (the process did
not run), not refused: it is tried again with a fresh budget."""

CALL_SECONDS = 5.0
"""The longest one database call may take (connecting included) before it counts as failed."""

BACKOFF_FIRST_SECONDS = 0.1
"""The pause before the first reconnect after a database error; it doubles per failure."""

BACKOFF_MAX_SECONDS = 2.0
"""The longest pause between reconnects (each pause is jittered down by up to half)."""

CHANNEL = "harness_nodes"
"""The NOTIFY channel joins, restarts and departures are announced on."""

_Connection = psycopg.Connection[TupleRow]
_T = TypeVar("_T")

_REGISTER = """
INSERT INTO harness_nodes (node_id, endpoint, incarnation, heartbeat_at)
VALUES (%(node_id)s, %(endpoint)s, %(incarnation)s, clock_timestamp())
ON CONFLICT (node_id) DO UPDATE SET endpoint = excluded.endpoint,
    incarnation = excluded.incarnation, heartbeat_at = excluded.heartbeat_at
"""

_LIVE = """
SELECT node_id, endpoint, incarnation,
    extract(epoch FROM heartbeat_at + make_interval(secs => %(dead_after)s) - clock_timestamp())
FROM harness_nodes
WHERE heartbeat_at + make_interval(secs => %(dead_after)s) > clock_timestamp()
ORDER BY node_id
"""


class MembershipError(SupervisionError):
    """Membership cannot be read or kept: the message names the node or the database."""


@attrs.frozen(kw_only=True)
class NodeInfo:
    """One live node as the membership table shows it.

    Attributes:
        node_id: the node's stable name.
        endpoint: where gateways reach it (`host:port`).
        incarnation: unique to this start of the node (a restart changes it).
    """

    node_id: str
    endpoint: str
    incarnation: str


@attrs.define(eq=False)
class MembershipView:
    """The live nodes as last read, and a way to wait for the next change.

    Consumers never hold the watcher up: they read `nodes` when they like
    and `wait_changed` returns at once if they missed changes.
    """

    nodes: tuple[NodeInfo, ...] = ()
    version: int = 0
    _changed: trio.Event = attrs.field(factory=trio.Event, init=False)

    def node_ids(self) -> list[str]:
        """The live nodes' ids, sorted."""
        return [node.node_id for node in self.nodes]

    async def wait_changed(self, version: int) -> int:
        """Return the current version once it is newer than `version`.

        Cancellation: cancellable; nothing is affected.
        """
        while self.version <= version:
            await self._changed.wait()
        await trio.lowlevel.checkpoint()
        return self.version

    def _update(self, nodes: tuple[NodeInfo, ...]) -> None:
        if nodes == self.nodes:
            return
        self.nodes = nodes
        self.version += 1
        changed, self._changed = self._changed, trio.Event()
        changed.set()


@attrs.define(eq=False)
class Membership:
    """The `harness_nodes` table of one PostgreSQL database.

    Args:
        dsn: a libpq connection string or `postgresql://` URL (the store's).
        heartbeat_interval: seconds between a node's heartbeats.
        dead_after: seconds after its last heartbeat a node counts as dead.
    """

    dsn: str
    heartbeat_interval: float = attrs.field(
        default=HEARTBEAT_SECONDS, kw_only=True, validator=attrs.validators.gt(0)
    )
    dead_after: float = attrs.field(
        default=DEAD_AFTER_SECONDS, kw_only=True, validator=attrs.validators.gt(0)
    )

    async def serve_node(
        self,
        node_id: str,
        endpoint: str,
        *,
        task_status: trio.TaskStatus[NodeInfo] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Register `node_id` at `endpoint` and heartbeat until cancelled; then leave.

        `task_status.started(info)` once the node is registered (and
        announced). A second registration of the same id (a restart
        elsewhere) replaces this one: this node's next heartbeat then fails.
        A failed heartbeat (the database is down or unreachable) is retried
        on a new connection with bounded, jittered backoff; the node fails
        only once it has gone `dead_after` without a heartbeat while its
        attempts failed. A node that simply did not run for longer (stopped,
        paused, starved) heartbeats again when it wakes, which announces its
        return; its sessions' leases decide what it may still write.

        Cancellation: stops the heartbeats (one in flight finishes first,
        within `CALL_SECONDS`) and deletes this incarnation's row
        (announced), shielded and bounded by `LEAVE_GRACE_SECONDS`.

        Raises:
            MembershipError: the database cannot be reached at the start, or
                not for `dead_after` since the last heartbeat; or another
                incarnation of `node_id` replaced this one.
        """
        info = NodeInfo(node_id=node_id, endpoint=endpoint, incarnation=uuid.uuid4().hex)
        link = _Link()
        try:
            await self._open(link)
            await self._on(link, _register, info)
            task_status.started(info)
            deadline = trio.current_time() + self.dead_after
            failures = 0
            while True:
                pause = self.heartbeat_interval if failures == 0 else _backoff(failures)
                await trio.sleep_until(min(trio.current_time() + pause, deadline))
                if failures == 0 and trio.current_time() >= deadline:
                    # No heartbeat failed: the process did not run (SIGSTOP, a paused
                    # VM, a starved CPU). That is no outage: it beats again now, with
                    # a full budget, and the beat announces its return.
                    log.warning(
                        "node %r: back after %.1f s without running; heartbeating again",
                        node_id,
                        trio.current_time() - deadline + self.dead_after,
                    )
                    deadline = trio.current_time() + self.dead_after
                try:
                    with trio.CancelScope(shield=True):
                        left = deadline - trio.current_time()
                        if link.connection is None:
                            await self._open(link, timeout=left)
                        left = deadline - trio.current_time()
                        alive = await self._on(
                            link, _heartbeat, info, self.dead_after, timeout=left
                        )
                except MembershipError as exc:
                    if trio.current_time() - deadline > STALL_SLACK_SECONDS:
                        # The attempt's own deadline passed long ago: the process did
                        # not run meanwhile (it was stopped in the middle of the call).
                        log.warning(
                            "node %r: back after a stall in a heartbeat; heartbeating again",
                            node_id,
                        )
                        deadline = trio.current_time() + self.dead_after
                        continue
                    if trio.current_time() >= deadline:
                        raise MembershipError(
                            f"node {node_id!r}: no heartbeat for {self.dead_after:g} s "
                            f"(dead_after), so its liveness has run out: {exc}"
                        ) from exc
                    failures += 1
                    log.warning("node %r: heartbeat failed, reconnecting: %s", node_id, exc)
                    continue
                if not alive:
                    raise MembershipError(
                        f"node {node_id!r}: incarnation {info.incarnation} was replaced by "
                        "another start of the same node id; this one stops heartbeating"
                    )
                if failures:
                    log.warning("node %r: heartbeating again", node_id)
                deadline = trio.current_time() + self.dead_after
                failures = 0
        finally:
            with trio.move_on_after(LEAVE_GRACE_SECONDS, shield=True):
                await self._leave(link, info)

    async def _leave(self, link: _Link, info: NodeInfo) -> None:
        """Delete `info`'s row (announced) and close the link's connection.

        The link may have lost its connection with the call in flight when
        the node was stopped (its registration, just committed), or have a
        broken one: the row is deleted on a new connection then, so a node
        stopped the moment it joined does not linger in every view until
        `dead_after`. A database that cannot be reached is logged: the row
        then runs out by itself.
        """
        try:
            if link.connection is not None and link.connection.broken:
                link.connection.close()
                link.connection = None
            if link.connection is None:
                await self._open(link)
            assert link.connection is not None
            connection, link.connection = link.connection, None
            await trio.to_thread.run_sync(
                _leave_and_close, connection, info, abandon_on_cancel=True
            )
        except (MembershipError, psycopg.Error) as exc:
            log.warning("node %r: could not leave the membership: %s", info.node_id, exc)

    async def live_nodes(self) -> tuple[NodeInfo, ...]:
        """The nodes whose heartbeat is younger than `dead_after`, sorted by id.

        One read on a connection of its own, within `CALL_SECONDS`.

        Cancellation: returns at once (a read in flight is abandoned; its
        connection is closed when it ends).

        Raises:
            MembershipError: the database cannot be reached or does not answer.
        """
        nodes, _ = await _blocking(self.dsn, _read_live, self.dsn, self.dead_after)
        return nodes

    async def serve_view(
        self, *, task_status: trio.TaskStatus[MembershipView] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Keep a `MembershipView` current until cancelled.

        `task_status.started(view)` once the first read is in. The view is
        re-read when a node announces a change (`LISTEN harness_nodes`) and
        when the oldest heartbeat would run out, so a silent death shows
        within `dead_after` of the node's last heartbeat. When the database
        fails after the start, the view keeps its last nodes (logged) and
        reconnects with bounded, jittered backoff until it reads again.

        Cancellation: stops watching at once; the view keeps its last nodes.

        Raises:
            MembershipError: the database cannot be reached for the first read.
        """
        view = MembershipView()
        link = _Link()
        started = False
        announced = False
        failures = 0

        def on_notify(_: psycopg.Notify) -> None:
            nonlocal announced
            announced = True

        try:
            while True:
                try:
                    if link.connection is None:
                        await self._open(link)
                        assert link.connection is not None
                        link.connection.add_notify_handler(on_notify)
                        await self._on(link, _listen)
                    announced = False
                    nodes, expires_in = await self._on(link, _live, self.dead_after)
                    view._update(nodes)
                    if not started:
                        task_status.started(view)
                        started = True
                    if failures:
                        log.warning("cluster membership: reading the live nodes again")
                    failures = 0
                    with trio.move_on_after(expires_in):
                        while not announced:
                            assert link.connection is not None
                            await trio.lowlevel.wait_readable(link.connection.fileno())
                            await self._on(link, _receive_notifies)
                except MembershipError as exc:
                    if not started:
                        raise
                    failures += 1
                    log.warning(
                        "%s; keeping the last view (%s) and reconnecting",
                        exc,
                        ", ".join(view.node_ids()) or "no live nodes",
                    )
                    await trio.sleep(_backoff(failures))
        finally:
            if link.connection is not None:
                link.connection.close()

    async def _open(self, link: _Link, *, timeout: float = CALL_SECONDS) -> None:
        """Give `link` a new connection (raises `MembershipError`; cancellable at once)."""
        link.connection = await _blocking(self.dsn, _open, self.dsn, timeout=timeout)

    async def _on(
        self, link: _Link, work: Callable[..., _T], *args: Any, timeout: float = CALL_SECONDS
    ) -> _T:
        """Run `work(connection, *args)` on `link`'s connection in a worker thread.

        On any failure (a database error, no answer within `timeout`,
        cancellation) the link loses its connection, which is closed now or,
        when its thread was abandoned, by that thread once it ends.
        """
        connection = link.connection
        assert connection is not None
        try:
            return await _blocking(self.dsn, work, connection, *args, timeout=timeout)
        except BaseException:
            link.connection = None
            raise


@attrs.define(eq=False)
class _Link:
    """The connection a watcher or a node works on; `None` while it has to reconnect."""

    connection: _Connection | None = None


@attrs.define(eq=False)
class _Handoff:
    """Decides who closes the connections of a call whose caller may give up on it.

    The caller abandons the thread on cancellation or timeout; whichever of
    the two finishes last closes every connection the call touched.
    """

    _lock: threading.Lock = attrs.field(factory=threading.Lock)
    _started: bool = False
    _ended: bool = False
    _abandoned: bool = False
    touched: list[object] = attrs.field(factory=list)

    def begin(self) -> bool:
        """In the thread: the call starts; False when the caller gave up first (do nothing)."""
        with self._lock:
            self._started = True
            return not self._abandoned

    def end(self, result: object) -> bool:
        """In the thread: the call ended; True when the caller is gone (close now)."""
        with self._lock:
            self.touched.append(result)
            self._ended = True
            return self._abandoned

    def abandon(self) -> bool:
        """In Trio: the caller gives up; True when the thread ended or never started (close now).

        A cancellation can reach `trio.to_thread.run_sync` before its thread
        runs at all; then nothing else would close the connections.
        """
        with self._lock:
            self._abandoned = True
            return self._ended or not self._started


async def _blocking(
    dsn: str, work: Callable[..., _T], *args: Any, timeout: float = CALL_SECONDS
) -> _T:
    """Run blocking `work(*args)` in a worker thread within `timeout`; errors become ours.

    On failure or cancellation every connection among `args` and the result
    is closed (by the thread when it was abandoned mid-call).
    """
    handoff = _Handoff(touched=list(args))

    def run() -> _T:
        if not handoff.begin():
            raise MembershipError("the caller gave up before this call started")
        result: _T | None = None
        try:
            result = work(*args)
            return result
        finally:
            if handoff.end(result):
                _close(handoff.touched)

    failed = True
    try:
        with trio.fail_after(max(timeout, 0.0)):
            answer = await trio.to_thread.run_sync(run, abandon_on_cancel=True)
        failed = False
        return answer
    except trio.TooSlowError as exc:
        raise MembershipError(
            f"cluster membership in {_where(dsn)}: no answer within {max(timeout, 0.0):.3g} s"
        ) from exc
    except psycopg.Error as exc:
        raise MembershipError(f"cluster membership in {_where(dsn)}: {exc}") from exc
    finally:
        if failed and handoff.abandon():
            _close(handoff.touched)


def _close(things: list[object]) -> None:
    for thing in things:
        if isinstance(thing, psycopg.Connection):
            thing.close()


def _backoff(failures: int) -> float:
    """The pause before reconnect number `failures`: doubling, capped, jittered down by half."""
    ceiling = min(BACKOFF_MAX_SECONDS, BACKOFF_FIRST_SECONDS * 2.0 ** min(failures - 1, 16))
    return ceiling * random.uniform(0.5, 1.0)


def _where(dsn: str) -> str:
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "PostgreSQL (unparsable connection string)"
    return f"PostgreSQL '{params.get('host', 'localhost')}:{params.get('port', 5432)}'"


def _open(dsn: str) -> _Connection:
    """A new connection whose every wait is bounded: connecting, statements, a silent peer."""
    connection = psycopg.connect(
        dsn,
        autocommit=True,
        application_name="harness membership",
        connect_timeout=max(2, round(CALL_SECONDS)),
        keepalives=1,
        keepalives_idle=max(1, round(CALL_SECONDS)),
        keepalives_interval=1,
        keepalives_count=3,
        tcp_user_timeout=round(CALL_SECONDS * 1000),
    )
    try:
        connection.execute(
            "SELECT set_config('statement_timeout', %s, false)",
            (str(round(CALL_SECONDS * 1000)),),
        )
        ensure_schema(connection, f"cluster membership in {_where(dsn)}")
    except BaseException:
        connection.close()
        raise
    return connection


def _register(connection: _Connection, info: NodeInfo) -> None:
    with connection.transaction():
        connection.execute(_REGISTER.encode(), attrs.asdict(info))
        connection.execute("SELECT pg_notify(%s, %s)", (CHANNEL, info.node_id))


_HEARTBEAT = """
WITH previous AS (
    SELECT heartbeat_at FROM harness_nodes
    WHERE node_id = %(node_id)s AND incarnation = %(incarnation)s FOR UPDATE
)
UPDATE harness_nodes SET heartbeat_at = clock_timestamp()
FROM previous
WHERE node_id = %(node_id)s AND incarnation = %(incarnation)s
RETURNING previous.heartbeat_at + make_interval(secs => %(dead_after)s) <= clock_timestamp()
"""


def _heartbeat(connection: _Connection, info: NodeInfo, dead_after: float) -> bool:
    """Renew the heartbeat; False when the row is gone (replaced by another start).

    A node whose previous heartbeat was already too old (it was stalled, and
    counted as dead) announces its return, so views take it back at once.
    """
    with connection.transaction():
        row = connection.execute(
            _HEARTBEAT.encode(),
            {
                "node_id": info.node_id,
                "incarnation": info.incarnation,
                "dead_after": dead_after,
            },
        ).fetchone()
        if row is None:
            return False
        if row[0]:
            connection.execute("SELECT pg_notify(%s, %s)", (CHANNEL, info.node_id))
    return True


def _leave_and_close(connection: _Connection, info: NodeInfo) -> None:
    with connection:
        if connection.broken:
            return
        with connection.transaction():
            connection.execute(
                "DELETE FROM harness_nodes WHERE node_id = %s AND incarnation = %s",
                (info.node_id, info.incarnation),
            )
            connection.execute("SELECT pg_notify(%s, %s)", (CHANNEL, info.node_id))


def _listen(connection: _Connection) -> None:
    connection.execute(f"LISTEN {CHANNEL}".encode())


def _receive_notifies(connection: _Connection) -> None:
    """Read what the socket holds; psycopg hands each notification to the handlers."""
    connection.execute(b"SELECT 1")


def _read_live(dsn: str, dead_after: float) -> tuple[tuple[NodeInfo, ...], float]:
    with _open(dsn) as connection:
        return _live(connection, dead_after)


def _live(connection: _Connection, dead_after: float) -> tuple[tuple[NodeInfo, ...], float]:
    """The live nodes, and the seconds until the oldest heartbeat runs out."""
    rows = connection.execute(_LIVE.encode(), {"dead_after": dead_after}).fetchall()
    nodes = tuple(
        NodeInfo(node_id=str(node_id), endpoint=str(endpoint), incarnation=str(incarnation))
        for node_id, endpoint, incarnation, _ in rows
    )
    expires_in = min((float(left) for *_, left in rows), default=dead_after)
    return nodes, max(expires_in, 0.0)
