"""Message transports a connection runs over: a websocket, or newline-delimited stdio.

A transport moves whole text messages. `receive` returns the next message
(bytes for a binary websocket frame) and raises `TransportClosed` once the
peer is gone; `send` writes one message; `close(code, reason)` ends it
politely where the transport has close codes, and `abort` drops it at once.
"""

from __future__ import annotations

from typing import Protocol

import attrs
import trio
import trio_websocket


class TransportClosed(Exception):
    """The peer closed the transport (or it broke); `code` is the close code when known."""

    def __init__(self, code: int | None, reason: str = "") -> None:
        super().__init__(f"transport closed ({code}): {reason}")
        self.code = code
        self.reason = reason


class Transport(Protocol):
    """Whole-message I/O for one connection."""

    async def receive(self) -> str | bytes:
        """The next message. Raises `TransportClosed`."""
        ...

    async def send(self, text: str) -> None:
        """Send one message. Raises `TransportClosed`."""
        ...

    async def close(self, code: int, reason: str) -> None:
        """Close politely (a close frame where the transport has one)."""
        ...

    async def abort(self) -> None:
        """Drop the transport at once, without a close handshake."""
        ...


@attrs.define(eq=False)
class WebSocketTransport:
    """A trio-websocket connection over a stream the gateway owns (so it can abort it)."""

    connection: trio_websocket.WebSocketConnection
    stream: trio.abc.Stream

    async def receive(self) -> str | bytes:
        """The next message; `TransportClosed` with the peer's close code."""
        try:
            message: str | bytes = await self.connection.get_message()
        except trio_websocket.ConnectionClosed as exc:
            reason = exc.reason
            raise TransportClosed(
                None if reason is None else reason.code,
                "" if reason is None or reason.reason is None else reason.reason,
            ) from None
        return message

    async def send(self, text: str) -> None:
        """Send one text frame."""
        try:
            await self.connection.send_message(text)
        except (trio_websocket.ConnectionClosed, trio.BrokenResourceError) as exc:
            raise TransportClosed(None, str(exc)) from None

    async def close(self, code: int, reason: str) -> None:
        """Send a close frame with `code` and wait for the peer's (callers bound the wait)."""
        await self.connection.aclose(code=code, reason=reason[:120])

    async def abort(self) -> None:
        """Close the TCP stream under the websocket."""
        await trio.aclose_forcefully(self.stream)
