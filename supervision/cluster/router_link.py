"""The gateway's end of one node stream: one websocket per node carrying every client's calls.

A `NodeLink` is an actor with a reader task and a writer task. Calls from
any client connection are sent with ids rewritten to the link's own
counter (so two clients' ids never clash on the node) and answered to the
waiting caller; notifications are handed to the client they belong to (by
the envelope's client key). When the websocket drops, every waiting call
fails with `NodeDown` at once, so the router can retry it elsewhere.

The link pings the node every `ping_interval` seconds; a node that sends
nothing within `ping_timeout` of a ping, neither its pong nor any other
frame, has its link dropped the same way, so a node that froze (stopped,
or cut off) while its TCP connection stays open is given up within
seconds, not when a call's retry deadline runs out. The node's websocket
answers pings from its reader task, so a node that is alive but slow to
answer one call is not dropped; nor is one whose pong is held up on a
busy stream (a node's websocket answers a ping only once it has taken in
the frames before it, and the pong goes out behind the envelopes queued
before it): every frame that arrives shows the node alive.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio
import trio_websocket

from supervision.cluster import wire
from supervision.cluster.membership import NodeInfo
from supervision.gateway.protocol import dumps

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_SECONDS = 5.0
"""How long opening a node stream may take before the node counts as down."""

ACK_DEADLINE_SECONDS = 10.0
"""How long a node may take to acknowledge a new virtual connection (answer its
`initialize`, which needs no session) before the call counts the node as down."""

PING_INTERVAL_SECONDS = 1.0
"""How long a node stream waits between keep-alive pings."""

PING_TIMEOUT_SECONDS = 5.0
"""How long a ping's pong may take before the node counts as down (its calls retry elsewhere):
the heartbeat's dead-after, so a frozen node is dropped as soon as it is silent that long."""

SEND_QUEUE = 1024
"""Envelopes queued for one node's writer; a caller past it waits (backpressure to its client)."""

MAX_LINK_FRAME = 16 * 1024 * 1024
"""The largest envelope a node may send (a batch of one client's frames)."""


def endpoint_address(node: NodeInfo) -> tuple[str, int, str]:
    """The host, port and path of `node`'s `ws://HOST:PORT[/PATH]` endpoint (IPv6 bracketed).

    Raises:
        ValueError: the endpoint is not such a URL (the message names the node).
    """
    try:
        url = urllib.parse.urlsplit(node.endpoint)
        host, port = url.hostname, url.port
    except ValueError as exc:
        raise ValueError(
            f"node {node.node_id!r} has a malformed endpoint {node.endpoint!r}: {exc}"
        ) from None
    if url.scheme != "ws" or not host or port is None:
        raise ValueError(
            f"node {node.node_id!r} has endpoint {node.endpoint!r}; expected ws://HOST:PORT"
        )
    return host, port, url.path or "/"


class NodeDown(Exception):
    """The node stream is gone (or could not be opened): retry the call on another node."""


class ClientEnded(NodeDown):
    """The node closed this client's virtual connection (the stream is up): retry there."""


Notify = Callable[[str, Mapping[str, Any]], None]
"""`notify(node_id, message)`: a notification (or the node ending the client) for one client."""


@attrs.define(eq=False)
class _Waiter:
    key: str
    done: trio.Event = attrs.field(factory=trio.Event)
    reply: Mapping[str, Any] | None = None
    down: str | None = None
    client_ended: bool = False


@attrs.define(eq=False)
class NodeLink:
    """One node stream (see the module docstring). Run with `run()`; `up` is set once connected."""

    node: NodeInfo
    secret: str = attrs.field(repr=False)
    clients: dict[str, Notify] = attrs.field(factory=dict)
    """Client key → where its notifications go."""
    up: trio.Event = attrs.field(factory=trio.Event)
    down: str | None = None
    """Why the link is down (None while it may be used)."""
    ack_deadline: float = ACK_DEADLINE_SECONDS
    """How long a node may take to answer a virtual connection's `initialize`."""
    ping_interval: float = PING_INTERVAL_SECONDS
    ping_timeout: float = PING_TIMEOUT_SECONDS
    _opened: set[str] = attrs.field(factory=set)
    _generations: dict[str, int] = attrs.field(factory=dict)
    """Client key → how often the node ended it: each reopening uses a new wire key, so
    frames still in flight for the ended one never reach the new virtual connection."""
    _waiters: dict[int, _Waiter] = attrs.field(factory=dict)
    _ids: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1))
    _send: trio.MemorySendChannel[str] | None = None
    _cancel: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    _pinging: trio.CancelScope | None = None
    """The wait for the pong of the ping out (None between pings): each frame from the
    node moves its deadline, since a node that sends is not frozen."""

    @property
    def node_id(self) -> str:
        """The node this link reaches."""
        return self.node.node_id

    async def run(self) -> None:
        """Connect, then serve the stream until it drops or `close()`; never raises.

        Any failure (an unreachable or malformed endpoint, a node sending
        garbage, a bug) fails this link only: its waiting calls fail with
        `NodeDown` and the reason names the node.

        Cancellation: closes the websocket; waiting calls fail with `NodeDown`.
        """
        reason = "node stream closed"
        try:
            with self._cancel:
                reason = await self._connect_and_serve()
        except (
            OSError,
            trio.TooSlowError,
            trio_websocket.HandshakeError,
            trio_websocket.ConnectionClosed,
        ) as exc:
            reason = f"cannot keep a node stream to {self.node.endpoint}: {exc!r}"
        except ValueError as exc:  # a malformed endpoint row (see `endpoint_address`)
            reason = str(exc)
        except Exception as exc:
            log.exception("node stream to %s failed", self.node_id)
            reason = f"node stream to {self.node_id!r} at {self.node.endpoint} failed: {exc!r}"
        finally:
            self._fail(reason)

    async def _connect_and_serve(self) -> str:
        """Open the TCP stream (ours, so it is always closed), upgrade it, serve it."""
        host, port, path = endpoint_address(self.node)
        with trio.fail_after(CONNECT_TIMEOUT_SECONDS):
            stream = await trio.open_tcp_stream(host, port)
        try:
            async with trio.open_nursery() as nursery:
                with trio.fail_after(CONNECT_TIMEOUT_SECONDS):
                    websocket = await trio_websocket.wrap_client_stream(
                        nursery,
                        stream,
                        host,
                        path,
                        extra_headers=[(b"Authorization", f"Bearer {self.secret}".encode())],
                        max_message_size=MAX_LINK_FRAME,
                    )
                reason = await self._serve(websocket)
                nursery.cancel_scope.cancel()
            return reason
        except trio.TooSlowError:
            return (
                f"node {self.node_id!r} did not accept a node stream "
                f"within {CONNECT_TIMEOUT_SECONDS} s"
            )
        finally:
            await trio.aclose_forcefully(stream)

    async def _serve(self, websocket: trio_websocket.WebSocketConnection) -> str:
        send, receive = trio.open_memory_channel[str](SEND_QUEUE)
        self._send = send
        self.up.set()
        reason = "node stream closed"
        async with trio.open_nursery() as nursery:

            async def write() -> None:
                try:
                    async for text in receive:
                        await websocket.send_message(text)
                except trio_websocket.ConnectionClosed:
                    return  # the reader sees the close too

            async def keep_alive() -> None:
                nonlocal reason
                while True:
                    await trio.sleep(self.ping_interval)
                    with trio.move_on_after(self.ping_timeout) as timeout:
                        self._pinging = timeout
                        try:
                            await websocket.ping()
                        except trio_websocket.ConnectionClosed:
                            return  # the reader sees the close too
                        finally:
                            self._pinging = None
                    if timeout.cancelled_caught:
                        reason = (
                            f"node {self.node_id!r} did not answer a ping "
                            f"within {self.ping_timeout:g} s, nor send anything else"
                        )
                        self._fail(reason)  # its callers retry now, not after the close
                        nursery.cancel_scope.cancel()
                        return

            nursery.start_soon(write)
            nursery.start_soon(keep_alive)
            try:
                while True:
                    text = await websocket.get_message()
                    if self._pinging is not None:
                        self._pinging.deadline = trio.current_time() + self.ping_timeout
                    self._deliver(wire.parse(text))
            except trio_websocket.ConnectionClosed as exc:
                reason = f"node {self.node_id!r} closed its stream: {exc.reason}"
            except wire.EnvelopeError as exc:
                reason = f"node {self.node_id!r} sent garbage: {exc}"
            finally:
                nursery.cancel_scope.cancel()
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    await websocket.aclose()
        return reason

    def close(self, reason: str) -> None:
        """Drop the link (the node left the view): waiting calls fail with `NodeDown`."""
        self._fail(reason)
        self._cancel.cancel()

    def _fail(self, reason: str) -> None:
        if self.down is None:
            self.down = reason
        self.up.set()
        if self._send is not None:
            self._send.close()
        for waiter in self._waiters.values():
            waiter.down = self.down
            waiter.done.set()
        self._waiters.clear()
        for key, notify in list(self.clients.items()):
            notify(self.node_id, {"_linkDown": self.down})
            self.clients.pop(key, None)

    def _wire_key(self, key: str) -> str:
        return f"{key}~{self._generations.get(key, 0)}"

    def _deliver(self, envelope: wire.Envelope) -> None:
        key, _, generation = envelope.key.rpartition("~")
        if not generation.isdigit() or int(generation) != self._generations.get(key, 0):
            return  # a virtual connection this link already gave up
        notify = self.clients.get(key)
        if envelope.end is not None:
            self._opened.discard(key)
            self._generations[key] = int(generation) + 1
            if self._send is not None:
                # Frames already on their way reopen the ended key on the node; end it again.
                with contextlib.suppress(trio.WouldBlock, trio.ClosedResourceError):
                    self._send.send_nowait(wire.end_to_node(envelope.key))
            # The node closed this client (e.g. its session broke there): its calls retry.
            for waiting_id, waiter in list(self._waiters.items()):
                if waiter.key == key:
                    del self._waiters[waiting_id]
                    waiter.down = f"node {self.node_id!r} closed the client: {envelope.reason}"
                    waiter.client_ended = True
                    waiter.done.set()
            if notify is not None:
                notify(self.node_id, {"_clientEnded": envelope.end, "reason": envelope.reason})
            return
        for text in envelope.texts:
            try:
                message = json.loads(text)
            except ValueError as exc:
                raise wire.EnvelopeError(f"a frame for {key!r} is not JSON: {exc}") from None
            for one in message if isinstance(message, list) else [message]:
                if not isinstance(one, dict):
                    raise wire.EnvelopeError(f"a frame for {key!r} is not a JSON-RPC object")
                answered = one.get("id") if "method" not in one else None
                found = self._waiters.pop(answered, None) if isinstance(answered, int) else None
                if found is not None:
                    found.reply = one
                    found.done.set()
                elif "method" in one and notify is not None:
                    notify(self.node_id, one)

    async def _put(self, text: str) -> None:
        if self.down is not None or self._send is None:
            raise NodeDown(self.down or f"node {self.node_id!r} is not connected")
        try:
            await self._send.send(text)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise NodeDown(self.down or f"node {self.node_id!r} stream closed") from None

    async def _ensure_open(self, key: str, notify: Notify) -> str:
        """Open client `key`'s virtual connection unless it is open; return its wire key.

        Raises:
            ClientEnded: the node ended it right after answering its `initialize`
                (the wire key the call would use next was never initialized).
            NodeDown: the link dropped, or the node refused or did not answer.
        """
        self.clients[key] = notify
        if key in self._opened:
            return self._wire_key(key)
        self._opened.add(key)
        generation = self._generations.get(key, 0)
        try:
            with trio.fail_after(self.ack_deadline):
                reply = await self._request(
                    self._wire_key(key), key, "initialize", {"protocolVersion": 1}
                )
        except trio.TooSlowError:
            self._opened.discard(key)
            raise NodeDown(
                f"node {self.node_id!r} did not answer initialize within {self.ack_deadline} s"
            ) from None
        except BaseException:
            self._opened.discard(key)
            raise
        if "error" in reply:
            self._opened.discard(key)
            raise NodeDown(f"node {self.node_id!r} refused initialize: {reply['error']}")
        if self._generations.get(key, 0) != generation:
            raise ClientEnded(f"node {self.node_id!r} closed the client right after its initialize")
        return self._wire_key(key)

    async def _request(
        self, wire_key: str, key: str, method: str, params: Mapping[str, Any]
    ) -> Mapping[str, Any]:
        rpc_id = next(self._ids)
        waiter = self._waiters[rpc_id] = _Waiter(key=key)
        try:
            await self._put(
                wire.to_node(
                    wire_key,
                    dumps({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params}),
                )
            )
            await waiter.done.wait()
        finally:
            self._waiters.pop(rpc_id, None)
        if waiter.reply is None:
            if waiter.client_ended:
                raise ClientEnded(waiter.down or f"node {self.node_id!r} closed the client")
            raise NodeDown(waiter.down or f"node {self.node_id!r} went away")
        return waiter.reply

    async def call(
        self, key: str, notify: Notify, method: str, params: Mapping[str, Any]
    ) -> Mapping[str, Any]:
        """Send one request for client `key` and return the node's reply message.

        Cancellation: the call is abandoned (the node still runs it; its
        reply is dropped).

        Raises:
            NodeDown: the link is down or dropped before the reply came.
            ClientEnded: the node closed this client's virtual connection (also when
                it did so right after opening it: the call was not sent then).
        """
        await self.up.wait()
        return await self._request(await self._ensure_open(key, notify), key, method, params)

    async def notify(
        self, key: str, notify: Notify, method: str, params: Mapping[str, Any]
    ) -> None:
        """Send one notification for client `key`.

        Raises:
            NodeDown: the link is down.
        """
        await self.up.wait()
        wire_key = await self._ensure_open(key, notify)
        await self._put(
            wire.to_node(wire_key, dumps({"jsonrpc": "2.0", "method": method, "params": params}))
        )

    async def end(self, key: str) -> None:
        """Close client `key`'s virtual connection on the node (a no-op when it has none)."""
        self.clients.pop(key, None)
        if key in self._opened and self.down is None:
            self._opened.discard(key)
            with contextlib.suppress(NodeDown):  # the node's side ended with the stream
                await self._put(wire.end_to_node(self._wire_key(key)))
