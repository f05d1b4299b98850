"""`_harness/sessions/watch`: added, status, removed; coalesced and paced per watch."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from actors.agent import AgentOptions
from actors.providers.simulator import SimulatorConfig
from supervision.gateway import AgentProfile
from supervision.gateway.auth import Principal
from supervision.gateway.sessions import SessionDirectory
from supervision.gateway.status import WatchCursor
from tests.gateway.helpers import ALL, RpcClient, connect, running_gateway, stalled_client


async def _changes(watcher: RpcClient, count: int) -> list[dict[str, Any]]:
    def changes() -> list[dict[str, Any]]:
        return [
            n["params"] for n in watcher.notifications if n["method"] == "_harness/sessions/changed"
        ]

    with trio.fail_after(30):
        await watcher.wait_for(lambda n: len(changes()) >= count)
    return changes()


async def _prompt(driver: RpcClient, sid: str, text: str) -> None:
    await driver.call(
        "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}
    )


async def test_status_changes_reach_watchers_of_a_gateway_opened_from_code() -> None:
    async with (
        running_gateway() as gateway,
        connect(gateway) as watcher,
        connect(gateway) as driver,
    ):
        await watcher.call("_harness/sessions/watch", {})
        sid = (await driver.call("session/new", {"cwd": "/", "mcpServers": []}))["sessionId"]
        await _prompt(driver, sid, "hi")
        changes = await _changes(watcher, 3)
        assert [c["change"] for c in changes] == ["added", "status", "status"]
        running, ended = changes[1]["session"], changes[2]["session"]
        assert running["sessionId"] == sid and running["turn"] == 0
        assert running["status"] == "running"
        # Each summary has the durable head when it was announced: one fan-out batch may hold
        # the whole turn, so both can show the same head.
        assert ended["status"] == "idle" and ended["headSeq"] >= running["headSeq"] >= 0
        await driver.call("session/close", {"sessionId": sid})
        assert [c["change"] for c in await _changes(watcher, 4)][3] == "removed"


async def test_sessions_started_before_the_watch_and_attached_ones_are_followed() -> None:
    async with running_gateway() as gateway, connect(gateway) as driver:
        before = (await driver.call("session/new", {"cwd": "/", "mcpServers": []}))["sessionId"]
        stored = (await driver.call("session/new", {"cwd": "/", "mcpServers": []}))["sessionId"]
        await _prompt(driver, stored, "remember me")
        await driver.call("session/close", {"sessionId": stored})
        async with connect(gateway) as watcher:
            await watcher.call("_harness/sessions/watch", {})
            await _prompt(driver, before, "one")
            await driver.call("session/resume", {"sessionId": stored})  # starts its agent again
            await _prompt(driver, stored, "two")
            changes = await _changes(watcher, 4)
            # Changes of one session come in order; two sessions' changes may interleave
            # (each session's feed hands out its own batches).
            for sid, turn in ((before, 0), (stored, 1)):
                of_session = [
                    (c["change"], c["session"]["status"], c["session"]["turn"])
                    for c in changes
                    if c["session"]["sessionId"] == sid
                ]
                assert of_session == [("status", "running", turn), ("status", "idle", turn)]
            assert len(changes) == 4


async def test_nothing_follows_the_sessions_once_no_watch_is_open() -> None:
    async with running_gateway() as gateway, connect(gateway) as driver:
        sid = (await driver.call("session/new", {"cwd": "/", "mcpServers": []}))["sessionId"]
        assert gateway.fanout.feeds == 0  # no watch, no subscription: no feed at all
        async with connect(gateway) as first, connect(gateway) as second:
            await first.call("_harness/sessions/watch", {})
            await second.call("_harness/sessions/watch", {})
            assert gateway.fanout.feeds == 1
        await _prompt(driver, sid, "unwatched")  # a whole turn: the watchers' goodbyes ran
        assert gateway.statistics().connections == 1
        assert gateway.fanout.feeds == 0


BURST = 1000


def _per_session(
    notifications: list[dict[str, Any]], seen: dict[str, list[tuple[str, str | None]]]
) -> None:
    """Add each session's changes to `seen`: (change, status), in arrival order."""
    for n in notifications:
        if n["method"] == "_harness/sessions/changed":
            session = n["params"]["session"]
            seen.setdefault(session["sessionId"], []).append(
                (n["params"]["change"], session.get("status"))
            )


async def test_a_burst_of_a_thousand_sessions_reaches_a_fast_watcher_without_a_close() -> None:
    async with (
        running_gateway(config=SimulatorConfig(reply_tokens=4)) as gateway,
        connect(gateway) as watcher,
    ):
        with trio.fail_after(240):
            await watcher.call("_harness/sessions/watch", {})
            agents = [
                await gateway.directory.create(profile="default", owner=None) for _ in range(BURST)
            ]
            for agent in agents:
                agent.followup("hi")
            for agent in agents:
                await agent.when_idle()

            seen: dict[str, list[tuple[str, str | None]]] = {}
            read = 0

            def settled() -> bool:
                nonlocal read
                _per_session(watcher.notifications[read:], seen)
                read = len(watcher.notifications)
                return len(seen) == BURST and all(
                    c[-1] == ("status", "idle") for c in seen.values()
                )

            await watcher.wait_until(settled)
        assert watcher.ws.closed is None
        assert gateway.statistics().slow_consumer_closes == 0
        for changes in seen.values():
            # "added" first (carrying the newest status when a status came before it was
            # written), then the statuses in the order they happened, the newest last.
            assert changes[0][0] == "added"
            statuses = [status for _, status in changes]
            assert statuses in (
                ["idle", "running", "idle"],
                ["running", "idle"],
                ["idle", "idle"],
                ["idle"],
            ), changes


async def test_a_stalled_watcher_is_closed_4008_once_after_the_write_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_gateway(config=SimulatorConfig(reply_tokens=4)) as gateway:
        async with stalled_client(gateway) as (watcher, reading):
            await watcher.call("_harness/sessions/watch", {})
            reading.cancel()  # nothing more is read: a few kilobytes stall the gateway's writes
            started = trio.current_time()
            agents = [
                await gateway.directory.create(profile="default", owner=None) for _ in range(BURST)
            ]
            for agent in agents:
                agent.followup("hi")
            for agent in agents:
                await agent.when_idle()  # the agents never wait for the watcher
            ran = trio.current_time() - started
            await gateway.wait_slow_consumer_closes(1)
            closed = trio.current_time() - started
            await trio.testing.wait_all_tasks_blocked()
        assert ran < 10.0 <= closed  # closed once a write stalled for the deadline (10 s)
        assert gateway.statistics().slow_consumer_closes == 1
        assert gateway.statistics().connections == 0


async def test_overflows_of_a_closing_connection_count_one_slow_consumer() -> None:
    async with running_gateway() as gateway, connect(gateway):
        (connection,) = gateway.connections
        connection.outbox.control_capacity = 1
        # While the writer cannot write (its stream's lock is held here) nothing drains.
        async with connection.transport.stream._lock:
            for _ in range(4):
                connection.send_notification({"jsonrpc": "2.0", "method": "x", "params": {}})
        await trio.testing.wait_all_tasks_blocked()
        assert gateway.statistics().slow_consumer_closes == 1


async def test_a_watch_coalesces_each_sessions_unwritten_changes() -> None:
    async with running_gateway() as gateway:
        cursor = WatchCursor(
            subscription="w", directory=gateway.directory, principal=Principal(token=ALL)
        )
        cases: list[tuple[list[tuple[str, str | None]], list[tuple[str, str | None]]]] = [
            # an unwritten "added" carries the newest status
            ([("added", "idle"), ("status", "running"), ("status", "idle")], [("added", "idle")]),
            # only the newest unwritten status is written
            ([("status", "running"), ("status", "idle")], [("status", "idle")]),
            # lifecycle changes are never coalesced away
            ([("added", "idle"), ("removed", None)], [("added", "idle"), ("removed", None)]),
            # a removal makes unwritten statuses moot, and is written once
            ([("status", "running"), ("removed", None)], [("removed", None)]),
            (
                [("removed", None), ("status", "running"), ("removed", None)],
                [("removed", None)],
            ),
            # a session that runs again after its removal shows it
            (
                [("removed", None), ("status", "running")],
                [("removed", None), ("status", "running")],
            ),
        ]
        for index, (recorded, _) in enumerate(cases):
            for change, status in recorded:
                cursor.record(f"s{index}", change, status)
        assert cursor.pending == sum(len(written) for _, written in cases)
        taken = cursor.take(limit=4)
        assert [sid for sid, _ in taken] == ["s0", "s1", "s2", "s3"]  # oldest first
        taken += cursor.take()
        assert cursor.pending == 0
        for (_, changes), (_, written) in zip(taken, cases, strict=True):
            assert [(c.change, c.status) for c in changes] == written


async def test_a_change_recorded_while_the_writer_reads_the_store_goes_after_the_older_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A change of a session whose summary needs the store is written by the watch's task,
    which awaits the store; a newer change recorded meanwhile must not overtake it."""
    store_read = trio.Event()
    summaries: dict[str, dict[str, Any] | None] = {}

    def summary_now(self: SessionDirectory, session_id: str) -> dict[str, Any] | None:
        return summaries.get(session_id)

    async def summary(self: SessionDirectory, session_id: str) -> dict[str, Any]:
        await store_read.wait()
        return {"sessionId": session_id, "status": "running"}

    monkeypatch.setattr(SessionDirectory, "summary_now", summary_now)
    monkeypatch.setattr(SessionDirectory, "summary", summary)
    async with running_gateway() as gateway, connect(gateway) as watcher:
        (connection,) = gateway.connections
        cursor = WatchCursor(
            subscription="w", directory=gateway.directory, principal=Principal(token=ALL)
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cursor.serve, connection)
            await trio.testing.wait_all_tasks_blocked()
            cursor.record("s", "status", "running")  # needs the store: the task writes it
            await trio.testing.wait_all_tasks_blocked()  # the task is reading the store
            summaries["s"] = {"sessionId": "s", "status": "idle"}
            cursor.record("s", "status", "idle")  # could be written at once, but must wait
            store_read.set()
            with trio.fail_after(10):
                await watcher.wait_for(lambda n: n["params"]["session"].get("status") == "idle")
            nursery.cancel_scope.cancel()
    assert _changes_of(watcher) == [("s", "status", "running"), ("s", "status", "idle")]


def _changes_of(watcher: RpcClient) -> list[tuple[str, str, str | None]]:
    """(sessionId, change, status) of every change the watcher got, in order."""
    return [
        (
            n["params"]["session"]["sessionId"],
            n["params"]["change"],
            n["params"]["session"].get("status"),
        )
        for n in watcher.notifications
        if n["method"] == "_harness/sessions/changed"
    ]


async def test_a_watch_filter_selects_sessions_by_agent_and_by_parent() -> None:
    async with (
        running_gateway() as gateway,
        connect(gateway) as by_agent,
        connect(gateway) as by_parent,
    ):
        with trio.fail_after(30):
            directory = gateway.directory
            directory.profiles["other"] = AgentProfile(options=AgentOptions(model="deepseek-chat"))
            parent = await directory.create(profile="default", owner=None)
            pid = parent.session.id
            await by_agent.call("_harness/sessions/watch", {"filter": {"agent": "other"}})
            await by_parent.call("_harness/sessions/watch", {"filter": {"parentSessionId": pid}})
            other = await directory.create(profile="other", owner=None)
            child = await directory.create(profile="default", owner=None, parent=pid)
            agents = [parent, other, child]
            for agent in agents:
                agent.followup("hi")
            for agent in agents:
                await agent.when_idle()
            for agent in agents:
                await directory.close(agent.session.id)
            await by_agent.wait_for(lambda n: n["params"].get("change") == "removed")
            await by_parent.wait_for(lambda n: n["params"].get("change") == "removed")
        for watcher, only in ((by_agent, other), (by_parent, child)):
            changes = _changes_of(watcher)
            assert {sid for sid, _, _ in changes} == {only.session.id}
            assert changes[0][1] == "added" and changes[-1][1] == "removed"


async def test_a_watch_filtered_by_status_sees_sessions_enter_and_leave_it() -> None:
    # Turns that stream for a while: each one's start is written before its end is durable.
    config = SimulatorConfig(reply_tokens=20, token_rate=100)
    async with running_gateway(config=config) as gateway, connect(gateway) as watcher:
        with trio.fail_after(30):
            await watcher.call("_harness/sessions/watch", {"filter": {"status": "running"}})
            agent = await gateway.directory.create(profile="default", owner=None)
            sid = agent.session.id
            for turn, text in enumerate(("one", "two")):
                agent.followup(text)
                await agent.when_idle()
                await watcher.wait_until(
                    lambda turn=turn: (
                        [s for _, _, s in _changes_of(watcher)].count("idle") == turn + 1
                    )
                )
            await gateway.directory.close(sid)
            other = await gateway.directory.create(profile="default", owner=None)
            other.followup("three")
            await watcher.wait_until(lambda: _changes_of(watcher)[-1][0] == other.session.id)
        # Not the idle "added", nor the removal of a session last written idle.
        assert _changes_of(watcher) == [
            (sid, "status", "running"),
            (sid, "status", "idle"),
            (sid, "status", "running"),
            (sid, "status", "idle"),
            (other.session.id, "status", "running"),
        ]
