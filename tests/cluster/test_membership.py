"""Cluster membership: heartbeats, NOTIFY on join and leave, silent deaths, restarts."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import trio

from supervision.cluster import Membership, MembershipError, MembershipView, NodeInfo, owner
from supervision.cluster import membership as membership_module
from tests.postgres import PostgresServer, running_postgres


async def changed(view: MembershipView, version: int) -> list[str]:
    """The node ids once the view moved past `version` (within 10 s)."""
    with trio.fail_after(10):
        await view.wait_changed(version)
    return view.node_ids()


async def test_nodes_that_join_and_leave_are_announced_at_once(postgres_dsn: str) -> None:
    # A death would take 60 s to notice here: only the announcements can explain the speed.
    membership = Membership(postgres_dsn, dead_after=60)
    async with trio.open_nursery() as nursery:
        view: MembershipView = await nursery.start(membership.serve_view)
        assert view.nodes == ()
        with trio.CancelScope() as node_a:
            a: NodeInfo = await nursery.start(membership.serve_node, "a", "127.0.0.1:7001")
        assert a.endpoint == "127.0.0.1:7001"
        seen = view.version
        nursery.start_soon(membership.serve_node, "b", "127.0.0.1:7002")
        with trio.fail_after(2):
            while view.node_ids() != ["a", "b"]:
                seen = await view.wait_changed(seen)
        assert await membership.live_nodes() == view.nodes
        node_a.cancel()
        nursery.cancel_scope.cancel()


async def test_a_stopped_node_leaves_the_view(postgres_dsn: str) -> None:
    membership = Membership(postgres_dsn, dead_after=60)
    async with trio.open_nursery() as nursery:
        view: MembershipView = await nursery.start(membership.serve_view)
        async with trio.open_nursery() as nodes:
            await nodes.start(membership.serve_node, "a", "127.0.0.1:7001")
            await nodes.start(membership.serve_node, "b", "127.0.0.1:7002")
            while view.node_ids() != ["a", "b"]:
                await changed(view, view.version - 1)
            stopping = trio.CancelScope()

            async def short_lived() -> None:
                with stopping:
                    await membership.serve_node("c", "127.0.0.1:7003")

            nodes.start_soon(short_lived)
            while view.node_ids() != ["a", "b", "c"]:
                await changed(view, view.version)
            stopping.cancel()
            with trio.fail_after(10):  # far below dead_after: only the announcement explains it
                while view.node_ids() != ["a", "b"]:
                    await view.wait_changed(view.version)
            nodes.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
    assert await membership.live_nodes() == ()


async def test_a_node_stopped_as_its_registration_returns_still_leaves(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stopped while its registration (committed, announced) was still coming back from
    # its worker thread, a node lost its connection with the call and left nothing: it
    # stayed in every view until dead_after. The test above failed that way now and then
    # on a loaded machine, where the view and the test outran the node's thread hop.
    returned = threading.Event()
    register = membership_module._register

    def slow_to_return(connection: psycopg.Connection[Any], info: NodeInfo) -> None:
        register(connection, info)
        returned.wait(10)

    monkeypatch.setattr(membership_module, "_register", slow_to_return)
    membership = Membership(postgres_dsn, dead_after=600)
    async with trio.open_nursery() as nursery:
        view: MembershipView = await nursery.start(membership.serve_view)
        stopping = trio.CancelScope()

        async def short_lived() -> None:
            with stopping:
                await membership.serve_node("c", "127.0.0.1:7003")

        nursery.start_soon(short_lived)
        while view.node_ids() != ["c"]:
            await changed(view, view.version)
        stopping.cancel()
        returned.set()
        with trio.fail_after(10):  # far below dead_after: only the departure explains it
            while view.node_ids() != []:
                await view.wait_changed(view.version)
        nursery.cancel_scope.cancel()


async def test_a_node_that_stops_heartbeating_is_dead_after_its_timeout(postgres_dsn: str) -> None:
    membership = Membership(postgres_dsn, dead_after=0.5)
    await membership.live_nodes()  # creates the schema
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        # A node that crashed right after registering: no heartbeat, no departure.
        connection.execute(
            "INSERT INTO harness_nodes VALUES ('ghost', '127.0.0.1:7009', 'x', clock_timestamp())"
        )
    async with trio.open_nursery() as nursery:
        view: MembershipView = await nursery.start(membership.serve_view)
        assert view.node_ids() == ["ghost"]
        assert await changed(view, view.version) == []
        nursery.cancel_scope.cancel()


async def test_heartbeats_keep_a_node_alive_past_the_timeout(postgres_dsn: str) -> None:
    membership = Membership(postgres_dsn, heartbeat_interval=0.1, dead_after=1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(membership.serve_node, "a", "127.0.0.1:7001")
        await trio.sleep(2.0)
        assert [node.node_id for node in await membership.live_nodes()] == ["a"]
        nursery.cancel_scope.cancel()


async def test_a_restarted_node_replaces_its_old_incarnation(postgres_dsn: str) -> None:
    membership = Membership(postgres_dsn, heartbeat_interval=0.1)
    with pytest.RaisesGroup(
        pytest.RaisesExc(MembershipError, match=r"node 'a': incarnation \w+ was replaced")
    ):
        async with trio.open_nursery() as nursery:
            old: NodeInfo = await nursery.start(membership.serve_node, "a", "10.0.0.1:7001")
            new: NodeInfo = await nursery.start(membership.serve_node, "a", "10.0.0.2:7001")
            assert old.incarnation != new.incarnation
            assert await membership.live_nodes() == (new,)
            await trio.sleep_forever()


async def test_the_view_places_sessions_by_rendezvous(postgres_dsn: str) -> None:
    membership = Membership(postgres_dsn)
    async with trio.open_nursery() as nursery:
        for index in range(3):
            await nursery.start(membership.serve_node, f"n{index}", f"127.0.0.1:{7000 + index}")
        view: MembershipView = await nursery.start(membership.serve_view)
        placed = {owner(f"s{index}", view.node_ids()) for index in range(60)}
        assert placed == {"n0", "n1", "n2"}
        nursery.cancel_scope.cancel()


async def test_an_unreachable_database_is_named(postgres_dsn: str) -> None:
    with pytest.raises(MembershipError, match=r"cluster membership in PostgreSQL '127\.0\.0\.1:1'"):
        await Membership("postgresql://harness@127.0.0.1:1/x").live_nodes()


async def test_a_node_back_from_a_stall_announces_its_return(postgres_dsn: str) -> None:
    membership = Membership(postgres_dsn, heartbeat_interval=0.2, dead_after=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(membership.serve_node, "s", "127.0.0.1:7009")
        with psycopg.connect(postgres_dsn, autocommit=True) as listener:
            listener.execute("LISTEN harness_nodes")
            # As if the node had been stopped for a while: its last heartbeat is long gone.
            listener.execute(
                "UPDATE harness_nodes SET heartbeat_at = clock_timestamp() - interval '1 min'"
            )
            with trio.fail_after(5):
                while True:
                    notices = await trio.to_thread.run_sync(
                        lambda: list(listener.notifies(timeout=0.5, stop_after=1))
                    )
                    if notices:
                        break
            assert notices[0].payload == "s"
        nursery.cancel_scope.cancel()


async def test_a_node_that_did_not_run_past_dead_after_heartbeats_again(
    postgres_dsn: str,
) -> None:
    # A SIGSTOP as the node's Trio loop sees it: nothing runs, then every deadline is past.
    membership = Membership(postgres_dsn, heartbeat_interval=0.2, dead_after=1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(membership.serve_node, "s", "127.0.0.1:7009")
        view: MembershipView = await nursery.start(membership.serve_view)
        time.sleep(1.5)  # noqa: ASYNC251 - blocks the whole loop, as a stopped process is
        with trio.fail_after(5):
            while True:  # the view may first read the node as dead, then its return
                nodes = await membership.live_nodes()
                if [node.node_id for node in nodes] == ["s"]:
                    break
                await trio.sleep(0.1)
        await trio.sleep(1.5)  # the node keeps beating: still live past another dead_after
        assert [node.node_id for node in await membership.live_nodes()] == ["s"]
        assert view.node_ids() == ["s"]
        nursery.cancel_scope.cancel()


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[PostgresServer]:
    """A server of this module's own, which the outage tests stop and start again."""
    with running_postgres() as server:
        yield server


async def test_nodes_and_views_ride_out_a_short_database_outage(
    own_postgres: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    dsn = own_postgres.new_schema()
    membership = Membership(dsn, heartbeat_interval=0.2, dead_after=8)
    async with trio.open_nursery() as nursery:
        await nursery.start(membership.serve_node, "a", "127.0.0.1:7001")
        view: MembershipView = await nursery.start(membership.serve_view)
        assert view.node_ids() == ["a"]
        await trio.to_thread.run_sync(own_postgres.halt)
        await trio.sleep(3)
        assert view.node_ids() == ["a"]  # the last view, kept while the database is down
        await trio.to_thread.run_sync(own_postgres.resume)
        # The view reads again: a node that joins after the outage shows.
        await nursery.start(membership.serve_node, "b", "127.0.0.1:7002")
        with trio.fail_after(10):
            while view.node_ids() != ["a", "b"]:
                await view.wait_changed(view.version)
        # And node a heartbeats again.
        with trio.fail_after(5):
            while True:
                with psycopg.connect(dsn, autocommit=True) as connection:
                    row = connection.execute(
                        "SELECT clock_timestamp() - heartbeat_at < interval '1 s' "
                        "FROM harness_nodes WHERE node_id = 'a'"
                    ).fetchone()
                if row is not None and row[0]:
                    break
                await trio.sleep(0.2)
        nursery.cancel_scope.cancel()
    assert "keeping the last view (a) and reconnecting" in caplog.text


async def test_a_node_whose_database_stays_down_past_dead_after_fails(
    own_postgres: PostgresServer,
) -> None:
    dsn = own_postgres.new_schema()
    membership = Membership(dsn, heartbeat_interval=0.2, dead_after=1.5)
    try:
        with (
            trio.fail_after(15),
            pytest.RaisesGroup(
                pytest.RaisesExc(
                    MembershipError, match=r"node 'a': no heartbeat for 1\.5 s \(dead_after\)"
                )
            ),
        ):
            async with trio.open_nursery() as nursery:
                await nursery.start(membership.serve_node, "a", "127.0.0.1:7001")
                await trio.to_thread.run_sync(own_postgres.halt)
                await trio.sleep_forever()
    finally:
        await trio.to_thread.run_sync(own_postgres.resume)


async def test_a_blackholed_database_never_holds_up_cancellation() -> None:
    # A listener that accepts and never answers: the connection attempt hangs.
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    held: list[trio.SocketStream] = []
    async with trio.open_nursery() as nursery:

        async def accept() -> None:
            while True:
                held.append(await listener.accept())

        nursery.start_soon(accept)
        membership = Membership(f"postgresql://harness@127.0.0.1:{port}/x")
        with trio.fail_after(1):
            with trio.move_on_after(0.3):
                await membership.live_nodes()
        with pytest.raises(MembershipError, match=r"no answer within|timeout"):
            await membership.live_nodes()
        nursery.cancel_scope.cancel()
    for stream in held:
        await stream.aclose()
    await listener.aclose()


class _FailingDelete:
    """A live connection whose DELETE fails as a dropped server makes it fail."""

    broken = False

    def __enter__(self) -> _FailingDelete:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def transaction(self) -> _FailingDelete:
        return self

    def execute(self, *args: object) -> None:
        raise psycopg.OperationalError("server closed the connection unexpectedly")


async def test_a_leave_whose_delete_fails_is_logged_and_does_not_escape(
    caplog: pytest.LogCaptureFixture,
) -> None:
    membership = Membership("postgresql://unused")
    link = membership_module._Link(connection=_FailingDelete())  # type: ignore[arg-type]
    info = NodeInfo(node_id="n1", endpoint="ws://127.0.0.1:1", incarnation="i1")
    await membership._leave(link, info)
    assert link.connection is None
    assert "node 'n1': could not leave the membership: server closed" in caplog.text
