"""A node ending a client right after answering its `initialize` never gets a call before one.

The link reopens an ended client under a new wire key; a call whose open
was answered and then ended (before the call went out) must not send its
request under the new key, which the node never saw `initialize` for
(it would answer -32600 "before initialize"): it fails `ClientEnded`, so
the router retries it, and the retry opens the client again first.
"""

from __future__ import annotations

import json

import trio

from supervision.cluster import wire
from supervision.cluster.membership import NodeInfo
from supervision.cluster.router_link import ClientEnded, NodeLink


def connected_link() -> tuple[NodeLink, trio.MemoryReceiveChannel[str]]:
    """A link as `run()` leaves it once up, its envelopes to the node in a channel."""
    link = NodeLink(
        node=NodeInfo(node_id="n", endpoint="ws://127.0.0.1:1", incarnation="i"), secret="s"
    )
    send, receive = trio.open_memory_channel[str](16)
    link._send = send
    link.up.set()
    return link, receive


def sent(text: str) -> tuple[str, dict[str, object]]:
    envelope = wire.parse(text)
    return envelope.key, json.loads(envelope.texts[0])


async def test_a_call_whose_client_ended_right_after_initialize_is_not_sent() -> None:
    link, to_node = connected_link()
    outcome: list[object] = []

    async def call() -> None:
        try:
            outcome.append(await link.call("k", lambda _node, _message: None, "session/x", {}))
        except ClientEnded as exc:
            outcome.append(exc)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            key, initialize = sent(await to_node.receive())
            assert (key, initialize["method"]) == ("k~0", "initialize")
            # The reply and the end arrive together: the call has not run in between.
            reply = {"jsonrpc": "2.0", "id": initialize["id"], "result": {}}
            link._deliver(wire.parse(wire.to_gateway(key, [json.dumps(reply)])))
            link._deliver(wire.parse(wire.end_to_gateway(key, 1008, "overflow")))
    (error,) = outcome
    assert isinstance(error, ClientEnded)
    assert "right after its initialize" in str(error)
    # Only the end of the ended key went out after it (no request under a new key).
    assert [wire.parse(t) for t in drain(to_node)] == [wire.Envelope(key="k~0", end=1000)]

    # The retry opens the client again, under the new key, before its request.
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            outcome.clear()
            nursery.start_soon(call)
            key, initialize = sent(await to_node.receive())
            assert (key, initialize["method"]) == ("k~1", "initialize")
            reply = {"jsonrpc": "2.0", "id": initialize["id"], "result": {}}
            link._deliver(wire.parse(wire.to_gateway(key, [json.dumps(reply)])))
            key, request = sent(await to_node.receive())
            assert (key, request["method"]) == ("k~1", "session/x")
            answer = {"jsonrpc": "2.0", "id": request["id"], "result": {"ok": True}}
            link._deliver(wire.parse(wire.to_gateway(key, [json.dumps(answer)])))
    assert outcome == [answer]


def drain(channel: trio.MemoryReceiveChannel[str]) -> list[str]:
    texts = []
    while True:
        try:
            texts.append(channel.receive_nowait())
        except trio.WouldBlock:
            return texts


async def test_a_notification_whose_client_ended_right_after_initialize_is_not_sent() -> None:
    link, to_node = connected_link()
    failures: list[ClientEnded] = []

    async def notify() -> None:
        try:
            await link.notify("k", lambda _node, _message: None, "session/cancel", {})
        except ClientEnded as exc:
            failures.append(exc)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(notify)
            key, initialize = sent(await to_node.receive())
            reply = {"jsonrpc": "2.0", "id": initialize["id"], "result": {}}
            link._deliver(wire.parse(wire.to_gateway(key, [json.dumps(reply)])))
            link._deliver(wire.parse(wire.end_to_gateway(key, 1008, "overflow")))
    assert len(failures) == 1
    assert [wire.parse(t) for t in drain(to_node)] == [wire.Envelope(key="k~0", end=1000)]
