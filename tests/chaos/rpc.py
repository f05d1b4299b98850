"""A small JSON-RPC 2.0 client over one websocket, for many concurrent calls (trio-websocket).

`open_rpc(url, token)` connects with `Authorization: Bearer TOKEN`, starts
a reader task, sends `initialize` and yields an `RpcConnection`. `call`
sends one request and waits for its own answer while other calls are in
flight on the same socket; notifications go, in arrival order, to the
`on_notification(method, params)` callback given at connect time (run in
the reader task, so it must not block). When the socket closes, every
waiting call raises `RpcClosed`.
"""

from __future__ import annotations

import itertools
import json
import urllib.parse
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio
import trio_websocket

Notification = Callable[[str, Any], None]

CLOSE_SECONDS = 1.0
"""How long leaving `open_rpc` waits for the websocket's close handshake."""


class RpcError(Exception):
    """The server answered a call with a JSON-RPC error."""

    def __init__(self, method: str, error: dict[str, Any]) -> None:
        super().__init__(f"{method} failed: {error}")
        self.method = method
        self.code = error.get("code")
        self.error = error


class RpcClosed(Exception):
    """The websocket closed while a call waited for its answer."""


@attrs.define(eq=False)
class _Slot:
    method: str
    done: trio.Event = attrs.field(factory=trio.Event)
    answer: dict[str, Any] | None = None


@attrs.define(eq=False)
class RpcConnection:
    """One websocket; see the module docstring."""

    ws: trio_websocket.WebSocketConnection
    on_notification: Notification
    _ids: itertools.count[int] = attrs.field(factory=itertools.count)
    _pending: dict[int, _Slot] = attrs.field(factory=dict)
    closed: bool = False
    close_reason: str | None = None
    """Why the peer closed the socket (its close code and reason), once it did."""

    async def call(self, method: str, params: Any = None) -> Any:
        """Send `method` and wait for its result.

        Raises:
            RpcError: the server answered with an error.
            RpcClosed: the socket closed first.
        """
        id = next(self._ids)
        slot = _Slot(method)
        self._pending[id] = slot
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
        if params is not None:
            message["params"] = params
        try:
            await self.ws.send_message(json.dumps(message))
            await slot.done.wait()
        except trio_websocket.ConnectionClosed as exc:
            raise RpcClosed(f"{method}: the socket closed ({exc})") from exc
        finally:
            self._pending.pop(id, None)
        if slot.answer is None:
            raise RpcClosed(f"{method}: the socket closed before the answer")
        if "error" in slot.answer:
            raise RpcError(method, slot.answer["error"])
        return slot.answer.get("result")

    async def pump(self) -> None:
        """Read frames until the socket closes, then fail every waiting call."""
        try:
            while True:
                value = json.loads(await self.ws.get_message())
                for message in value if isinstance(value, list) else [value]:
                    if "method" in message:
                        self.on_notification(message["method"], message.get("params"))
                    else:
                        slot = self._pending.get(message.get("id"))
                        if slot is not None:
                            slot.answer = message
                            slot.done.set()
        except trio_websocket.ConnectionClosed as exc:
            self.close_reason = str(exc.reason)
        finally:
            self.closed = True
            for slot in self._pending.values():
                slot.done.set()


def _ignore(method: str, params: Any) -> None:
    """Drop a notification (a connection that only makes calls)."""


@asynccontextmanager
async def open_rpc(
    url: str, token: str, on_notification: Notification = _ignore
) -> AsyncIterator[RpcConnection]:
    """A connected, initialized `RpcConnection`; closed (and its reader ended) on the way out.

    An exception from the body leaves as it is, not wrapped in the reader's nursery group.
    """
    failure: BaseException | None = None
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None and parts.port is not None, url
    # The TCP stream is ours, so it is closed even when the server went first (the test
    # stops the gateway before its clients leave).
    stream = await trio.open_tcp_stream(parts.hostname, parts.port)
    try:
        async with trio.open_nursery() as nursery:
            ws = await trio_websocket.wrap_client_stream(
                nursery,
                stream,
                parts.hostname,
                parts.path or "/",
                extra_headers=[(b"Authorization", f"Bearer {token}".encode())],
                message_queue_size=256,
                max_message_size=16 * 1024 * 1024,
            )
            connection = RpcConnection(ws=ws, on_notification=on_notification)
            nursery.start_soon(connection.pump)
            await connection.call("initialize", {"protocolVersion": 1})
            try:
                yield connection
            except BaseException as exc:
                failure = exc
            with trio.move_on_after(CLOSE_SECONDS):
                await ws.aclose()
            nursery.cancel_scope.cancel()
    finally:
        await trio.aclose_forcefully(stream)
    if failure is not None:
        raise failure
