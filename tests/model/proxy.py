"""A loopback proxy that gives the real llama.cpp server the habits of llama-cpp-python's server.

The C++ `llama-server` (used for its `timings` and `cached_tokens`) streams
cleanly: no comment lines, usage when asked, tool-call `id` and `name` once
per call, and a second request waits for a free slot. llama-cpp-python's
Python server, which many users run instead, does otherwise; this proxy
reproduces those habits on the real server's real bytes, each switched on
by its own flag:

- `pings`: a `: ping` comment line before every event;
- `drop_usage`: the request's `stream_options` are removed, so the server
  sends no usage chunk (what a server that never reports usage looks like);
- `repeat_call_fields`: every tool-call fragment repeats its call's `id`,
  `type` and `name`;
- `interrupts`: that many times, a new chat request cuts the stream in
  progress (its connection closes mid-body), as `interrupt_requests` does.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeAlias

import httpx
import trio

ASGIMessage: TypeAlias = Mapping[str, Any]
Receive: TypeAlias = Callable[[], Awaitable[ASGIMessage]]
Send: TypeAlias = Callable[[dict[str, Any]], Awaitable[None]]


class LlamaCppPythonProxy:
    """An ASGI app forwarding to `upstream` with the habits chosen (see the module docstring).

    Attributes:
        pings_sent: `: ping` lines written.
        interrupted: Streams cut by a later request.
        first_event: Set once a chat stream has forwarded its first event.
    """

    def __init__(
        self,
        upstream: str,
        *,
        pings: bool = False,
        drop_usage: bool = False,
        repeat_call_fields: bool = False,
        interrupts: int = 0,
    ) -> None:
        self._client = httpx.AsyncClient(base_url=upstream, timeout=httpx.Timeout(300.0))
        self._pings = pings
        self._drop_usage = drop_usage
        self._repeat = repeat_call_fields
        self._interrupts = interrupts
        self._active: set[trio.CancelScope] = set()
        self.pings_sent = 0
        self.interrupted = 0
        self.first_event = trio.Event()

    async def aclose(self) -> None:
        """Close the upstream client."""
        await self._client.aclose()

    async def __call__(self, scope: ASGIMessage, receive: Receive, send: Send) -> None:
        """Forward one request; a cut stream ends without its last body message."""
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        request = json.loads(body) if body else {}
        if self._drop_usage:
            request.pop("stream_options", None)
        if self._interrupts and self._active:
            self._interrupts -= 1
            for active in list(self._active):
                active.cancel()
                self.interrupted += 1
        with trio.CancelScope() as cut:
            self._active.add(cut)
            try:
                await self._forward(scope, request, send)
                return
            finally:
                self._active.discard(cut)
        # Cut: return without the final body message, so the server drops the connection.

    async def _forward(self, scope: ASGIMessage, request: dict[str, Any], send: Send) -> None:
        async with self._client.stream(
            str(scope["method"]), str(scope["path"]), json=request
        ) as response:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": [
                        (b"content-type", response.headers["content-type"].encode("latin-1"))
                    ],
                }
            )
            ids: dict[int, dict[str, Any]] = {}
            lines = response.aiter_lines()
            try:
                async for line in lines:
                    if line.startswith("data: "):
                        if self._pings:
                            await _body(send, b": ping\n\n")
                            self.pings_sent += 1
                        if self._repeat:
                            line = _repeat_call_fields(line, ids)
                        self.first_event.set()
                    await _body(send, line.encode() + b"\n")
            finally:
                await _finish(response, lines)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _finish(response: httpx.Response, lines: AsyncIterator[str]) -> None:
    """Close `response` and run its reading chain to its end, even when cut.

    A cut (a cancellation while a line is being forwarded) leaves httpx's
    chain of body generators suspended; closing the response alone does not
    end them, and the garbage collector would finalize them later (Trio warns).
    Once the connection is closed, resuming the chain ends it at once.
    """
    with trio.CancelScope(shield=True):
        await response.aclose()
        with contextlib.suppress(httpx.HTTPError, httpx.StreamError):
            async for _ in lines:
                pass


async def _body(send: Send, data: bytes) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": True})


def _repeat_call_fields(line: str, calls: dict[int, dict[str, Any]]) -> str:
    data = line.removeprefix("data: ")
    if data == "[DONE]":
        return line
    chunk = json.loads(data)
    for choice in chunk.get("choices") or ():
        for fragment in (choice.get("delta") or {}).get("tool_calls") or ():
            known = calls.setdefault(fragment["index"], {})
            function = fragment.setdefault("function", {})
            for key in ("id", "type"):
                if key in fragment:
                    known[key] = fragment[key]
                elif key in known:
                    fragment[key] = known[key]
            if "name" in function:
                known["name"] = function["name"]
            elif "name" in known:
                function["name"] = known["name"]
    return "data: " + json.dumps(chunk, separators=(",", ":"))
