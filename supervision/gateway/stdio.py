"""Newline-delimited JSON-RPC over a pair of byte streams (ACP's stdio transport).

One message per line, UTF-8. A line longer than `MAX_LINE` bytes ends the
transport (the peer broke the framing); EOF ends it normally. There are no
close codes: `close` and `abort` only stop reading.
"""

from __future__ import annotations

import attrs
import trio

from supervision.gateway.transport import Framing, TransportClosed

MAX_LINE = 1024 * 1024 + 1
"""Longest line read (a frame of at most 1 MiB plus its newline)."""


def _no_header(length: int) -> bytes:
    return b""


LINE_FRAMING = Framing(header=_no_header, trailer=b"\n")
"""One message per line."""


@attrs.define(eq=False)
class StdioTransport:
    """Lines from `stdin`, lines to `stdout`."""

    stdin: trio.abc.ReceiveStream
    stdout: trio.abc.SendStream
    framing: Framing = LINE_FRAMING
    _buffer: bytearray = attrs.field(factory=bytearray)
    _closed: bool = False

    async def receive(self) -> str | bytes:
        """The next line (without its newline); `TransportClosed(1000)` at EOF."""
        while True:
            if self._closed:
                raise TransportClosed(1000, "closed")
            end = self._buffer.find(b"\n")
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                try:
                    return line.decode("utf-8")
                except UnicodeDecodeError:
                    return line  # not text: answered like a binary frame
            if len(self._buffer) > MAX_LINE:
                raise TransportClosed(1009, f"a line of more than {MAX_LINE} bytes")
            data = await self.stdin.receive_some(65536)
            if not data:
                raise TransportClosed(1000, "end of input")
            self._buffer.extend(data)

    async def send_batch(self, frames: list[bytes]) -> None:
        """Write several lines (made with `framing`) at once."""
        try:
            await self.stdout.send_all(b"".join(frames))
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise TransportClosed(None, str(exc)) from None

    async def close(self, code: int, reason: str) -> None:
        """Stop reading (stdio has no close frame)."""
        self._closed = True
        await trio.lowlevel.checkpoint()

    async def abort(self) -> None:
        """Stop reading."""
        self._closed = True
        await trio.lowlevel.checkpoint()
