"""The gateway: `open_gateway` / `serve_gateway`, one listener for `/acp`, `/healthz` and `/`.

Each accepted TCP connection is handled in its own task of the gateway's
nursery; whatever happens in it (a malformed request, a handler bug, a
dropped socket) ends that connection only. Websocket upgrades on `/acp`
are authenticated at the handshake (Origin → 403, token → 401) before they
are accepted, then run as a `Connection` actor.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio
import trio_websocket

from actors.latency import LatencySummary
from actors.providers.actor import ProviderActorStatistics
from actors.session import Event, MemoryStore
from supervision.gateway.auth import Denial, Principal, Token, authenticate
from supervision.gateway.connection import (
    CLOSE_GOING_AWAY,
    DEFAULT_PING_INTERVAL_SECONDS,
    DEFAULT_PING_TIMEOUT_SECONDS,
    MAX_SUBSCRIPTIONS,
    MAX_WATCHES,
    Connection,
)
from supervision.gateway.cursors import EventTexts
from supervision.gateway.fanout import Fanout
from supervision.gateway.http import HttpFront, HttpRequest, ReplayStream
from supervision.gateway.methods import MethodTable
from supervision.gateway.sessions import AgentProfile, SessionDirectory
from supervision.gateway.status import StatusWatch
from supervision.gateway.transport import (
    DirectSend,
    SharedStream,
    Transport,
    WebSocketTransport,
)
from supervision.runtime import Runtime

log = logging.getLogger(__name__)

DEFAULT_WRITE_DEADLINE_SECONDS = 10.0
DEFAULT_MAX_INFLIGHT = 64
DEFAULT_MAX_FRAME = 1024 * 1024
MESSAGE_QUEUE_SIZE = 4
"""trio-websocket's inbound queue: the reader hands requests to workers, so this stays small."""

VERSION = "0.1.0"


class GatewayError(Exception):
    """The gateway could not start (the message names the host and port)."""


@attrs.frozen(kw_only=True)
class GatewayStatistics:
    """A snapshot of the gateway."""

    connections: int
    subscriptions: int
    slow_consumer_closes: int
    frames_written: int


@attrs.define(eq=False)
class Gateway:
    """The running gateway: its runtime, tokens, limits, connections and counters.

    Get one from `open_gateway` or `serve_gateway`; `url` is the websocket URL.
    """

    runtime: Runtime
    directory: SessionDirectory
    tokens: tuple[Token, ...]
    origins: tuple[str, ...]
    host: str
    port: int
    write_deadline: float = DEFAULT_WRITE_DEADLINE_SECONDS
    max_inflight: int = DEFAULT_MAX_INFLIGHT
    max_frame: int = DEFAULT_MAX_FRAME
    ping_interval: float = DEFAULT_PING_INTERVAL_SECONDS
    ping_timeout: float = DEFAULT_PING_TIMEOUT_SECONDS
    static_dir: Path | None = None
    cwd: str = attrs.field(factory=os.getcwd)
    version: str = VERSION
    epoch: str = attrs.field(factory=lambda: secrets.token_hex(8))
    runtime_id: str = attrs.field(factory=lambda: secrets.token_hex(8))
    methods: MethodTable = attrs.field(factory=MethodTable)
    connections: set[Connection] = attrs.field(factory=set)
    event_texts: EventTexts = attrs.field(factory=EventTexts)
    fanout: Fanout = attrs.field(init=False)
    status_watch: StatusWatch = attrs.field(init=False)
    slow_consumer_closes: int = 0
    _claims: dict[str, set[int]] = attrs.field(factory=dict)
    _started: float = attrs.field(factory=trio.current_time)
    _closed_frames: int = 0
    _slow_consumer_closed: trio.Event = attrs.field(factory=trio.Event)

    def __attrs_post_init__(self) -> None:
        store = self.runtime.store
        self.fanout = Fanout(
            changes=store.durable_changes,
            read_now=self.read_durable_now,
            read=self.read_durable,
            # A memory store keeps each event's JSON text: the fan-out sends it as it is.
            stored_json=store.durable_json_range if isinstance(store, MemoryStore) else None,
        )
        self.status_watch = StatusWatch(directory=self.directory, fanout=self.fanout)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Gateway]:
        """Run the gateway's own tasks (the session fan-out) for the body of the context.

        `serve_gateway` does this itself; a caller running connections on a
        `Gateway` it built (stdio) wraps them in it. Leaving the context
        stops the fan-out.
        """
        async with trio.open_nursery() as nursery:
            await nursery.start(self.fanout.run)
            try:
                yield self
            finally:
                nursery.cancel_scope.cancel()

    @property
    def url(self) -> str:
        """`ws://HOST:PORT/acp`."""
        return f"ws://{self.host}:{self.port}/acp"

    @property
    def http_url(self) -> str:
        """`http://HOST:PORT/` (the dashboard)."""
        return f"http://{self.host}:{self.port}/"

    def statistics(self) -> GatewayStatistics:
        """Connections, subscriptions, slow-consumer closes, frames written."""
        return GatewayStatistics(
            connections=len(self.connections),
            subscriptions=sum(len(c.subscriptions) for c in self.connections),
            slow_consumer_closes=self.slow_consumer_closes,
            frames_written=self._closed_frames + sum(c.frames_written for c in self.connections),
        )

    def limits(self) -> dict[str, Any]:
        """The limits advertised in `initialize`."""
        return {
            "maxFrame": self.max_frame,
            "maxInflight": self.max_inflight,
            "maxBatch": 32,
            "maxSubscriptions": MAX_SUBSCRIPTIONS,
            "maxWatches": MAX_WATCHES,
            "writeDeadlineMs": int(self.write_deadline * 1000),
        }

    def count_slow_consumer(self) -> None:
        """Count one connection closed (4008) for not keeping up."""
        self.slow_consumer_closes += 1
        self._slow_consumer_closed.set()
        self._slow_consumer_closed = trio.Event()

    async def wait_slow_consumer_closes(self, count: int) -> None:
        """Return once at least `count` connections were closed as slow consumers.

        Cancellation: cancellable; nothing is affected.
        """
        while self.slow_consumer_closes < count:
            await self._slow_consumer_closed.wait()
        await trio.lowlevel.checkpoint()

    # -- prompts' turns ----------------------------------------------------------

    def claim_turn(self, session_id: str, turn: int) -> bool:
        """Claim `turn` of `session_id` for one pending prompt; False if another holds it."""
        claimed = self._claims.setdefault(session_id, set())
        if turn in claimed:
            return False
        claimed.add(turn)
        return True

    def release_turn(self, session_id: str, turn: int) -> None:
        """Drop a claim once its prompt was answered."""
        claimed = self._claims.get(session_id)
        if claimed is not None:
            claimed.discard(turn)
            if not claimed:
                del self._claims[session_id]

    # -- the log ----------------------------------------------------------------

    async def head_seq(self, session_id: str) -> int:
        """The newest durable seq of the session (-1 for an empty log)."""
        session = self.directory.live_session(session_id)
        if session is not None:
            return session.durable_seq
        return len(await self.runtime.store.load(session_id)) - 1

    def read_durable_now(
        self, session_id: str, from_seq: int, limit: int
    ) -> tuple[Sequence[Event], int] | None:
        """Durable events from `from_seq` in the live log, without waiting; None if it lacks them.

        Returns up to `limit` events (at least one) and the durable head.
        None: no running agent, a hibernating session, or the store's commit
        of `from_seq` is not recorded in the live log yet (`read_durable` then).
        """
        session = self.directory.live_session(session_id)
        if session is None or session.hibernating:
            return None
        head = session.durable_seq
        if head < from_seq:
            return None
        return session.durable_events(from_seq, limit), head

    async def read_durable(
        self, session_id: str, from_seq: int, limit: int
    ) -> tuple[Sequence[Event], int]:
        """Wait until `from_seq` is durable; return up to `limit` events from it, and the head.

        Waits on the store's durability mark (woken by its commit), so it
        follows a session across agent restarts; reads from the live log,
        else (no live agent, or its session hibernates) from the store.

        Raises:
            SessionError: the store failed to commit the session's events.
        """
        store = self.runtime.store
        await store.wait_durable(session_id, from_seq)
        session = self.directory.live_session(session_id)
        if session is not None and not session.hibernating and len(session) > from_seq:
            await session.wait_durable(from_seq)
            if not session.hibernating:  # it may have hibernated while this waited
                return session.durable_events(from_seq, limit), session.durable_seq
        events = await store.load(session_id)
        return tuple(events[from_seq : from_seq + limit]), len(events) - 1

    # -- runtime views -------------------------------------------------------------

    async def stats(self, principal: Principal) -> dict[str, Any]:
        """`_harness/stats`: built from the runtime's and gateway's `statistics()`."""
        live = [
            agent
            for sid in await self.directory.session_ids()
            if self.directory.visible(principal, sid)
            and (agent := self.directory.live_agent(sid)) is not None
        ]
        running = sum(1 for agent in live if agent.status == "running")
        providers = []
        for name, provider in self.runtime.providers.items():
            mine = [a for a in live if a.options.provider_name == name]
            inflight = 0
            failures: dict[str, int] = {}
            latency = LatencySummary(samples=0, p50_ms=None, p99_ms=None)
            statistics = getattr(provider, "statistics", None)
            snapshot = statistics() if callable(statistics) else None
            if snapshot is not None:
                inflight = int(getattr(snapshot, "in_flight", 0))
            if isinstance(snapshot, ProviderActorStatistics):
                failures = dict(snapshot.failures_by_code)
                latency = snapshot.latency
            providers.append(
                {
                    "name": name,
                    "inflight": inflight,
                    "requests": sum(a.statistics().loop.requests for a in mine),
                    "retries": sum(a.statistics().loop.retries for a in mine),
                    "failuresByCode": failures,
                    "latencyMs": {"p50": latency.p50_ms, "p99": latency.p99_ms},
                }
            )
        input_tokens = cache_read = 0
        for agent in live:
            # A hibernating session is not woken: its figures are cached, or read from the store.
            figures = await self.directory.figures(agent.session.id)
            input_tokens += figures.input_tokens
            cache_read += figures.cache_read_tokens
        store = self.runtime.store
        commits, commit_p99 = 0, None
        store_statistics = getattr(store, "statistics", None)
        store_snapshot = store_statistics() if callable(store_statistics) else None
        commit_latency = getattr(store_snapshot, "commit_latency", None)
        if isinstance(commit_latency, LatencySummary):
            commits = int(getattr(store_snapshot, "commits", 0))
            commit_p99 = commit_latency.p99_ms
        gateway = self.statistics()
        return {
            "uptimeS": trio.current_time() - self._started,
            "epoch": self.epoch,
            "sessions": {"live": len(live), "running": running, "idle": len(live) - running},
            "providers": providers,
            "cache": {
                "inputTokens": input_tokens,
                "cacheReadTokens": cache_read,
                "hitRatio": cache_read / input_tokens if input_tokens else 0.0,
            },
            "store": {"commits": commits, "commitP99Ms": commit_p99},
            "gateway": {
                "connections": gateway.connections,
                "subscriptions": gateway.subscriptions,
                "slowConsumerCloses": gateway.slow_consumer_closes,
            },
            "supervision": {"restarts": self.runtime.supervisor.statistics().restarts},
        }

    def supervision_tree(self, principal: Principal) -> dict[str, Any]:
        """The root supervisor and its (visible) agent children."""
        supervisor = self.runtime.supervisor
        statistics = supervisor.statistics()
        children: list[dict[str, Any]] = []
        for child in supervisor.children():
            sid = child.id.removeprefix("agent:")
            if child.id.startswith("agent:") and not self.directory.visible(principal, sid):
                continue
            children.append(
                {
                    "path": f"{self.runtime.name}/{child.id}",
                    "strategy": None,
                    "children": [],
                    "restarts": child.restarts,
                    "incarnation": self.directory.incarnation(sid),
                    "status": child.state,
                }
            )
        return {
            "path": self.runtime.name,
            "strategy": statistics.strategy,
            "children": children,
            "restarts": statistics.restarts,
            "incarnation": 0,
            "status": "running" if statistics.running else "stopped",
        }

    def notify_observers(self, session_id: str, message: Mapping[str, Any]) -> None:
        """Send a notification about `session_id` to every connection that may observe it (its
        token has the `observe` scope and a session filter covering the session), on its
        control lane; no other connection learns of it."""
        for connection in list(self.connections):
            principal = connection.principal
            if principal.has("observe") and self.directory.visible(principal, session_id):
                connection.send_notification(message)

    # -- connections -------------------------------------------------------------

    async def run_connection(
        self,
        transport: Transport,
        principal: Principal,
        *,
        answer_after_eof: bool = False,
        ping: Callable[[], Awaitable[None]] | None = None,
        direct: DirectSend | None = None,
    ) -> int:
        """Run one connection actor to its end; returns its close code.

        `answer_after_eof`: when the input ends, answer the requests already
        running before closing (for stdio, whose output stays open).
        `ping`: sends a ping and returns at its pong; given, the connection
        is kept alive with it (`ping_interval`, `ping_timeout`).
        `direct`: the transport, when the fan-out's rounds may be written to it
        synchronously (`Connection.flush_round`).
        """
        connection = Connection(
            ping=ping,
            direct=direct,
            ping_interval=self.ping_interval,
            ping_timeout=self.ping_timeout,
            answer_after_eof=answer_after_eof,
            gateway=self,
            transport=transport,
            principal=principal,
            write_deadline=self.write_deadline,
            max_inflight=self.max_inflight,
            max_frame=self.max_frame,
        )
        self.connections.add(connection)
        try:
            return await connection.run()
        finally:
            self.connections.discard(connection)
            self._closed_frames += connection.frames_written

    async def handle_websocket(self, request: HttpRequest, stream: trio.abc.Stream) -> None:
        """Authenticate the handshake, then accept it and run the connection."""
        socket = stream.socket if isinstance(stream, ReplayStream | trio.SocketStream) else None
        shared = SharedStream(stream, socket=socket)
        async with trio.open_nursery() as nursery:
            ws_request = await trio_websocket.wrap_server_stream(
                nursery,
                shared,
                message_queue_size=MESSAGE_QUEUE_SIZE,
                max_message_size=self.max_frame,
            )
            verdict = authenticate(
                ws_request.headers, ws_request.proposed_subprotocols, self.tokens, self.origins
            )
            if isinstance(verdict, Denial):
                await ws_request.reject(
                    verdict.status,
                    extra_headers=[(b"content-type", b"text/plain")],
                    body=(verdict.reason + "\n").encode(),
                )
            else:
                websocket = await ws_request.accept(subprotocol=verdict.subprotocol)
                transport = WebSocketTransport(connection=websocket, stream=shared)
                await self.run_connection(
                    transport,
                    Principal(token=verdict.token),
                    ping=transport.ping,
                    direct=transport if socket is not None else None,
                )
            nursery.cancel_scope.cancel()

    def shut_down_connections(self) -> None:
        """Close every connection with 1001 (the server is going away)."""
        for connection in list(self.connections):
            connection.close(CLOSE_GOING_AWAY, "server shutting down")


async def bind(
    tokens: Iterable[Token], host: str, port: int
) -> tuple[tuple[Token, ...], list[trio.SocketListener], int]:
    """A gateway's tokens (at least one), its listeners on `host:port`, and the port they got.

    Raises:
        GatewayError: no token was given, or the address cannot be bound.
    """
    token_list = tuple(tokens)
    if not token_list:
        raise GatewayError("the gateway needs at least one token")
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise GatewayError(f"cannot listen on {host}:{port}: {exc}") from exc
    bound = listeners[0].socket.getsockname()[1]
    return token_list, listeners, bound


async def serve_gateway(
    runtime: Runtime,
    *,
    host: str = "127.0.0.1",
    port: int = 8700,
    tokens: Iterable[Token],
    profiles: Mapping[str, AgentProfile],
    origins: Iterable[str] | None = None,
    write_deadline: float = DEFAULT_WRITE_DEADLINE_SECONDS,
    max_inflight: int = DEFAULT_MAX_INFLIGHT,
    ping_interval: float = DEFAULT_PING_INTERVAL_SECONDS,
    ping_timeout: float = DEFAULT_PING_TIMEOUT_SECONDS,
    static_dir: Path | None = None,
    task_status: trio.TaskStatus[Gateway] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the gateway until cancelled; `task_status.started(gateway)` once it listens.

    `origins=None` allows the gateway's own origin (`http://HOST:PORT`).
    Websockets are pinged every `ping_interval` seconds; one whose pong
    does not arrive within `ping_timeout` is closed with 1011.
    Cancellation closes every connection with 1001 (aborting those that
    cannot take a close frame within a second), then stops listening.

    Raises:
        GatewayError: the address cannot be bound.
    """
    token_list, listeners, bound = await bind(tokens, host, port)
    gateway = Gateway(
        runtime=runtime,
        directory=SessionDirectory(runtime=runtime, profiles=dict(profiles)),
        tokens=token_list,
        origins=tuple(origins) if origins is not None else (f"http://{host}:{bound}",),
        host=host,
        port=bound,
        write_deadline=write_deadline,
        max_inflight=max_inflight,
        ping_interval=ping_interval,
        ping_timeout=ping_timeout,
        static_dir=static_dir,
    )
    front = HttpFront(websocket=gateway.handle_websocket, ws_url=gateway.url, static_dir=static_dir)

    async def handle(stream: trio.SocketStream) -> None:
        try:
            await front.handle(stream)
        except Exception:
            # One connection's failure never reaches the listener.
            log.exception("gateway connection failed")

    async with gateway.running(), trio.open_nursery() as nursery:
        try:
            await nursery.start(trio.serve_listeners, handle, listeners)
            task_status.started(gateway)
            await trio.sleep_forever()
        finally:
            gateway.shut_down_connections()


@asynccontextmanager
async def open_gateway(
    runtime: Runtime,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    tokens: Iterable[Token],
    profiles: Mapping[str, AgentProfile],
    origins: Iterable[str] | None = None,
    write_deadline: float = DEFAULT_WRITE_DEADLINE_SECONDS,
    max_inflight: int = DEFAULT_MAX_INFLIGHT,
    ping_interval: float = DEFAULT_PING_INTERVAL_SECONDS,
    ping_timeout: float = DEFAULT_PING_TIMEOUT_SECONDS,
    static_dir: Path | None = None,
) -> AsyncIterator[Gateway]:
    """Serve the gateway for the body of the context; yields it once it listens.

    Leaving the context closes every connection with 1001 and stops listening.

    Raises:
        GatewayError: the address cannot be bound.
    """
    async with trio.open_nursery() as nursery:
        gateway: Gateway = await nursery.start(
            lambda task_status: serve_gateway(
                runtime,
                host=host,
                port=port,
                tokens=tokens,
                profiles=profiles,
                origins=origins,
                write_deadline=write_deadline,
                max_inflight=max_inflight,
                ping_interval=ping_interval,
                ping_timeout=ping_timeout,
                static_dir=static_dir,
                task_status=task_status,
            )
        )
        try:
            yield gateway
        finally:
            nursery.cancel_scope.cancel()
