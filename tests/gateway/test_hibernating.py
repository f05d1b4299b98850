"""Hibernating sessions are read from the store by every gateway method, and stay hibernating."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import trio

from actors.agent import Agent, AgentOptions
from actors.session import Event, event_to_json, rebuild_request
from actors.session.events import AssistantMessage
from supervision.gateway import AgentProfile, Gateway
from tests.gateway.helpers import RpcClient, connect, running_gateway


async def _hibernating(gateway: Gateway, count: int) -> list[Agent]:
    gateway.directory.profiles["sleepy"] = AgentProfile(
        options=AgentOptions(model="deepseek-chat", hibernate=True)
    )
    agents = [await gateway.directory.create(profile="sleepy", owner=None) for _ in range(count)]
    for agent in agents:
        agent.followup("hello")
        agent.followup("and again")
    for agent in agents:
        await agent.when_idle()
        assert agent.session.hibernating
    return agents


def _usage(events: list[Event]) -> dict[str, int]:
    usage = {"inputTokens": 0, "outputTokens": 0, "cacheReadTokens": 0}
    for event in events:
        if isinstance(event.data, AssistantMessage) and event.data.usage is not None:
            usage["inputTokens"] += event.data.usage.input_tokens
            usage["outputTokens"] += event.data.usage.output_tokens
            usage["cacheReadTokens"] += event.data.usage.cache_read_tokens
    return usage


async def _answers(client: RpcClient, sid: str) -> dict[str, Any]:
    return {
        method: await client.call(method, params)
        for method, params in [
            ("_harness/stats", {}),
            ("_harness/sessions/list", {}),
            ("session/list", {}),
            ("_harness/log/read", {"sessionId": sid, "fromSeq": 0, "limit": 1000}),
            ("_harness/session/state", {"sessionId": sid}),
            ("_harness/request/rebuild", {"sessionId": sid, "turn": 1, "step": 0}),
        ]
    }


async def test_every_read_method_reads_hibernating_sessions_without_waking_them() -> None:
    async with running_gateway() as gateway, connect(gateway) as client:
        with trio.fail_after(30):
            agents = await _hibernating(gateway, 2)
            sid = agents[0].session.id
            stored = {a.session.id: await gateway.runtime.store.load(a.session.id) for a in agents}
            # Twice: the first call reads the store, the second the figures cached from it.
            for _ in range(2):
                answers = await _answers(client, sid)
                assert all(agent.session.hibernating for agent in agents)
        assert client.ws.closed is None

        usage = {s: _usage(events) for s, events in stored.items()}
        stats = answers["_harness/stats"]
        assert stats["sessions"] == {"live": 2, "running": 0, "idle": 2}
        cache = stats["cache"]
        assert cache["inputTokens"] == sum(u["inputTokens"] for u in usage.values()) > 0
        assert cache["cacheReadTokens"] == sum(u["cacheReadTokens"] for u in usage.values())

        summaries = {s["sessionId"]: s for s in answers["_harness/sessions/list"]["sessions"]}
        for session_id, events in stored.items():
            assert summaries[session_id] == {
                "sessionId": session_id,
                "agent": "sleepy",
                "status": "idle",
                "createdAt": events[0].time,
                "updatedAt": events[-1].time,
                "headSeq": len(events) - 1,
                "turn": 1,
                "usage": usage[session_id],
            }
        rows = {r["sessionId"]: r for r in answers["session/list"]["sessions"]}
        assert {s: rows[s]["_meta"]["harness"] for s in stored} == {s: summaries[s] for s in stored}

        events = [event_to_json(e) for e in stored[sid]]
        read = answers["_harness/log/read"]
        assert read == {"events": events, "nextSeq": len(events), "headSeq": len(events) - 1}

        state = answers["_harness/session/state"]
        assert state["status"] == "idle" and "turn" not in state and "step" not in state

        rebuilt = answers["_harness/request/rebuild"]
        request = rebuild_request(list(stored[sid]), 1, 0, -1).to_json()
        assert rebuilt["request"] == request
        text = json.dumps(request, separators=(",", ":"), ensure_ascii=False)
        assert rebuilt["sha256"] == hashlib.sha256(text.encode()).hexdigest()


async def test_a_watch_summarises_a_session_that_hibernated_before_its_change_was_written() -> None:
    async with running_gateway() as gateway, connect(gateway) as watcher:
        with trio.fail_after(30):
            await watcher.call("_harness/sessions/watch", {})
            (agent,) = await _hibernating(gateway, 1)
            sid = agent.session.id
            stored = await gateway.runtime.store.load(sid)

            def idle_at_head(n: dict[str, Any]) -> bool:
                session = n["params"].get("session", {})
                return (
                    n["method"] == "_harness/sessions/changed"
                    and session.get("status") == "idle"
                    and session.get("headSeq") == len(stored) - 1
                )

            changed = await watcher.wait_for(idle_at_head)
        assert changed["params"]["session"]["usage"] == _usage(stored)
        assert agent.session.hibernating
