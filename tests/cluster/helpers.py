"""Cluster test helpers: a deployment config on a test database, and a raw node-stream client."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import attrs
import trio
import trio_websocket

from supervision.cluster import wire
from supervision.cluster.membership import MembershipView
from supervision.cluster.node import run_node
from supervision.cluster.router_serve import serve_cluster_gateway
from supervision.config import DeploymentConfig, parse_config
from supervision.gateway import Token

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


def write_config(path: Path, dsn: str, *, token_rate: float = 0.0, reply_tokens: int = 8) -> Path:
    """The same deployment as a TOML file (for subprocesses)."""
    path.write_text(
        f'[store]\nurl = "{dsn}"\n\n[cluster]\nnodes = "postgres"\n\n'
        f'[providers.default]\nkind = "simulator"\ntoken_rate = {token_rate}\n'
        f"reply_tokens = {reply_tokens}\n\n"
        '[agents.default]\nprovider = "default"\nmax_steps = 4\n'
    )
    return path


@attrs.define(eq=False)
class NodeProcess:
    """A `harness node` subprocess and the endpoint it printed."""

    node_id: str
    process: subprocess.Popen[bytes]
    endpoint: str


@contextmanager
def node_processes(
    config_path: Path, node_ids: tuple[str, ...]
) -> Iterator[dict[str, NodeProcess]]:
    """`harness node` subprocesses, each ready (its line printed); killed by PID on the way out."""
    started: dict[str, NodeProcess] = {}
    try:
        for node_id in node_ids:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "supervision.cli",
                    "node",
                    "--config",
                    str(config_path),
                    "--node-id",
                    node_id,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env={**os.environ, "HARNESS_CLUSTER_TOKEN": CLUSTER_SECRET},
                cwd=config_path.parent,
            )
            assert process.stdout is not None
            line = process.stdout.readline().decode().strip()
            assert line.startswith(f"harness node {node_id} listening on ws://"), line
            started[node_id] = NodeProcess(
                node_id=node_id, process=process, endpoint=line.rpartition(" ")[2]
            )
        yield started
    finally:
        for node in started.values():
            if node.process.poll() is None:
                node.process.send_signal(signal.SIGTERM)
        for node in started.values():
            try:
                node.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                node.process.kill()
                node.process.wait()
            assert node.process.stdout is not None
            node.process.stdout.close()


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
        await self.send(rpc_id, method, params)
        return await self.answer(rpc_id, timeout=timeout)

    async def send(self, rpc_id: int, method: str, params: dict[str, Any]) -> None:
        """Send a request under the current key without waiting for its reply."""
        message = {"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params}
        await self.websocket.send_message(wire.to_node(self.key, json.dumps(message)))

    async def answer(self, rpc_id: int, *, timeout: float = 20) -> Any:
        """The reply to request `rpc_id` (of any key), read until it comes."""
        for obj in self.received:
            if isinstance(obj, dict) and obj.get("id") == rpc_id and "method" not in obj:
                return obj
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
    """A node-stream client connected to `endpoint`, initialized; its TCP stream always closed."""
    host, _, port = endpoint.removeprefix("ws://").partition(":")
    stream = await trio.open_tcp_stream(host, int(port))
    try:
        async with trio.open_nursery() as nursery:
            websocket = await trio_websocket.wrap_client_stream(
                nursery,
                stream,
                host,
                "/",
                extra_headers=[(b"Authorization", f"Bearer {secret}".encode())],
            )
            client = RawNodeClient(websocket=websocket)
            await client.call("initialize", {"protocolVersion": 1})
            yield client
            with trio.move_on_after(1):
                await websocket.aclose()
            nursery.cancel_scope.cancel()
    finally:
        await trio.aclose_forcefully(stream)


async def start_gateway(
    config: DeploymentConfig,
    nursery: trio.Nursery,
    *,
    view: MembershipView | None = None,
    retry_deadline: float | None = None,
    tokens: Sequence[Token] = (),
) -> Any:
    """A cluster gateway on 127.0.0.1 port 0 (token `GATEWAY_SECRET`, then `tokens`)."""
    return await nursery.start(
        lambda task_status: serve_cluster_gateway(
            config,
            host="127.0.0.1",
            port=0,
            tokens=[Token(secret=GATEWAY_SECRET, name="full-access"), *tokens],
            view=view,
            retry_deadline=retry_deadline,
            task_status=task_status,
        )
    )


@asynccontextmanager
async def running_cluster(
    config: DeploymentConfig,
    node_ids: tuple[str, ...],
    nursery: trio.Nursery,
    *,
    tokens: Sequence[Token] = (),
) -> AsyncIterator[tuple[dict[str, trio.CancelScope], Any]]:
    """In-process nodes (each cancellable by its scope) and a cluster gateway, all on port 0
    (`tokens` besides the full-access `GATEWAY_SECRET`)."""
    scopes: dict[str, trio.CancelScope] = {}
    for node_id in node_ids:
        scopes[node_id] = await start_node(config, node_id, nursery)
    gateway = await start_gateway(config, nursery, tokens=tokens)
    await wait_nodes(gateway, len(node_ids))
    yield scopes, gateway


GATEWAY_SECRET = "test-secret"


async def start_node(
    config: DeploymentConfig, node_id: str, nursery: trio.Nursery
) -> trio.CancelScope:
    """Start one in-process node; cancelling the returned scope stops it cleanly."""
    scope = trio.CancelScope()

    async def run(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            await run_node(config, node_id=node_id, task_status=task_status)

    await nursery.start(run)
    return scope


async def wait_nodes(gateway: Any, count: int) -> None:
    """Wait until the cluster gateway's view holds `count` nodes."""
    view = gateway.methods.router.view
    with trio.fail_after(10):
        while len(view.nodes) != count:
            await view.wait_changed(view.version)


def serve_process(config_path: Path, token: str) -> subprocess.Popen[bytes]:
    """`harness serve --config FILE --port 0 --token TOKEN` as a subprocess (stdout piped)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "supervision.cli",
            "serve",
            "--config",
            str(config_path),
            "--port",
            "0",
            "--token",
            token,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "HARNESS_CLUSTER_TOKEN": CLUSTER_SECRET},
        cwd=config_path.parent,
    )
