"""One node process in process: its node stream, takeover, request ids, `harness node`."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
import trio
import trio_websocket
from wsproto.utilities import LocalProtocolError

from actors.messages import UserSource
from actors.session.events import TurnStart, UserMessage
from actors.session.postgres_store import PostgresStore
from supervision.cluster import Membership, wire
from supervision.cluster.node import (
    ENVELOPE_BYTES,
    NodeError,
    NodeStream,
    _ClientTransport,
    run_node,
)
from supervision.cluster.wire import MOVED
from supervision.config import ConfigError, parse_config
from tests.cluster.helpers import (
    CLUSTER_SECRET,
    RawNodeClient,
    cluster_config,
    raw_node_client,
    write_config,
)


@pytest.fixture(autouse=True)
def _secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_CLUSTER_TOKEN", CLUSTER_SECRET)


async def stored_events(dsn: str, session_id: str) -> list[object]:
    store = PostgresStore(dsn)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.serve)
        events = await store.load(session_id)
        nursery.cancel_scope.cancel()
    return list(events)


async def test_a_node_registers_and_serves_prompts_with_request_ids(postgres_dsn: str) -> None:
    config = cluster_config(postgres_dsn)
    async with trio.open_nursery() as nursery:
        endpoint = await nursery.start(
            lambda task_status: run_node(config, node_id="n1", task_status=task_status)
        )
        assert endpoint.startswith("ws://127.0.0.1:")
        nodes = await Membership(postgres_dsn).live_nodes()
        assert [(n.node_id, n.endpoint) for n in nodes] == [("n1", endpoint)]
        async with raw_node_client(endpoint) as client:
            new = await client.call(
                "session/new",
                {"cwd": "/", "mcpServers": [], "_meta": {"harness": {"sessionId": "s-1"}}},
            )
            assert new == {"sessionId": "s-1"}
            prompt = {
                "sessionId": "s-1",
                "prompt": [{"type": "text", "text": "hello"}],
                "_meta": {"harness": {"requestId": "req-1"}},
            }
            first = await client.call("session/prompt", prompt)
            assert first["stopReason"] == "end_turn"
            # The same request id again is answered from the log: no second turn.
            again = await client.call("session/prompt", prompt)
            assert again == first
        nursery.cancel_scope.cancel()
    events = await stored_events(postgres_dsn, "s-1")
    users = [e.data for e in events if isinstance(e.data, UserMessage)]  # type: ignore[attr-defined]
    assert [u.source for u in users] == [UserSource(request_id="req-1")]
    turns = [e for e in events if isinstance(e.data, TurnStart)]  # type: ignore[attr-defined]
    assert len(turns) == 1


async def test_a_node_refuses_a_wrong_secret(postgres_dsn: str) -> None:
    config = cluster_config(postgres_dsn)
    async with trio.open_nursery() as nursery:
        endpoint = await nursery.start(
            lambda task_status: run_node(config, task_status=task_status)
        )
        host, _, port = endpoint.removeprefix("ws://").partition(":")
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            await stream.send_all(
                b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                b"Authorization: Bearer wrong\r\n\r\n"
            )
            with trio.fail_after(10):
                answer = await stream.receive_some()
        assert answer.startswith(b"HTTP/1.1 401"), answer
        nursery.cancel_scope.cancel()


async def test_a_node_needs_the_cluster_secret(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HARNESS_CLUSTER_TOKEN")
    with pytest.raises(ConfigError, match="HARNESS_CLUSTER_TOKEN"):
        await run_node(cluster_config(postgres_dsn))


def test_harness_node_prints_its_line_and_exits_0_on_sigterm(
    postgres_dsn: str, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "cluster.toml", postgres_dsn)
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "supervision.cli",
            "node",
            "--config",
            str(config),
            "--node-id",
            "cli-1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "HARNESS_CLUSTER_TOKEN": CLUSTER_SECRET},
        cwd=tmp_path,
    ) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline().decode()
            assert line.startswith("harness node cli-1 listening on ws://127.0.0.1:"), line
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0
        finally:
            if process.poll() is None:
                process.kill()


def test_the_cluster_table_is_strict() -> None:
    base = {
        "store": {"url": "postgresql://h/db"},
        "providers": {"default": {"kind": "simulator"}},
        "agents": {"default": {}},
    }
    with pytest.raises(ConfigError, match="unknown key 'ring' in \\[cluster\\]"):
        parse_config({**base, "cluster": {"nodes": "postgres", "ring": 1}}, "<t>")
    with pytest.raises(ConfigError, match="cluster"):
        parse_config({**base, "cluster": {"nodes": "etcd"}}, "<t>")
    no_url = {k: v for k, v in base.items() if k != "store"}
    with pytest.raises(ConfigError, match="needs \\[store\\] url"):
        parse_config({**no_url, "cluster": {"nodes": "postgres"}}, "<t>")
    config = parse_config({**base, "cluster": {"nodes": "postgres"}}, "<t>")
    assert config.cluster is not None and config.cluster.token_env == "HARNESS_CLUSTER_TOKEN"


async def test_a_gateway_sending_garbage_loses_its_stream_not_the_node(postgres_dsn: str) -> None:
    config = cluster_config(postgres_dsn)
    async with trio.open_nursery() as nursery:
        endpoint = await nursery.start(
            lambda task_status: run_node(config, node_id="g", task_status=task_status)
        )
        async with raw_node_client(endpoint) as bad:
            await bad.websocket.send_message("this is not an envelope")
            with trio.fail_after(10):
                with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                    await bad.websocket.get_message()
            assert closed.value.reason.code == 1008
        async with raw_node_client(endpoint) as good:
            new = await good.call("session/new", {"cwd": "/", "mcpServers": []})
            assert new["sessionId"]
        nursery.cancel_scope.cancel()


async def test_a_stream_whose_websocket_fails_is_lost_not_the_node(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # trio-websocket's reader task can raise while answering a ping on a connection that
    # is closing (LocalProtocolError: "Pong cannot be sent in state LOCAL_CLOSING"), as
    # a node woken from SIGSTOP did; that task runs beside the stream's handler, and its
    # failure once took the whole node down.
    async def failing_pong(self: Any, event: Any) -> None:
        raise LocalProtocolError(f"Event {event.response()} cannot be sent in state CLOSING.")

    failed = trio.Event()

    class Failures(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage() == "node stream from a gateway failed":
                failed.set()

    failures = Failures()
    logger = logging.getLogger("supervision.cluster.node")
    logger.addHandler(failures)
    try:
        config = cluster_config(postgres_dsn)
        async with trio.open_nursery() as nursery:
            endpoint = await nursery.start(
                lambda task_status: run_node(config, node_id="p", task_status=task_status)
            )
            with monkeypatch.context() as patched:
                patched.setattr(
                    trio_websocket.WebSocketConnection, "_handle_ping_event", failing_pong
                )
                async with raw_node_client(endpoint) as pinging, trio.open_nursery() as pings:
                    # Its pong never comes (nor does trio-websocket end the wait at the close).
                    pings.start_soon(pinging.websocket.ping, b"are you there")
                    with trio.fail_after(10):
                        with pytest.raises(trio_websocket.ConnectionClosed):
                            while True:  # the end of its virtual connection, then the close
                                await pinging.websocket.get_message()
                    pings.cancel_scope.cancel()
            with trio.fail_after(10):
                await failed.wait()  # logged by the node, which goes on
            async with raw_node_client(endpoint) as good:
                new = await good.call("session/new", {"cwd": "/", "mcpServers": []})
                assert new["sessionId"]
            nursery.cancel_scope.cancel()
    finally:
        logger.removeHandler(failures)


@asynccontextmanager
async def _node_with_slow_session(postgres_dsn: str) -> AsyncIterator[RawNodeClient]:
    """A node whose turns take ~1.5 s, and a raw client of it with the session `s-1` made."""
    config = cluster_config(postgres_dsn, token_rate=40, reply_tokens=60)
    async with trio.open_nursery() as nursery:
        endpoint = await nursery.start(
            lambda task_status: run_node(config, node_id="n1", task_status=task_status)
        )
        async with raw_node_client(endpoint) as client:
            await client.call(
                "session/new",
                {"cwd": "/", "mcpServers": [], "_meta": {"harness": {"sessionId": "s-1"}}},
            )
            yield client
        nursery.cancel_scope.cancel()


async def test_a_prompt_sent_again_after_its_connection_ended_follows_its_turn(
    postgres_dsn: str,
) -> None:
    # A gateway that loses its stream (the node stalled) sends the prompt again, with its
    # request id, on a new connection: the turn still running is followed, not lost to
    # the first connection's claim on it.
    async with _node_with_slow_session(postgres_dsn) as client:
        prompt = {
            "sessionId": "s-1",
            "prompt": [{"type": "text", "text": "hello"}],
            "_meta": {"harness": {"requestId": "req-1"}},
        }
        message = {"jsonrpc": "2.0", "id": 99, "method": "session/prompt", "params": prompt}
        await client.websocket.send_message(wire.to_node(client.key, json.dumps(message)))
        await trio.sleep(0.3)  # the turn runs
        await client.websocket.send_message(wire.end_to_node(client.key))
        with trio.fail_after(10):  # the node confirms the end of the first connection
            while wire.parse(await client.websocket.get_message()).end is None:
                pass
        client.key = "client-2"
        await client.call("initialize", {"protocolVersion": 1})
        again = await client.call("session/prompt", prompt, timeout=20)
        assert again["stopReason"] == "end_turn"
    events = await stored_events(postgres_dsn, "s-1")
    assert len([e for e in events if isinstance(e.data, TurnStart)]) == 1  # type: ignore[attr-defined]


async def test_a_queued_prompt_dropped_by_a_cancel_answers_cancelled_and_its_retry_runs(
    postgres_dsn: str,
) -> None:
    # Its message never reaches the log, so only the agent can tell the prompt's fate: the
    # prompt is answered `cancelled` (as on a single-process gateway), and the same request
    # id sent again runs as a new turn instead of waiting for a message that never comes.
    async with _node_with_slow_session(postgres_dsn) as client:

        def prompt(text: str, request_id: str) -> dict[str, Any]:
            return {
                "sessionId": "s-1",
                "prompt": [{"type": "text", "text": text}],
                "_meta": {"harness": {"requestId": request_id}},
            }

        await client.send(98, "session/prompt", prompt("a long story", "req-live"))
        client.key = "client-2"  # one prompt per session per connection
        await client.call("initialize", {"protocolVersion": 1})
        await client.send(99, "session/prompt", prompt("behind it", "req-queued"))
        state: dict[str, Any] = {}
        with trio.fail_after(20):
            while state.get("inbox", {}).get("nextTurn") != 1:  # queued behind the turn
                state = await client.call("_harness/session/state", {"sessionId": "s-1"})
        await client.call("_harness/session/cancel", {"sessionId": "s-1", "keepInbox": False})
        assert (await client.answer(99))["result"]["stopReason"] == "cancelled"
        assert (await client.answer(98))["result"]["stopReason"] == "cancelled"
        again = await client.call("session/prompt", prompt("behind it", "req-queued"))
        assert again["stopReason"] == "end_turn"
    events = await stored_events(postgres_dsn, "s-1")
    users = [e.data for e in events if isinstance(e.data, UserMessage)]  # type: ignore[attr-defined]
    assert [u.source for u in users] == [
        UserSource(request_id="req-live"),
        UserSource(request_id="req-queued"),
    ]
    assert len([e for e in events if isinstance(e.data, TurnStart)]) == 2  # type: ignore[attr-defined]


async def test_a_session_taken_over_behind_a_nodes_back_is_dropped_there(
    postgres_dsn: str,
) -> None:
    # As a node that wakes from a stall finds: another writer has its session. Its prompt
    # in flight is answered MOVED at once (the gateway sends it to the new owner), and so
    # is every later call, while the node's other sessions go on.
    config = cluster_config(postgres_dsn, token_rate=20, reply_tokens=200)  # a long turn
    async with trio.open_nursery() as nursery:
        endpoint = await nursery.start(
            lambda task_status: run_node(config, node_id="n1", task_status=task_status)
        )
        async with raw_node_client(endpoint) as client:
            await client.call(
                "session/new",
                {"cwd": "/", "mcpServers": [], "_meta": {"harness": {"sessionId": "s-1"}}},
            )
            prompt = {
                "sessionId": "s-1",
                "prompt": [{"type": "text", "text": "hello"}],
                "_meta": {"harness": {"requestId": "req-1"}},
            }
            async with trio.open_nursery() as inner:
                replies: list[Any] = []

                async def send() -> None:
                    replies.append(await client.request("session/prompt", prompt, timeout=20))

                inner.start_soon(send)
                await trio.sleep(0.5)
                with psycopg.connect(postgres_dsn, autocommit=True) as connection:
                    connection.execute(
                        "UPDATE harness_leases SET epoch = epoch + 1, owner = 'thief', "
                        "expires_at = clock_timestamp() + interval '60 s' "
                        "WHERE session_id = 's-1'"
                    )
            (reply,) = replies
            assert reply["error"]["code"] == MOVED, reply
            assert "taken over by another node" in reply["error"]["message"]
            later = await client.request("_harness/session/state", {"sessionId": "s-1"})
            assert later["error"]["code"] == MOVED
            assert "thief" in later["error"]["message"]
        nursery.cancel_scope.cancel()


async def test_a_long_batch_reaches_the_gateway_in_envelopes_of_bounded_size() -> None:
    sent: list[str] = []

    class Stream:
        async def send(self, text: str) -> None:
            sent.append(text)

    inbound_send, inbound = trio.open_memory_channel[str](1)
    transport = _ClientTransport(
        key="k", stream=cast(NodeStream, Stream()), inbound=inbound, outbound=inbound_send
    )
    frames = [json.dumps({"n": n, "pad": "x" * 100_000}).encode() for n in range(60)]
    await transport.send_batch(frames)
    envelopes = [wire.parse(text) for text in sent]
    assert len(envelopes) > 1
    assert all(len(text) < 2 * ENVELOPE_BYTES for text in sent)
    assert [t.encode() for e in envelopes for t in e.texts] == frames  # all, in order


async def test_a_node_refuses_a_listen_address_of_several_sockets_and_closes_them(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A host name that resolves to IPv4 and IPv6 gets a listener (and a port) for each,
    # and the node registers one endpoint: refused, naming the address, nothing left open.
    opened: list[trio.SocketListener] = []
    open_listeners = trio.open_tcp_listeners

    async def two_listeners(port: int, *, host: str | None = None) -> list[trio.SocketListener]:
        for _ in range(2):
            opened.extend(await open_listeners(0, host="127.0.0.1"))
        return opened

    monkeypatch.setattr(trio, "open_tcp_listeners", two_listeners)
    with pytest.raises(NodeError, match=r"'n1': dual\.example:0 resolves to 2 addresses"):
        await run_node(cluster_config(postgres_dsn), node_id="n1", listen="dual.example:0")
    assert len(opened) == 2 and all(listener.socket.fileno() == -1 for listener in opened)
