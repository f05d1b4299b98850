"""The simulator engine: a deterministic, DeepSeek-compatible chat-completions server core.

`SimulatorEngine.handle` takes one HTTP request (`SimRequest`) and returns a
`SimResponse` whose body is bytes or an async generator of bytes (an event
stream). It knows nothing of sockets: `simulator_transport` puts it behind
`httpx.MockTransport`, `SimulatorApp` behind ASGI, `serve_simulator` on a
loopback port.

Routes: `POST /chat/completions` (and `/v1/...`), `GET /models` (and
`/v1/models`), `POST /_sim/flush` (empties the prefix cache). The engine
routes and authenticates requests; chat requests are validated
(`validation`), answered by the deterministic model or a scripted reply,
accounted in the prefix cache, and streamed as server-sent events
(`streaming`) with the request's `Fault` applied, or, for `stream: false`,
sent as one `chat.completion` body (`completion`). Every chat request is
recorded (`requests`), including what became of it: completed, rejected,
reset, or disconnected by the client.

The engine waits through AnyIO, so it runs under Trio (the tests, the
demo, `serve_simulator`) and under asyncio (the benchmark's simulator
process, served by Uvicorn); under Trio every wait is Trio's own, so
`autojump_clock` tests take no real time.
"""

from __future__ import annotations

import time
import types
from collections import deque
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import aclosing
from typing import Any, Literal, TypeAlias

import anyio
import attrs

from actors.providers.simulator.answer import Answer, compose_answer
from actors.providers.simulator.body_json import parse_body
from actors.providers.simulator.cache import CacheStatistics, PrefixCache
from actors.providers.simulator.completion import completion_body, stream_only_fields
from actors.providers.simulator.config import Profile, SimulatorConfig
from actors.providers.simulator.exchange import (
    ConnectionReset,
    SimRequest,
    SimResponse,
    SimStream,
)
from actors.providers.simulator.faults import FAULT_HEADER, Fault, FaultError, FaultPlan
from actors.providers.simulator.model import ReplyScript
from actors.providers.simulator.prompt_chain import PromptChains
from actors.providers.simulator.responses import (
    error_response,
    fault_response,
    json_response,
    stream_response,
)
from actors.providers.simulator.streaming import Frame, Frames, write_events
from actors.providers.simulator.tool_lists import ToolLists
from actors.providers.simulator.validation import Chat, Rejection, parse_chat

__all__ = [
    "ConnectionReset",
    "Outcome",
    "Profile",
    "RecordedRequest",
    "SimRequest",
    "SimResponse",
    "SimStream",
    "SimulatorConfig",
    "SimulatorEngine",
    "SimulatorStatistics",
]

Outcome: TypeAlias = Literal[
    "pending", "streaming", "completed", "rejected", "reset", "disconnected"
]
"""What became of a recorded chat request."""

_CHAT_PATHS = ("/chat/completions", "/v1/chat/completions")
_MODEL_PATHS = ("/models", "/v1/models")
_FLUSH_PATH = "/_sim/flush"
_ROUTES = {
    **dict.fromkeys(_CHAT_PATHS, "POST"),
    **dict.fromkeys(_MODEL_PATHS, "GET"),
    _FLUSH_PATH: "POST",
}
"""The method each path accepts, in the order the 404 message lists them."""


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
    _settled: anyio.Event = attrs.field(factory=anyio.Event, init=False)

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


class SimulatorEngine:
    """A deterministic DeepSeek-compatible chat-completions server, without sockets.

    Args:
        config: Behaviour knobs.
        clock: Monotonic seconds, for cache TTLs (default `anyio.current_time`: the
            event loop's clock, Trio's under Trio).
        wall_clock: Epoch seconds, for the `created` field of chunks.

    Attributes:
        faults: Faults for upcoming chat requests.
        replies: Scripted replies for upcoming chat requests.
    """

    def __init__(
        self,
        config: SimulatorConfig | None = None,
        *,
        clock: Callable[[], float] = anyio.current_time,
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
        self._chains = PromptChains(
            block_tokens=self.config.cache_block_tokens,
            max_nodes=self.config.prompt_memo_segments,
            max_chars=self.config.prompt_memo_chars,
        )
        self._tool_lists = ToolLists()
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
        method = _ROUTES.get(request.path)
        if method is None:
            routes = ", ".join(_ROUTES)
            return error_response(
                404, f"no route {request.method} {request.path}; routes: {routes}"
            )
        if request.method != method:
            return error_response(405, f"{request.path} accepts {method}, not {request.method}")
        if request.path in _CHAT_PATHS:
            return await self._chat(request)
        if request.path in _MODEL_PATHS:
            return self._models(request)
        return json_response(200, {"flushed_blocks": self.flush_cache()})

    def _models(self, request: SimRequest) -> SimResponse:
        rejection = self._auth_failure(request)
        if rejection is not None:
            return rejection
        return json_response(
            200,
            {
                "object": "list",
                "data": [
                    {"id": name, "object": "model", "owned_by": "simulator"}
                    for name in sorted(self.config.profiles)
                ],
            },
        )

    def _auth_failure(self, request: SimRequest) -> SimResponse | None:
        key = self.config.api_key
        if key is None:
            return None
        given = request.headers.get("authorization", "")
        if given == f"Bearer {key}":
            return None
        token = given.removeprefix("Bearer ").strip()
        shown = f"****{token[-4:]}" if token else "(none)"
        return error_response(
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
        admitted = self._admit(record, request)
        if isinstance(admitted, SimResponse):
            return _rejected(record, admitted)
        chat, fault = admitted
        record.fault = fault
        await self._wait_before_headers(record, self.config.latency + fault.first_byte_delay)
        if fault.reset_before_headers:
            raise self._reset(record, "before headers")
        failure = fault_response(fault)
        if failure is not None:
            return _rejected(record, failure)
        if not chat.stream:
            return await self._complete(record, chat, fault)
        return self._respond(record, chat, fault)

    async def _wait_before_headers(self, record: RecordedRequest, seconds: float) -> None:
        """Sleep `seconds`; a client giving up meanwhile is recorded as a disconnect."""
        if not seconds:
            return
        slept = False
        try:
            await anyio.sleep(seconds)
            slept = True
        finally:
            if not slept:  # the client gave up waiting for the headers
                self._note_abandoned(record)

    def _admit(
        self, record: RecordedRequest, request: SimRequest
    ) -> tuple[Chat, Fault] | SimResponse:
        """Check a chat request (key, size, JSON, validity, fault header) and take its fault.

        Returns the validated chat and its fault, or the response refusing it.
        """
        rejection = self._auth_failure(request)
        if rejection is not None:
            return rejection
        if len(request.body) > self.config.max_body_bytes:
            return error_response(413, f"request body exceeds {self.config.max_body_bytes} bytes")
        try:
            record.body = parse_body(request.body)
        except ValueError as exc:
            return error_response(400, f"Failed to deserialize the JSON body: {exc}")
        try:
            chat = parse_chat(record.body, self.config, tool_lists=self._tool_lists)
            fault = self.faults.take(
                record.number, request.headers.get(FAULT_HEADER), model=chat.model
            )
        except Rejection as exc:
            return error_response(exc.status, exc.message, param=exc.param)
        except FaultError as exc:
            return error_response(400, str(exc), param="X-Sim-Fault")
        unusable = [] if chat.stream else stream_only_fields(fault)
        if unusable:
            return error_response(
                400,
                f"fault field(s) {', '.join(unusable)} need a streamed request (stream: true)",
                param="X-Sim-Fault",
            )
        return chat, fault

    def _answer(self, record: RecordedRequest, chat: Chat, fault: Fault) -> Answer:
        answer = compose_answer(
            chat,
            fault,
            replies=self.replies,
            script=self.config.script,
            cache=self._cache,
            chains=self._chains,
            reply_tokens=self.config.reply_tokens,
        )
        record.usage = types.MappingProxyType(answer.usage)
        return answer

    async def _complete(self, record: RecordedRequest, chat: Chat, fault: Fault) -> SimResponse:
        """Answer a non-streamed request after the time its tokens would take to stream."""
        answer = self._answer(record, chat, fault)
        if self.config.token_rate:
            tokens = int(answer.usage["completion_tokens"])
            await self._wait_before_headers(record, tokens / self.config.token_rate)
        body = completion_body(
            answer, model=chat.model, number=record.number, created=int(self._wall_clock())
        )
        record.status = 200
        record._settle("completed")
        return json_response(200, body)

    def _respond(self, record: RecordedRequest, chat: Chat, fault: Fault) -> SimResponse:
        answer = self._answer(record, chat, fault)
        record.status = 200
        record._settle("streaming")
        frames = Frames(
            model=chat.model,
            number=record.number,
            created=int(self._wall_clock()),
            # Usage goes where the fault puts it, and only when the client asked for it.
            fault=fault if chat.include_usage else attrs.evolve(fault, usage="none"),
            token_delay=1 / self.config.token_rate if self.config.token_rate else 0.0,
        )
        events = frames.build(
            answer.reply, answer.reasoning_tokens, answer.text_tokens, answer.finish, answer.usage
        )
        stream = SimStream(self._emit(record, events, fault), lambda: self._note_abandoned(record))
        return stream_response(stream)

    async def _emit(
        self, record: RecordedRequest, frames: list[Frame], fault: Fault
    ) -> AsyncGenerator[bytes, None]:
        """Write `frames`, keeping the stream counters and the record's outcome."""
        self._streaming += 1
        try:
            body = write_events(
                frames,
                fault,
                on_complete=lambda: record._settle("completed"),
                on_reset=lambda sent: self._reset(record, f"after {sent} events"),
            )
            async with aclosing(body):
                async for piece in body:
                    yield piece
        finally:
            self._streaming -= 1
            # A no-op once completed or reset: only an early end is a disconnect.
            self._note_abandoned(record)

    def _reset(self, record: RecordedRequest, where: str) -> ConnectionReset:
        """Settle `record` as reset; the exception that drops its connection."""
        record._settle("reset")
        self._resets += 1
        return ConnectionReset(f"chat request {record.number}: reset {where}")

    def _note_abandoned(self, record: RecordedRequest) -> None:
        """The client left before the end: a disconnect, unless the request already settled."""
        if record.outcome in ("pending", "streaming"):
            record._settle("disconnected")
            self._disconnects += 1


def _rejected(record: RecordedRequest, response: SimResponse) -> SimResponse:
    record.status = response.status
    record._settle("rejected")
    return response
