"""A node process: sessions under its own runtime, served to gateways over node streams.

`run_node(config)` opens the deployment with the shared PostgreSQL store of
`[store] url`, listens for gateways' node streams (websockets, one per
gateway, authenticated with the cluster secret), registers in the
`harness_nodes` table (heartbeat every second, dead five seconds after the
last) and hosts every session a gateway touches here, until cancelled. Its
session leases last as long as its heartbeat (five seconds, renewed every
third of that), so a node the membership drops loses its sessions to a
takeover at about the same time. When
a node joins, the sessions it now owns are released here at their next turn
boundary (`supervision.cluster.node_rebalance`).
Each client connection a gateway forwards becomes a virtual connection of
an ordinary gateway `Connection` (see `supervision.cluster.wire`), so the
node answers the same methods as `harness serve`, with the node's
additions (`supervision.cluster.node_methods`).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Mapping

import attrs
import trio
import trio_websocket

from actors.boundary import one_exception
from actors.session.postgres_store import PostgresStore
from supervision.cluster.membership import Membership, MembershipView
from supervision.cluster.node_methods import NODE_METHODS, lease_owner
from supervision.cluster.node_rebalance import Rebalancer, tell_subscribers_moved
from supervision.cluster.wire import MOVED, EnvelopeError, end_to_gateway, parse, to_gateway
from supervision.config import MAX_PORT, ConfigError, DeploymentConfig
from supervision.deployment import Deployment, open_deployment
from supervision.gateway import AgentProfile, Gateway, Token
from supervision.gateway.auth import Denial, Principal, authenticate
from supervision.gateway.connection import CLOSE_GOING_AWAY, CLOSE_NORMAL, CLOSE_POLICY
from supervision.gateway.methods import MethodTable
from supervision.gateway.protocol import RpcError
from supervision.gateway.sessions import SessionDirectory
from supervision.gateway.transport import Framing, TransportClosed
from supervision.supervisor import SupervisionError

log = logging.getLogger(__name__)

CLIENT_QUEUE = 256
"""Frames queued for one virtual connection; a client past it is closed (1008), never waited on."""

MAX_NODE_FRAME = 16 * 1024 * 1024
"""The largest node-stream envelope (it may carry a batch of a client's frames)."""

HANDSHAKE_SECONDS = 10.0
"""How long a gateway may take to open a node stream (its websocket handshake)."""

ENVELOPE_BYTES = 1024 * 1024
"""The frame bytes one envelope to a gateway carries at most (unless one frame is larger):
a longer batch (a log replay) goes in several, so no envelope nears a gateway's 16 MiB limit."""


class NodeError(SupervisionError):
    """A node cannot start: the message names the setting or the address."""


def cluster_secret(config: DeploymentConfig, environ: Mapping[str, str] | None = None) -> str:
    """The secret gateways present to nodes, from the variable `[cluster] token_env` names.

    Raises:
        ConfigError: the config has no `[cluster]` table or no `[store] url`,
            or the variable is unset or empty.
    """
    if config.cluster is None or config.store.url is None:
        raise ConfigError(
            f'{config.source}: a cluster needs [cluster] nodes = "postgres" and '
            '[store] url = "postgresql://..."'
        )
    environ = os.environ if environ is None else environ
    secret = environ.get(config.cluster.token_env)
    if not secret:
        raise ConfigError(
            f"{config.source}: [cluster] token_env names environment variable "
            f"{config.cluster.token_env!r}, which is not set: gateways and nodes share that secret"
        )
    return secret


def default_node_id() -> str:
    """A node id for a node started without one: the host name and a random suffix."""
    return f"{socket.gethostname()}-{secrets.token_hex(3)}"


def _url_host(host: str) -> str:
    """`host` as a URL writes it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def _host_port(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > MAX_PORT:
        raise NodeError(
            f"--listen {listen!r} must be HOST:PORT, port 0-{MAX_PORT} (0: any free one)"
        )
    return host.strip("[]"), int(port)


def _no_header(_length: int) -> bytes:
    return b""


MESSAGE_FRAMING = Framing(header=_no_header, trailer=b"")
"""A virtual connection's frames are its bare messages: the node stream's envelope delimits them."""


@attrs.define(eq=False)
class _ClientTransport:
    """One virtual connection's transport: frames in from a channel, out over the node stream."""

    key: str
    stream: NodeStream
    inbound: trio.MemoryReceiveChannel[str]
    outbound: trio.MemorySendChannel[str]
    """The stream's side of `inbound` (closed when the client ends)."""
    ended: bool = False
    """True once the gateway was sent this client's end: nothing more is sent for it."""

    def forget(self) -> None:
        """Drop this client from the stream (only if its key still names this one)."""
        if self.stream.clients.get(self.key) is self:
            del self.stream.clients[self.key]
        self.outbound.close()

    async def end(self, code: int, reason: str) -> None:
        """Send the gateway this client's end, once; later frames for it are not sent."""
        self.forget()
        if not self.ended:
            self.ended = True
            await self.stream.send(end_to_gateway(self.key, code, reason))

    async def receive(self) -> str | bytes:
        try:
            return await self.inbound.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise TransportClosed(CLOSE_NORMAL, "the gateway ended this client") from None

    @property
    def framing(self) -> Framing:
        return MESSAGE_FRAMING

    async def send_batch(self, frames: list[bytes]) -> None:
        group: list[str] = []
        size = 0
        for frame in frames:
            if group and size + len(frame) > ENVELOPE_BYTES:
                await self._send_group(group)
                group, size = [], 0
            group.append(frame.decode())
            size += len(frame)
        if group:
            await self._send_group(group)

    async def _send_group(self, texts: list[str]) -> None:
        if not self.ended:  # else the gateway ended this client; it drops what comes for it
            await self.stream.send(to_gateway(self.key, texts))

    async def close(self, code: int, reason: str) -> None:
        await self.end(code, reason)

    async def abort(self) -> None:
        self.forget()


@attrs.define(eq=False)
class NodeStream:
    """The actor of one gateway's node stream: demultiplexes envelopes to virtual connections."""

    gateway: Gateway
    websocket: trio_websocket.WebSocketConnection
    principal_token: Token
    clients: dict[str, _ClientTransport] = attrs.field(factory=dict)

    async def send(self, text: str) -> None:
        """Send one envelope to the gateway.

        Raises:
            TransportClosed: the stream is gone.
        """
        try:
            await self.websocket.send_message(text)
        except (trio_websocket.ConnectionClosed, trio.BrokenResourceError) as exc:
            raise TransportClosed(None, f"node stream closed: {exc}") from None

    async def run(self) -> None:
        """Serve the stream until the gateway leaves; its virtual connections end with it.

        Cancellation: ends every virtual connection (their turns go on).
        """
        async with trio.open_nursery() as nursery:
            while True:
                try:
                    text = await self.websocket.get_message()
                except trio_websocket.ConnectionClosed:
                    break
                try:
                    envelope = parse(text)
                except EnvelopeError as exc:
                    await self.websocket.aclose(CLOSE_POLICY, str(exc)[:120])
                    break
                if envelope.end is not None:
                    client = self.clients.get(envelope.key)
                    if client is not None:
                        client.forget()
                    continue
                client = self.clients.get(envelope.key)
                if client is None:
                    client = self._open(nursery, envelope.key)
                for message in envelope.texts:
                    try:
                        client.outbound.send_nowait(message)
                    except trio.WouldBlock:
                        # Overflow: this client only is closed, the stream goes on.
                        await client.end(CLOSE_POLICY, f"over {CLIENT_QUEUE} frames queued")
                        break
                    except trio.ClosedResourceError:
                        break
            nursery.cancel_scope.cancel()

    def _open(self, nursery: trio.Nursery, key: str) -> _ClientTransport:
        send, receive = trio.open_memory_channel[str](CLIENT_QUEUE)
        transport = _ClientTransport(key=key, stream=self, inbound=receive, outbound=send)
        self.clients[key] = transport

        async def serve() -> None:
            try:
                await self.gateway.run_connection(
                    transport, Principal(token=self.principal_token), answer_after_eof=False
                )
            finally:
                transport.forget()

        nursery.start_soon(serve)
        return transport


@attrs.define(eq=False)
class LostSessions:
    """Drops the sessions whose lease this node learns it lost (its store's `lease_lost`).

    Another node took the session over (this one stalled past its lease, or
    was cut off from the database): its prompt in flight here is answered
    `MOVED` at once (the gateway sends it again, with the same request id,
    to the new owner), its log subscriptions here are told
    `_harness/log/moved` (the gateway resumes them there), and its agent is
    closed (its late writes are refused by fencing anyway).
    """

    gateway: Gateway
    nursery: trio.Nursery

    def drop(self, session_id: str) -> None:
        """Drop `session_id` here as described above (called in the store's writer task)."""
        error = RpcError(
            MOVED,
            f"session {session_id!r} was taken over by another node while this node had it",
            {"reason": "moved", "sessionId": session_id, "retryAfterMs": 0},
        )
        for connection in list(self.gateway.connections):
            connection.end_prompt(session_id, error)
        tell_subscribers_moved(self.gateway, session_id)
        self.nursery.start_soon(self.gateway.directory.close, session_id)
        log.warning("node lost session %s to another writer; dropped it here", session_id)


def node_gateway(
    deployment: Deployment,
    profiles: Mapping[str, AgentProfile],
    token: Token,
    *,
    node_id: str,
    host: str,
    port: int,
) -> Gateway:
    """The node's gateway object: the node's runtime behind the node method table.

    Its `runtime_id` is the node id (so `initialize` and `_harness/stats` name the node).
    """
    runtime = deployment.runtime
    return Gateway(
        runtime=runtime,
        directory=SessionDirectory(
            runtime=runtime, profiles=dict(profiles), agent_restart="temporary"
        ),
        tokens=(token,),
        origins=(),
        host=host,
        port=port,
        runtime_id=node_id,
        methods=MethodTable(methods=NODE_METHODS),
    )


async def run_node(
    config: DeploymentConfig,
    *,
    node_id: str | None = None,
    listen: str = "127.0.0.1:0",
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Host sessions for the cluster until cancelled; `task_status.started(endpoint_url)`.

    `endpoint_url` is `ws://HOST:PORT` (the port actually bound), also what
    the node registers in `harness_nodes` under `node_id` (default:
    `HOSTNAME-RANDOM`). Started once it listens and is registered.

    Cancellation: leaves the membership table, closes the node streams
    (gateways retry elsewhere), ends every live turn in the log (`aborted`,
    "disposed") and flushes the store.

    Raises:
        ConfigError: no `[cluster]` / `[store] url`, or the cluster secret is unset.
        NodeError: `listen` is malformed or cannot be bound.
        MembershipError: the database cannot be reached.
    """
    from supervision.commands.serve import profiles_of

    secret = cluster_secret(config)
    url = config.store.url
    assert url is not None
    host, port = _host_port(listen)
    node_id = node_id or default_node_id()
    token = Token(secret=secret, name="cluster")
    stopping = trio.Event()

    async def host_sessions(task_status: trio.TaskStatus[str]) -> None:
        with trio.CancelScope() as shield:
            membership = Membership(url)
            # A node's leases last as long as its heartbeat: when the membership
            # says it is dead, its sessions can be taken over too.
            store = PostgresStore(
                url, lease_ttl=membership.dead_after, lease_owner=lease_owner(node_id)
            )
            async with open_deployment(config, store=store) as deployment:
                gateway: Gateway | None = None

                async def handle(request: trio_websocket.WebSocketRequest) -> None:
                    verdict = authenticate(
                        request.headers, request.proposed_subprotocols, (token,), ()
                    )
                    if isinstance(verdict, Denial):
                        await request.reject(verdict.status, body=(verdict.reason + "\n").encode())
                        return
                    websocket = await request.accept()
                    assert gateway is not None
                    try:
                        await NodeStream(
                            gateway=gateway, websocket=websocket, principal_token=token
                        ).run()
                    except TransportClosed:
                        pass  # the gateway went away while a reply was being sent
                    except Exception:
                        # One stream's failure never takes the node down.
                        log.exception("node stream from a gateway failed")
                    finally:
                        with trio.CancelScope(shield=True), trio.move_on_after(1):
                            await websocket.aclose(CLOSE_GOING_AWAY, "node stream ended")

                async def serve_stream(stream: trio.SocketStream) -> None:
                    # The websocket's reader task runs in this stream's own nursery, so
                    # its failure (trio-websocket can fail answering a ping on a closing
                    # connection) ends this stream only, never the node.
                    try:
                        async with trio.open_nursery() as websocket_tasks:
                            request: trio_websocket.WebSocketRequest | None = None
                            with trio.move_on_after(HANDSHAKE_SECONDS):
                                request = await trio_websocket.wrap_server_stream(
                                    websocket_tasks, stream, max_message_size=MAX_NODE_FRAME
                                )
                            if request is not None:
                                await handle(request)
                            websocket_tasks.cancel_scope.cancel()
                    except Exception:
                        log.exception("node stream from a gateway failed")
                    finally:
                        await trio.aclose_forcefully(stream)

                try:
                    listeners = await trio.open_tcp_listeners(port, host=host)
                except OSError as exc:
                    raise NodeError(f"node {node_id!r} cannot listen on {listen}: {exc}") from exc
                try:
                    if len(listeners) != 1:
                        # Each would get a port of its own, and the node registers one endpoint.
                        raise NodeError(
                            f"node {node_id!r}: {listen} resolves to {len(listeners)} addresses;"
                            " give one address to listen on"
                        )
                    bound = listeners[0].socket.getsockname()[1]
                    async with trio.open_nursery() as nursery:
                        endpoint = f"ws://{_url_host(host)}:{bound}"
                        gateway = node_gateway(
                            deployment,
                            profiles_of(deployment),
                            token,
                            node_id=node_id,
                            host=host,
                            port=bound,
                        )
                        await nursery.start(gateway.fanout.run)
                        store.lease_lost = LostSessions(gateway=gateway, nursery=nursery).drop
                        await nursery.start(trio.serve_listeners, serve_stream, listeners)
                        await nursery.start(membership.serve_node, node_id, endpoint)
                        view: MembershipView = await nursery.start(membership.serve_view)
                        rebalancer = Rebalancer(gateway=gateway, view=view, node_id=node_id)
                        nursery.start_soon(rebalancer.run)
                        log.info("node %s listening on %s", node_id, endpoint)
                        # From here on the node stops only through `stopping`, so that its
                        # shutdown runs in order: leave, close the streams, end the turns, flush.
                        shield.shield = True
                        task_status.started(endpoint)
                        await stopping.wait()
                        nursery.cancel_scope.cancel()
                finally:
                    for listener in listeners:
                        await trio.aclose_forcefully(listener)

    with one_exception():  # the node's own error (NodeError, ...), not its nurseries' group
        async with trio.open_nursery() as outer:
            endpoint: str = await outer.start(host_sessions)
            task_status.started(endpoint)
            try:
                await trio.sleep_forever()
            finally:
                stopping.set()
