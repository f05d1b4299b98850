"""Node-stream keep-alive: a node frozen mid-call is dropped within seconds, a slow one is not.

The nodes here are in-process fakes behind in-memory streams (so the clock
can jump): each answers `initialize` and then either answers calls, answers
them late, or freezes (reads and writes nothing more, its stream still open).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest
import trio
import trio.testing
import trio_websocket

from supervision.cluster import MembershipView, owner, wire
from supervision.cluster.membership import NodeInfo
from supervision.cluster.router import Router, RouterClient
from supervision.gateway.connection import Connection


class FreezableStream(trio.abc.Stream):
    """A stream that, once `frozen`, neither delivers what arrives nor sends (a stopped process)."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.frozen = False

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        data = await self.inner.receive_some(max_bytes)
        if self.frozen:
            await trio.sleep_forever()
        return bytes(data)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.frozen:
            await trio.sleep_forever()
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.inner.aclose()


Behaviour = Callable[[FreezableStream], Awaitable[None]]


async def freeze(stream: FreezableStream) -> None:
    stream.frozen = True
    await trio.sleep_forever()


async def answer_late(stream: FreezableStream) -> None:
    await trio.sleep(30)  # a long turn: the node's websocket still answers pings meanwhile


async def answer_at_once(stream: FreezableStream) -> None:
    return None


async def fake_node(name: str, stream: FreezableStream, on_call: Behaviour) -> None:
    async with trio.open_nursery() as nursery:
        request = await trio_websocket.wrap_server_stream(nursery, stream)
        websocket = await request.accept()
        while True:
            envelope = wire.parse(await websocket.get_message())
            for text in envelope.texts:
                message = json.loads(text)
                if message.get("method") != "initialize":
                    await on_call(stream)
                if "id" in message:
                    reply = {"jsonrpc": "2.0", "id": message["id"], "result": {"node": name}}
                    await websocket.send_message(wire.to_gateway(envelope.key, [json.dumps(reply)]))


def nodes_at(
    monkeypatch: pytest.MonkeyPatch, nursery: trio.Nursery, behaviours: dict[str, Behaviour]
) -> MembershipView:
    """A view of fake nodes `NAME.test:1`, each reached through an in-memory stream."""

    async def open_stream(host: str, port: int) -> trio.abc.Stream:
        name = host.removesuffix(".test")
        ours, theirs = trio.testing.memory_stream_pair()
        nursery.start_soon(fake_node, name, FreezableStream(theirs), behaviours[name])
        return ours

    monkeypatch.setattr(trio, "open_tcp_stream", open_stream)
    view = MembershipView()
    view._update(
        tuple(
            NodeInfo(node_id=name, endpoint=f"ws://{name}.test:1", incarnation="1")
            for name in behaviours
        )
    )
    return view


def session_owned_by(name: str, nodes: list[str]) -> str:
    return next(sid for sid in (f"s-{i}" for i in range(1000)) if owner(sid, nodes) == name)


async def test_a_node_frozen_mid_call_is_dropped_and_the_call_retried_elsewhere(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with trio.open_nursery() as nursery:
        view = nodes_at(monkeypatch, nursery, {"frozen": freeze, "healthy": answer_at_once})
        router = Router(view=view, secret="s", nursery=nursery, ping_interval=1.0, ping_timeout=2.0)
        client = RouterClient(router=router, connection=cast(Connection, None), key="k")
        sid = session_owned_by("frozen", ["frozen", "healthy"])
        started = trio.current_time()
        node_id, reply = await router.forward(client, sid, "session/prompt", {"sessionId": sid})
        assert (node_id, reply["result"]) == ("healthy", {"node": "healthy"})
        # Declared dead within a ping interval and a ping timeout, not at the 60 s deadline.
        assert trio.current_time() - started <= 1.0 + 2.0 + 0.5
        assert router.retries == 1
        down = router.links["frozen"].down
        assert down is not None and "did not answer a ping within 2 s" in down
        nursery.cancel_scope.cancel()


async def test_a_node_slow_to_answer_one_call_keeps_its_stream(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with trio.open_nursery() as nursery:
        view = nodes_at(monkeypatch, nursery, {"slow": answer_late})
        router = Router(view=view, secret="s", nursery=nursery, ping_interval=1.0, ping_timeout=2.0)
        client = RouterClient(router=router, connection=cast(Connection, None), key="k")
        node_id, reply = await router.forward(client, "s", "session/prompt", {"sessionId": "s"})
        assert (node_id, reply["result"]) == ("slow", {"node": "slow"})
        assert router.retries == 0
        assert router.links["slow"].down is None
        nursery.cancel_scope.cancel()


def test_the_keepalive_settings_are_checked() -> None:
    from supervision.config import ConfigError, parse_config

    base: dict[str, Any] = {
        "store": {"url": "postgresql://127.0.0.1/x"},
        "providers": {"default": {"kind": "simulator"}},
        "agents": {"default": {"provider": "default"}},
    }
    config = parse_config({**base, "cluster": {"nodes": "postgres"}}, "<test>")
    assert config.cluster is not None
    assert (config.cluster.node_ping_interval, config.cluster.node_ping_timeout) == (1.0, 5.0)
    tuned = parse_config(
        {**base, "cluster": {"nodes": "postgres", "node_ping_timeout": 3}}, "<test>"
    )
    assert tuned.cluster is not None and tuned.cluster.node_ping_timeout == 3
    with pytest.raises(ConfigError, match=r"cluster\.node_ping_interval"):
        parse_config({**base, "cluster": {"nodes": "postgres", "node_ping_interval": 0}}, "<t>")
