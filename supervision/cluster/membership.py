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

This is liveness only, for placement: whether a node may write a session is
decided by the session's lease in the store, never by membership.
"""

from __future__ import annotations

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

HEARTBEAT_SECONDS = 1.0
"""How often a node renews its heartbeat."""

DEAD_AFTER_SECONDS = 5.0
"""How long after its last heartbeat a node counts as dead."""

LEAVE_GRACE_SECONDS = 5.0
"""How long a stopping node spends deleting its row."""

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

        Cancellation: stops the heartbeats and deletes this incarnation's row
        (announced), shielded and bounded by `LEAVE_GRACE_SECONDS`.

        Raises:
            MembershipError: the database cannot be reached, or another
                incarnation of `node_id` replaced this one.
        """
        info = NodeInfo(node_id=node_id, endpoint=endpoint, incarnation=uuid.uuid4().hex)
        connection = await self._connect()
        try:
            await self._call(_register, connection, info)
            task_status.started(info)
            while True:
                await trio.sleep(self.heartbeat_interval)
                if not await self._call(_heartbeat, connection, info, self.dead_after):
                    raise MembershipError(
                        f"node {node_id!r}: incarnation {info.incarnation} was replaced by "
                        "another start of the same node id; this one stops heartbeating"
                    )
        finally:
            with trio.move_on_after(LEAVE_GRACE_SECONDS, shield=True):
                await trio.to_thread.run_sync(
                    _leave_and_close, connection, info, abandon_on_cancel=True
                )

    async def live_nodes(self) -> tuple[NodeInfo, ...]:
        """The nodes whose heartbeat is younger than `dead_after`, sorted by id.

        Cancellation: takes effect before or after the read, never during it.

        Raises:
            MembershipError: the database cannot be reached.
        """
        connection = await self._connect()
        try:
            nodes, _ = await self._call(_live, connection, self.dead_after)
        finally:
            connection.close()
        return nodes

    async def serve_view(
        self, *, task_status: trio.TaskStatus[MembershipView] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Keep a `MembershipView` current until cancelled.

        `task_status.started(view)` once the first read is in. The view is
        re-read when a node announces a change (`LISTEN harness_nodes`) and
        when the oldest heartbeat would run out, so a silent death shows
        within `dead_after` of the node's last heartbeat.

        Cancellation: stops watching; the view keeps its last nodes.

        Raises:
            MembershipError: the database cannot be reached.
        """
        view = MembershipView()
        connection = await self._connect()
        announced = False

        def on_notify(_: psycopg.Notify) -> None:
            nonlocal announced
            announced = True

        try:
            connection.add_notify_handler(on_notify)
            await self._call(_listen, connection)
            nodes, expires_in = await self._call(_live, connection, self.dead_after)
            view._update(nodes)
            task_status.started(view)
            while True:
                with trio.move_on_after(expires_in):
                    while not announced:
                        await trio.lowlevel.wait_readable(connection.fileno())
                        await self._call(_receive_notifies, connection)
                announced = False
                nodes, expires_in = await self._call(_live, connection, self.dead_after)
                view._update(nodes)
        finally:
            connection.close()

    async def _connect(self) -> _Connection:
        return await self._call(_open, self.dsn)

    async def _call(self, work: Callable[..., _T], *args: Any) -> _T:
        """Run blocking `work(*args)` in a worker thread; database errors become ours."""
        try:
            return await trio.to_thread.run_sync(work, *args)
        except psycopg.Error as exc:
            raise MembershipError(f"cluster membership in {_where(self.dsn)}: {exc}") from exc


def _where(dsn: str) -> str:
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "PostgreSQL (unparsable connection string)"
    return f"PostgreSQL '{params.get('host', 'localhost')}:{params.get('port', 5432)}'"


def _open(dsn: str) -> _Connection:
    connection = psycopg.connect(dsn, autocommit=True, application_name="harness membership")
    try:
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


def _live(connection: _Connection, dead_after: float) -> tuple[tuple[NodeInfo, ...], float]:
    """The live nodes, and the seconds until the oldest heartbeat runs out."""
    rows = connection.execute(_LIVE.encode(), {"dead_after": dead_after}).fetchall()
    nodes = tuple(
        NodeInfo(node_id=str(node_id), endpoint=str(endpoint), incarnation=str(incarnation))
        for node_id, endpoint, incarnation, _ in rows
    )
    expires_in = min((float(left) for *_, left in rows), default=dead_after)
    return nodes, max(expires_in, 0.0)
