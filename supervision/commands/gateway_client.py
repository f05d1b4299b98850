"""A small JSON-RPC client of the gateway (§9) over trio-websocket, for `harness watch`.

One reader task owns the socket's receiving side: replies wake the caller
waiting on that request id, notifications go into a bounded channel
(capacity `NOTIFICATION_BUFFER`; when it is full the reader blocks, so a slow
consumer slows only this connection, and the gateway's cursors make the
server side wait nothing for it).
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    HandshakeError,
    WebSocketConnection,
    open_websocket_url,
)

from supervision.commands.common import EXIT_USAGE, CommandError, websocket_url

NOTIFICATION_BUFFER = 1024
"""Notifications waiting for the consumer before the reader blocks."""
MAX_MESSAGE_BYTES = 1 << 20
"""The gateway's frame limit; larger frames close the connection."""


class GatewayCallError(CommandError):
    """The gateway answered a request with a JSON-RPC error."""

    def __init__(self, method: str, error: dict[str, Any]) -> None:
        super().__init__(f"{method}: {error.get('message')} (code {error.get('code')})")
        self.error = error


@attrs.define(eq=False)
class _Waiter:
    done: trio.Event = attrs.field(factory=trio.Event)
    reply: dict[str, Any] | None = None


@attrs.define(eq=False)
class GatewayClient:
    """A connected, initialized client; get one with `open_gateway_client`."""

    socket: WebSocketConnection
    notifications: trio.MemoryReceiveChannel[dict[str, Any]]
    initialize: dict[str, Any] = attrs.field(factory=dict)
    _send: trio.MemorySendChannel[dict[str, Any]] | None = None
    _ids: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1))
    _waiters: dict[int, _Waiter] = attrs.field(factory=dict)

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Send a request and return its result.

        Cancellation: cancellable; a late reply is then discarded.

        Raises:
            GatewayCallError: the gateway answered with an error.
            CommandError: the connection closed first.
        """
        request_id = next(self._ids)
        waiter = _Waiter()
        self._waiters[request_id] = waiter
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}}
        try:
            await self.socket.send_message(json.dumps(message))
            await waiter.done.wait()
        except ConnectionClosed:
            raise CommandError(f"the gateway closed the connection during {method}") from None
        finally:
            self._waiters.pop(request_id, None)
        reply = waiter.reply
        if reply is None:
            raise CommandError(f"the gateway closed the connection during {method}")
        if "error" in reply:
            raise GatewayCallError(method, reply["error"])
        return reply.get("result")

    async def _read(self) -> None:
        assert self._send is not None
        async with self._send:
            try:
                while True:
                    text = await self.socket.get_message()
                    message = json.loads(text)
                    if "method" not in message:
                        waiter = self._waiters.get(message.get("id"))
                        if waiter is not None:
                            waiter.reply = message
                            waiter.done.set()
                    else:
                        await self._send.send(message)
            except ConnectionClosed:
                pass
            finally:
                for waiter in self._waiters.values():
                    waiter.done.set()


@asynccontextmanager
async def open_gateway_client(url: str, token: str) -> AsyncIterator[GatewayClient]:
    """Connect to the gateway at `url` with `token`, `initialize`, and yield the client.

    Leaving the context closes the socket and stops the reader.

    Raises:
        CommandError: the gateway is unreachable or refused the token (the
            message says which and what to do).
    """
    try:
        websocket_url(url)
    except argparse.ArgumentTypeError as exc:
        raise CommandError(f"--url: {exc}", EXIT_USAGE) from None
    headers = [(b"authorization", f"Bearer {token}".encode())]
    try:
        async with open_websocket_url(
            url,
            subprotocols=["harness.v1"],
            extra_headers=headers,
            max_message_size=MAX_MESSAGE_BYTES,
        ) as socket:
            send, receive = trio.open_memory_channel[dict[str, Any]](NOTIFICATION_BUFFER)
            client = GatewayClient(socket=socket, notifications=receive, send=send)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(client._read)
                client.initialize = await client.call(
                    "initialize",
                    {
                        "protocolVersion": 1,
                        "clientCapabilities": {},
                        "clientInfo": {"name": "harness-watch", "version": "1"},
                    },
                )
                yield client
                nursery.cancel_scope.cancel()
    except ConnectionRejected as exc:
        if exc.status_code == 401:
            raise CommandError(
                f"the gateway at {url} refused the token (HTTP 401); pass the token "
                "`harness serve` printed with --token or HARNESS_TOKEN"
            ) from None
        raise CommandError(
            f"the gateway at {url} refused the connection (HTTP {exc.status_code})"
        ) from None
    except HandshakeError as exc:
        cause = exc.__cause__ or exc.__context__ or exc
        raise CommandError(
            f"cannot connect to the gateway at {url} ({cause}); is `harness serve` running there?"
        ) from None
