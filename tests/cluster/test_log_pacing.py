"""Log events through the cluster gateway are paced by the supervisor's socket.

A supervisor that reads its log subscription slower than the node sends
is never closed: its subscription falls behind, catches up from the store
and joins again, and it receives every event once, in order.
"""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
import trio
import trio_websocket

from supervision.gateway.connection import Connection
from tests.cluster.helpers import CLUSTER_SECRET, cluster_config, running_cluster
from tests.gateway.helpers import AUTH, RpcClient, connect


@pytest.fixture(autouse=True)
def _secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_CLUSTER_TOKEN", CLUSTER_SECRET)


async def small_window_stream(host: str, port: int) -> trio.SocketStream:
    """A TCP stream with a tiny receive buffer: the gateway can send only as fast as it is read."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await sock.connect((host, port))
    return trio.SocketStream(sock)


async def read_slowly(client: RpcClient) -> None:
    """Read frames one at a time with a pause after each, until the socket closes."""
    try:
        while True:
            client.file(json.loads(await client.ws.get_message()))
            await trio.sleep(0.001)
    except trio_websocket.ConnectionClosed:
        client._arrived.set()


async def whole_log(client: RpcClient, session_id: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while True:
        page = await client.call(
            "_harness/log/read", {"sessionId": session_id, "fromSeq": len(events)}
        )
        events.extend(page["events"])
        if page["nextSeq"] > page["headSeq"]:
            return events


async def open_slow(nursery: trio.Nursery, host: str, port: int) -> RpcClient:
    """An initialized supervisor on a 4 KiB receive window that reads one frame a millisecond."""
    stream = await small_window_stream(host, port)
    websocket = await trio_websocket.wrap_client_stream(
        nursery,
        stream,
        host,
        "/acp",
        extra_headers=[(k.encode(), v.encode()) for k, v in AUTH],
        message_queue_size=1,
    )
    slow = RpcClient(ws=websocket)
    nursery.start_soon(read_slowly, slow)
    await slow.call("initialize", {"protocolVersion": 1})
    return slow


async def test_a_slow_supervisor_catches_up_from_the_store_and_is_never_closed(
    postgres_dsn: str,
) -> None:
    config = cluster_config(postgres_dsn, reply_tokens=300)
    async with trio.open_nursery() as nursery:
        async with running_cluster(config, ("a",), nursery) as (_, gateway):
            slow = await open_slow(nursery, gateway.host, gateway.port)
            (connection,) = gateway.connections
            assert isinstance(connection, Connection)
            async with connect(gateway) as driver:
                with trio.fail_after(90):
                    sid = (await driver.call("session/new", {"cwd": "/", "mcpServers": []}))[
                        "sessionId"
                    ]
                    await slow.call("_harness/log/subscribe", {"sessionId": sid, "fromSeq": 0})
                    # A 64 KiB log lane, and a writer held while three turns (over 900
                    # events, far more than the 512 replies a connection may queue) run.
                    connection.outbox.log_capacity = 64 * 1024
                    connection.write_deadline = 60.0
                    async with connection.transport.stream._lock:
                        for turn in range(3):
                            reply = await driver.call(
                                "session/prompt",
                                {"sessionId": sid, "prompt": [{"type": "text", "text": f"{turn}"}]},
                            )
                            assert reply["stopReason"] == "end_turn"
                    expected = await whole_log(driver, sid)
                    assert len(expected) > 900
                    await slow.wait_for_log_events(len(expected))
                    assert slow.log_events[sid] == expected  # each event once, in order
                    caught_up = [
                        n for n in slow.notifications if n["method"] == "_harness/log/caughtUp"
                    ]
                    assert len(caught_up) == 1
                    assert slow.ws.closed is None
                    assert gateway.statistics().slow_consumer_closes == 0
                    assert connection.catch_ups > 0  # it fell behind while the writer waited
            await trio.aclose_forcefully(slow.ws._stream)
        nursery.cancel_scope.cancel()
