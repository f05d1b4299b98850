"""`_harness/sessions/watch` on a gateway opened from code: added, status, removed."""

from __future__ import annotations

from typing import Any

import trio

from tests.gateway.helpers import RpcClient, connect, running_gateway


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
            statuses = [(c["session"]["sessionId"], c["change"]) for c in changes]
            assert statuses == [(before, "status")] * 2 + [(stored, "status")] * 2


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
