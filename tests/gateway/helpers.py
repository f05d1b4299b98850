"""A runtime with a gateway on 127.0.0.1 port 0, and a small JSON-RPC websocket client."""

from __future__ import annotations

import itertools
import json
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio
import trio_websocket

from actors.agent import AgentOptions, Tool
from actors.prompt import SystemPrompt
from actors.providers import Provider
from actors.providers.openai_compat import OpenAICompatProvider
from actors.providers.simulator import SimulatorConfig, SimulatorEngine, simulator_transport
from actors.session import MemoryStore, SessionStore
from supervision.gateway import AgentProfile, Gateway, Token, open_gateway
from supervision.runtime import open_runtime

SECRET = "test-secret"
ALL = Token(secret=SECRET, name="full-access")
AUTH = [("Authorization", f"Bearer {SECRET}")]


async def _list_files(arguments: dict[str, Any] | str, call: object) -> str:
    return "notes.txt\nplan.md"


LIST_FILES = Tool(
    name="list_files",
    description="List files under a path.",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}},
    execute=_list_files,
)


@asynccontextmanager
async def simulator_provider(
    config: SimulatorConfig | None = None,
) -> AsyncIterator[tuple[Provider, SimulatorEngine]]:
    """An OpenAI-compatible provider answered in process by the simulator (no socket)."""
    engine = SimulatorEngine(config or SimulatorConfig())
    async with httpx.AsyncClient(transport=simulator_transport(engine)) as client:
        yield (
            OpenAICompatProvider(
                client, base_url="http://simulator.test", api_key=engine.config.api_key
            ),
            engine,
        )


@asynccontextmanager
async def running_gateway(
    *,
    tokens: Sequence[Token] = (ALL,),
    store: SessionStore | None = None,
    write_deadline: float = 10.0,
    config: SimulatorConfig | None = None,
    origins: Sequence[str] | None = None,
    max_inflight: int = 64,
    static_dir: Path | None = None,
    ping_interval: float = 20.0,
    ping_timeout: float = 20.0,
) -> AsyncIterator[Gateway]:
    """A runtime on the simulator with the `default` profile, and its gateway."""
    async with (
        simulator_provider(config) as (provider, _),
        open_runtime(
            system_prompt=SystemPrompt(persona="test"),
            store=store or MemoryStore(),
            providers={"default": provider},
        ) as runtime,
        open_gateway(
            runtime,
            tokens=tokens,
            profiles={
                "default": AgentProfile(
                    options=AgentOptions(model="deepseek-chat"), tools=(LIST_FILES,)
                )
            },
            write_deadline=write_deadline,
            origins=origins,
            max_inflight=max_inflight,
            static_dir=static_dir,
            ping_interval=ping_interval,
            ping_timeout=ping_timeout,
        ) as gateway,
    ):
        yield gateway


@attrs.define(eq=False)
class RpcClient:
    """JSON-RPC over one websocket: `call` waits for its answer; notifications are kept in order."""

    ws: trio_websocket.WebSocketConnection
    notifications: list[dict[str, Any]] = attrs.field(factory=list)
    _ids: itertools.count[int] = attrs.field(factory=itertools.count)
    _answers: dict[Any, dict[str, Any]] = attrs.field(factory=dict)
    _arrived: trio.Event = attrs.field(factory=trio.Event)
    frames: list[Any] = attrs.field(factory=list)
    log_events: dict[str, list[dict[str, Any]]] = attrs.field(factory=dict)
    log_event_count: int = 0

    async def send(self, message: Any) -> None:
        await self.ws.send_message(message if isinstance(message, str) else json.dumps(message))

    async def pump(self) -> None:
        """Read frames until the socket closes."""
        try:
            while True:
                self.file(json.loads(await self.ws.get_message()))
        except trio_websocket.ConnectionClosed:
            self._arrived.set()

    def file(self, value: Any) -> None:
        """Keep one decoded frame (answers by id, notifications and log events in order)."""
        self.frames.append(value)
        for message in value if isinstance(value, list) else [value]:
            if message.get("method") == "_harness/log/event":
                params = message["params"]
                self.log_events.setdefault(params["sessionId"], []).append(params["event"])
                self.log_event_count += 1
            elif message.get("method") == "_harness/log/events":
                self._file_batch(message["params"])
            elif message.get("method") == "_harness/log/merged":
                for batch in message["params"]["batches"]:
                    self._file_batch(batch)
            if "method" in message:
                self.notifications.append(message)
            else:
                self._answers[message.get("id")] = message
        self._arrived.set()
        self._arrived = trio.Event()

    def _file_batch(self, params: dict[str, Any]) -> None:
        self.log_events.setdefault(params["sessionId"], []).extend(params["events"])
        self.log_event_count += len(params["events"])

    async def answer(self, id: Any) -> dict[str, Any]:
        while id not in self._answers:
            if self.ws.closed is not None:
                raise trio_websocket.ConnectionClosed(self.ws.closed)
            await self._arrived.wait()
        return self._answers.pop(id)

    async def request(self, method: str, params: Any = None) -> dict[str, Any]:
        id = next(self._ids)
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)
        return await self.answer(id)

    async def call(self, method: str, params: Any = None) -> Any:
        answer = await self.request(method, params)
        if "error" in answer:
            raise AssertionError(f"{method} failed: {answer['error']}")
        return answer["result"]

    async def wait_for_log_events(self, count: int) -> None:
        """Wait until `count` log events arrived in all."""
        while self.log_event_count < count:
            if self.ws.closed is not None:
                raise trio_websocket.ConnectionClosed(self.ws.closed)
            await self._arrived.wait()

    async def wait_until(self, condition: Any) -> None:
        """Wait until `condition()` holds, checking it once per frame that arrives."""
        while not condition():
            if self.ws.closed is not None:
                raise trio_websocket.ConnectionClosed(self.ws.closed)
            await self._arrived.wait()

    async def wait_for(self, predicate: Any) -> dict[str, Any]:
        while True:
            for message in self.notifications:
                if predicate(message):
                    return message
            if self.ws.closed is not None:
                raise trio_websocket.ConnectionClosed(self.ws.closed)
            await self._arrived.wait()


@asynccontextmanager
async def connect(
    gateway: Gateway,
    *,
    headers: Sequence[tuple[str, str]] = AUTH,
    initialize: bool = True,
    subprotocols: Sequence[str] | None = None,
    message_queue_size: int = 64,
) -> AsyncIterator[RpcClient]:
    """A client connected to `gateway` with a reader task; initialized unless told not to."""
    async with open_client(
        gateway.host,
        gateway.port,
        headers=headers,
        initialize=initialize,
        subprotocols=subprotocols,
        message_queue_size=message_queue_size,
    ) as client:
        yield client


async def wrap_websocket(
    nursery: trio.Nursery,
    stream: trio.abc.Stream,
    host: str,
    *,
    headers: Sequence[tuple[str, str]] = AUTH,
    subprotocols: Sequence[str] | None = None,
    message_queue_size: int = 64,
) -> trio_websocket.WebSocketConnection:
    """The client side of a gateway websocket at `/acp` over `stream`, `headers` sent."""
    return await trio_websocket.wrap_client_stream(
        nursery,
        stream,
        host,
        "/acp",
        extra_headers=[(k.encode(), v.encode()) for k, v in headers],
        subprotocols=subprotocols,
        message_queue_size=message_queue_size,
    )


async def small_window_stream(gateway: Gateway) -> trio.SocketStream:
    """A TCP stream to `gateway` with a 4 KiB receive buffer (no autotuning), so a client
    that reads slowly or not at all fills it after a few kilobytes."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await sock.connect((gateway.host, gateway.port))
    return trio.SocketStream(sock)


@asynccontextmanager
async def open_client(
    host: str,
    port: int,
    *,
    headers: Sequence[tuple[str, str]] = AUTH,
    initialize: bool = True,
    subprotocols: Sequence[str] | None = None,
    message_queue_size: int = 64,
) -> AsyncIterator[RpcClient]:
    """As `connect`, to any host and port; the TCP stream is always closed on the way out."""
    stream = await trio.open_tcp_stream(host, port)
    try:
        async with trio.open_nursery() as nursery:
            ws = await wrap_websocket(
                nursery,
                stream,
                host,
                headers=headers,
                subprotocols=subprotocols,
                message_queue_size=message_queue_size,
            )
            client = RpcClient(ws=ws)
            nursery.start_soon(client.pump)
            if initialize:
                await client.call("initialize", {"protocolVersion": 1})
            yield client
            with trio.move_on_after(1):
                await ws.aclose()
            nursery.cancel_scope.cancel()
    finally:
        await trio.aclose_forcefully(stream)


@asynccontextmanager
async def stalled_client(gateway: Gateway) -> AsyncIterator[tuple[RpcClient, trio.CancelScope]]:
    """A client on a TCP stream with tiny buffers at both ends, initialized, with a reader task;
    cancel the yielded scope to stop reading (the gateway's writes to it then stall at once).

    The gateway's side of the socket gets a small send buffer too (it would otherwise grow to
    megabytes), so a few kilobytes unread are enough to stall it.
    """
    stream = await small_window_stream(gateway)
    before = set(gateway.connections)
    try:
        async with trio.open_nursery() as nursery:
            ws = await wrap_websocket(nursery, stream, gateway.host, message_queue_size=1)
            client = RpcClient(ws=ws)
            reading = trio.CancelScope()

            async def read() -> None:
                with reading:
                    await client.pump()

            nursery.start_soon(read)
            await client.call("initialize", {"protocolVersion": 1})
            (connection,) = gateway.connections - before
            served = connection.transport.stream.inner.socket  # type: ignore[attr-defined]
            served.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            yield client, reading
            nursery.cancel_scope.cancel()
    finally:
        await trio.aclose_forcefully(stream)
