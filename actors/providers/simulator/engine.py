"""The simulator engine: a deterministic, DeepSeek-compatible chat-completions server core.

`SimulatorEngine.handle` takes one HTTP request (`SimRequest`) and returns a
`SimResponse` whose body is bytes or an async generator of bytes (an event
stream). It knows nothing of sockets: `simulator_transport` puts it behind
`httpx.MockTransport`, `SimulatorApp` behind ASGI, `serve_simulator` on a
loopback port.

Routes: `POST /chat/completions` (and `/v1/...`), `GET /models` (and
`/v1/models`), `POST /_sim/flush` (empties the prefix cache). Chat requests
are checked the way DeepSeek checks them (bearer key, JSON, message shapes,
tool-call/tool-result pairing, the reasoning-content rule of the model's
profile), answered by the deterministic model or a scripted reply, accounted
in the prefix cache, and streamed as server-sent events, with the request's
`Fault` applied. Every chat request is recorded (`requests`), including what
became of it: completed, rejected, reset, or disconnected by the client.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import types
from collections import deque
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from http import HTTPStatus
from typing import Any, Literal, TypeAlias

import attrs
import trio

from actors.providers.simulator.cache import CacheStatistics, PrefixCache
from actors.providers.simulator.faults import FAULT_HEADER, Fault, FaultError, FaultPlan
from actors.providers.simulator.model import (
    ReplyScript,
    SimReply,
    SimToolCall,
    call_id,
    deterministic_reply,
)
from actors.providers.simulator.tokens import render_message, render_prompt, tokenize

Profile: TypeAlias = Literal["v4", "r1"]
"""A model's reasoning-content rule: `v4` requires `reasoning_content` on every
assistant message with tool calls; `r1` refuses it on any input message."""
Outcome: TypeAlias = Literal[
    "pending", "streaming", "completed", "rejected", "reset", "disconnected"
]
"""What became of a recorded chat request."""

_CHAT_PATHS = ("/chat/completions", "/v1/chat/completions")
_MODEL_PATHS = ("/models", "/v1/models")
_FLUSH_PATH = "/_sim/flush"
_ARGUMENT_PIECE = 8
_SSE_HEADERS = (
    ("content-type", "text/event-stream; charset=utf-8"),
    ("cache-control", "no-cache"),
)
_JSON_HEADERS = (("content-type", "application/json"),)
_STATUS_MESSAGES = {
    400: "Invalid Format",
    401: "Authentication Fails",
    402: "Insufficient Balance",
    422: "Invalid Parameters",
    429: "Rate Limit Reached",
    500: "Server Error",
    503: "Server Overloaded",
}
_ROLES = ("system", "user", "assistant", "tool")


def _default_profiles() -> Mapping[str, Profile]:
    return types.MappingProxyType({"deepseek-chat": "v4", "deepseek-reasoner": "r1"})


def _freeze_profiles(value: Mapping[str, Profile]) -> Mapping[str, Profile]:
    for name, profile in value.items():
        if profile not in ("v4", "r1"):
            raise ValueError(f"model {name!r} has profile {profile!r}; profiles: v4, r1")
    return types.MappingProxyType(dict(value))


@attrs.frozen(kw_only=True)
class SimulatorConfig:
    """How the simulator behaves.

    Attributes:
        api_key: The bearer key chat and model requests must carry; None
            accepts any (or none).
        profiles: Known models and their reasoning-content rule.
        default_profile: The profile of models not in `profiles`; None
            refuses unknown models ("Model Not Exist").
        reply_tokens: Length of the deterministic filler reply, in tokens.
        token_rate: Streamed tokens per second; 0 streams as fast as possible.
        cache_block_tokens: Prefix-cache block size.
        cache_ttl: Seconds an unused cache block lives; None: until evicted.
        cache_max_blocks: The most cache blocks kept.
        max_body_bytes: The largest request body accepted (413 beyond).
        max_recorded: How many recent chat requests `requests` keeps.
    """

    api_key: str | None = "sk-simulator"
    profiles: Mapping[str, Profile] = attrs.field(
        factory=_default_profiles, converter=_freeze_profiles
    )
    default_profile: Profile | None = "v4"
    reply_tokens: int = 24
    token_rate: float = 0.0
    cache_block_tokens: int = 64
    cache_ttl: float | None = None
    cache_max_blocks: int = 1 << 16
    max_body_bytes: int = 8 * 1024 * 1024
    max_recorded: int = 1000

    def __attrs_post_init__(self) -> None:
        if self.reply_tokens < 1:
            raise ValueError(f"reply_tokens must be positive, got {self.reply_tokens}")
        if not (self.token_rate >= 0 and math.isfinite(self.token_rate)):
            raise ValueError(f"token_rate must be finite and >= 0, got {self.token_rate!r}")
        if self.max_body_bytes < 1 or self.max_recorded < 1:
            raise ValueError("max_body_bytes and max_recorded must be positive")


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

    Iterating it paces the events (on Trio's clock) and raises
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


@attrs.define(kw_only=True, eq=False)
class RecordedRequest:
    """A chat request the engine received, and what became of it.

    Attributes:
        number: The chat request's number, from 0.
        path: The path it was sent to.
        headers: Its headers.
        raw: Its body bytes.
        body: Its body as JSON, when it parsed.
        fault: The fault applied, once chosen.
        status: The response status, once sent.
        usage: The usage reported for it, once computed.
        outcome: What became of it.
    """

    number: int
    path: str
    headers: Mapping[str, str]
    raw: bytes
    body: Any = None
    fault: Fault | None = None
    status: int | None = None
    usage: Mapping[str, Any] | None = None
    outcome: Outcome = "pending"
    _settled: trio.Event = attrs.field(factory=trio.Event, init=False)

    async def wait_settled(self) -> Outcome:
        """Wait until the request's outcome is final (not pending or streaming); return it.

        Cancellation: safe to cancel; nothing changes.
        """
        await self._settled.wait()
        return self.outcome

    def _settle(self, outcome: Outcome) -> None:
        self.outcome = outcome
        if outcome not in ("pending", "streaming"):
            self._settled.set()


@attrs.frozen(kw_only=True)
class SimulatorStatistics:
    """Counters of a `SimulatorEngine`.

    Attributes:
        chat_requests: Chat requests received.
        streaming: Event streams in progress.
        disconnects: Streams the client left before their end.
        resets: Connections the engine dropped on purpose.
        cache: The prefix cache's counters.
    """

    chat_requests: int
    streaming: int
    disconnects: int
    resets: int
    cache: CacheStatistics


class _Rejection(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


@attrs.frozen(kw_only=True)
class _Chat:
    model: str
    profile: Profile
    messages: list[dict[str, Any]]
    tools: list[Any] | None
    max_tokens: int | None
    thinking: bool
    cache_key: str


class SimulatorEngine:
    """A deterministic DeepSeek-compatible chat-completions server, without sockets.

    Args:
        config: Behaviour knobs.
        clock: Monotonic seconds, for cache TTLs (default `trio.current_time`).
        wall_clock: Epoch seconds, for the `created` field of chunks.

    Attributes:
        faults: Faults for upcoming chat requests.
        replies: Scripted replies for upcoming chat requests.
    """

    def __init__(
        self,
        config: SimulatorConfig | None = None,
        *,
        clock: Callable[[], float] = trio.current_time,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config or SimulatorConfig()
        self.faults = FaultPlan()
        self.replies = ReplyScript()
        self._wall_clock = wall_clock
        self._cache = PrefixCache(
            block_tokens=self.config.cache_block_tokens,
            ttl=self.config.cache_ttl,
            max_blocks=self.config.cache_max_blocks,
            clock=clock,
        )
        self._records: deque[RecordedRequest] = deque(maxlen=self.config.max_recorded)
        self._chat_requests = 0
        self._streaming = 0
        self._disconnects = 0
        self._resets = 0

    @property
    def requests(self) -> list[RecordedRequest]:
        """The most recent chat requests (up to `max_recorded`), oldest first."""
        return list(self._records)

    def statistics(self) -> SimulatorStatistics:
        """Current counters."""
        return SimulatorStatistics(
            chat_requests=self._chat_requests,
            streaming=self._streaming,
            disconnects=self._disconnects,
            resets=self._resets,
            cache=self._cache.statistics(),
        )

    def flush_cache(self) -> int:
        """Empty the prefix cache; returns how many blocks were dropped."""
        return self._cache.flush()

    async def handle(self, request: SimRequest) -> SimResponse:
        """Answer one HTTP request.

        Cancellation: cancelling a request waiting on a `first_byte_delay`
        abandons it; a returned stream does its waiting while iterated.

        Raises:
            ConnectionReset: the request's fault drops the connection before
                the response headers.
        """
        if request.path in _CHAT_PATHS:
            if request.method != "POST":
                return _error_response(405, f"{request.path} accepts POST, not {request.method}")
            return await self._chat(request)
        if request.path in _MODEL_PATHS:
            if request.method != "GET":
                return _error_response(405, f"{request.path} accepts GET, not {request.method}")
            rejection = self._auth_failure(request)
            if rejection is not None:
                return rejection
            return _json_response(200, self._model_list())
        if request.path == _FLUSH_PATH:
            if request.method != "POST":
                return _error_response(405, f"{_FLUSH_PATH} accepts POST, not {request.method}")
            return _json_response(200, {"flushed_blocks": self.flush_cache()})
        routes = ", ".join([*_CHAT_PATHS, *_MODEL_PATHS, _FLUSH_PATH])
        return _error_response(404, f"no route {request.method} {request.path}; routes: {routes}")

    def _model_list(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "owned_by": "simulator"}
                for name in sorted(self.config.profiles)
            ],
        }

    def _auth_failure(self, request: SimRequest) -> SimResponse | None:
        key = self.config.api_key
        if key is None:
            return None
        given = request.headers.get("authorization", "")
        if given == f"Bearer {key}":
            return None
        token = given.removeprefix("Bearer ").strip()
        shown = f"****{token[-4:]}" if token else "(none)"
        return _error_response(
            401,
            f"Authentication Fails, Your api key: {shown} is invalid",
            type_="authentication_error",
            code="invalid_request_error",
        )

    async def _chat(self, request: SimRequest) -> SimResponse:
        record = RecordedRequest(
            number=self._chat_requests,
            path=request.path,
            headers=types.MappingProxyType(dict(request.headers)),
            raw=request.body,
        )
        self._chat_requests += 1
        self._records.append(record)
        rejection = self._auth_failure(request)
        if rejection is not None:
            return _rejected(record, rejection)
        if len(request.body) > self.config.max_body_bytes:
            return _rejected(
                record,
                _error_response(413, f"request body exceeds {self.config.max_body_bytes} bytes"),
            )
        try:
            record.body = json.loads(request.body)
        except ValueError as exc:
            return _rejected(
                record,
                _error_response(400, f"Failed to deserialize the JSON body: {exc}"),
            )
        try:
            chat = self._validate(record.body)
            fault = self.faults.take(record.number, request.headers.get(FAULT_HEADER))
        except _Rejection as exc:
            return _rejected(record, _error_response(exc.status, exc.message, param=exc.param))
        except FaultError as exc:
            return _rejected(record, _error_response(400, str(exc), param="X-Sim-Fault"))
        record.fault = fault
        if fault.first_byte_delay:
            slept = False
            try:
                await trio.sleep(fault.first_byte_delay)
                slept = True
            finally:
                if not slept:  # the client gave up waiting for the headers
                    self._note_abandoned(record)
        if fault.reset_before_headers:
            record._settle("reset")
            self._resets += 1
            raise ConnectionReset(f"chat request {record.number}: reset before headers")
        if fault.status is not None:
            headers: list[tuple[str, str]] = []
            if fault.retry_after is not None:
                headers.append(("retry-after", fault.retry_after))
            if fault.retry_after_ms is not None:
                headers.append(("retry-after-ms", str(fault.retry_after_ms)))
            message = _status_message(fault.status)
            return _rejected(
                record, _error_response(fault.status, message, extra_headers=tuple(headers))
            )
        return self._respond(record, chat, fault)

    def _respond(self, record: RecordedRequest, chat: _Chat, fault: Fault) -> SimResponse:
        prompt = render_prompt(chat.tools, chat.messages)
        seed = hashlib.sha256("".join(prompt).encode()).digest()
        reply = self.replies.take() or deterministic_reply(
            chat.messages,
            thinking=chat.thinking,
            reply_tokens=self.config.reply_tokens,
            seed=seed,
        )
        calls = tuple(
            call if call.id is not None else attrs.evolve(call, id=call_id(seed, n))
            for n, call in enumerate(reply.tool_calls)
        )
        text_tokens = tokenize(reply.text)
        truncated = chat.max_tokens is not None and len(text_tokens) > chat.max_tokens
        if chat.max_tokens is not None:
            text_tokens = text_tokens[: chat.max_tokens]
        reply = attrs.evolve(reply, text="".join(text_tokens), tool_calls=calls)
        finish = fault.finish_reason or reply.finish_reason
        if finish is None:
            finish = "tool_calls" if calls else "length" if truncated else "stop"
        reasoning_tokens = tokenize(reply.reasoning)
        completion = render_message(_echo(reply, chat.profile))
        hit = self._cache.lookup(chat.cache_key, prompt)
        self._cache.insert(chat.cache_key, prompt + completion)
        completion_count = (
            len(reasoning_tokens)
            + len(text_tokens)
            + sum(len(tokenize(call.name + call.arguments)) for call in calls)
        )
        usage: dict[str, Any] = {
            "prompt_tokens": len(prompt),
            "completion_tokens": completion_count,
            "total_tokens": len(prompt) + completion_count,
            "prompt_tokens_details": {"cached_tokens": hit},
            "prompt_cache_hit_tokens": hit,
            "prompt_cache_miss_tokens": len(prompt) - hit,
        }
        if reasoning_tokens:
            usage["completion_tokens_details"] = {"reasoning_tokens": len(reasoning_tokens)}
        record.usage = types.MappingProxyType(usage)
        record.status = 200
        record._settle("streaming")
        frames = _Frames(
            chat=chat,
            number=record.number,
            created=int(self._wall_clock()),
            fault=fault,
            token_delay=1 / self.config.token_rate if self.config.token_rate else 0.0,
        )
        events = frames.build(reply, reasoning_tokens, text_tokens, finish, usage)
        stream = SimStream(self._emit(record, events, fault), lambda: self._note_abandoned(record))
        return SimResponse(status=200, headers=_SSE_HEADERS, stream=stream)

    async def _emit(
        self, record: RecordedRequest, frames: list[_Frame], fault: Fault
    ) -> AsyncGenerator[bytes, None]:
        writer = _Writer(size=fault.write_size, newline="\r\n" if fault.crlf else "\n")
        finished = False
        sent = 0
        self._streaming += 1
        try:
            for position, frame in enumerate(frames):
                pieces: list[bytes] = []
                if frame.event:
                    if fault.reset_after_chunks == sent:
                        for piece in writer.flush():
                            yield piece
                        record._settle("reset")
                        self._resets += 1
                        raise ConnectionReset(
                            f"chat request {record.number}: reset after {sent} events"
                        )
                    if fault.stall_after_chunks == sent:
                        for piece in writer.flush():
                            yield piece
                        await trio.sleep_forever()
                    if fault.malformed_after_chunks == sent:
                        pieces += writer.push('data: {"choices": [{"delta"\n\n')
                    if fault.llama_cpp:
                        pieces += writer.push(": ping\n\n")
                    sent += 1
                if frame.delay:
                    await trio.sleep(frame.delay)
                else:
                    await trio.lowlevel.checkpoint()
                pieces += writer.push(frame.text)
                if position == len(frames) - 1:
                    pieces += writer.flush()
                    # Once the last byte is handed over, the client may hang up
                    # without reading on: that is not a disconnect.
                    finished = True
                    record._settle("completed")
                for piece in pieces:
                    yield piece
        finally:
            self._streaming -= 1
            if not finished:
                self._note_abandoned(record)

    def _note_abandoned(self, record: RecordedRequest) -> None:
        """The client left before the end: a disconnect, unless the request already settled."""
        if record.outcome in ("pending", "streaming"):
            record._settle("disconnected")
            self._disconnects += 1

    def _validate(self, body: object) -> _Chat:
        if not isinstance(body, dict):
            raise _Rejection(422, "the request body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str):
            raise _Rejection(422, "model must be a string", param="model")
        profile = self.config.profiles.get(model, self.config.default_profile)
        if profile is None:
            known = ", ".join(sorted(self.config.profiles))
            raise _Rejection(400, f"Model Not Exist: {model!r}; models: {known}", param="model")
        if body.get("stream") is not True:
            raise _Rejection(400, "the simulator only streams: set stream to true", param="stream")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _Rejection(422, "messages must be a non-empty list", param="messages")
        for index, message in enumerate(messages):
            _check_message(index, message)
        _check_tool_pairing(messages)
        _check_reasoning(messages, profile)
        tools = body.get("tools")
        if tools is not None:
            _check_tools(tools)
        max_tokens = body.get("max_tokens")
        if max_tokens is not None and (
            not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
        ):
            raise _Rejection(422, "max_tokens must be a positive integer", param="max_tokens")
        thinking_value = body.get("thinking")
        if thinking_value is not None and not (
            isinstance(thinking_value, dict)
            and thinking_value.get("type") in ("enabled", "disabled")
        ):
            raise _Rejection(
                422,
                'thinking must be {"type": "enabled"} or {"type": "disabled"}',
                param="thinking",
            )
        thinking = profile == "r1" or (
            isinstance(thinking_value, dict) and thinking_value.get("type") == "enabled"
        )
        user = body.get("user")
        return _Chat(
            model=model,
            profile=profile,
            messages=messages,
            tools=tools,
            max_tokens=max_tokens,
            thinking=thinking,
            cache_key=json.dumps([model, thinking, user if isinstance(user, str) else None]),
        )


def _check_message(index: int, message: object) -> None:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise _Rejection(422, f"{where} must be an object", param=where)
    role = message.get("role")
    if role not in _ROLES:
        raise _Rejection(422, f"{where}.role must be one of {', '.join(_ROLES)}", param=where)
    content = message.get("content")
    if not (content is None or isinstance(content, str) or _text_parts(content)):
        raise _Rejection(
            422, f"{where}.content must be a string, null or a list of text parts", param=where
        )
    reasoning = message.get("reasoning_content")
    if reasoning is not None and not isinstance(reasoning, str):
        raise _Rejection(422, f"{where}.reasoning_content must be a string", param=where)
    if role == "tool" and not isinstance(message.get("tool_call_id"), str):
        raise _Rejection(422, f"{where}.tool_call_id must be a string", param=where)
    calls = message.get("tool_calls")
    if calls is None:
        return
    if role != "assistant" or not isinstance(calls, list):
        raise _Rejection(422, f"{where}.tool_calls must be a list on an assistant", param=where)
    for number, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not (
            isinstance(call, dict)
            and isinstance(call.get("id"), str)
            and call.get("type") == "function"
            and isinstance(function, dict)
            and isinstance(function.get("name"), str)
            and isinstance(function.get("arguments"), str)
        ):
            raise _Rejection(
                422,
                f"{where}.tool_calls[{number}] must be "
                '{"id", "type": "function", "function": {"name", "arguments"}} with strings',
                param=where,
            )


def _text_parts(content: object) -> bool:
    return isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        for part in content
    )


def _check_tool_pairing(messages: Sequence[dict[str, Any]]) -> None:
    pending: set[str] = set()
    for index, message in enumerate(messages):
        role = message["role"]
        if role == "tool":
            answered = message["tool_call_id"]
            if answered not in pending:
                raise _Rejection(
                    400,
                    f"Messages with role 'tool' must be a response to a preceding message with "
                    f"'tool_calls' (messages[{index}] answers unknown call {answered!r})",
                    param=f"messages[{index}]",
                )
            pending.discard(answered)
            continue
        if pending:
            raise _Rejection(
                400,
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. (insufficient tool messages following "
                f"tool_calls message; missing {', '.join(sorted(pending))} "
                f"before messages[{index}])",
                param=f"messages[{index}]",
            )
        pending = {call["id"] for call in message.get("tool_calls") or ()}
    if pending:
        raise _Rejection(
            400,
            "An assistant message with 'tool_calls' must be followed by tool messages "
            "responding to each 'tool_call_id'. (insufficient tool messages following "
            f"tool_calls message; missing {', '.join(sorted(pending))} at the end)",
            param="messages",
        )


def _check_reasoning(messages: Sequence[dict[str, Any]], profile: Profile) -> None:
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        has_reasoning = message.get("reasoning_content") is not None
        if profile == "v4" and message.get("tool_calls") and not has_reasoning:
            raise _Rejection(
                400,
                f"Missing `reasoning_content` field in the assistant message at message index "
                f"{index}: an assistant message with tool_calls must carry its reasoning_content",
                param=f"messages[{index}].reasoning_content",
            )
        if profile == "r1" and has_reasoning:
            raise _Rejection(
                400,
                f"`reasoning_content` is not allowed in input messages for this model "
                f"(messages[{index}])",
                param=f"messages[{index}].reasoning_content",
            )


def _check_tools(tools: object) -> None:
    if not isinstance(tools, list):
        raise _Rejection(422, "tools must be a list", param="tools")
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not (
            isinstance(tool, dict)
            and tool.get("type") == "function"
            and isinstance(function, dict)
            and isinstance(function.get("name"), str)
        ):
            raise _Rejection(
                422,
                f'tools[{index}] must be {{"type": "function", "function": {{"name", ...}}}}',
                param=f"tools[{index}]",
            )


def _echo(reply: SimReply, profile: Profile) -> dict[str, Any]:
    """The assistant message a client following `profile` sends back for `reply`."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.tool_calls and profile == "v4":
        message["reasoning_content"] = reply.reasoning
    if reply.tool_calls:
        message["tool_calls"] = [_call_json(call) for call in reply.tool_calls]
    return message


def _call_json(call: SimToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def _status_message(status: int) -> str:
    if status in _STATUS_MESSAGES:
        return _STATUS_MESSAGES[status]
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return f"Error {status}"


def _rejected(record: RecordedRequest, response: SimResponse) -> SimResponse:
    record.status = response.status
    record._settle("rejected")
    return response


def _json_response(
    status: int, body: object, extra_headers: tuple[tuple[str, str], ...] = ()
) -> SimResponse:
    data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    return SimResponse(status=status, headers=_JSON_HEADERS + extra_headers, body=data)


def _error_response(
    status: int,
    message: str,
    *,
    type_: str | None = None,
    param: str | None = None,
    code: str | None = None,
    extra_headers: tuple[tuple[str, str], ...] = (),
) -> SimResponse:
    """A DeepSeek error body: `{"error": {"message", "type", "param", "code"}}`."""
    if type_ is None:
        type_ = "invalid_request_error" if status < 500 else "server_error"
        if status == 429:
            type_ = "rate_limit_error"
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return _json_response(status, body, extra_headers)


@attrs.frozen(kw_only=True)
class _Frame:
    text: str
    event: bool
    delay: float = 0.0


@attrs.frozen(kw_only=True)
class _Frames:
    """Builds the event stream of one reply, as frames to pace and write."""

    chat: _Chat
    number: int
    created: int
    fault: Fault
    token_delay: float

    def build(
        self,
        reply: SimReply,
        reasoning_tokens: list[str],
        text_tokens: list[str],
        finish: str,
        usage: dict[str, Any],
    ) -> list[_Frame]:
        fault = self.fault
        frames = [
            _Frame(text=f"{fault.keepalive_line}\n\n", event=False, delay=fault.keepalive_interval)
            for _ in range(fault.keepalives)
        ]
        first: dict[str, Any] = {"role": "assistant", "content": ""}
        if reasoning_tokens:
            first = {"role": "assistant", "content": None, "reasoning_content": ""}
        frames.append(self._event({"delta": first}))
        frames += [self._token({"reasoning_content": token}) for token in reasoning_tokens]
        frames += [self._token({"content": token}) for token in text_tokens]
        frames += [self._token({"tool_calls": [piece]}) for piece in self._call_pieces(reply)]
        with_usage = fault.usage == "final" and not fault.llama_cpp
        frames.append(
            self._event(
                {"delta": {"content": ""}, "finish_reason": finish},
                usage=usage if with_usage else None,
            )
        )
        if fault.usage == "separate" and not fault.llama_cpp:
            frames.append(self._event(None, usage=usage))
        if not fault.omit_done:
            frames.append(_Frame(text="data: [DONE]\n\n", event=True))
        return frames

    def _call_pieces(self, reply: SimReply) -> list[dict[str, Any]]:
        """Tool-call fragments, the calls interleaved round-robin."""
        sequences: list[list[dict[str, Any]]] = []
        for index, call in enumerate(reply.tool_calls):
            arguments = call.arguments
            pieces = [
                arguments[start : start + _ARGUMENT_PIECE]
                for start in range(0, len(arguments), _ARGUMENT_PIECE)
            ]
            sequence: list[dict[str, Any]] = [
                {
                    "index": index,
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": ""},
                }
            ]
            for piece in pieces:
                if self.fault.llama_cpp:
                    # llama.cpp repeats the id and the name on every fragment.
                    sequence.append(
                        {
                            "index": index,
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": piece},
                        }
                    )
                else:
                    sequence.append({"index": index, "function": {"arguments": piece}})
            sequences.append(sequence)
        longest = max((len(sequence) for sequence in sequences), default=0)
        return [
            sequence[position]
            for position in range(longest)
            for sequence in sequences
            if position < len(sequence)
        ]

    def _token(self, delta: dict[str, Any]) -> _Frame:
        return attrs.evolve(self._event({"delta": delta}), delay=self.token_delay)

    def _event(
        self, choice: dict[str, Any] | None, *, usage: dict[str, Any] | None = None
    ) -> _Frame:
        chunk: dict[str, Any] = {
            "id": f"chatcmpl-sim-{self.number}",
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.chat.model,
            "system_fingerprint": "fp_simulator",
            "choices": [],
        }
        if choice is not None:
            chunk["choices"] = [
                {"index": 0, "logprobs": None, "finish_reason": None, **choice},
            ]
        if usage is not None:
            chunk["usage"] = usage
        data = json.dumps(chunk, separators=(",", ":"), ensure_ascii=False)
        return _Frame(text=f"data: {data}\n\n", event=True)


@attrs.define(kw_only=True, eq=False)
class _Writer:
    """Encodes frames with `newline` line ends, re-cut into writes of `size` bytes."""

    size: int | None
    newline: str
    _pending: bytearray = attrs.field(factory=bytearray, init=False)

    def push(self, text: str) -> list[bytes]:
        data = text.replace("\n", self.newline).encode()
        if self.size is None:
            return [data]
        self._pending += data
        pieces = []
        while len(self._pending) >= self.size:
            pieces.append(bytes(self._pending[: self.size]))
            del self._pending[: self.size]
        return pieces

    def flush(self) -> list[bytes]:
        if not self._pending:
            return []
        piece = bytes(self._pending)
        self._pending.clear()
        return [piece]
