"""The DeepSeek / OpenAI-compatible chat-completions adapter: httpx, streaming SSE.

`OpenAICompatProvider` implements the `Provider` protocol for any server that
speaks the OpenAI chat-completions wire format with `stream: true`: DeepSeek,
OpenAI, vLLM, llama.cpp's server, and the local simulator. This module owns
the HTTP exchange, its clocks and its counters; the request body comes from
`actors.providers.openai_wire` (byte-stable, so the provider's prefix cache
can hit on every request after the first), the event stream is parsed by
`actors.providers.openai_stream`, and failures are classified by
`actors.providers.failures`. Their public names are re-exported here.

Every request failure ends the stream as `FinishChunk(reason="error",
failure=Failure(...))`; nothing is raised. Failure codes (retryable ones
marked *):

- HTTP statuses: `bad_request` (400), `unauthorized` (401),
  `insufficient_balance` (402), `forbidden` (403), `not_found` (404),
  `invalid_parameters` (422); `request_timeout`* (408), `conflict`* (409),
  `rate_limited`* (429), `server_error`* (500), `bad_gateway`* (502),
  `server_overloaded`* (503), `gateway_timeout`* (504); any other status is
  `http_error`, retryable for 5xx. `Retry-After` / `retry-after-ms` become
  `retry_after_ms`, capped.
- The connection: `connect_error`* (no response headers: refused, reset,
  TLS, DNS), `connection_lost`* (broke while the body streamed),
  `stream_truncated`* (the body ended without `data: [DONE]`),
  `transport_error` (a local protocol error or an unsupported URL).
- Clocks: `connect_timeout`*, `read_timeout`* (silence, or keep-alives
  only, for too long), `deadline_exceeded`* (from `StreamTimeouts`);
  `write_timeout`*, `pool_timeout`* (from the client's own `httpx.Timeout`,
  whose read timeout the adapter replaces per request: see
  `OpenAICompatProvider`).
- The stream: `insufficient_system_resource`* (DeepSeek stopped for lack of
  capacity), `stream_error`* (an `{"error": ...}` event mid-stream),
  `malformed_event`, `event_too_large`, `too_many_tool_calls`,
  `content_filter`, `unknown_finish_reason`, `unexpected_content_type` (a
  JSON body where an event stream was expected).

A malformed event is treated as a server bug, not a transient fault: the same
request would most likely trip it again and bill the prompt again, so it is
not retryable; a request-error listener can still choose to retry it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping

import attrs
import httpx
import trio

from actors.providers.base import ChunkBatch, ProviderError, unbatched
from actors.providers.chunks import Chunk, Failure, FinishChunk
from actors.providers.failures import error_finish, error_message, transport_failure
from actors.providers.failures import failure_for_status as failure_for_status
from actors.providers.failures import parse_retry_after as parse_retry_after
from actors.providers.http_client import ProviderClient
from actors.providers.openai_stream import StreamParser
from actors.providers.openai_stream import parse_usage as parse_usage
from actors.providers.openai_wire import R1_PROFILE as R1_PROFILE
from actors.providers.openai_wire import V4_PROFILE as V4_PROFILE
from actors.providers.openai_wire import ModelProfile as ModelProfile
from actors.providers.openai_wire import ReasoningReplay as ReasoningReplay
from actors.providers.openai_wire import RequestEncoder
from actors.providers.request import GenerateRequest
from actors.providers.sse import DEFAULT_MAX_EVENT_BYTES

_MAX_ERROR_BODY = 64 * 1024
_CLOSE_GRACE = 5.0
_DRAIN_GRACE = 1.0
_DRAIN_BYTES = 64 * 1024


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value > 0:  # also refuses NaN
        raise ValueError(f"{attribute.name} must be a positive number of seconds, got {value!r}")


@attrs.frozen(kw_only=True)
class StreamTimeouts:
    """The adapter's clocks, all measured with `trio.current_time()`.

    The body has one read-idle clock: it fails the request when the server
    has sent nothing for `read_idle` seconds, and keep-alives (comment lines,
    `data: : keep-alive`) reset it only while the last event that carried
    data is less than `no_data` seconds old. So a stalled server costs at
    most `read_idle`, and one that only trickles keep-alives at most
    `no_data`, per attempt.

    Attributes:
        connect: From sending the request until the response headers arrive.
        read_idle: The longest silence allowed between two reads of the body.
        no_data: The longest time allowed without an event carrying data
            (counted from the response headers, then from the last such
            event), keep-alives notwithstanding.
        deadline: The whole request, from `stream()` starting to the finish
            chunk (time the consumer spends between chunks counts too).
    """

    connect: float = attrs.field(default=10.0, validator=_positive)
    read_idle: float = attrs.field(default=30.0, validator=_positive)
    no_data: float = attrs.field(default=60.0, validator=_positive)
    deadline: float = attrs.field(default=600.0, validator=_positive)


@attrs.frozen(kw_only=True)
class ProviderStatistics:
    """Counters of one `OpenAICompatProvider`.

    Attributes:
        requests: Streams started.
        in_flight: Streams started and not yet closed.
        failures: Streams that ended with an error finish.
        tool_encodings: Times a tool tuple was serialized (cache misses).
    """

    requests: int
    in_flight: int
    failures: int
    tool_encodings: int


class OpenAICompatProvider:
    """A `Provider` for OpenAI-compatible chat-completions servers.

    The provider does not own its client: the caller builds one
    `httpx.AsyncClient` (with explicit `httpx.Timeout` and `httpx.Limits`)
    per provider and closes it. The adapter's own clocks (`StreamTimeouts`)
    run on Trio, so they honour `MockClock`, tell keep-alives from data and
    work with any transport. They alone bound the wait for headers and body:
    each request is sent without the client's read timeout (its connect,
    write and pool timeouts still apply), so a client built with a shorter
    read timeout can never cut a stream the adapter would let live.

    Given a `ProviderClient` (what `open_http_client`, and so the provider
    actor, builds), the adapter hands each request straight to the client's
    transport: the same body, headers (the client's defaults included, but
    `Accept-Encoding: identity`, so the body is read as it arrives) and
    timeouts, the same failures, without httpx's client layers (auth,
    redirects, cookies, event hooks), which a `ProviderClient` does not
    use. Any other `httpx.AsyncClient` is used through its `send`, as is.

    Args:
        client: The HTTP client requests go through.
        base_url: The API root; requests go to `{base_url}/chat/completions`.
        api_key: Sent as a bearer token; None sends no `Authorization` header.
        timeouts: Connect, read-idle and overall-deadline limits.
        profiles: The `ModelProfile` of each model name that differs from
            `default_profile`.
        default_profile: The profile of every other model.
        retry_after_cap: The longest server-requested wait, in seconds, put in
            `Failure.retry_after_ms` (longer requests are capped).
        max_event_bytes: The largest single SSE event accepted.
        wall_clock: Epoch seconds now, for `Retry-After` HTTP dates.

    Raises:
        ProviderError: `base_url` is not an absolute http(s) URL, or a limit is
            not positive.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        base_url: str,
        api_key: str | None,
        timeouts: StreamTimeouts = StreamTimeouts(),
        profiles: Mapping[str, ModelProfile] | None = None,
        default_profile: ModelProfile = V4_PROFILE,
        retry_after_cap: float = 60.0,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        try:
            url = httpx.URL(base_url.rstrip("/") + "/chat/completions")
        except httpx.InvalidURL as exc:
            raise ProviderError(f"base_url {base_url!r} is not a valid URL: {exc}") from exc
        if url.scheme not in ("http", "https") or not url.host:
            raise ProviderError(f"base_url {base_url!r} must be an absolute http(s) URL")
        if not retry_after_cap >= 0:
            raise ProviderError(f"retry_after_cap must be >= 0 seconds, got {retry_after_cap!r}")
        if max_event_bytes < 1:
            raise ProviderError(f"max_event_bytes must be positive, got {max_event_bytes}")
        self._client = client
        self._url = url
        self._headers = {"content-type": "application/json", "accept": "text/event-stream"}
        if api_key is not None:
            self._headers["authorization"] = f"Bearer {api_key}"
        self._timeouts = timeouts
        # The adapter's clocks bound every read; the client's own read timeout must not
        # undercut them (a 30 s httpx read timeout used to end 60 s read-idle waits).
        client_timeout = client.timeout
        self._request_timeout = httpx.Timeout(
            connect=client_timeout.connect,
            read=None,
            write=client_timeout.write,
            pool=client_timeout.pool,
        )
        self._transport: httpx.AsyncBaseTransport | None = None
        self._direct_headers: list[tuple[bytes, bytes]] = []
        self._direct_extensions: dict[str, object] = {}
        if isinstance(client, ProviderClient):
            self._transport = client.transport
            merged = httpx.Headers(client.headers)
            merged.update(self._headers)
            merged["accept-encoding"] = "identity"
            merged["host"] = url.netloc.decode("ascii")
            self._direct_headers = list(merged.raw)
            self._direct_extensions = {"timeout": self._request_timeout.as_dict()}
        self._encoder = RequestEncoder(profiles=profiles, default_profile=default_profile)
        self._retry_after_cap_ms = int(retry_after_cap * 1000)
        self._max_event_bytes = max_event_bytes
        self._wall_clock = wall_clock
        self._requests = 0
        self._in_flight = 0
        self._failures = 0

    def profile_for(self, model: str) -> ModelProfile:
        """The profile that decides how `model`'s history is serialized."""
        return self._encoder.profile_for(model)

    def statistics(self) -> ProviderStatistics:
        """Request counters, for dashboards and tests."""
        return ProviderStatistics(
            requests=self._requests,
            in_flight=self._in_flight,
            failures=self._failures,
            tool_encodings=self._encoder.tool_encodings,
        )

    def encode_request(self, request: GenerateRequest) -> bytes:
        """The exact request body sent for `request`.

        Keys come in a fixed order (`model`, `messages`, `tools`, the
        configured options, `stream`, `stream_options`), so equal requests
        give equal bytes. `config` keys other than `model`, `max_tokens`,
        `temperature`, `thinking`, `reasoning_effort`, `tool_choice`,
        `parallel_tool_calls`, `response_format` and `stop` are not sent.

        Raises:
            ProviderError: a message or config value cannot be serialized.
        """
        return self._encoder.encode(request)

    def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
        """Send `request` and yield its chunks one by one (see `stream_batches`)."""
        return unbatched(self.stream_batches(request))

    async def stream_batches(self, request: GenerateRequest) -> AsyncGenerator[ChunkBatch, None]:
        """Send `request` and yield its chunks, ending with one `FinishChunk`.

        The chunks come in batches: those parsed from one read of the body
        together; the read that ends the stream comes with the final chunks
        (usage, finish), handed over once the response is closed (so its
        connection is back in the pool by then).

        Use it under `contextlib.aclosing`. Failures (statuses, resets,
        timeouts, malformed events) end the stream with
        `FinishChunk(reason="error")` and are never raised. A `UsageChunk`
        precedes the finish whenever the server reported usage. After
        `data: [DONE]` the rest of the body is read (for at most a second) so
        the connection can go back to the pool.

        Cancellation: cancelling the consumer, or closing the generator
        early, closes the HTTP response at once (the close is shielded and
        bounded), so the server sees the disconnect.

        Raises:
            ProviderError: the request cannot be serialized (a caller bug).
        """
        payload = self.encode_request(request)
        deadline = trio.current_time() + self._timeouts.deadline
        self._requests += 1
        self._in_flight += 1
        body: _Body | None = None
        finish: FinishChunk | None = None
        try:
            opened = await self._open(self._http_request(payload), deadline)
            if isinstance(opened, Failure):
                finish = error_finish(opened)
                yield (finish,)
                return
            body = _Body(opened)
            refusal = await self._refusal(body, deadline)
            if refusal is not None:
                finish = error_finish(refusal)
                yield (finish,)
                return
            parser = StreamParser(max_event_bytes=self._max_event_bytes)
            data_due = trio.current_time() + self._timeouts.no_data
            last: list[Chunk] = []
            while parser.outcome is None:
                data = await self._read(body, deadline, data_due)
                if isinstance(data, Failure):
                    parser.fail(data)
                elif data is None:
                    parser.fail(
                        Failure(
                            code="stream_truncated",
                            message=f"{self._url} ended the event stream without data: [DONE]",
                            retryable=True,
                        )
                    )
                else:
                    seen = parser.data_events
                    chunks = parser.feed(data)
                    if parser.data_events != seen:
                        data_due = trio.current_time() + self._timeouts.no_data
                    if parser.outcome is not None:
                        last = chunks  # they go with the final chunks, once the body is closed
                    elif chunks:
                        yield tuple(chunks)
            if parser.done:
                # Read the end of the body so the connection can be reused.
                with trio.move_on_after(_DRAIN_GRACE):
                    await body.exhaust()
            # Closed before the finish is handed over: the connection is back in its pool
            # (or closed) before the consumer, seeing the finish, sends its next request.
            with trio.move_on_after(_CLOSE_GRACE, shield=True):
                await body.close()
            body = None
            last += parser.final_chunks()
            finish = parser.outcome
            yield tuple(last)
        finally:
            self._in_flight -= 1
            if finish is not None and finish.failure is not None:
                self._failures += 1
            if body is not None:
                with trio.move_on_after(_CLOSE_GRACE, shield=True):
                    await body.close()

    def _http_request(self, payload: bytes) -> httpx.Request:
        """The request carrying `payload`, for the client or straight for its transport."""
        if self._transport is None:
            http_request = self._client.build_request(
                "POST",
                self._url,
                content=payload,
                headers=self._headers,
                timeout=self._request_timeout,
            )
            http_request.stream = _Payload(payload)  # same bytes; Content-Length stays
            return http_request
        return httpx.Request(
            "POST",
            self._url,
            headers=[*self._direct_headers, (b"content-length", b"%d" % len(payload))],
            stream=_Payload(payload),
            extensions=self._direct_extensions,
        )

    async def _open(self, http_request: httpx.Request, deadline: float) -> httpx.Response | Failure:
        limit = min(deadline, trio.current_time() + self._timeouts.connect)
        with trio.move_on_at(limit):
            try:
                if self._transport is None:
                    return await self._client.send(http_request, stream=True)
                response = await self._transport.handle_async_request(http_request)
                response.request = http_request
                return response
            except httpx.RequestError as exc:
                return transport_failure(exc, self._url, started=False)
        return self._timed_out(
            limit,
            deadline,
            Failure(
                code="connect_timeout",
                message=f"no response headers from {self._url} within {self._timeouts.connect} s",
                retryable=True,
            ),
        )

    async def _read(self, body: _Body, deadline: float, data_due: float) -> bytes | Failure | None:
        """The next bytes of the body, None at its end, or why there are none.

        `data_due` is when the no-data bound runs out: bytes that arrive
        before it are returned even if they are only keep-alives.
        """
        now = trio.current_time()
        if now >= deadline:
            # Checked here too: bytes already buffered arrive without a checkpoint.
            return self._deadline_failure()
        if now >= data_due:
            return self._no_data_failure()
        idle_due = now + self._timeouts.read_idle
        limit = min(deadline, idle_due, data_due)
        with trio.move_on_at(limit):
            try:
                return await body.next()
            except httpx.RequestError as exc:
                return transport_failure(exc, self._url, started=True)
        if limit >= deadline:
            return self._deadline_failure()
        if limit >= idle_due:
            return Failure(
                code="read_timeout",
                message=f"{self._url} sent nothing for {self._timeouts.read_idle} s",
                retryable=True,
            )
        return self._no_data_failure()

    def _no_data_failure(self) -> Failure:
        return Failure(
            code="read_timeout",
            message=f"{self._url} sent no data for {self._timeouts.no_data} s "
            "(at most keep-alives)",
            retryable=True,
        )

    def _timed_out(self, limit: float, deadline: float, step: Failure) -> Failure:
        """Why a wait that ended at `limit` failed: the overall deadline, or `step`."""
        return self._deadline_failure() if limit >= deadline else step

    def _deadline_failure(self) -> Failure:
        return Failure(
            code="deadline_exceeded",
            message=f"the request to {self._url} did not finish within its "
            f"{self._timeouts.deadline} s deadline",
            retryable=True,
        )

    async def _read_bounded(self, body: _Body, deadline: float) -> bytes:
        """Up to `_MAX_ERROR_BODY` bytes of a non-stream body (less if reading fails)."""
        data = bytearray()
        data_due = trio.current_time() + self._timeouts.no_data
        while len(data) < _MAX_ERROR_BODY:
            piece = await self._read(body, deadline, data_due)
            if not isinstance(piece, bytes):
                break
            data += piece
        return bytes(data[:_MAX_ERROR_BODY])

    async def _refusal(self, body: _Body, deadline: float) -> Failure | None:
        """Why the response is not an event stream to parse, or None if it is.

        An error status is classified from its (bounded) body; a JSON body
        where an event stream was expected is `unexpected_content_type`.
        """
        response = body.response
        if response.status_code != 200:
            return failure_for_status(
                response.status_code,
                response.headers,
                await self._read_bounded(body, deadline),
                now=self._wall_clock(),
                retry_after_cap_ms=self._retry_after_cap_ms,
            )
        if response.headers.get("content-type", "").startswith("application/json"):
            message = error_message(await self._read_bounded(body, deadline))
            return Failure(
                code="unexpected_content_type",
                message=f"{self._url} answered with JSON instead of an event stream: {message}",
            )
        return None


class _Payload(httpx.AsyncByteStream):
    """A request body sent in one piece, through an iterator that is not a generator.

    httpx's own byte stream yields the body from an async generator. A
    request cancelled while its body is being written (the connect clock
    ending a wait on a server that does not read) leaves that generator
    suspended, to be finalized by the garbage collector, which Trio reports
    as a `ResourceWarning`. This iterator has no frame to leave suspended.
    """

    def __init__(self, data: bytes) -> None:
        self._data = data

    def __aiter__(self) -> AsyncIterator[bytes]:
        return _Once(self._data)


class _Once:
    """An async iterator over one bytes object."""

    def __init__(self, data: bytes) -> None:
        self._data: bytes | None = data

    def __aiter__(self) -> _Once:
        return self

    async def __anext__(self) -> bytes:
        data, self._data = self._data, None
        if data is None:
            raise StopAsyncIteration
        return data


class _Body:
    """A streamed response body whose reader always finishes deterministically.

    httpx reads a body through a chain of async generators (its own and the
    transport's) that only end when iterated to their end or through an
    exception. Closing the response alone leaves them suspended, to be
    finalized later by the garbage collector (Trio warns about that). So
    `close()` closes the response and then resumes the chain until it ends,
    which is immediate once the connection is closed.
    """

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._chunks: AsyncIterator[bytes] | None = None

    async def next(self) -> bytes | None:
        """The next bytes, or None at the end of the body.

        Raises:
            httpx.RequestError: the connection failed.
        """
        if self._chunks is None:
            stream = self.response.stream
            encoding = self.response.headers.get("content-encoding", "identity")
            if isinstance(stream, httpx.AsyncByteStream) and encoding in ("identity", ""):
                # The transport's chunks as they come, without httpx's re-chunking layers.
                self._chunks = aiter(stream)
            else:
                self._chunks = self.response.aiter_bytes()  # httpx decodes
        try:
            return await anext(self._chunks)
        except StopAsyncIteration:
            return None

    async def exhaust(self) -> None:
        """Read (and drop) the rest of the body, at most `_DRAIN_BYTES` of it."""
        budget = _DRAIN_BYTES
        with contextlib.suppress(httpx.RequestError, httpx.StreamError):
            while budget >= 0 and (data := await self.next()) is not None:
                budget -= len(data)

    async def close(self) -> None:
        """Close the response and let the reading chain end."""
        await self.response.aclose()
        if self._chunks is not None:
            await self.exhaust()
