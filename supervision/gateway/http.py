"""The gateway's one port: a small HTTP/1.1 front that hands websocket upgrades to trio-websocket.

Why a front instead of trio-websocket's own server: trio-websocket (via
wsproto) only speaks the upgrade handshake, so a plain `GET /healthz` or
`GET /` would be refused as a bad handshake. The front reads the request
head with h11 (the HTTP/1.1 parser wsproto itself builds on), bounded in
size and time; a `GET /acp` that asks to upgrade is passed on, bytes
replayed untouched, to trio-websocket (`wrap_server_stream`), which does
the real handshake; everything else is answered here: `/healthz`, the
dashboard page and the files of a static directory, then the connection
is closed. So one listener serves the websocket, the health check and the
dashboard, and the websocket handling stays trio-websocket's.
"""

from __future__ import annotations

import mimetypes
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import attrs
import h11
import trio

MAX_HEAD_BYTES = 16 * 1024
"""Largest request head (request line and headers) read before refusing with 431."""

HEAD_TIMEOUT_SECONDS = 10.0
"""How long a client may take to send its request head."""

ACP_PATH = "/acp"

PLACEHOLDER_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>harness gateway</title></head>
<body>
<h1>harness gateway</h1>
<p>The dashboard is not part of this release yet; it comes later.
This page is a placeholder and shows nothing live.</p>
<p>Supervisors connect over the websocket at <code>{ws_url}</code>
(ACP v1 with the <code>_harness/*</code> extensions); <code>GET /healthz</code> answers 200.</p>
</body></html>
"""


@attrs.frozen(kw_only=True)
class HttpRequest:
    """The parsed head of one request: method, target path, headers (lower-cased names)."""

    method: str
    path: str
    headers: tuple[tuple[bytes, bytes], ...]

    def wants_websocket(self) -> bool:
        """True for a websocket upgrade request."""
        upgrade = dict(self.headers).get(b"upgrade", b"")
        return upgrade.lower() == b"websocket"


class ReplayStream(trio.abc.Stream):
    """A stream that first returns bytes already read from `inner`, then reads `inner`."""

    def __init__(self, inner: trio.abc.Stream, already_read: bytes) -> None:
        self._inner = inner
        self._buffer = already_read

    @property
    def socket(self) -> trio.socket.SocketType | None:
        """The TCP socket under the inner stream (sends bypass nothing here), if it is one."""
        return self._inner.socket if isinstance(self._inner, trio.SocketStream) else None

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """Buffered bytes first, then the inner stream's."""
        if self._buffer:
            await trio.lowlevel.checkpoint()
            size = len(self._buffer) if max_bytes is None else max_bytes
            data, self._buffer = self._buffer[:size], self._buffer[size:]
            return bytes(data)
        return bytes(await self._inner.receive_some(max_bytes))

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Send on the inner stream."""
        await self._inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        """As the inner stream."""
        await self._inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        """Close the inner stream."""
        await self._inner.aclose()


WebSocketHandler = Callable[[HttpRequest, trio.abc.Stream], Awaitable[None]]
"""Takes over a websocket upgrade: the parsed head and a stream replaying it."""


@attrs.frozen(kw_only=True)
class HttpFront:
    """Routes one TCP connection: websocket upgrades on `/acp` to `websocket`, the rest here.

    Attributes:
        websocket: the handler that takes over an upgrade.
        ws_url: the websocket URL shown on the placeholder page.
        static_dir: a directory whose files are served (`/` is its
            `index.html`); without one, or without that file, `/` is the
            placeholder page.
    """

    websocket: WebSocketHandler
    ws_url: str
    static_dir: Path | None = None

    async def handle(self, stream: trio.abc.Stream) -> None:
        """Serve one connection; never raises for client misbehaviour (it just closes).

        Cancellation: closes the connection.
        """
        async with stream:
            head = await _read_head(stream)
            if head is None:
                return
            request, raw = head
            if request.path == ACP_PATH and request.wants_websocket():
                await self.websocket(request, ReplayStream(stream, raw))
                return
            status, content_type, body = self._route(request)
            if request.method == "HEAD":
                body = b""
            await _respond(stream, status, content_type, body)

    def _route(self, request: HttpRequest) -> tuple[int, str, bytes]:
        if request.method not in ("GET", "HEAD"):
            return 405, "text/plain", f"method {request.method} not allowed\n".encode()
        if request.path == "/healthz":
            return 200, "text/plain", b"ok\n"
        if request.path == ACP_PATH:
            return 426, "text/plain", b"upgrade to a websocket to speak ACP here\n"
        found = self._static_file("index.html" if request.path == "/" else request.path[1:])
        if found is not None:
            content_type = mimetypes.guess_type(found.name)[0] or "application/octet-stream"
            return 200, content_type, found.read_bytes()
        if request.path == "/":
            page = PLACEHOLDER_PAGE.format(ws_url=self.ws_url)
            return 200, "text/html; charset=utf-8", page.encode()
        return 404, "text/plain", f"{request.path} not found\n".encode()

    def _static_file(self, relative: str) -> Path | None:
        if self.static_dir is None or not relative:
            return None
        root = self.static_dir.resolve()
        candidate = (root / relative).resolve()
        if candidate != root and root not in candidate.parents:
            return None  # a path escaping the directory is simply not found
        return candidate if candidate.is_file() else None


async def _read_head(stream: trio.abc.Stream) -> tuple[HttpRequest, bytes] | None:
    """The request head and every byte read so far, or None after answering a bad request."""
    connection = h11.Connection(h11.SERVER)
    raw = bytearray()
    with trio.move_on_after(HEAD_TIMEOUT_SECONDS):
        while True:
            try:
                event = connection.next_event()
            except h11.RemoteProtocolError as exc:
                await _respond(stream, 400, "text/plain", f"bad request: {exc}\n".encode())
                return None
            if isinstance(event, h11.Request):
                target = event.target.decode("latin-1")
                return (
                    HttpRequest(
                        method=event.method.decode("latin-1"),
                        path=target.split("?", 1)[0],
                        headers=tuple((bytes(k), bytes(v)) for k, v in event.headers),
                    ),
                    bytes(raw),
                )
            if event is h11.NEED_DATA:
                if len(raw) > MAX_HEAD_BYTES:
                    await _respond(stream, 431, "text/plain", b"request head too large\n")
                    return None
                try:
                    data = await stream.receive_some(4096)
                except trio.BrokenResourceError:
                    return None
                if not data:
                    return None
                raw.extend(data)
                connection.receive_data(bytes(data))
            else:
                return None
    return None


async def _respond(stream: trio.abc.Stream, status: int, content_type: str, body: bytes) -> None:
    headers: Sequence[tuple[str, str]] = (
        ("content-type", content_type),
        ("content-length", str(len(body))),
        ("connection", "close"),
        ("cache-control", "no-store"),
    )
    head = f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers) + "\r\n"
    try:
        with trio.move_on_after(HEAD_TIMEOUT_SECONDS):
            await stream.send_all(head.encode("latin-1") + body)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    426: "Upgrade Required",
    431: "Request Header Fields Too Large",
}
