"""Rebalancing on a node: a session owned elsewhere is released at its turn boundary."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from actors.providers.simulator import SimulatorConfig
from actors.session.events import TurnStart
from supervision.cluster import MembershipView, owner
from supervision.cluster.membership import NodeInfo
from supervision.cluster.node_methods import NODE_METHODS
from supervision.cluster.node_rebalance import Rebalancer
from supervision.cluster.wire import MOVED
from supervision.gateway import Gateway
from supervision.gateway.methods import MethodTable
from supervision.gateway.sessions import SessionDirectory
from tests.gateway.helpers import connect, running_gateway


def prompt(session_id: str, rpc_id: int) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": rpc_id,
        "method": "session/prompt",
        "params": {
            "sessionId": session_id,
            "prompt": [{"type": "text", "text": "long answer please"}],
            "_meta": {"harness": {"requestId": "req-1"}},
        },
    }


async def test_an_idle_session_with_a_prompt_replaying_from_the_log_is_released() -> None:
    # 1000 tokens: the turn is some 1000 events, so replaying it takes four batches.
    async with running_gateway(config=SimulatorConfig(reply_tokens=1000)) as gateway:
        gateway.methods = MethodTable(methods=NODE_METHODS)
        async with connect(gateway) as client, trio.open_nursery() as nursery:
            with trio.fail_after(30):
                (connection,) = gateway.connections
                agent = await gateway.directory.create(profile="default", owner=None)
                sid = agent.session.id
                await client.send(prompt(sid, 1))
                assert (await client.answer(1))["result"]["stopReason"] == "end_turn"
                # The same request again replays the logged turn. With the writer held
                # and a one-byte log lane, the replay stops after its first batch: the
                # agent is idle while the prompt is still being answered.
                connection.outbox.log_capacity = 1
                async with connection.transport.stream._lock:
                    await client.send(prompt(sid, 2))
                    await trio.testing.wait_all_tasks_blocked(cushion=0.05)
                    assert sid in connection.prompts
                    assert agent.status == "idle"
                    # "me" outranks all of n candidates with chance 1/(n+1): the
                    # search stops at the first that outranks it, so n can be huge.
                    other = next(
                        name
                        for name in (f"other-{i}" for i in range(1_000_000))
                        if owner(sid, ["me", name]) == name
                    )
                    view = MembershipView()
                    rebalancer = Rebalancer(gateway=gateway, view=view, node_id="me")
                    nursery.start_soon(rebalancer.run)
                    await trio.testing.wait_all_tasks_blocked()
                    view._update(
                        tuple(
                            NodeInfo(node_id=name, endpoint="ws://127.0.0.1:1", incarnation="1")
                            for name in ("me", other)
                        )
                    )
                    await trio.testing.wait_all_tasks_blocked(cushion=0.1)
                    assert rebalancer.releases == 1
                    assert gateway.directory.live_agent(sid) is None
                # The replay finishes from the store, answered once.
                assert (await client.answer(2))["result"]["stopReason"] == "end_turn"
            stored = await gateway.runtime.store.load(sid)
            assert sum(isinstance(e.data, TurnStart) for e in stored) == 1
            nursery.cancel_scope.cancel()


async def test_a_session_started_here_while_owned_elsewhere_is_released_once_idle() -> None:
    async with running_gateway() as gateway:
        gateway.methods = MethodTable(methods=NODE_METHODS)
        directory = gateway.directory
        async with connect(gateway) as client, trio.open_nursery() as nursery:
            with trio.fail_after(30):
                view = MembershipView()
                view._update(
                    tuple(
                        NodeInfo(node_id=name, endpoint="ws://127.0.0.1:1", incarnation="1")
                        for name in ("me", "other")
                    )
                )
                stored: dict[str, str] = {}  # owner → a stored session it owns, not running
                while len(stored) < 2:
                    agent = await directory.create(profile="default", owner=None)
                    stored.setdefault(owner(agent.session.id, ["me", "other"]), agent.session.id)
                    await directory.close(agent.session.id)
                released = trio.Event()
                directory.on_change(
                    lambda sid, change, _: (
                        released.set() if (sid, change) == (stored["other"], "removed") else None
                    )
                )
                rebalancer = Rebalancer(
                    gateway=gateway, view=view, node_id="me", takeover_grace=0.2
                )
                nursery.start_soon(rebalancer.run)
                await trio.testing.wait_all_tasks_blocked()
                # A gateway that saw "other" down sends both here: each is taken over, and
                # its prompt runs to its end before anything is released.
                for rpc_id, sid in enumerate((stored["other"], stored["me"])):
                    await client.send(prompt(sid, rpc_id))
                    reply = await client.answer(rpc_id)
                    assert reply["result"]["stopReason"] == "end_turn"
                await released.wait()
                assert rebalancer.releases == 1
                assert directory.live_agent(stored["other"]) is None  # released to its owner
                assert directory.live_agent(stored["me"]) is not None  # owned here: kept
            nursery.cancel_scope.cancel()


async def stored_session_owned_by(gateway: Gateway, name: str, nodes: list[str]) -> str:
    """A stored session (its agent not running) whose owner over `nodes` is `name`."""
    while True:
        agent = await gateway.directory.create(profile="default", owner=None)
        await gateway.directory.close(agent.session.id)
        if owner(agent.session.id, nodes) == name:
            return agent.session.id


def view_of(*names: str) -> MembershipView:
    view = MembershipView()
    view._update(
        tuple(
            NodeInfo(node_id=name, endpoint="ws://127.0.0.1:1", incarnation="1") for name in names
        )
    )
    return view


def on_removed(gateway: Gateway, session_id: str) -> trio.Event:
    """Set once the directory stops `session_id`'s agent."""
    removed = trio.Event()
    gateway.directory.on_change(
        lambda sid, change, _: removed.set() if (sid, change) == (session_id, "removed") else None
    )
    return removed


async def test_a_subscription_set_up_while_its_session_is_released_is_answered_moved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The subscribe takes the session over here; the node releases it at once (owned
    # elsewhere, idle) while the subscribe still reads the log's head. Registered after
    # its subscribers were told `_harness/log/moved`, it would follow a log this node no
    # longer writes, silent for ever: it is answered MOVED instead (the gateway asks the
    # owner).
    async with running_gateway() as gateway:
        gateway.methods = MethodTable(methods=NODE_METHODS)
        async with connect(gateway) as client, trio.open_nursery() as nursery:
            with trio.fail_after(30):
                sid = await stored_session_owned_by(gateway, "other", ["me", "other"])
                head_read = trio.Event()
                read_head = Gateway.head_seq

                async def held_head_seq(self: Gateway, session_id: str) -> int:
                    await head_read.wait()
                    return await read_head(self, session_id)

                monkeypatch.setattr(Gateway, "head_seq", held_head_seq)
                released = on_removed(gateway, sid)
                rebalancer = Rebalancer(
                    gateway=gateway, view=view_of("me", "other"), node_id="me", takeover_grace=0
                )
                nursery.start_soon(rebalancer.run)
                await client.send(
                    {
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "_harness/log/subscribe",
                        "params": {"sessionId": sid, "fromSeq": 0},
                    }
                )
                await released.wait()
                head_read.set()
                reply = await client.answer(1)
                assert reply["error"]["code"] == MOVED, reply
                (connection,) = gateway.connections
                assert connection.subscriptions == {}
            nursery.cancel_scope.cancel()


async def test_a_send_whose_session_is_released_while_it_starts_is_answered_moved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The send takes the session over here and the node releases it (owned elsewhere,
    # idle) before the send, held up after the start, queues its message: it is answered
    # MOVED (the gateway asks the owner), not failed because the agent stopped.
    async with running_gateway() as gateway:
        gateway.methods = MethodTable(methods=NODE_METHODS)
        async with connect(gateway) as client, trio.open_nursery() as nursery:
            with trio.fail_after(30):
                sid = await stored_session_owned_by(gateway, "other", ["me", "other"])
                started = trio.Event()
                attach = SessionDirectory.attach

                async def held_attach(self: SessionDirectory, session_id: str) -> Any:
                    agent = await attach(self, session_id)
                    await started.wait()
                    return agent

                monkeypatch.setattr(SessionDirectory, "attach", held_attach)
                released = on_removed(gateway, sid)
                rebalancer = Rebalancer(
                    gateway=gateway, view=view_of("me", "other"), node_id="me", takeover_grace=0
                )
                nursery.start_soon(rebalancer.run)
                await client.send(
                    {
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "_harness/session/send",
                        "params": {
                            "sessionId": sid,
                            "content": [{"type": "text", "text": "later"}],
                            "placement": "next_turn",
                            "_meta": {"harness": {"requestId": "req-1"}},
                        },
                    }
                )
                await released.wait()
                await trio.testing.wait_all_tasks_blocked()  # the release is over
                started.set()
                reply = await client.answer(1)
                assert reply["error"]["code"] == MOVED, reply
            nursery.cancel_scope.cancel()
