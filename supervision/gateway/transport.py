"""Message transports a connection runs over: a websocket, or newline-delimited stdio.

A transport moves whole text messages. `receive` returns the next message
(bytes for a binary websocket frame) and raises `TransportClosed` once the
peer is gone; `send_batch` writes messages; `close(code, reason)` ends it
politely where the transport has close codes, and `abort` drops it at once.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
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


@attrs.frozen
class Framing:
    """How a transport delimits outgoing messages: `header(length)`, the payload, `trailer`.

    Frames are built once, where the payload is made (the fan-out builds
    each log frame with one join), and written as they are.
    """

    header: Callable[[int], bytes]
    trailer: bytes

    def frame(self, payload: bytes) -> bytes:
        """`payload` (UTF-8) as one outgoing frame."""
        return b"".join((self.header(len(payload)), payload, self.trailer))


class Transport(Protocol):
    """Whole-message I/O for one connection; outgoing messages are frames made with `framing`."""

    @property
    def framing(self) -> Framing:
        """How outgoing messages are framed for this transport."""
        ...

    async def send_batch(self, frames: list[bytes]) -> None:
        """Send several frames with one write. Raises `TransportClosed`."""
        ...

    async def receive(self) -> str | bytes:
        """The next message. Raises `TransportClosed`."""
        ...

    async def close(self, code: int, reason: str) -> None:
        """Close politely (a close frame where the transport has one)."""
        ...

    async def abort(self) -> None:
        """Drop the transport at once, without a close handshake."""
        ...


def text_frame_header(length: int) -> bytes:
    """The header of an unmasked, final text frame of `length` payload bytes (RFC 6455 §5.2).

    A server's frames are never masked, and the gateway negotiates no
    extension, so this header and the payload are the whole frame.
    """
    if length < 126:
        return bytes((0x81, length))
    if length < 65536:
        return struct.pack("!BBH", 0x81, 126, length)
    return struct.pack("!BBQ", 0x81, 127, length)


WEBSOCKET_FRAMING = Framing(header=text_frame_header, trailer=b"")
"""Unmasked text frames."""


class DirectSend(Protocol):
    """A transport the fan-out may write to synchronously, at the end of its round.

    `can_send_now()` is true when nothing else is writing and the transport
    is open; then `send_now(data)` takes all of `data` without blocking or
    yielding: what the socket accepts at once is written, and the rest (the
    *tail*) is written first by the transport's next write of any kind
    (`send_batch`, or a ping, pong or close frame), so bytes never
    interleave. It returns True when nothing is left.
    """

    def can_send_now(self) -> bool:
        """True when `send_now` may be called."""
        ...

    def send_now(self, data: bytes) -> bool:
        """Write `data` now as far as the socket takes it; True when all of it was written."""
        ...


class SharedStream(trio.abc.Stream):
    """The TCP stream under a websocket, shared by trio-websocket and the gateway's writer.

    trio-websocket writes its handshake, pongs, pings and close frames
    through `send_all`; the gateway's writer writes whole batches of text
    frames with `send_frames`. A lock serialises the two, so frames never
    interleave, and `send_frames` writes nothing once the websocket started
    closing (`closed` says so), so no data frame follows a close frame.

    With `socket` (the TCP socket under `inner`), `write_now` writes without
    a task switch or a system call beyond the write itself, while no other
    write holds the stream and no tail waits: the part the socket's buffer does not take at
    once is kept as the stream's *tail*, which every later write (either
    kind) sends first, under the lock, so a frame cut by a full buffer is
    never interleaved with another.

    A write that fails or is cancelled partway (a ping under the keep-alive's
    timeout, a write past its deadline) may have left part of a frame on the
    wire, so the stream is *broken*: every later write raises
    `trio.BrokenResourceError` and `write_now` is refused; the connection can
    only be aborted.
    """

    def __init__(
        self, inner: trio.abc.Stream, socket: trio.socket.SocketType | None = None
    ) -> None:
        self.inner = inner
        self._lock = trio.StrictFIFOLock()
        self._socket = socket
        self._tail = b""
        self._closing = False
        self._broken = False

    @property
    def writable_now(self) -> bool:
        """True when `write_now` may write: a socket, no write in progress, no tail (so a stalled
        socket's bytes wait in the gateway's bounded outbox, not here), not closing."""
        return (
            self._socket is not None
            and not self._tail
            and not self._lock.locked()
            and not self._closing
            and not self._broken
        )

    @property
    def has_tail(self) -> bool:
        """True while part of a `write_now` waits for the next write."""
        return bool(self._tail)

    def write_now(self, data: bytes) -> bool:
        """Write `data` without waiting, as far as the socket takes it; the rest is the tail.

        Only while `writable_now` (the caller has just checked it). Returns
        True when all of `data` was written. A socket error writes nothing
        here: the data becomes the tail, and the next write reports the error.
        """
        socket = self._socket
        assert socket is not None and not self._tail  # a second tail would lose the first
        try:
            written = os.write(socket.fileno(), data)
        except OSError:  # a full buffer, or a broken connection the next write reports
            written = 0
        if written < len(data):
            self._tail = data[written:]
            return False
        return True

    async def _write(self, data: bytes | bytearray | memoryview) -> None:
        # Under the lock. A write cut partway leaves the peer part of a frame: nothing may
        # follow it.
        self._refuse_if_broken()
        try:
            await self.inner.send_all(data)
        except BaseException:
            self._broken = True
            raise

    def _refuse_if_broken(self) -> None:
        if self._broken:
            raise trio.BrokenResourceError("an earlier write was cut partway")

    async def _write_tail(self) -> None:
        # Under the lock: the rest of a `write_now`, before anything else.
        tail, self._tail = self._tail, b""
        if tail:
            await self._write(tail)

    async def _acquire(self) -> None:
        # Uncontended (the usual case) without the scheduler pass `acquire` costs.
        try:
            self._lock.acquire_nowait()
        except trio.WouldBlock:
            await self._lock.acquire()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Write `data` after any write in progress.

        Raises:
            trio.BrokenResourceError: the stream is broken (see the class docstring), or broke.
        """
        await self._acquire()
        try:
            await self._write_tail()
            await self._write(data)
        finally:
            self._lock.release()

    async def send_frames(self, data: bytes, closed: Callable[[], bool]) -> bool:
        """Write the tail, then `data` unless `closed()` is true once the lock is held; False if
        `data` was not written (empty `data` writes only the tail).

        Cancellation: cancellable while waiting for the lock and while writing
        (a cancelled write may have written part of `data`: the stream is then broken).

        Raises:
            trio.BrokenResourceError: the stream is broken (see the class docstring), or broke.
        """
        await self._acquire()
        try:
            await self._write_tail()
            if closed():
                return False
            if data:
                await self._write(data)
            else:
                self._refuse_if_broken()
            return True
        finally:
            self._lock.release()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """Read from the inner stream."""
        return bytes(await self.inner.receive_some(max_bytes))

    async def wait_send_all_might_not_block(self) -> None:
        """As the inner stream."""
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        """Close the inner stream (a tail still waiting is dropped)."""
        self._closing = True
        self._tail = b""
        await self.inner.aclose()


@attrs.define(eq=False)
class WebSocketTransport:
    """A trio-websocket connection over a stream the gateway owns (so it can abort it).

    Incoming messages, pings, pongs and the close handshake go through
    trio-websocket; outgoing text messages are framed here and written a
    whole batch per system call (one `send_message` per frame costs several
    times the whole fan-out of an event).
    """

    connection: trio_websocket.WebSocketConnection
    stream: SharedStream
    framing: Framing = WEBSOCKET_FRAMING

    async def receive(self) -> str | bytes:
        """The next message; `TransportClosed` with the peer's close code."""
        try:
            message: str | bytes = await self.connection.get_message()
        except trio_websocket.ConnectionClosed as exc:
            raise _closed(exc) from None
        return message

    def can_send_now(self) -> bool:
        """True while the websocket is open and nothing else writes (see `DirectSend`)."""
        return self.connection.closed is None and self.stream.writable_now

    def send_now(self, data: bytes) -> bool:
        """Write text frames now, the rest when the socket drains (see `DirectSend`)."""
        return self.stream.write_now(data)

    async def send_batch(self, frames: list[bytes]) -> None:
        """Send text frames (made with `framing`) with one write, after the tail of a
        `send_now` (an empty list writes only that)."""
        try:
            written = await self.stream.send_frames(
                b"".join(frames), lambda: self.connection.closed is not None
            )
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise TransportClosed(None, str(exc)) from None
        if not written:
            raise _closed(trio_websocket.ConnectionClosed(self.connection.closed))

    async def ping(self) -> None:
        """Send a ping and return when its pong arrived. Raises `TransportClosed`."""
        try:
            await self.connection.ping()
        except trio_websocket.ConnectionClosed as exc:
            raise _closed(exc) from None

    async def close(self, code: int, reason: str) -> None:
        """Send a close frame with `code` and wait for the peer's (callers bound the wait)."""
        await self.connection.aclose(code=code, reason=reason[:120])

    async def abort(self) -> None:
        """Close the TCP stream under the websocket."""
        await trio.aclose_forcefully(self.stream)


def _closed(exc: trio_websocket.ConnectionClosed) -> TransportClosed:
    reason = exc.reason
    return TransportClosed(
        None if reason is None else reason.code,
        "" if reason is None or reason.reason is None else reason.reason,
    )
