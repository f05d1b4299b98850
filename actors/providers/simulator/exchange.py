"""What a front end and the engine exchange: one request in, a response or a reset out.

Front ends (`simulator_transport`, `SimulatorApp`) turn their own requests
into `SimRequest`, play back the `SimResponse` (iterating and closing its
`SimStream`), and turn `ConnectionReset` into a dropped connection.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping

import attrs


@attrs.frozen(kw_only=True)
class SimRequest:
    """One HTTP request as the engine sees it.

    Attributes:
        method: The HTTP method, upper case.
        path: The URL path, without the query.
        headers: Header values by lower-case name.
        body: The request body.
    """

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes


@attrs.frozen(kw_only=True)
class SimResponse:
    """What the engine answers: a status, headers, and a body or an event stream.

    `stream`, when set, replaces `body`; see `SimStream`.
    """

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes = b""
    stream: SimStream | None = None


class SimStream:
    """An event-stream body, written piece by piece.

    Iterating it paces the events (on the event loop's clock) and raises
    `ConnectionReset` where the connection must be dropped. Front ends must
    `aclose()` it when they stop iterating early (the client went away), so
    the engine records the disconnect, even if iteration never started.
    """

    def __init__(self, pieces: AsyncGenerator[bytes, None], on_abandon: Callable[[], None]) -> None:
        self._pieces = pieces
        self._on_abandon = on_abandon

    def __aiter__(self) -> SimStream:
        return self

    async def __anext__(self) -> bytes:
        """The next piece of the body.

        Raises:
            StopAsyncIteration: the body is complete.
            ConnectionReset: the fault drops the connection here.
        """
        return await anext(self._pieces)

    async def aclose(self) -> None:
        """Stop the stream; a stream not yet complete is recorded as a disconnect."""
        await self._pieces.aclose()
        self._on_abandon()


class ConnectionReset(Exception):
    """Raised by the engine where a front end must drop the connection."""
