"""Node-stream keep-alive: a node frozen mid-call is dropped within seconds, a slow one is not.

The nodes here are fakes behind in-memory streams (`tests.cluster.fake_nodes`,
so the clock can jump): each answers `initialize` and then either answers
calls, answers them late, keeps sending while it reads nothing, or freezes
(reads and writes nothing more, its stream still open).
"""

from __future__ import annotations

from typing import Any, cast

import pytest
import trio
import trio.testing

from supervision.cluster.router import Router, RouterClient
from supervision.cluster.wire import MOVED
from supervision.gateway.connection import Connection
from tests.cluster.fake_nodes import (
    FakeCall,
    answer_at_once,
    answered_by,
    freeze,
    nodes_at,
    session_owned_by,
)


async def answer_late(call: FakeCall) -> dict[str, Any]:
    await trio.sleep(30)  # a long turn: the node's websocket still answers pings meanwhile
    return answered_by(call)


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


async def stream_updates_unread(call: FakeCall) -> dict[str, Any]:
    # A node busy streaming (its reader held up behind the frames it sends, as when the
    # gateway reads slowly): it takes in nothing more, so pings go unanswered, while its
    # updates keep coming for longer than the ping timeout.
    call.stream.deaf = True
    for n in range(40):
        await call.notify("session/update", {"n": n})
        await trio.sleep(0.5)
    return answered_by(call)


async def test_a_node_that_keeps_sending_keeps_its_stream_while_its_pong_waits(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with trio.open_nursery() as nursery:
        view = nodes_at(monkeypatch, nursery, {"busy": stream_updates_unread})
        router = Router(view=view, secret="s", nursery=nursery, ping_interval=1.0, ping_timeout=2.0)
        link = router.link(view.nodes[0])
        updates: list[Any] = []
        reply = await link.call(
            "k", lambda _, message: updates.append(message), "session/prompt", {"sessionId": "s"}
        )
        assert reply["result"] == {"node": "busy"}
        assert len(updates) == 40
        assert link.down is None
        nursery.cancel_scope.cancel()


LEASE_LEFT_MS = 4000


async def frozen_on_its_first_stream(call: FakeCall) -> dict[str, Any]:
    # Its first stream stalls (the gateway drops it), yet the node stays in the view and
    # keeps its lease: a later stream reaches it as usual.
    if call.stream_number == 0:
        return await freeze(call)
    return answered_by(call)


async def moved_to_holder(call: FakeCall) -> dict[str, Any]:
    # The other node cannot take the session: the holder's lease is renewed, always
    # LEASE_LEFT_MS from running out.
    data = {
        "reason": "moved",
        "sessionId": call.message["params"]["sessionId"],
        "retryAfterMs": LEASE_LEFT_MS,
        "holderNode": "holder",
    }
    return {"error": {"code": MOVED, "message": "held by node 'holder'", "data": data}}


async def test_a_live_holder_whose_stream_dropped_with_the_call_is_asked_again(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The call's node drops (its stream stalled) but stays in the view and keeps the
    # session's lease; the next node answers MOVED naming it. Once its lease would have
    # run out, were it dead, it is asked again on a new stream (before, it was skipped
    # for the rest of the call, every MOVED waited out as a dead holder's, and the call
    # failed -33003 at its deadline).
    async with trio.open_nursery() as nursery:
        view = nodes_at(
            monkeypatch, nursery, {"holder": frozen_on_its_first_stream, "other": moved_to_holder}
        )
        router = Router(view=view, secret="s", nursery=nursery, ping_interval=1.0, ping_timeout=2.0)
        client = RouterClient(router=router, connection=cast(Connection, None), key="k")
        sid = session_owned_by("holder", ["holder", "other"])
        started = trio.current_time()
        node_id, reply = await router.forward(client, sid, "session/prompt", {"sessionId": sid})
        assert (node_id, reply["result"]) == ("holder", {"node": "holder"})
        assert trio.current_time() - started <= 1.0 + 2.0 + LEASE_LEFT_MS / 1000 + 0.5
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
