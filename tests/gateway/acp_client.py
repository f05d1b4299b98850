"""An unmodified ACP client (the `agent-client-protocol` SDK) driving the gateway: run as a program.

Usage: python acp_client.py WS_URL TOKEN. Prints one JSON object with what
it saw; exits non-zero on any failure. asyncio, as the SDK requires: this is
why it runs in its own process.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import acp
from acp import schema
from acp.ws import create_websocket_stream


class Recorder:
    """The client side: records every session/update it receives."""

    def __init__(self) -> None:
        self.updates: list[dict[str, Any]] = []
        self.first_update = asyncio.Event()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update.model_dump(by_alias=True, exclude_none=True))
        self.first_update.set()

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("not expected")


async def main(url: str, token: str) -> dict[str, Any]:
    transport = await create_websocket_stream(url, headers={"Authorization": f"Bearer {token}"})
    recorder = Recorder()
    conn = acp.connect_to_agent(recorder, transport)
    init = await conn.initialize(protocol_version=1)
    created = await conn.new_session(cwd="/", mcp_servers=[])
    sid = created.session_id
    first = await conn.prompt(
        session_id=sid,
        prompt=[schema.TextContentBlock(type="text", text='call list_files {"path": "."}')],
    )
    first_updates = [u["sessionUpdate"] for u in recorder.updates]
    recorder.updates.clear()
    recorder.first_update.clear()
    second = asyncio.ensure_future(
        conn.prompt(
            session_id=sid, prompt=[schema.TextContentBlock(type="text", text="tell me more")]
        )
    )
    await asyncio.wait_for(recorder.first_update.wait(), 10)
    await conn.cancel(session_id=sid)
    cancelled = await asyncio.wait_for(second, 10)
    recorder.updates.clear()
    await conn.load_session(cwd="/", session_id=sid, mcp_servers=[])
    replayed = list(recorder.updates)
    await transport.close()
    return {
        "protocolVersion": init.protocol_version,
        "loadSession": init.agent_capabilities.load_session,
        "firstStop": first.stop_reason,
        "firstUpdates": first_updates,
        "secondStop": cancelled.stop_reason,
        "replayed": replayed,
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2]))))
