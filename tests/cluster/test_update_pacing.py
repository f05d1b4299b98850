"""A prompt's `session/update`s through the cluster gateway are paced as in one process.

They go into the supervisor connection's byte-bounded log lane (never its
512-frame control lane), with the prompt's reply behind them: a supervisor
that reads slower than the turn streams keeps its connection and receives
every update, in order, then the reply; one that stops reading is closed
4008 only when a write stalls past the write deadline.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from supervision.gateway.connection import CLOSE_SLOW_CONSUMER, Connection
from tests.cluster.helpers import CLUSTER_SECRET, cluster_config, running_cluster
from tests.cluster.test_log_pacing import open_slow, whole_log
from tests.gateway.helpers import RpcClient, connect


@pytest.fixture(autouse=True)
def _secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_CLUSTER_TOKEN", CLUSTER_SECRET)


def chunks(client: RpcClient, session_id: str) -> list[str]:
    """The text of every `agent_message_chunk` update `client` got for the session, in order."""
    return [
        n["params"]["update"]["content"]["text"]
        for n in client.notifications
        if n["method"] == "session/update"
        and n["params"]["sessionId"] == session_id
        and n["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
    ]


def streamed_text(events: list[dict[str, Any]]) -> list[str]:
    """The chunk texts of the log's `assistant/chunk` events, in order."""
    return [
        e["data"]["chunk"]["text"]
        for e in events
        if e["type"] == "assistant/chunk"
        and e["data"]["chunk"]["type"] == "text"
        and e["data"]["chunk"]["text"]
    ]


async def turn_ended(driver: RpcClient, session_id: str) -> None:
    """Wait until the session's log has a `turn/end` (the driver is subscribed to it)."""
    await driver.wait_for(
        lambda n: (
            n["method"] == "_harness/log/event"
            and n["params"]["sessionId"] == session_id
            and n["params"]["event"]["type"] == "turn/end"
        )
    )


async def watched_session(driver: RpcClient) -> str:
    """A new session's id, with `driver` subscribed to its log."""
    sid = str((await driver.call("session/new", {"cwd": "/", "mcpServers": []}))["sessionId"])
    await driver.call("_harness/log/subscribe", {"sessionId": sid})
    return sid


async def send_prompt(client: RpcClient, session_id: str) -> None:
    """Send `session/prompt` (id "p") without waiting for its answer."""
    await client.send(
        {
            "jsonrpc": "2.0",
            "id": "p",
            "method": "session/prompt",
            "params": {"sessionId": session_id, "prompt": [{"type": "text", "text": "go"}]},
        }
    )


async def test_a_slow_prompter_keeps_its_connection_and_gets_every_update_in_order(
    postgres_dsn: str,
) -> None:
    config = cluster_config(postgres_dsn, reply_tokens=800)
    async with trio.open_nursery() as nursery:
        async with running_cluster(config, ("a",), nursery) as (_, gateway):
            slow = await open_slow(nursery, gateway.host, gateway.port)
            (connection,) = gateway.connections
            assert isinstance(connection, Connection)
            async with connect(gateway) as driver:
                with trio.fail_after(90):
                    sid = await watched_session(driver)
                    connection.write_deadline = 60.0
                    async with connection.transport.stream._lock:
                        # The writer is held while the whole turn streams (800 updates,
                        # more than the control lane's 512 frames).
                        await send_prompt(slow, sid)
                        await turn_ended(driver, sid)
                    reply = await slow.answer("p")
                    assert reply["result"]["stopReason"] == "end_turn"
                    expected = streamed_text(await whole_log(driver, sid))
                    assert len(expected) >= 800
                    assert chunks(slow, sid) == expected  # every update once, in order
                    # The reply came after every update of its turn.
                    last_update = max(
                        i
                        for i, f in enumerate(slow.frames)
                        if isinstance(f, dict) and f.get("method") == "session/update"
                    )
                    assert slow.frames.index(reply) > last_update
                    assert slow.ws.closed is None
                    assert gateway.statistics().slow_consumer_closes == 0
            await trio.aclose_forcefully(slow.ws._stream)
        nursery.cancel_scope.cancel()


async def test_a_prompter_that_stops_reading_is_closed_4008_only_at_the_write_deadline(
    postgres_dsn: str,
) -> None:
    config = cluster_config(postgres_dsn, reply_tokens=800)
    async with trio.open_nursery() as nursery:
        async with running_cluster(config, ("a",), nursery) as (_, gateway):
            slow = await open_slow(nursery, gateway.host, gateway.port)
            (connection,) = gateway.connections
            assert isinstance(connection, Connection)
            async with connect(gateway) as driver:
                with trio.fail_after(90):
                    sid = await watched_session(driver)
                    connection.write_deadline = 2.0
                    async with connection.transport.stream._lock:
                        await send_prompt(slow, sid)
                        # Over 512 updates come while nothing is read; only the write
                        # stalled past its deadline closes the connection.
                        started = trio.current_time()
                        await gateway.wait_slow_consumer_closes(1)
                        assert trio.current_time() - started >= 1.0
                    assert connection._close_code == CLOSE_SLOW_CONSUMER
                    assert "stalled" in connection._close_reason
                    assert gateway.statistics().slow_consumer_closes == 1
            await trio.aclose_forcefully(slow.ws._stream)
        nursery.cancel_scope.cancel()
