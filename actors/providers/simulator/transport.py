"""The simulator behind `httpx.MockTransport`: socket-free tests of the real adapter.

The engine's resets become the exceptions httpx raises for a real server
that drops the connection (`httpx.RemoteProtocolError`), and closing a
response closes the engine's stream, so the engine records the disconnect
at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx

from actors.providers.simulator.engine import SimulatorEngine
from actors.providers.simulator.exchange import ConnectionReset, SimRequest, SimStream


def simulator_transport(engine: SimulatorEngine) -> httpx.MockTransport:
    """An httpx transport answering every request with `engine`.

    Use it as `httpx.AsyncClient(transport=simulator_transport(engine))`;
    requests never touch a socket, and the engine's pacing runs on Trio's
    clock, so `autojump_clock` tests of timeouts take no real time.
    """

    async def handler(request: httpx.Request) -> httpx.Response:
        sim_request = SimRequest(
            method=request.method,
            path=request.url.path,
            headers={name.lower(): value for name, value in request.headers.items()},
            body=request.content,
        )
        try:
            response = await engine.handle(sim_request)
        except ConnectionReset as exc:
            raise httpx.RemoteProtocolError(
                f"Server disconnected without sending a response ({exc})", request=request
            ) from exc
        if response.stream is None:
            return httpx.Response(
                response.status, headers=list(response.headers), content=response.body
            )
        return httpx.Response(
            response.status,
            headers=list(response.headers),
            stream=_EngineStream(response.stream, request),
        )

    return httpx.MockTransport(handler)


class _EngineStream(httpx.AsyncByteStream):
    def __init__(self, chunks: SimStream, request: httpx.Request) -> None:
        self._chunks = chunks
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for piece in self._chunks:
                yield piece
        except ConnectionReset as exc:
            raise httpx.RemoteProtocolError(
                f"peer closed connection without sending complete message body ({exc})",
                request=self._request,
            ) from exc

    async def aclose(self) -> None:
        await self._chunks.aclose()
