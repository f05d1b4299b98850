"""A misbehaving node fails its own link only: the cluster gateway stays up and says why."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

import pytest
import trio
import trio_websocket

from supervision.cluster import Membership, MembershipView, owner
from supervision.cluster.node import CLIENT_QUEUE, run_node
from supervision.cluster.wire import MOVED, parse, to_gateway
from supervision.gateway.connection import CLOSE_INTERNAL, CLOSE_POLICY
from supervision.gateway.protocol import OVERLOADED
from tests.cluster.helpers import (
    CLUSTER_SECRET,
    cluster_config,
    raw_node_client,
    running_cluster,
    start_gateway,
    wait_nodes,
)
from tests.gateway.helpers import connect

Behaviour = Callable[[trio_websocket.WebSocketConnection], Awaitable[None]]


@pytest.fixture(autouse=True)
def _secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_CLUSTER_TOKEN", CLUSTER_SECRET)


@asynccontextmanager
async def fake_node(
    dsn: str, node_id: str, behaviour: Behaviour, *, endpoint: str | None = None
) -> AsyncIterator[None]:
    """A websocket server on 127.0.0.1 port 0 running `behaviour` per stream, registered as
    `node_id` (at `endpoint` instead, when given) in the nodes table."""

    async def handle(request: trio_websocket.WebSocketRequest) -> None:
        websocket = await request.accept()
        with suppress(trio_websocket.ConnectionClosed):
            await behaviour(websocket)

    async with trio.open_nursery() as nursery:
        server: trio_websocket.WebSocketServer = await nursery.start(
            lambda task_status: trio_websocket.serve_websocket(
                handle, "127.0.0.1", 0, None, task_status=task_status
            )
        )
        await nursery.start(
            Membership(dsn).serve_node, node_id, endpoint or f"ws://127.0.0.1:{server.port}"
        )
        yield
        nursery.cancel_scope.cancel()


def answering_with(text: str) -> Behaviour:
    """A node answering the first frame of each client with `text`, then reading on."""

    async def behaviour(websocket: trio_websocket.WebSocketConnection) -> None:
        envelope = parse(await websocket.get_message())
        await websocket.send_message(to_gateway(envelope.key, [text]))
        while True:
            await websocket.get_message()

    return behaviour


async def stats_entries(gateway: Any) -> dict[str, Any]:
    async with connect(gateway) as client:
        with trio.fail_after(30):
            stats = await client.call("_harness/stats", {})
    return {entry["nodeId"]: entry for entry in stats["nodes"]}


@pytest.mark.parametrize("garbage", ["not json", "[1, 2]", '"a string"'])
async def test_a_node_sending_garbage_fails_its_link_only(postgres_dsn: str, garbage: str) -> None:
    config = cluster_config(postgres_dsn)
    async with trio.open_nursery() as nursery:
        async with (
            running_cluster(config, ("a",), nursery) as (_, gateway),
            fake_node(postgres_dsn, "bad", answering_with(garbage)),
        ):
            await wait_nodes(gateway, 2)
            entries = await stats_entries(gateway)
            assert "sent garbage" in entries["bad"]["error"], entries["bad"]
            assert "stats" in entries["a"]
            # The gateway is still up and serves the healthy node.
            async with connect(gateway) as client:
                new = await client.call("session/new", {"cwd": "/", "mcpServers": []})
                assert new["sessionId"]
        nursery.cancel_scope.cancel()


async def test_a_malformed_endpoint_row_fails_that_link_only(postgres_dsn: str) -> None:
    config = cluster_config(postgres_dsn)
    async with trio.open_nursery() as nursery:
        async with (
            running_cluster(config, ("a",), nursery) as (_, gateway),
            fake_node(postgres_dsn, "bad", answering_with("{}"), endpoint="ws://::1:9"),
        ):
            await wait_nodes(gateway, 2)
            entries = await stats_entries(gateway)
            assert "malformed endpoint 'ws://::1:9'" in entries["bad"]["error"], entries["bad"]
            assert "stats" in entries["a"]
        nursery.cancel_scope.cancel()


async def test_a_node_listening_on_ipv6_is_reachable(postgres_dsn: str) -> None:
    config = cluster_config(postgres_dsn)
    async with trio.open_nursery() as nursery:
        async with running_cluster(config, ("a",), nursery) as (_, gateway):
            endpoint = await nursery.start(
                lambda task_status: run_node(
                    config, node_id="v6", listen="[::1]:0", task_status=task_status
                )
            )
            assert endpoint.startswith("ws://[::1]:"), endpoint
            await wait_nodes(gateway, 2)
            entries = await stats_entries(gateway)
            assert entries["v6"]["stats"]["sessions"]["live"] == 0, entries["v6"]
        nursery.cancel_scope.cancel()


Script = Callable[[dict[str, Any]], dict[str, Any] | None]
"""A fake node's answer to one request: the reply's result/error members, or None for none."""


def scripted(
    script: Script, *, after: Callable[[str, dict[str, Any]], list[str]] | None = None
) -> Behaviour:
    """A node answering each request by `script` (initialize answered `{}`); `after(key,
    request)` lists further frames to send once a request was answered."""

    async def behaviour(websocket: trio_websocket.WebSocketConnection) -> None:
        while True:
            envelope = parse(await websocket.get_message())
            for text in envelope.texts:
                request = json.loads(text)
                if "id" not in request:
                    continue
                body = {} if request["method"] == "initialize" else script(request)
                if body is None:
                    continue
                reply = json.dumps({"jsonrpc": "2.0", "id": request["id"], **body})
                await websocket.send_message(to_gateway(envelope.key, [reply]))
                later = after(envelope.key, request) if after is not None else []
                if later:
                    await trio.sleep(0.2)  # the gateway has handled the reply by then
                    await websocket.send_message(to_gateway(envelope.key, later))

    return behaviour


async def test_a_negative_retry_after_is_clamped(postgres_dsn: str) -> None:
    config = cluster_config(postgres_dsn)
    moved = {"error": {"code": MOVED, "message": "held", "data": {"retryAfterMs": -1}}}
    async with trio.open_nursery() as nursery:
        gateway = await start_gateway(config, nursery, retry_deadline=1)
        async with fake_node(postgres_dsn, "mover", scripted(lambda request: moved)):
            await wait_nodes(gateway, 1)
            async with connect(gateway) as client:
                reply = await client.request("session/new", {"cwd": "/", "mcpServers": []})
            assert reply["error"]["code"] == OVERLOADED, reply
            assert "held" in reply["error"]["message"]
        nursery.cancel_scope.cancel()


async def test_a_bad_resubscribe_reply_closes_that_client_only(postgres_dsn: str) -> None:
    config = cluster_config(postgres_dsn)
    subscribes = 0

    def script(request: dict[str, Any]) -> dict[str, Any]:
        nonlocal subscribes
        subscribes += 1
        # The first subscribe is served; the resumed one is answered without a subscription.
        return {"result": {"subscription": "s1"} if subscribes == 1 else {}}

    def moved_once(key: str, request: dict[str, Any]) -> list[str]:
        if subscribes != 1:
            return []
        notice = {"subscription": "s1", "sessionId": "s-1"}
        return [json.dumps({"jsonrpc": "2.0", "method": "_harness/log/moved", "params": notice})]

    async with trio.open_nursery() as nursery:
        gateway = await start_gateway(config, nursery, retry_deadline=2)
        async with fake_node(postgres_dsn, "odd", scripted(script, after=moved_once)):
            await wait_nodes(gateway, 1)
            async with connect(gateway) as client:
                await client.call("_harness/log/subscribe", {"sessionId": "s-1", "fromSeq": 0})
                with trio.fail_after(10), pytest.raises(trio_websocket.ConnectionClosed):
                    await client.wait_for(lambda message: False)
                assert client.ws.closed is not None
                assert client.ws.closed.code == CLOSE_INTERNAL
                assert "could not be resumed" in (client.ws.closed.reason or "")
            async with connect(gateway) as again:  # the gateway is still up
                assert "nodes" in await again.call("_harness/stats", {})
        nursery.cancel_scope.cancel()


async def test_cluster_log_subscribe_reports_the_gateways_epoch(postgres_dsn: str) -> None:
    config = cluster_config(postgres_dsn)
    async with trio.open_nursery() as nursery:
        async with (
            running_cluster(config, ("a",), nursery) as (_, gateway),
            connect(gateway) as client,
        ):
            epoch = (await client.call("_harness/stats", {}))["epoch"]
            sid = (await client.call("session/new", {"cwd": "/", "mcpServers": []}))["sessionId"]
            subscribed = await client.call("_harness/log/subscribe", {"sessionId": sid})
            assert subscribed["epoch"] == epoch == gateway.epoch
        nursery.cancel_scope.cancel()


async def test_the_cluster_gateway_refuses_batch_and_merge(postgres_dsn: str) -> None:
    config = cluster_config(postgres_dsn)
    async with trio.open_nursery() as nursery:
        async with (
            running_cluster(config, ("a",), nursery) as (_, gateway),
            connect(gateway) as client,
        ):
            sid = (await client.call("session/new", {"cwd": "/", "mcpServers": []}))["sessionId"]
            answer = await client.request(
                "_harness/log/subscribe", {"sessionId": sid, "batch": True}
            )
            assert answer["error"]["code"] == -32602
            assert answer["error"]["data"] == {"path": "/batch", "reason": "unsupported"}
            answer = await client.request(
                "_harness/log/subscribe", {"sessionId": sid, "merge": True}
            )
            assert answer["error"]["code"] == -32602
            assert answer["error"]["data"] == {"path": "/merge", "reason": "unsupported"}
        nursery.cancel_scope.cancel()


async def silent(websocket: trio_websocket.WebSocketConnection) -> None:
    """A node that reads everything and answers nothing (its stream stays up)."""
    while True:
        await websocket.get_message()


async def test_a_silent_node_is_timed_out(postgres_dsn: str) -> None:
    config = cluster_config(postgres_dsn)
    # A name that ranks first for the lists, so `session/list` tries the silent node first.
    name = next(n for n in (f"silent-{i}" for i in range(100)) if owner("", ["a", n]) == n)
    async with trio.open_nursery() as nursery:
        async with running_cluster(config, ("a",), nursery) as (_, gateway):
            router = gateway.methods.router
            router.each_node_deadline = router.ack_deadline = 1
            async with fake_node(postgres_dsn, name, silent):
                await wait_nodes(gateway, 2)
                entries = await stats_entries(gateway)
                assert entries[name]["error"] == "timeout"
                assert "stats" in entries["a"]
                async with connect(gateway) as client:
                    with trio.fail_after(10):
                        assert (await client.call("session/list", {}))["sessions"] == []
                router.retry_deadline, router.ack_deadline = 1, 0.3
                router.links.pop(name).close("test: reconnect")
                only_silent = MembershipView()
                only_silent._update(tuple(n for n in router.view.nodes if n.node_id == name))
                router.view = only_silent
                async with connect(gateway) as client:
                    reply = await client.request("session/list", {})
                assert reply["error"]["code"] == OVERLOADED
                assert f"node {name!r} did not answer initialize" in reply["error"]["message"]
        nursery.cancel_scope.cancel()


async def test_a_node_ends_an_overflowing_client_once_and_its_key_can_be_reused(
    postgres_dsn: str,
) -> None:
    config = cluster_config(postgres_dsn)
    async with trio.open_nursery() as nursery:
        endpoint = await nursery.start(
            lambda task_status: run_node(config, node_id="n", task_status=task_status)
        )
        async with raw_node_client(endpoint) as raw:
            ws, key = raw.websocket, raw.key
            noise = json.dumps({"jsonrpc": "2.0", "method": "_harness/none"})
            await ws.send_message(to_gateway(key, [noise] * (CLIENT_QUEUE + 10)))
            hello = {"jsonrpc": "2.0", "id": 101, "method": "initialize", "params": {}}
            hello["params"] = {"protocolVersion": 1}
            listing = {"jsonrpc": "2.0", "id": 102, "method": "session/list", "params": {}}
            ends: list[int] = []
            replies: dict[int, dict[str, Any]] = {}
            with trio.fail_after(20):
                while not ends:
                    envelope = parse(await ws.get_message())
                    if envelope.end is not None:
                        ends.append(envelope.end)
                # The key is used again at once: a new virtual connection.
                await ws.send_message(to_gateway(key, [json.dumps(hello)]))
                await ws.send_message(to_gateway(key, [json.dumps(listing)]))
                while 102 not in replies:
                    envelope = parse(await ws.get_message())
                    if envelope.end is not None:
                        ends.append(envelope.end)
                    for text in envelope.texts:
                        message = json.loads(text)
                        if message.get("id") in (101, 102):
                            replies[message["id"]] = message
            assert ends == [CLOSE_POLICY]
            assert "result" in replies[101], replies
            assert "result" in replies[102], replies
        nursery.cancel_scope.cancel()


async def test_cancel_reaches_the_node_running_the_prompt(postgres_dsn: str) -> None:
    config = cluster_config(postgres_dsn, token_rate=20, reply_tokens=400)
    async with trio.open_nursery() as nursery:
        async with (
            running_cluster(config, ("a", "b"), nursery) as (_, gateway),
            connect(gateway) as client,
        ):
            router = gateway.methods.router
            sid = (await client.call("session/new", {"cwd": "/", "mcpServers": []}))["sessionId"]
            prompt = text_prompt(sid)
            await client.send(prompt)
            with trio.fail_after(10):
                await client.wait_for(lambda m: m["method"] == "session/update")
            running_on = owner(sid, ["a", "b"])
            # This gateway's view now places the session on the other node (a stale view).
            moved_view = MembershipView()
            moved_view._update(tuple(n for n in router.view.nodes if n.node_id != running_on))
            router.view = moved_view
            await client.send(
                {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}}
            )
            with trio.fail_after(15):
                reply = await client.answer(prompt["id"])
            assert reply["result"]["stopReason"] == "cancelled", reply
        nursery.cancel_scope.cancel()


def text_prompt(session_id: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": "p-1",
        "method": "session/prompt",
        "params": {"sessionId": session_id, "prompt": [{"type": "text", "text": "hi"}]},
    }
