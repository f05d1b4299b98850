"""An unmodified ACP client, out of process over the SDK's own websocket transport."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio

from actors.providers.simulator import SimulatorConfig
from tests.gateway.helpers import SECRET, running_gateway

CLIENT = Path(__file__).with_name("acp_client.py")


async def test_the_acp_sdk_prompts_cancels_and_loads_a_session() -> None:
    # Slow tokens so the second prompt is still streaming when it is cancelled.
    config = SimulatorConfig(reply_tokens=200, token_rate=100.0)
    async with running_gateway(config=config) as gateway:
        with trio.fail_after(60):
            done = await trio.run_process(
                [sys.executable, str(CLIENT), gateway.url, SECRET],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    assert done.returncode == 0, done.stderr.decode()
    seen = json.loads(done.stdout)
    assert seen["protocolVersion"] == 1 and seen["loadSession"] is True
    assert seen["firstStop"] == "end_turn"
    assert {"agent_message_chunk", "tool_call", "tool_call_update"} <= set(seen["firstUpdates"])
    assert seen["firstUpdates"].index("tool_call") < seen["firstUpdates"].index("tool_call_update")
    assert seen["secondStop"] == "cancelled"
    replayed = [u["sessionUpdate"] for u in seen["replayed"]]
    assert replayed[0] == "user_message_chunk"
    assert seen["replayed"][0]["content"]["text"] == 'call list_files {"path": "."}'
    assert replayed.count("user_message_chunk") == 2
    assert "tool_call" in replayed and "agent_message_chunk" in replayed
