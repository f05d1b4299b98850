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

    async def send_batch(self, texts: list[str]) -> None:
        """Send several messages with as few writes as possible. Raises `TransportClosed`."""
        ...

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


class CoalescingStream(trio.abc.Stream):
    """A stream whose writes can be gathered: inside `gather()`, `send_all` only buffers.

    trio-websocket writes each message with its own `send_all` (one system
    call per frame); gathering a batch of frames and writing it with one
    `flush()` cuts the gateway's fan-out cost several times over. Outside
    `gather()` writes go straight through (handshake, pongs, close frames).
    """

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self._gathering = False
        self._pending: list[bytes] = []

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Buffer while gathering, else send."""
        if self._gathering:
            self._pending.append(bytes(data))
            await trio.lowlevel.checkpoint()
            return
        await self.inner.send_all(data)

    def gather(self) -> None:
        """Start buffering writes."""
        self._gathering = True

    async def flush(self) -> None:
        """Stop buffering and write everything buffered in one `send_all`."""
        self._gathering = False
        pending, self._pending = self._pending, []
        if pending:
            await self.inner.send_all(b"".join(pending))

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """Read from the inner stream."""
        return bytes(await self.inner.receive_some(max_bytes))

    async def wait_send_all_might_not_block(self) -> None:
        """As the inner stream."""
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        """Close the inner stream."""
        await self.inner.aclose()


@attrs.define(eq=False)
class WebSocketTransport:
    """A trio-websocket connection over a stream the gateway owns (so it can abort it)."""

    connection: trio_websocket.WebSocketConnection
    stream: CoalescingStream

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

    async def send_batch(self, texts: list[str]) -> None:
        """Send text frames gathered into one write."""
        self.stream.gather()
        try:
            for text in texts:
                await self.send(text)
        finally:
            await self.stream.flush()

    async def close(self, code: int, reason: str) -> None:
        """Send a close frame with `code` and wait for the peer's (callers bound the wait)."""
        await self.connection.aclose(code=code, reason=reason[:120])

    async def abort(self) -> None:
        """Close the TCP stream under the websocket."""
        await trio.aclose_forcefully(self.stream)
