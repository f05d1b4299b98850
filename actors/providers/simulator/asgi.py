"""The simulator as an ASGI 3 application.

`SimulatorApp` reads each request (keeping at most `max_body_bytes + 1`
bytes), hands it to the engine and writes the answer. Meanwhile it watches
for `http.disconnect` and abandons the request as soon as the client goes
away (while the engine holds the headers back, or mid-stream), so the engine
records the disconnect.

Resets: an engine reset after the headers ends the app without finishing
the body, so the server closes the connection mid-body (the client sees an
incomplete chunked body). A reset *before* the headers cannot be expressed
in ASGI: the app ends without a response, and the server does what it does
then (Hypercorn answers `500` with `connection: close`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextlib import aclosing
from typing import Any, TypeAlias

import anyio

from actors.providers.simulator.engine import SimulatorEngine
from actors.providers.simulator.exchange import ConnectionReset, SimRequest

ASGIMessage: TypeAlias = Mapping[str, Any]
Receive: TypeAlias = Callable[[], Awaitable[ASGIMessage]]
Send: TypeAlias = Callable[[dict[str, Any]], Awaitable[None]]


class SimulatorApp:
    """An ASGI application over a `SimulatorEngine` (HTTP and lifespan scopes).

    Args:
        engine: The engine answering requests.
    """

    def __init__(self, engine: SimulatorEngine) -> None:
        self.engine = engine

    async def __call__(self, scope: ASGIMessage, receive: Receive, send: Send) -> None:
        """Serve one ASGI scope.

        Cancellation: cancelling the app abandons the request; a stream in
        progress is closed and recorded as a disconnect.
        """
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        body = await self._read_body(receive)
        request = SimRequest(
            method=str(scope["method"]).upper(),
            path=str(scope["path"]),
            headers={
                name.decode("latin-1").lower(): value.decode("latin-1")
                for name, value in scope["headers"]
            },
            body=body,
        )
        async with anyio.create_task_group() as group:
            group.start_soon(_cancel_on_disconnect, receive, group.cancel_scope)
            await self._answer(request, send)
            group.cancel_scope.cancel()

    async def _answer(self, request: SimRequest, send: Send) -> None:
        try:
            response = await self.engine.handle(request)
        except ConnectionReset:
            return
        await send(
            {
                "type": "http.response.start",
                "status": response.status,
                "headers": [
                    (name.encode("latin-1"), value.encode("latin-1"))
                    for name, value in response.headers
                ],
            }
        )
        if response.stream is None:
            await send({"type": "http.response.body", "body": response.body})
            return
        async with aclosing(response.stream) as pieces:
            try:
                async for piece in pieces:
                    await send({"type": "http.response.body", "body": piece, "more_body": True})
            except ConnectionReset:
                return  # without the last body message: the server drops the connection
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _read_body(self, receive: Receive) -> bytes:
        limit = self.engine.config.max_body_bytes + 1
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            if len(body) < limit:
                body += message.get("body", b"")[: limit - len(body)]
            if not message.get("more_body", False):
                break
        return bytes(body)


async def _cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
