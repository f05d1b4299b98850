"""A node process killed mid-turn: its prompt completes elsewhere, once, and streams go on."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.messages import UserSource
from actors.session import Event
from actors.session.codec import event_to_json
from actors.session.events import StepStart, TurnEnd, TurnStart, UserMessage
from actors.session.postgres_store import PostgresStore
from supervision.cluster import owner
from supervision.config import load_config
from tests.cluster.helpers import (
    CLUSTER_SECRET,
    node_processes,
    start_gateway,
    wait_nodes,
    write_config,
)
from tests.gateway.helpers import connect


@pytest.fixture(autouse=True)
def _secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_CLUSTER_TOKEN", CLUSTER_SECRET)


async def stored_events(dsn: str, session_id: str) -> list[Event]:
    store = PostgresStore(dsn)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.serve)
        events = await store.load(session_id)
        nursery.cancel_scope.cancel()
    return list(events)


def turns_of_request(events: list[Event], request_id: str) -> dict[int, str | None]:
    """Each turn whose user message carries `request_id`, and how it ended (None: still open)."""
    turns: dict[int, str | None] = {}
    current = None
    for event in events:
        data = event.data
        if isinstance(data, TurnStart | StepStart):
            current = data.turn
        elif (
            isinstance(data, UserMessage)
            and isinstance(data.source, UserSource)
            and data.source.request_id == request_id
        ):
            assert current is not None
            turns[current] = None
        elif isinstance(data, TurnEnd) and data.turn in turns:
            turns[data.turn] = data.reason.kind
    return turns


def request_ids(events: list[Event]) -> set[str]:
    return {
        e.data.source.request_id
        for e in events
        if isinstance(e.data, UserMessage)
        and isinstance(e.data.source, UserSource)
        and e.data.source.request_id is not None
    }


def text(value: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": value}]


async def test_a_node_killed_mid_turn_its_prompt_completes_once_and_streams_go_on(
    postgres_dsn: str, tmp_path: Path
) -> None:
    path = write_config(tmp_path / "cluster.toml", postgres_dsn, token_rate=40, reply_tokens=80)
    config = load_config(path)
    with node_processes(path, ("a", "b")) as nodes:
        async with trio.open_nursery() as nursery:
            gateway = await start_gateway(config, nursery)
            await wait_nodes(gateway, 2)
            async with connect(gateway) as client, connect(gateway) as watcher:
                sid = (await client.call("session/new", {"cwd": "/", "mcpServers": []}))[
                    "sessionId"
                ]
                victim = owner(sid, ["a", "b"])
                subscribed = await watcher.call(
                    "_harness/log/subscribe", {"sessionId": sid, "fromSeq": 0}
                )
                assert subscribed["fromSeq"] == 0
                replies: dict[str, Any] = {}
                answered = trio.Event()

                async def prompt() -> None:
                    replies["first"] = await client.request(
                        "session/prompt", {"sessionId": sid, "prompt": text("tell me a story")}
                    )
                    answered.set()

                nursery.start_soon(prompt)
                with trio.fail_after(20):
                    await watcher.wait_for(
                        lambda m: (
                            m.get("method") == "_harness/log/event"
                            and m["params"]["event"]["type"] == "assistant/chunk"
                        )
                    )
                os.kill(nodes[victim].process.pid, signal.SIGKILL)
                nodes[victim].process.wait()
                with trio.fail_after(45):
                    await answered.wait()
                assert replies["first"].get("result", {}).get("stopReason") == "end_turn", replies
                events = await stored_events(postgres_dsn, sid)
                with trio.fail_after(10):
                    await watcher.wait_for_log_events(len(events))
            nursery.cancel_scope.cancel()
    events = await stored_events(postgres_dsn, sid)
    assert [e.seq for e in events] == list(range(len(events)))
    (request_id,) = request_ids(events)
    turns = turns_of_request(events, request_id)
    ends = [turns[t] for t in sorted(turns)]
    # The attempt the kill cut off was closed `interrupted` by the next owner; one completed.
    assert ends[-1] == "completed" and ends.count("completed") == 1, ends
    assert all(end == "interrupted" for end in ends[:-1]), ends
    seen = watcher.log_events[sid]
    assert [e["seq"] for e in seen] == list(range(len(events)))
    assert seen == [event_to_json(e) for e in events]
