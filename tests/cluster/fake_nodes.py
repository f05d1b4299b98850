"""Fake nodes for router tests: websocket servers behind in-memory streams (the clock can jump).

`nodes_at(monkeypatch, nursery, behaviours)` returns a membership view of
the nodes `NAME.test:1` and makes `trio.open_tcp_stream` reach each one
through a fresh in-memory stream (one fake node per stream). A fake node
answers `initialize` itself and every other call with what its behaviour
returns; a behaviour may also freeze the stream (a stopped process), stop
reading it (a node whose reader is held up while it keeps sending), send
notifications, or take its time.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import pytest
import trio
import trio.testing
import trio_websocket

from supervision.cluster import MembershipView, owner, wire
from supervision.cluster.membership import NodeInfo


class FreezableStream(trio.abc.Stream):
    """A stream that stops delivering what arrives once `deaf` (and sending too once `frozen`)."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.frozen = False
        self.deaf = False

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        data = await self.inner.receive_some(max_bytes)
        if self.frozen or self.deaf:
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


@attrs.define(eq=False)
class FakeCall:
    """One call a fake node got: which node, on its how-manieth stream, and the message."""

    node: str
    stream_number: int
    """0 on the node's first stream, 1 on the next one the gateway opened, and so on."""
    key: str
    message: dict[str, Any]
    stream: FreezableStream
    websocket: trio_websocket.WebSocketConnection
    behind_reply: list[str] = attrs.field(factory=list)
    """Frames sent in the reply's envelope, right behind it (`notify_behind_reply`)."""

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        """Send a notification to this call's client."""
        text = json.dumps({"jsonrpc": "2.0", "method": method, "params": params})
        await self.websocket.send_message(wire.to_gateway(self.key, [text]))

    def notify_behind_reply(self, method: str, params: dict[str, Any]) -> None:
        """Send a notification in the reply's envelope, right behind the reply."""
        self.behind_reply.append(json.dumps({"jsonrpc": "2.0", "method": method, "params": params}))


Behaviour = Callable[[FakeCall], Awaitable[dict[str, Any]]]
"""Answers a call: the reply's `result` or `error` member (`{"result": ...}`)."""


def answered_by(call: FakeCall) -> dict[str, Any]:
    """The reply body naming the node that answered."""
    return {"result": {"node": call.node}}


async def answer_at_once(call: FakeCall) -> dict[str, Any]:
    return answered_by(call)


async def freeze(call: FakeCall) -> dict[str, Any]:
    call.stream.frozen = True
    await trio.sleep_forever()
    raise AssertionError("unreachable")


async def fake_node(
    name: str, stream_number: int, stream: FreezableStream, on_call: Behaviour
) -> None:
    async with trio.open_nursery() as nursery:
        request = await trio_websocket.wrap_server_stream(nursery, stream)
        websocket = await request.accept()
        while True:
            try:
                envelope = wire.parse(await websocket.get_message())
            except trio_websocket.ConnectionClosed:
                nursery.cancel_scope.cancel()  # the gateway dropped this stream
                return
            for text in envelope.texts:
                message = json.loads(text)
                behind: list[str] = []
                if message.get("method") == "initialize":
                    body: dict[str, Any] = {"result": {"node": name}}
                else:
                    call = FakeCall(
                        node=name,
                        stream_number=stream_number,
                        key=envelope.key,
                        message=message,
                        stream=stream,
                        websocket=websocket,
                    )
                    body = await on_call(call)
                    behind = call.behind_reply
                if "id" in message:
                    reply = json.dumps({"jsonrpc": "2.0", "id": message["id"], **body})
                    await websocket.send_message(wire.to_gateway(envelope.key, [reply, *behind]))


def nodes_at(
    monkeypatch: pytest.MonkeyPatch, nursery: trio.Nursery, behaviours: dict[str, Behaviour]
) -> MembershipView:
    """A view of fake nodes `NAME.test:1`, each stream to one a new in-memory stream."""
    streams: collections.Counter[str] = collections.Counter()

    async def open_stream(host: str, port: int) -> trio.abc.Stream:
        name = host.removesuffix(".test")
        ours, theirs = trio.testing.memory_stream_pair()
        number = streams[name]
        streams[name] += 1
        nursery.start_soon(fake_node, name, number, FreezableStream(theirs), behaviours[name])
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
    """A session id whose rendezvous owner over `nodes` is `name`."""
    return next(sid for sid in (f"s-{i}" for i in range(1000)) if owner(sid, nodes) == name)
