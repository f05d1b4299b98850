"""Cluster test helpers: a deployment config on a test database, and a raw node-stream client."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio
import trio_websocket

from supervision.cluster import wire
from supervision.config import DeploymentConfig, parse_config

CLUSTER_SECRET = "cluster-test-secret"


def cluster_config(dsn: str, *, token_rate: float = 0.0, reply_tokens: int = 8) -> DeploymentConfig:
    """A one-profile deployment on the simulator, its sessions in PostgreSQL at `dsn`."""
    return parse_config(
        {
            "store": {"url": dsn},
            "cluster": {"nodes": "postgres"},
            "providers": {
                "default": {
                    "kind": "simulator",
                    "token_rate": token_rate,
                    "reply_tokens": reply_tokens,
                }
            },
            "agents": {"default": {"provider": "default", "max_steps": 4}},
        },
        "<test>",
    )


def write_config(path: Path, dsn: str, *, token_rate: float = 0.0) -> Path:
    """The same deployment as a TOML file (for subprocesses)."""
    path.write_text(
        f'[store]\nurl = "{dsn}"\n\n[cluster]\nnodes = "postgres"\n\n'
        f'[providers.default]\nkind = "simulator"\ntoken_rate = {token_rate}\nreply_tokens = 8\n\n'
        '[agents.default]\nprovider = "default"\n'
    )
    return path


@attrs.define(eq=False)
class RawNodeClient:
    """One client key over a raw node stream: send requests, collect everything the node sends."""

    websocket: trio_websocket.WebSocketConnection
    key: str = "client-1"
    received: list[dict[str, Any]] = attrs.field(factory=list)
    _ids: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1))

    async def call(self, method: str, params: dict[str, Any], *, timeout: float = 20) -> Any:
        """Send a request; return its result (raise AssertionError with the error if any)."""
        reply = await self.request(method, params, timeout=timeout)
        assert "error" not in reply, reply
        return reply["result"]

    async def request(self, method: str, params: dict[str, Any], *, timeout: float = 20) -> Any:
        """Send a request; return its whole reply message."""
        rpc_id = next(self._ids)
        message = {"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params}
        await self.websocket.send_message(wire.to_node(self.key, json.dumps(message)))
        with trio.fail_after(timeout):
            while True:
                envelope = wire.parse(await self.websocket.get_message())
                assert envelope.end is None, envelope
                for text in envelope.texts:
                    obj = json.loads(text)
                    self.received.append(obj)
                    if isinstance(obj, dict) and obj.get("id") == rpc_id:
                        return obj


@asynccontextmanager
async def raw_node_client(
    endpoint: str, secret: str = CLUSTER_SECRET
) -> AsyncIterator[RawNodeClient]:
    """A node-stream client connected to `endpoint`, initialized."""
    async with trio_websocket.open_websocket_url(
        endpoint, extra_headers=[("Authorization", f"Bearer {secret}")]
    ) as websocket:
        client = RawNodeClient(websocket=websocket)
        await client.call("initialize", {"protocolVersion": 1})
        yield client
