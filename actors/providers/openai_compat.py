"""The DeepSeek / OpenAI-compatible chat-completions adapter: httpx, streaming SSE.

`OpenAICompatProvider` implements the `Provider` protocol for any server that
speaks the OpenAI chat-completions wire format with `stream: true`: DeepSeek,
OpenAI, vLLM, llama.cpp's server, and the local simulator.

Serialization is byte-stable: the system text is the first message, history
follows in order, tool schemas are serialized once per distinct tool tuple,
and everything is written with compact separators and without ASCII escaping,
so identical requests give identical bytes and the provider's prefix cache can
hit on every request after the first.

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
- Clocks: `connect_timeout`*, `read_timeout`*, `deadline_exceeded`* (from
  `StreamTimeouts`); `write_timeout`*, `pool_timeout`* (from the client's
  own `httpx.Timeout`).
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
import email.utils
import json
import math
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import Any, Literal, TypeAlias

import attrs
import httpx
import trio

from actors.messages import Message, ReasoningBlock, ToolSource
from actors.prompt.types import ToolSchema
from actors.providers.base import ProviderError
from actors.providers.chunks import (
    Chunk,
    Failure,
    FinishChunk,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
)
from actors.providers.request import GenerateRequest
from actors.providers.sse import DEFAULT_MAX_EVENT_BYTES, SSEDecoder, SSEError

ReasoningReplay: TypeAlias = Literal["with-tool-calls", "never"]
"""When a model wants its own reasoning sent back as `reasoning_content`."""

_CONFIG_KEYS = ("max_tokens", "temperature", "thinking", "reasoning_effort")
_MAX_ERROR_BODY = 64 * 1024
_MAX_TOOL_CALLS = 256
_TOOLS_CACHE_SIZE = 16
_CLOSE_GRACE = 5.0
_DRAIN_GRACE = 1.0
_DRAIN_BYTES = 64 * 1024
_EXCERPT = 200


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _excerpt(text: str) -> str:
    return text if len(text) <= _EXCERPT else text[:_EXCERPT] + "..."


@attrs.frozen(kw_only=True)
class ModelProfile:
    """What a model family expects back in its history.

    Attributes:
        name: A short label for messages and logs (`"v4"`, `"r1"`).
        reasoning_replay: `"with-tool-calls"`: every assistant message that
            carries tool calls is sent with `reasoning_content` (its reasoning
            text, `""` when it had none), other assistant messages without;
            `"never"`: `reasoning_content` is never sent (the server refuses it).
            Reasoning is always kept in the log either way.
    """

    name: str
    reasoning_replay: ReasoningReplay


V4_PROFILE = ModelProfile(name="v4", reasoning_replay="with-tool-calls")
"""DeepSeek V3.x/V4 thinking models: reasoning goes back with tool calls."""
R1_PROFILE = ModelProfile(name="r1", reasoning_replay="never")
"""DeepSeek R1-style reasoners: sending `reasoning_content` back is an error."""


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value > 0:  # also refuses NaN
        raise ValueError(f"{attribute.name} must be a positive number of seconds, got {value!r}")


@attrs.frozen(kw_only=True)
class StreamTimeouts:
    """The adapter's clocks, all measured with `trio.current_time()`.

    Attributes:
        connect: From sending the request until the response headers arrive.
        read_idle: The longest silence allowed between two reads of the body;
            any bytes reset it, keep-alive comments included.
        deadline: The whole request, from `stream()` starting to the finish
            chunk (time the consumer spends between chunks counts too).
    """

    connect: float = attrs.field(default=10.0, validator=_positive)
    read_idle: float = attrs.field(default=60.0, validator=_positive)
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
    run on Trio, so they honour `MockClock`, see keep-alive comments as
    progress and work with any transport; set the client's timeouts no
    tighter than these.

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
        self._profiles = dict(profiles or {})
        self._default_profile = default_profile
        self._retry_after_cap_ms = int(retry_after_cap * 1000)
        self._max_event_bytes = max_event_bytes
        self._wall_clock = wall_clock
        self._tools_cache: OrderedDict[tuple[int, ...], tuple[tuple[ToolSchema, ...], str]] = (
            OrderedDict()
        )
        self._requests = 0
        self._in_flight = 0
        self._failures = 0
        self._tool_encodings = 0

    def profile_for(self, model: str) -> ModelProfile:
        """The profile that decides how `model`'s history is serialized."""
        return self._profiles.get(model, self._default_profile)

    def statistics(self) -> ProviderStatistics:
        """Request counters, for dashboards and tests."""
        return ProviderStatistics(
            requests=self._requests,
            in_flight=self._in_flight,
            failures=self._failures,
            tool_encodings=self._tool_encodings,
        )

    def encode_request(self, request: GenerateRequest) -> bytes:
        """The exact request body sent for `request`.

        Keys come in a fixed order (`model`, `messages`, `tools`, the
        configured options, `stream`, `stream_options`), so equal requests
        give equal bytes. `config` keys other than `model`, `max_tokens`,
        `temperature`, `thinking` and `reasoning_effort` are not sent.

        Raises:
            ProviderError: a message or config value cannot be serialized.
        """
        profile = self.profile_for(request.model)
        messages: list[dict[str, Any]] = []
        if request.system:
            messages.append({"role": "system", "content": request.system})
        messages.extend(_encode_message(message, profile) for message in request.messages)
        try:
            parts = ['{"model":', _dumps(request.model), ',"messages":', _dumps(messages)]
            if request.tools:
                parts += [',"tools":', self._encode_tools(request.tools)]
            for key in _CONFIG_KEYS:
                value = request.config.get(key)
                if value is not None:
                    parts += [f',"{key}":', _dumps(value)]
        except (TypeError, ValueError) as exc:
            raise ProviderError(f"request for model {request.model!r} is not JSON: {exc}") from exc
        parts.append(',"stream":true,"stream_options":{"include_usage":true}}')
        return "".join(parts).encode()

    def _encode_tools(self, tools: tuple[ToolSchema, ...]) -> str:
        # Keyed by identity: the cached entry holds the schemas, so their ids
        # cannot be reused while the entry lives. Equal tuples of other
        # objects serialize to the same bytes anyway; this only saves work.
        key = tuple(id(tool) for tool in tools)
        cached = self._tools_cache.get(key)
        if cached is not None:
            self._tools_cache.move_to_end(key)
            return cached[1]
        encoded = _dumps(
            [
                {
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": tool.parameters,
                    },
                }
                for tool in tools
            ]
        )
        self._tool_encodings += 1
        self._tools_cache[key] = (tools, encoded)
        if len(self._tools_cache) > _TOOLS_CACHE_SIZE:
            self._tools_cache.popitem(last=False)
        return encoded

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
        """Send `request` and yield its chunks, ending with one `FinishChunk`.

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
            http_request = self._client.build_request(
                "POST", self._url, content=payload, headers=self._headers
            )
            opened = await self._open(http_request, deadline)
            if isinstance(opened, Failure):
                finish = _error(opened)
                yield finish
                return
            body = _Body(opened)
            if opened.status_code != 200:
                finish = _error(await self._status_failure(body, deadline))
                yield finish
                return
            if opened.headers.get("content-type", "").startswith("application/json"):
                finish = _error(await self._json_instead_of_stream(body, deadline))
                yield finish
                return
            parser = _StreamParser()
            decoder = SSEDecoder(max_event_bytes=self._max_event_bytes)
            while parser.outcome is None:
                data = await self._read(body, deadline)
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
                    try:
                        events = decoder.feed(data)
                    except SSEError as exc:
                        parser.fail(Failure(code="event_too_large", message=str(exc)))
                        events = []
                    for event in events:
                        for chunk in parser.handle(event.data):
                            yield chunk
                        if parser.outcome is not None:
                            break
            if parser.done:
                # Read the end of the body so the connection can be reused.
                with trio.move_on_after(_DRAIN_GRACE):
                    await body.exhaust()
            for chunk in parser.final_chunks():
                if isinstance(chunk, FinishChunk):
                    finish = chunk
                yield chunk
        finally:
            self._in_flight -= 1
            if finish is not None and finish.failure is not None:
                self._failures += 1
            if body is not None:
                with trio.move_on_after(_CLOSE_GRACE, shield=True):
                    await body.close()

    async def _open(self, http_request: httpx.Request, deadline: float) -> httpx.Response | Failure:
        limit = min(deadline, trio.current_time() + self._timeouts.connect)
        with trio.move_on_at(limit):
            try:
                return await self._client.send(http_request, stream=True)
            except httpx.RequestError as exc:
                return _transport_failure(exc, self._url, started=False)
        return self._timed_out(
            limit,
            deadline,
            Failure(
                code="connect_timeout",
                message=f"no response headers from {self._url} within {self._timeouts.connect} s",
                retryable=True,
            ),
        )

    async def _read(self, body: _Body, deadline: float) -> bytes | Failure | None:
        """The next bytes of the body, None at its end, or why there are none."""
        if trio.current_time() >= deadline:
            # Checked here too: bytes already buffered arrive without a checkpoint.
            return self._deadline_failure()
        limit = min(deadline, trio.current_time() + self._timeouts.read_idle)
        with trio.move_on_at(limit):
            try:
                return await body.next()
            except httpx.RequestError as exc:
                return _transport_failure(exc, self._url, started=True)
        return self._timed_out(
            limit,
            deadline,
            Failure(
                code="read_timeout",
                message=f"{self._url} sent nothing for {self._timeouts.read_idle} s",
                retryable=True,
            ),
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
        while len(data) < _MAX_ERROR_BODY:
            piece = await self._read(body, deadline)
            if not isinstance(piece, bytes):
                break
            data += piece
        return bytes(data[:_MAX_ERROR_BODY])

    async def _status_failure(self, body: _Body, deadline: float) -> Failure:
        return failure_for_status(
            body.response.status_code,
            body.response.headers,
            await self._read_bounded(body, deadline),
            now=self._wall_clock(),
            retry_after_cap_ms=self._retry_after_cap_ms,
        )

    async def _json_instead_of_stream(self, body: _Body, deadline: float) -> Failure:
        message = _error_message(await self._read_bounded(body, deadline))
        return Failure(
            code="unexpected_content_type",
            message=f"{self._url} answered with JSON instead of an event stream: {message}",
        )


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
            self._chunks = self.response.aiter_bytes()
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


def _encode_message(message: Message, profile: ModelProfile) -> dict[str, Any]:
    if message.role == "user":
        if isinstance(message.source, ToolSource):
            return {"role": "tool", "tool_call_id": message.source.call_id, "content": message.text}
        return {"role": "user", "content": message.text}
    out: dict[str, Any] = {"role": "assistant", "content": message.text}
    calls = message.tool_calls
    if calls and profile.reasoning_replay == "with-tool-calls":
        out["reasoning_content"] = "".join(
            block.text for block in message.content if isinstance(block, ReasoningBlock)
        )
    if calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in calls
        ]
    return out


def _error(failure: Failure) -> FinishChunk:
    return FinishChunk(reason="error", failure=failure)


def _transport_failure(exc: httpx.RequestError, url: httpx.URL, *, started: bool) -> Failure:
    detail = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, httpx.TimeoutException):
        code = {
            httpx.ConnectTimeout: "connect_timeout",
            httpx.ReadTimeout: "read_timeout",
            httpx.WriteTimeout: "write_timeout",
        }.get(type(exc), "pool_timeout")
        return Failure(code=code, message=f"{url}: {detail}", retryable=True)
    if isinstance(exc, (httpx.UnsupportedProtocol, httpx.LocalProtocolError)):
        return Failure(code="transport_error", message=f"{url}: {detail}")
    if started:
        return Failure(
            code="connection_lost",
            message=f"the connection to {url} broke mid-stream: {detail}",
            retryable=True,
        )
    return Failure(
        code="connect_error", message=f"no response from {url}: {detail}", retryable=True
    )


_STATUS_CODES: dict[int, tuple[str, bool]] = {
    400: ("bad_request", False),
    401: ("unauthorized", False),
    402: ("insufficient_balance", False),
    403: ("forbidden", False),
    404: ("not_found", False),
    408: ("request_timeout", True),
    409: ("conflict", True),
    422: ("invalid_parameters", False),
    429: ("rate_limited", True),
    500: ("server_error", True),
    502: ("bad_gateway", True),
    503: ("server_overloaded", True),
    504: ("gateway_timeout", True),
}


def failure_for_status(
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float,
    retry_after_cap_ms: int,
) -> Failure:
    """Classify an HTTP error response.

    Args:
        status: The response status.
        headers: Response headers (names case-insensitive, as httpx gives them).
        body: The (possibly truncated) response body; DeepSeek's
            `{"error": {"message", "type", "code"}}` message is carried over.
        now: Epoch seconds, to resolve a `Retry-After` HTTP date.
        retry_after_cap_ms: The longest wait to report.

    Returns:
        The failure, with `retry_after_ms` from `retry-after-ms` or `Retry-After`.
    """
    code, retryable = _STATUS_CODES.get(status, ("http_error", status >= 500))
    message = _error_message(body)
    if status == 402:
        message = f"the account balance is exhausted (HTTP 402): {message}"
    else:
        message = f"HTTP {status}: {message}"
    return Failure(
        code=code,
        message=message,
        status=status,
        retry_after_ms=parse_retry_after(headers, now=now, cap_ms=retry_after_cap_ms),
        retryable=retryable,
    )


def parse_retry_after(headers: Mapping[str, str], *, now: float, cap_ms: int) -> int | None:
    """The server's requested wait in milliseconds, capped at `cap_ms`.

    `retry-after-ms` (milliseconds) wins over `Retry-After` (seconds or an
    HTTP date, resolved against `now`). A date in the past means 0; an
    unparseable value is ignored.
    """
    wait_ms: float | None = None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        wait_ms = _finite(raw_ms)
    raw = headers.get("retry-after")
    if wait_ms is None and raw is not None:
        seconds = _finite(raw)
        if seconds is None:
            try:
                when = email.utils.parsedate_to_datetime(raw)
            except (TypeError, ValueError):
                when = None
            if when is not None and when.tzinfo is not None:
                seconds = when.timestamp() - now
        if seconds is not None:
            wait_ms = seconds * 1000
    if wait_ms is None:
        return None
    return min(cap_ms, max(0, math.ceil(wait_ms)))


def _finite(text: str) -> float | None:
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _error_message(body: bytes) -> str:
    """DeepSeek's `error.message` from an error body, or the body's text."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        return _excerpt(text) or "(empty body)"
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return _excerpt(text)


def parse_usage(usage: Mapping[str, Any]) -> Usage:
    """Map a chat-completions `usage` object to `Usage`.

    `cache_read_tokens` comes from DeepSeek's `prompt_cache_hit_tokens`, else
    OpenAI's `prompt_tokens_details.cached_tokens`; `reasoning_tokens` from
    `completion_tokens_details.reasoning_tokens` when reported. Missing or
    non-integer counts read as 0 (None for reasoning).
    """
    prompt_details = usage.get("prompt_tokens_details")
    completion_details = usage.get("completion_tokens_details")
    cache = _count(usage.get("prompt_cache_hit_tokens"))
    if cache is None and isinstance(prompt_details, Mapping):
        cache = _count(prompt_details.get("cached_tokens"))
    reasoning = None
    if isinstance(completion_details, Mapping):
        reasoning = _count(completion_details.get("reasoning_tokens"))
    return Usage(
        input_tokens=_count(usage.get("prompt_tokens")) or 0,
        output_tokens=_count(usage.get("completion_tokens")) or 0,
        cache_read_tokens=cache or 0,
        reasoning_tokens=reasoning,
    )


def _count(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


_FINISH_REASONS: dict[str, FinishReason] = {
    "stop": "completed",
    "length": "max-tokens",
    "tool_calls": "tool-calls",
    "function_call": "tool-calls",
}


class _Malformed(Exception):
    """An event broke the wire format; the message says how."""


@attrs.define(eq=False)
class _ToolCallState:
    id_sent: bool = False
    name_sent: bool = False


@attrs.define(eq=False)
class _StreamParser:
    """Turns the data of each event into chunks; pure, one per stream.

    `outcome` is set once the stream is over: the finish chunk to end with.
    """

    outcome: FinishChunk | None = None
    done: bool = False
    usage: Usage | None = None
    finish_reason: str | None = None
    calls: dict[int, _ToolCallState] = attrs.field(factory=dict)

    def fail(self, failure: Failure) -> None:
        self.outcome = _error(failure)

    def final_chunks(self) -> list[Chunk]:
        assert self.outcome is not None, "final_chunks() before the stream ended"
        if self.usage is None:
            return [self.outcome]
        return [UsageChunk(usage=self.usage), self.outcome]

    def handle(self, data: str) -> list[Chunk]:
        stripped = data.strip()
        if not stripped or stripped.startswith(":"):
            return []  # a data-only keep-alive ("data: : keep-alive")
        if stripped == "[DONE]":
            self.done = True
            self.outcome = self._finish()
            return []
        try:
            return self._event(data)
        except _Malformed as exc:
            self.fail(
                Failure(
                    code="malformed_event",
                    message=f"malformed stream event ({exc}): {_excerpt(data)!r}",
                )
            )
            return []
        except _TooManyToolCalls as exc:
            self.fail(Failure(code="too_many_tool_calls", message=str(exc)))
            return []

    def _event(self, data: str) -> list[Chunk]:
        try:
            obj = json.loads(data)
        except ValueError as exc:
            raise _Malformed(f"not JSON: {exc}") from exc
        if not isinstance(obj, dict):
            raise _Malformed("not a JSON object")
        if obj.get("error") is not None:
            message = _error_message(data.encode())
            self.fail(
                Failure(code="stream_error", message=f"error event: {message}", retryable=True)
            )
            return []
        usage = obj.get("usage")
        if usage is not None:
            if not isinstance(usage, dict):
                raise _Malformed("usage is not an object")
            self.usage = parse_usage(usage)
        choices = obj.get("choices")
        if choices is None:
            return []
        if not isinstance(choices, list):
            raise _Malformed("choices is not a list")
        chunks: list[Chunk] = []
        for choice in choices:
            if not isinstance(choice, dict):
                raise _Malformed("a choice is not an object")
            if choice.get("index", 0) != 0:
                continue
            self._choice(choice, chunks)
        return chunks

    def _choice(self, choice: dict[str, Any], chunks: list[Chunk]) -> None:
        delta = choice.get("delta")
        if delta is None:
            delta = {}
        if not isinstance(delta, dict):
            raise _Malformed("delta is not an object")
        reasoning = _optional_str(delta, "reasoning_content")
        if reasoning:
            chunks.append(ReasoningDelta(text=reasoning))
        content = _optional_str(delta, "content")
        if content:
            chunks.append(TextDelta(text=content))
        tool_calls = delta.get("tool_calls")
        if tool_calls is not None:
            if not isinstance(tool_calls, list):
                raise _Malformed("tool_calls is not a list")
            for position, call in enumerate(tool_calls):
                delta_chunk = self._tool_call(position, call)
                if delta_chunk is not None:
                    chunks.append(delta_chunk)
        reason = choice.get("finish_reason")
        if reason is not None:
            if not isinstance(reason, str):
                raise _Malformed("finish_reason is not a string")
            self.finish_reason = reason

    def _tool_call(self, position: int, call: object) -> ToolCallDelta | None:
        if not isinstance(call, dict):
            raise _Malformed("a tool call is not an object")
        index = call.get("index", position)
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise _Malformed("a tool call index is not a non-negative integer")
        function = call.get("function")
        if function is None:
            function = {}
        if not isinstance(function, dict):
            raise _Malformed("a tool call's function is not an object")
        call_id = _optional_str(call, "id")
        name = _optional_str(function, "name")
        arguments = _optional_str(function, "arguments") or ""
        state = self.calls.get(index)
        if state is None:
            if len(self.calls) >= _MAX_TOOL_CALLS:
                raise _TooManyToolCalls(
                    f"the stream opened more than {_MAX_TOOL_CALLS} tool calls (index {index})"
                )
            state = self.calls[index] = _ToolCallState()
        # Servers that repeat id and name on every fragment (llama.cpp) must
        # not make the loop join "echoecho": each is announced once.
        new_id = call_id if call_id and not state.id_sent else None
        new_name = name if name and not state.name_sent else None
        state.id_sent = state.id_sent or new_id is not None
        state.name_sent = state.name_sent or new_name is not None
        if new_id is None and new_name is None and not arguments:
            return None
        return ToolCallDelta(index=index, id=new_id, name=new_name, arguments=arguments)

    def _finish(self) -> FinishChunk:
        reason = self.finish_reason
        if reason is None or (reason == "stop" and self.calls):
            # No finish_reason, or "stop" after tool calls (older llama.cpp):
            # what was streamed says how the step ends.
            return FinishChunk(reason="tool-calls" if self.calls else "completed")
        mapped = _FINISH_REASONS.get(reason)
        if mapped is not None:
            return FinishChunk(reason=mapped)
        if reason == "insufficient_system_resource":
            return _error(
                Failure(
                    code="insufficient_system_resource",
                    message="the server stopped generating: insufficient system resource",
                    retryable=True,
                )
            )
        if reason == "content_filter":
            return _error(
                Failure(code="content_filter", message="the server's content filter stopped it")
            )
        return _error(
            Failure(
                code="unknown_finish_reason",
                message=f"unknown finish_reason {reason!r}; known: "
                + ", ".join(sorted([*_FINISH_REASONS, "insufficient_system_resource"])),
            )
        )


class _TooManyToolCalls(Exception):
    """A stream opened more tool-call indexes than the adapter tracks."""


def _optional_str(obj: Mapping[str, Any], key: str) -> str | None:
    value = obj.get(key)
    if value is None or isinstance(value, str):
        return value
    raise _Malformed(f"{key} is not a string")
