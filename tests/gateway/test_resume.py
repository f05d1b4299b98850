"""Resume: a socket killed mid-turn, resubscribed from last + 1, loses and repeats nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from actors.providers.simulator import SimulatorConfig
from tests.gateway.helpers import RpcClient, connect, running_gateway, wrap_websocket


def _events(notification: dict[str, Any]) -> list[dict[str, Any]]:
    """The log events a notification carries (one, several when batched, or none)."""
    if notification["method"] == "_harness/log/event":
        return [notification["params"]["event"]]
    if notification["method"] == "_harness/log/events":
        events: list[dict[str, Any]] = notification["params"]["events"]
        return events
    if notification["method"] == "_harness/log/merged":
        return [e for batch in notification["params"]["batches"] for e in batch["events"]]
    return []


@pytest.mark.parametrize("mode", [{}, {"batch": True}, {"merge": True}])
async def test_resubscribing_from_last_plus_one_after_a_kill_yields_the_log_exactly(
    mode: dict[str, bool],
) -> None:
    config = SimulatorConfig(reply_tokens=120, token_rate=200.0)
    async with running_gateway(config=config) as gateway, connect(gateway) as control:
        with trio.fail_after(30):
            sid = (await control.call("session/new", {"cwd": "/", "mcpServers": []}))["sessionId"]
            received: list[dict[str, Any]] = []
            async with trio.open_nursery() as nursery:
                stream = await trio.open_tcp_stream(gateway.host, gateway.port)
                ws = await wrap_websocket(nursery, stream, gateway.host)
                first = RpcClient(ws=ws)
                nursery.start_soon(first.pump)
                await first.call("initialize", {"protocolVersion": 1})
                await first.call("_harness/log/subscribe", {"sessionId": sid, "fromSeq": 0, **mode})
                await control.call(
                    "_harness/session/send",
                    {
                        "sessionId": sid,
                        "content": [{"type": "text", "text": "tell me a long story"}],
                        "placement": "next_turn",
                    },
                )
                await first.wait_for(
                    lambda n: any(e["type"] == "assistant/chunk" for e in _events(n))
                )
                await stream.aclose()  # the socket dies mid-turn
                nursery.cancel_scope.cancel()
            received = [e for n in first.notifications for e in _events(n)]
            agent = gateway.directory.live_agent(sid)
            assert agent is not None and agent.status == "running"  # the kill came mid-turn
            last = received[-1]["seq"]
            async with connect(gateway) as second:
                reply = await second.call(
                    "_harness/log/subscribe",
                    {"sessionId": sid, "fromSeq": last + 1, **mode},
                )
                assert reply["fromSeq"] == last + 1
                await agent.when_idle()
                await agent.session.flush()
                head = agent.session.durable_seq
                await second.wait_for(lambda n: any(e["seq"] == head for e in _events(n)))
                received += [e for n in second.notifications for e in _events(n)]
        assert [e["seq"] for e in received] == list(range(len(received)))
        assert [json.dumps(e) for e in received] == [json.dumps(e) for e in agent.session.to_json()]
