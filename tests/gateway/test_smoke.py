"""The gateway end to end over a real socket: initialize, new, prompt with a tool call."""

from __future__ import annotations

import trio

from tests.gateway.helpers import connect, running_gateway


async def test_prompt_with_a_tool_call_ends_the_turn_with_updates_before_the_reply() -> None:
    async with running_gateway() as gateway, connect(gateway) as client:
        with trio.fail_after(10):
            created = await client.call("session/new", {"cwd": "/", "mcpServers": []})
            sid = created["sessionId"]
            result = await client.call(
                "session/prompt",
                {
                    "sessionId": sid,
                    "prompt": [{"type": "text", "text": 'call list_files {"path": "."}'}],
                },
            )
        assert result["stopReason"] == "end_turn"
        kinds = [n["params"]["update"]["sessionUpdate"] for n in client.notifications]
        assert "tool_call" in kinds and "tool_call_update" in kinds
        assert "agent_message_chunk" in kinds
