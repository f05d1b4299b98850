"""Fan-out: 50 supervisors on 200 running sessions, one stalled reader closed with 4008."""

from __future__ import annotations

import json
import statistics
from contextlib import AsyncExitStack
from typing import Any

import pytest
import trio
import trio.testing

from actors.agent import Agent, AgentOptions
from actors.providers.simulator import SimulatorConfig
from actors.session import event_to_json
from actors.session.events import StepEnd, StepStart
from supervision.gateway import AgentProfile, Gateway
from supervision.gateway.cursors import EventTexts, LogCursor
from supervision.gateway.fanout import FEED_LINGER_MAX_SECONDS
from supervision.gateway.transport import WEBSOCKET_FRAMING
from tests.gateway.helpers import RpcClient, connect, running_gateway, stalled_client

SESSIONS = 200
SUPERVISORS = 50
PER_SUPERVISOR = 20
MODES: list[dict[str, bool]] = [{}, {"batch": True}, {"merge": True}]
"""Plain, batched and merged log subscriptions (`_harness/log/subscribe` params)."""
TURNS = 1


def _step_latencies_ms(agents: list[Agent], since: list[int] | None = None) -> list[int]:
    """Wall-clock ms from each `step/start` to its `step/end` (from seq `since[i]` of agent i)."""
    latencies = []
    for index, agent in enumerate(agents):
        started: dict[tuple[int, int], int] = {}
        for event in agent.session.events[since[index] if since else 0 :]:
            if isinstance(event.data, StepStart):
                started[(event.data.turn, event.data.step)] = event.time
            elif isinstance(event.data, StepEnd):
                key = (event.data.turn, event.data.step)
                latencies.append(event.time - started[key])
    return latencies


async def _run_turns(agents: list[Agent], text: str) -> None:
    for agent in agents:
        for turn in range(TURNS):
            agent.followup(f"{text} {turn}")
    for agent in agents:
        await agent.when_idle()
    for agent in agents:
        await agent.session.flush()


async def test_fifty_supervisors_get_everything_and_a_stalled_reader_is_closed_4008() -> None:
    config = SimulatorConfig(reply_tokens=6)
    # A deadline well above what a loaded machine can stall a healthy in-process reader for.
    async with running_gateway(config=config, write_deadline=5.0) as gateway:
        with trio.fail_after(120):
            agents = [
                await gateway.directory.create(profile="default", owner=None)
                for _ in range(SESSIONS)
            ]
            ids = [agent.session.id for agent in agents]
            async with AsyncExitStack() as stack:
                clients: list[RpcClient] = []
                plans: list[list[str]] = []
                for index in range(SUPERVISORS):
                    client = await stack.enter_async_context(connect(gateway))
                    plan = [ids[(index * PER_SUPERVISOR + j) % SESSIONS] for j in range(20)]
                    for sid in plan:
                        # A third of the supervisors have their events batched
                        # (`_harness/log/events`), a third merged (`_harness/log/merged`).
                        await client.call(
                            "_harness/log/subscribe",
                            {"sessionId": sid, "fromSeq": 0, **MODES[index % 3]},
                        )
                    clients.append(client)
                    plans.append(plan)

                await _run_turns(agents, "warm-up")
                baseline = _step_latencies_ms(agents)

                async with stalled_client(gateway) as (stalled, pump):
                    for sid in ids:
                        await stalled.call(
                            "_harness/log/subscribe", {"sessionId": sid, "fromSeq": 0}
                        )
                    pump.cancel()  # from now on nothing is read: the socket fills up
                    before = [len(agent.session) for agent in agents]
                    await _run_turns(agents, "with a stalled reader")
                    with_stalled = _step_latencies_ms(agents, before)
                    await gateway.wait_slow_consumer_closes(1)

                for client, plan in zip(clients, plans, strict=True):
                    expected = {sid: [json.dumps(e) for e in _log(gateway, sid)] for sid in plan}
                    await client.wait_for_log_events(sum(len(v) for v in expected.values()))
                    for sid in plan:
                        got = [json.dumps(e) for e in client.log_events[sid]]
                        assert got == expected[sid], f"subscriber missed events of {sid}"
                # The stalled connection is counted when its write times out, before its
                # teardown ends; the healthy ones may have everything already by then.
                await trio.testing.wait_all_tasks_blocked()
                assert gateway.statistics().slow_consumer_closes == 1
                assert gateway.statistics().connections == SUPERVISORS
        for agent in agents:
            assert agent.status == "idle"
        print(
            f"\nstep latency ms (mean/max): without stalled reader "
            f"{statistics.mean(baseline):.2f}/{max(baseline)}, with "
            f"{statistics.mean(with_stalled):.2f}/{max(with_stalled)}"
        )


def _log(gateway: Gateway, session_id: str) -> list[dict[str, Any]]:
    session = gateway.directory.live_session(session_id)
    assert session is not None
    return session.to_json()


@pytest.mark.parametrize("mode", MODES)
async def test_a_subscriber_dropped_by_the_fanout_catches_up_and_loses_nothing(
    mode: dict[str, bool],
) -> None:
    config = SimulatorConfig(reply_tokens=40)
    async with running_gateway(config=config) as gateway, connect(gateway) as client:
        with trio.fail_after(60):
            agent = await gateway.directory.create(profile="default", owner=None)
            sid = agent.session.id
            # Live only.
            await client.call("_harness/log/subscribe", {"sessionId": sid, **mode})
            (connection,) = gateway.connections
            # A one-byte log lane: nearly every batch the fan-out offers is refused, so the
            # subscription keeps dropping out, catching up from the log and joining again.
            connection.outbox.log_capacity = 1
            # While the writer cannot write (its stream's lock is held here) the lane stays
            # full, so the fan-out must refuse a batch whatever the machine's speed.
            async with connection.transport.stream._lock:
                # One turn per fan-out round: rounds are spaced up to
                # FEED_LINGER_MAX_SECONDS apart, and three turns inside one round would
                # be one batch, which an empty lane takes without refusing anything.
                for turn in range(3):
                    agent.followup(f"turn {turn}")
                    await agent.when_idle()
                    await agent.session.flush()
                    await trio.testing.wait_all_tasks_blocked(
                        cushion=FEED_LINGER_MAX_SECONDS + 0.05
                    )
                assert connection.statistics().catch_ups > 0
            expected = [json.dumps(e) for e in _log(gateway, sid)]
            await client.wait_for_log_events(len(expected))
            assert [json.dumps(e) for e in client.log_events[sid]] == expected
            assert connection.statistics().catch_ups > 0
            caught_up = [n for n in client.notifications if n["method"] == "_harness/log/caughtUp"]
            assert len(caught_up) == 1


async def test_a_cursor_makes_the_same_frames_one_event_at_a_time_as_in_one_batch() -> None:
    async with running_gateway() as gateway:
        agent = await gateway.directory.create(profile="default", owner=None)
        agent.followup("hello")
        await agent.when_idle()
        events = agent.session.durable_events(0)
        head = events[-1].seq
        framing = WEBSOCKET_FRAMING
        batched, single = (
            LogCursor(subscription="s", session_id=agent.session.id, next_seq=0, texts=EventTexts())
            for _ in range(2)
        )
        whole = batched.take(events, head, framing)
        one_by_one = [frame for event in events for frame in single.take([event], head, framing)]
        assert whole == one_by_one and len(whole) == len(events) + 1  # and one caughtUp
        assert single.take(events[:1], head, framing) == []  # delivered already: skipped


async def test_a_hibernating_session_replays_from_the_store_and_its_status_is_announced() -> None:
    async with (
        running_gateway() as gateway,
        connect(gateway) as watcher,
        connect(gateway) as client,
    ):
        with trio.fail_after(30):
            options = AgentOptions(model="deepseek-chat", hibernate=True)
            gateway.directory.profiles["sleepy"] = AgentProfile(options=options)
            await watcher.call("_harness/sessions/watch", {})
            agent = await gateway.directory.create(profile="sleepy", owner=None)
            sid = agent.session.id
            agent.followup("hello")
            await agent.when_idle()
            assert agent.session.hibernating
            await client.call("_harness/log/subscribe", {"sessionId": sid, "fromSeq": 0})
            stored = [json.dumps(event_to_json(e)) for e in await gateway.runtime.store.load(sid)]
            await client.wait_for_log_events(len(stored))
            assert [json.dumps(e) for e in client.log_events[sid]] == stored
            ended = await watcher.wait_for(
                lambda n: (
                    n["params"].get("change") == "status"
                    and n["params"]["session"]["status"] == "idle"
                )
            )
            assert ended["params"]["session"]["sessionId"] == sid
            assert watcher.ws.closed is None and client.ws.closed is None
