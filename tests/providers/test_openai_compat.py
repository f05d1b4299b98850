"""The OpenAI-compatible adapter against the simulator: serialization, streaming, failures, clocks.

Stream tests run three times: through `httpx.MockTransport` ("mock"), over a
real loopback socket served by Hypercorn through a plain `httpx.AsyncClient`
("loopback"), and over loopback through a `ProviderClient`, whose transport
the adapter drives directly ("direct"). Clock tests use the mock
front end under `autojump_clock`; a few run on loopback in real time.
"""

from __future__ import annotations

import email.utils
import gzip
import itertools
import json
import socket
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import attrs
import httpx
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from actors.messages import Message, ReasoningBlock, TextBlock, ToolCallBlock
from actors.prompt.types import ToolSchema
from actors.providers import Provider, ProviderError
from actors.providers.chunks import (
    Failure,
    FinishChunk,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
)
from actors.providers.http_client import ProviderClient
from actors.providers.openai_compat import (
    R1_PROFILE,
    V4_PROFILE,
    OpenAICompatProvider,
    StreamTimeouts,
    failure_for_status,
    parse_retry_after,
)
from actors.providers.openai_stream import StreamParser
from actors.providers.request import GenerateRequest
from actors.providers.simulator import (
    Fault,
    SimulatorConfig,
    SimulatorEngine,
    serve_simulator,
    simulator_transport,
)
from tests.providers.simulator_helpers import (
    API_KEY,
    assistant_of,
    calls_of,
    collect,
    finish_of,
    reasoning_of,
    text_of,
    tool_result,
    usage_of,
)

ECHO = ToolSchema(
    name="echo",
    description="Echo the text back.",
    parameters={"type": "object", "properties": {"text": {"type": "string"}}},
)
SYSTEM = "You are a careful assistant. Follow the house rules. " * 25


def _request(
    *messages: Message,
    model: str = "deepseek-chat",
    tools: tuple[ToolSchema, ...] = (),
    system: str | None = None,
    **config: Any,
) -> GenerateRequest:
    return GenerateRequest(
        config={"provider": "sim", "model": model, **config},
        system=system,
        tools=tools,
        messages=messages,
    )


def _failure(chunks: list[Any]) -> Failure:
    finish = finish_of(chunks)
    assert finish.reason == "error" and finish.failure is not None, finish
    return finish.failure


def _mock_provider(engine: SimulatorEngine, **options: Any) -> OpenAICompatProvider:
    client = httpx.AsyncClient(transport=simulator_transport(engine))
    return OpenAICompatProvider(
        client, base_url="http://simulator.test", api_key=API_KEY, **options
    )


@attrs.define
class Frontend:
    """Builds providers talking to an engine through one front end."""

    kind: str
    nursery: trio.Nursery
    clients: list[httpx.AsyncClient] = attrs.field(factory=list)

    async def provider(
        self, engine: SimulatorEngine | None = None, **options: Any
    ) -> tuple[OpenAICompatProvider, SimulatorEngine]:
        engine = engine or SimulatorEngine()
        if self.kind == "mock":
            client = httpx.AsyncClient(transport=simulator_transport(engine))
            base_url = "http://simulator.test"
        elif self.kind == "loopback":
            base_url = await self.nursery.start(serve_simulator, engine)
            client = httpx.AsyncClient(
                timeout=httpx.Timeout(30.0), limits=httpx.Limits(max_connections=4)
            )
        else:
            base_url = await self.nursery.start(serve_simulator, engine)
            client = ProviderClient(
                transport=httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=4)),
                timeout=httpx.Timeout(30.0),
            )
        self.clients.append(client)
        return OpenAICompatProvider(client, base_url=base_url, api_key=API_KEY, **options), engine


@pytest.fixture(params=["mock", "loopback", "direct"])
async def frontend(
    request: pytest.FixtureRequest, nursery: trio.Nursery
) -> AsyncIterator[Frontend]:
    front = Frontend(kind=request.param, nursery=nursery)
    yield front
    for client in front.clients:
        await client.aclose()


# --- serialization -------------------------------------------------------------------------


def _body(request: GenerateRequest, **options: Any) -> dict[str, Any]:
    provider = _mock_provider(SimulatorEngine(), **options)
    body = json.loads(provider.encode_request(request))
    assert isinstance(body, dict)
    return body


def _tool_history() -> tuple[Message, ...]:
    return (
        Message.user("look it up"),
        Message(
            role="assistant",
            content=(
                ReasoningBlock(text="I should call echo."),
                TextBlock(text="Calling."),
                ToolCallBlock(id="c1", name="echo", arguments='{"text":"hi"}'),
            ),
        ),
        tool_result("c1", "hi"),
        Message(
            role="assistant", content=(ReasoningBlock(text="done thinking"), TextBlock(text="ok"))
        ),
    )


def test_system_text_leads_and_history_maps_to_roles() -> None:
    body = _body(_request(*_tool_history(), system="Be brief."))
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "look it up"},
        {
            "role": "assistant",
            "content": "Calling.",
            "reasoning_content": "I should call echo.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "echo", "arguments": '{"text":"hi"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "hi"},
        {"role": "assistant", "content": "ok"},
    ]


def test_v4_sends_empty_reasoning_content_with_tool_calls_that_had_none() -> None:
    assistant = Message(
        role="assistant", content=(ToolCallBlock(id="c1", name="f", arguments="{}"),)
    )
    body = _body(_request(Message.user("go"), assistant, tool_result("c1", "x")))
    assert body["messages"][1]["reasoning_content"] == ""


def test_r1_never_sends_reasoning_content() -> None:
    body = _body(
        _request(*_tool_history(), model="deepseek-reasoner"),
        profiles={"deepseek-reasoner": R1_PROFILE},
    )
    assert not any("reasoning_content" in message for message in body["messages"])


def test_tools_are_omitted_when_empty_and_framed_as_functions() -> None:
    assert "tools" not in _body(_request(Message.user("x")))
    body = _body(_request(Message.user("x"), tools=(ECHO,)))
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "echo",
                "description": "Echo the text back.",
                "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
            },
        }
    ]


def test_each_tool_is_written_with_a_fixed_key_order() -> None:
    raw = _mock_provider(SimulatorEngine()).encode_request(
        _request(Message.user("x"), tools=(ECHO,))
    )
    assert (
        b',"tools":[{"type":"function","function":{"name":"echo",'
        b'"description":"Echo the text back.","parameters":{"type":"object",'
    ) in raw


def test_the_body_has_a_fixed_key_order_and_always_streams_usage() -> None:
    request = _request(
        Message.user("x"),
        tools=(ECHO,),
        max_tokens=50,
        temperature=0.5,
        thinking={"type": "enabled"},
        reasoning_effort="high",
        tool_choice="required",
        parallel_tool_calls=False,
        response_format={"type": "json_object"},
        stop=["END"],
        unrelated="not sent",
    )
    body = _body(request)
    assert list(body) == [
        "model",
        "messages",
        "tools",
        "max_tokens",
        "temperature",
        "thinking",
        "reasoning_effort",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "stop",
        "stream",
        "stream_options",
    ]
    assert body["tool_choice"] == "required" and body["parallel_tool_calls"] is False
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["thinking"] == {"type": "enabled"} and body["reasoning_effort"] == "high"
    assert list(_body(_request(Message.user("x")))) == [
        "model",
        "messages",
        "stream",
        "stream_options",
    ]


def test_equal_requests_give_identical_compact_unescaped_bytes() -> None:
    provider = _mock_provider(SimulatorEngine())
    one = provider.encode_request(_request(Message.user("héllo ✓"), tools=(ECHO,), system="S"))
    two = provider.encode_request(_request(Message.user("héllo ✓"), tools=(ECHO,), system="S"))
    assert one == two
    assert "héllo ✓".encode() in one
    assert b": " not in one and b", " not in one


def test_tool_schemas_are_serialized_once_per_tool_tuple() -> None:
    provider = _mock_provider(SimulatorEngine())
    tools = (ECHO,)
    for text in ("a", "b", "c"):
        provider.encode_request(_request(Message.user(text), tools=tools))
    assert provider.statistics().tool_encodings == 1
    provider.encode_request(
        _request(Message.user("d"), tools=(ECHO, attrs.evolve(ECHO, name="e2")))
    )
    assert provider.statistics().tool_encodings == 2


def test_a_bad_base_url_fails_at_construction() -> None:
    client = httpx.AsyncClient()
    with pytest.raises(ProviderError, match="ftp://x"):
        OpenAICompatProvider(client, base_url="ftp://x", api_key=None)


def test_the_provider_satisfies_the_protocol() -> None:
    assert isinstance(_mock_provider(SimulatorEngine()), Provider)


def test_the_model_name_is_sent_verbatim_and_unknown_names_get_the_default_profile() -> None:
    name = "vendor/Some-Model:2025 ✓"
    provider = _mock_provider(SimulatorEngine())
    assert (
        json.loads(provider.encode_request(_request(Message.user("x"), model=name)))["model"]
        == name
    )
    assert provider.profile_for(name) == V4_PROFILE


# --- streaming -----------------------------------------------------------------------------


async def test_a_text_reply_streams_with_usage_and_completes(frontend: Frontend) -> None:
    provider, engine = await frontend.provider(SimulatorEngine(SimulatorConfig(reply_tokens=12)))
    chunks = await collect(provider, _request(Message.user("hello")))
    assert len([chunk for chunk in chunks if isinstance(chunk, TextDelta)]) == 12
    recorded = engine.requests[0]
    assert recorded.usage is not None
    assert usage_of(chunks) == Usage(
        input_tokens=recorded.usage["prompt_tokens"], output_tokens=12, cache_read_tokens=0
    )
    assert finish_of(chunks) == FinishChunk(reason="completed")
    assert recorded.outcome == "completed"
    assert recorded.raw == provider.encode_request(_request(Message.user("hello")))


async def test_a_provider_client_request_carries_the_clients_headers_without_compression(
    nursery: trio.Nursery,
) -> None:
    engine = SimulatorEngine()
    url = await nursery.start(serve_simulator, engine)
    plain = httpx.AsyncClient(headers={"x-team": "a"})
    direct = ProviderClient(transport=httpx.AsyncHTTPTransport(), timeout=httpx.Timeout(30.0))
    direct.headers["x-team"] = "a"
    request = _request(Message.user("hello"))
    async with plain, direct:
        for client in (plain, direct):
            provider = OpenAICompatProvider(client, base_url=url, api_key=API_KEY)
            assert finish_of(await collect(provider, request)).reason == "completed"
    sent_plain, sent_direct = (dict(record.headers) for record in engine.requests)
    assert "gzip" in sent_plain.pop("accept-encoding")
    assert sent_direct.pop("accept-encoding") == "identity"
    assert sent_plain == sent_direct
    assert sent_direct["x-team"] == "a"
    assert engine.requests[0].raw == engine.requests[1].raw


async def test_a_compressed_stream_through_a_provider_client_is_decoded() -> None:
    body = b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\ndata: [DONE]\n\n'

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200,
            headers={"content-type": "text/event-stream", "content-encoding": "gzip"},
            content=gzip.compress(body),
        )

    client = ProviderClient(transport=httpx.MockTransport(handler), timeout=httpx.Timeout(5.0))
    async with client:
        provider = OpenAICompatProvider(client, base_url="http://sim.test", api_key=None)
        chunks = await collect(provider, _request(Message.user("hello")))
    assert text_of(chunks) == "hi"
    assert finish_of(chunks).reason == "completed"


async def test_parallel_tool_calls_are_announced_once_and_arguments_pass_raw(
    frontend: Frontend,
) -> None:
    provider, _ = await frontend.provider()
    text = 'call echo {"text": "first argument"}\ncall echo {"text": "second"}'
    chunks = await collect(provider, _request(Message.user(text), tools=(ECHO,)))
    deltas = [chunk for chunk in chunks if isinstance(chunk, ToolCallDelta)]
    assert [delta.index for delta in deltas[:4]] == [0, 1, 0, 1]
    calls = calls_of(chunks)
    assert [call.arguments for call in calls] == [
        '{"text": "first argument"}',
        '{"text": "second"}',
    ]
    assert finish_of(chunks).reason == "tool-calls"


async def test_llama_cpp_repeated_ids_and_names_are_announced_once(frontend: Frontend) -> None:
    provider, engine = await frontend.provider()
    engine.faults.queue(Fault(llama_cpp=True))
    chunks = await collect(provider, _request(Message.user('call echo {"text": "echo echo"}')))
    (call,) = calls_of(chunks)  # asserts the id and the name came exactly once
    assert call.name == "echo" and call.arguments == '{"text": "echo echo"}'
    assert usage_of(chunks) is None  # llama.cpp sends no usage: none is made up
    assert finish_of(chunks).reason == "tool-calls"


async def test_reasoning_streams_and_goes_back_with_tool_calls(frontend: Frontend) -> None:
    provider, engine = await frontend.provider()
    first = _request(
        Message.user('call echo {"text": "x"}'), tools=(ECHO,), thinking={"type": "enabled"}
    )
    chunks = await collect(provider, first)
    reasoning = reasoning_of(chunks)
    assert reasoning
    usage = usage_of(chunks)
    assert usage is not None and usage.reasoning_tokens
    assistant = assistant_of(chunks)
    second = first.with_messages(
        [*first.messages, assistant, tool_result(assistant.tool_calls[0].id, "x")]
    )
    chunks = await collect(provider, second)
    assert finish_of(chunks).reason == "completed", finish_of(chunks)
    sent = engine.requests[-1].body["messages"][1]
    assert sent["reasoning_content"] == reasoning


async def test_an_r1_history_round_trips_without_reasoning_content(frontend: Frontend) -> None:
    legacy = SimulatorEngine(SimulatorConfig(profiles={"deepseek-reasoner": "r1"}))
    provider, _ = await frontend.provider(legacy, profiles={"deepseek-reasoner": R1_PROFILE})
    first = _request(Message.user('call echo {"text": "x"}'), model="deepseek-reasoner")
    assistant = assistant_of(await collect(provider, first))
    assert any(isinstance(block, ReasoningBlock) for block in assistant.content)
    second = first.with_messages(
        [*first.messages, assistant, tool_result(assistant.tool_calls[0].id, "x")]
    )
    assert finish_of(await collect(provider, second)).reason == "completed"


@pytest.mark.parametrize("usage", ["separate", "final"])
async def test_usage_is_read_from_any_chunk(frontend: Frontend, usage: str) -> None:
    provider, engine = await frontend.provider()
    engine.faults.queue(Fault(usage=usage))  # type: ignore[arg-type]
    chunks = await collect(provider, _request(Message.user("hi")))
    assert usage_of(chunks) is not None
    assert finish_of(chunks).reason == "completed"


async def test_a_missing_usage_chunk_is_not_an_error(frontend: Frontend) -> None:
    provider, engine = await frontend.provider()
    engine.faults.queue(Fault(usage="none"))
    chunks = await collect(provider, _request(Message.user("hi")))
    assert usage_of(chunks) is None and finish_of(chunks).reason == "completed"


async def test_cache_hits_map_to_cache_read_tokens(frontend: Frontend) -> None:
    provider, _ = await frontend.provider()
    request = _request(Message.user("hi"), system=SYSTEM)
    await collect(provider, request)
    usage = usage_of(await collect(provider, request))
    assert usage is not None
    assert usage.cache_read_tokens == usage.input_tokens // 64 * 64 > 0


@pytest.mark.parametrize(
    "fault",
    [
        Fault(keepalives=3, keepalive_interval=0.0),
        Fault(keepalives=2, keepalive_interval=0.0, keepalive_line="data: : keep-alive"),
        Fault(crlf=True),
        Fault(write_size=1),
        Fault(write_size=4096),
        Fault(llama_cpp=True, crlf=True, write_size=3),
    ],
    ids=["comments", "data-keepalive", "crlf", "byte-by-byte", "coalesced", "llama-crlf-split"],
)
async def test_wire_variations_give_the_same_chunks(frontend: Frontend, fault: Fault) -> None:
    provider, _ = await frontend.provider(SimulatorEngine(wall_clock=lambda: 0.0))
    plain = await collect(provider, _request(Message.user("hi")))
    varied_provider, varied = await frontend.provider(SimulatorEngine(wall_clock=lambda: 0.0))
    varied.faults.queue(fault)
    chunks = await collect(varied_provider, _request(Message.user("hi")))
    if fault.llama_cpp:
        plain = [chunk for chunk in plain if not isinstance(chunk, UsageChunk)]
    # Events that arrive in one read come as one joined delta: the same sum, in fewer
    # chunks when the server wrote them together.
    assert _sum_of(chunks) == _sum_of(plain)
    if fault.write_size == 4096:
        assert len(chunks) < len(plain)


def _sum_of(chunks: list[Any]) -> tuple[Any, ...]:
    """What a stream's chunks add up to: text, reasoning, tool calls, usage and finish."""
    return (
        text_of(chunks),
        reasoning_of(chunks),
        calls_of(chunks),
        usage_of(chunks),
        finish_of(chunks),
    )


@pytest.mark.parametrize(
    ("finish_reason", "expected"),
    [("stop", "completed"), ("length", "max-tokens"), ("tool_calls", "tool-calls")],
)
async def test_finish_reasons_map_to_finish_chunks(
    frontend: Frontend, finish_reason: str, expected: str
) -> None:
    provider, engine = await frontend.provider()
    engine.faults.queue(Fault(finish_reason=finish_reason))  # type: ignore[arg-type]
    assert finish_of(await collect(provider, _request(Message.user("hi")))).reason == expected


async def test_max_tokens_in_config_ends_with_max_tokens(frontend: Frontend) -> None:
    provider, engine = await frontend.provider()
    chunks = await collect(provider, _request(Message.user("hi"), max_tokens=4))
    assert finish_of(chunks).reason == "max-tokens"
    assert engine.requests[0].body["max_tokens"] == 4
    assert len([chunk for chunk in chunks if isinstance(chunk, TextDelta)]) == 4


async def test_insufficient_system_resource_is_a_retryable_failure(frontend: Frontend) -> None:
    provider, engine = await frontend.provider()
    engine.faults.queue(Fault(finish_reason="insufficient_system_resource"))
    chunks = await collect(provider, _request(Message.user("hi")))
    failure = _failure(chunks)
    assert failure.code == "insufficient_system_resource" and failure.retryable
    assert usage_of(chunks) is not None  # usage seen before the end is still reported


async def test_content_filter_is_a_final_failure(frontend: Frontend) -> None:
    provider, engine = await frontend.provider()
    engine.faults.queue(Fault(finish_reason="content_filter"))
    failure = _failure(await collect(provider, _request(Message.user("hi"))))
    assert failure.code == "content_filter" and not failure.retryable


# --- failures ------------------------------------------------------------------------------


async def test_a_stream_without_done_is_retryable_truncation(frontend: Frontend) -> None:
    provider, engine = await frontend.provider()
    engine.faults.queue(Fault(omit_done=True))
    chunks = await collect(provider, _request(Message.user("hi")))
    failure = _failure(chunks)
    assert failure.code == "stream_truncated" and failure.retryable
    assert text_of(chunks)  # what streamed before stays in the chunks


async def test_a_reset_mid_stream_is_a_retryable_lost_connection(frontend: Frontend) -> None:
    provider, engine = await frontend.provider()
    engine.faults.queue(Fault(reset_after_chunks=4))
    chunks = await collect(provider, _request(Message.user("hi")))
    failure = _failure(chunks)
    assert failure.code == "connection_lost" and failure.retryable
    assert len([chunk for chunk in chunks if isinstance(chunk, TextDelta)]) == 3
    assert engine.requests[0].outcome == "reset"


async def test_a_malformed_event_is_a_final_failure(frontend: Frontend) -> None:
    provider, engine = await frontend.provider()
    engine.faults.queue(Fault(malformed_after_chunks=2))
    failure = _failure(await collect(provider, _request(Message.user("hi"))))
    assert failure.code == "malformed_event" and not failure.retryable
    assert '{"choices": [{"delta"' in failure.message


async def test_a_reset_before_headers_is_a_retryable_connect_error() -> None:
    engine = SimulatorEngine()
    engine.faults.queue(Fault(reset_before_headers=True))
    failure = _failure(await collect(_mock_provider(engine), _request(Message.user("hi"))))
    assert failure.code == "connect_error" and failure.retryable


async def test_a_reset_before_headers_over_hypercorn_is_a_retryable_500(
    nursery: trio.Nursery,
) -> None:
    # ASGI cannot drop a connection before the headers: Hypercorn answers 500.
    front = Frontend(kind="loopback", nursery=nursery)
    provider, engine = await front.provider()
    engine.faults.queue(Fault(reset_before_headers=True))
    failure = _failure(await collect(provider, _request(Message.user("hi"))))
    assert failure.status == 500 and failure.retryable
    await front.clients[0].aclose()


async def test_a_refused_connection_is_a_retryable_connect_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with httpx.AsyncClient() as client:
        provider = OpenAICompatProvider(client, base_url=f"http://127.0.0.1:{port}", api_key="k")
        failure = _failure(await collect(provider, _request(Message.user("hi"))))
    assert failure.code == "connect_error" and failure.retryable
    assert f"127.0.0.1:{port}" in failure.message


async def test_a_wrong_key_is_a_final_401_carrying_the_server_message(frontend: Frontend) -> None:
    provider, _ = await frontend.provider(SimulatorEngine(SimulatorConfig(api_key="other")))
    failure = _failure(await collect(provider, _request(Message.user("hi"))))
    assert (failure.code, failure.status, failure.retryable) == ("unauthorized", 401, False)
    assert "Authentication Fails" in failure.message


async def test_a_request_the_server_refuses_is_a_final_400(frontend: Frontend) -> None:
    provider, _ = await frontend.provider()
    dangling = Message(
        role="assistant", content=(ToolCallBlock(id="c9", name="f", arguments="{}"),)
    )
    failure = _failure(await collect(provider, _request(Message.user("x"), dangling)))
    assert (failure.code, failure.status, failure.retryable) == ("bad_request", 400, False)
    assert "c9" in failure.message


@pytest.mark.parametrize(
    ("status", "code", "retryable"),
    [
        (400, "bad_request", False),
        (401, "unauthorized", False),
        (402, "insufficient_balance", False),
        (422, "invalid_parameters", False),
        (408, "request_timeout", True),
        (409, "conflict", True),
        (429, "rate_limited", True),
        (500, "server_error", True),
        (502, "bad_gateway", True),
        (503, "server_overloaded", True),
        (504, "gateway_timeout", True),
        (418, "http_error", False),
        (599, "http_error", True),
    ],
)
async def test_statuses_are_classified(
    frontend: Frontend, status: int, code: str, retryable: bool
) -> None:
    provider, engine = await frontend.provider()
    engine.faults.queue(Fault(status=status))
    failure = _failure(await collect(provider, _request(Message.user("hi"))))
    assert (failure.code, failure.status, failure.retryable) == (code, status, retryable)


async def test_statistics_count_requests_and_failures() -> None:
    engine = SimulatorEngine()
    engine.faults.queue(Fault(status=503))
    provider = _mock_provider(engine)
    await collect(provider, _request(Message.user("hi")))
    await collect(provider, _request(Message.user("hi")))
    stats = provider.statistics()
    assert (stats.requests, stats.failures, stats.in_flight) == (2, 1, 0)


async def test_402_says_the_balance_is_exhausted(frontend: Frontend) -> None:
    provider, engine = await frontend.provider()
    engine.faults.queue(Fault(status=402))
    failure = _failure(await collect(provider, _request(Message.user("hi"))))
    assert "balance is exhausted" in failure.message and "Insufficient Balance" in failure.message


@pytest.mark.parametrize(
    ("fault", "expected_ms"),
    [
        (Fault(status=429, retry_after="2"), 2000),
        (Fault(status=503, retry_after="1.5"), 1500),
        (Fault(status=429, retry_after_ms=250), 250),
        (Fault(status=429, retry_after="9", retry_after_ms=250), 250),
        (Fault(status=429, retry_after="3600"), 60_000),
        (Fault(status=429, retry_after_ms=3_600_000), 60_000),
        (Fault(status=429, retry_after="soon"), None),
        (Fault(status=503), None),
    ],
)
async def test_retry_after_is_honoured_up_to_the_cap(
    frontend: Frontend, fault: Fault, expected_ms: int | None
) -> None:
    provider, engine = await frontend.provider()
    engine.faults.queue(fault)
    assert (
        _failure(await collect(provider, _request(Message.user("hi")))).retry_after_ms
        == expected_ms
    )


async def test_retry_after_accepts_an_http_date() -> None:
    engine = SimulatorEngine()
    date = email.utils.formatdate(1_000_030.0, usegmt=True)
    engine.faults.queue(Fault(status=429, retry_after=date))
    provider = _mock_provider(engine, wall_clock=lambda: 1_000_000.0, retry_after_cap=120.0)
    assert _failure(await collect(provider, _request(Message.user("hi")))).retry_after_ms == 30_000


def test_retry_after_in_the_past_means_now() -> None:
    date = email.utils.formatdate(100.0, usegmt=True)
    assert parse_retry_after({"retry-after": date}, now=200.0, cap_ms=60_000) == 0


@given(
    seconds=st.integers(0, 10**6),
    cap_ms=st.integers(0, 10**8),
    as_date=st.booleans(),
    now=st.integers(10**8, 4 * 10**9),
)
def test_retry_after_seconds_or_date_become_milliseconds_up_to_the_cap(
    seconds: int, cap_ms: int, as_date: bool, now: int
) -> None:
    value = email.utils.formatdate(now + seconds, usegmt=True) if as_date else str(seconds)
    assert parse_retry_after({"retry-after": value}, now=now, cap_ms=cap_ms) == min(
        cap_ms, seconds * 1000
    )


def test_an_error_body_that_is_not_json_is_carried_as_text() -> None:
    failure = failure_for_status(
        502, {}, b"<html>bad gateway</html>", now=0.0, retry_after_cap_ms=1000
    )
    assert failure.message == "HTTP 502: <html>bad gateway</html>"


def _raw_provider(
    events: list[str], content_type: str = "text/event-stream"
) -> OpenAICompatProvider:
    """A provider whose server answers every request with these event payloads."""
    body = "".join(f"data: {event}\n\n" for event in events).encode()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": content_type}, content=body)

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return OpenAICompatProvider(client, base_url="http://raw.test", api_key=None)


def _choice(delta: dict[str, Any], finish_reason: str | None = None) -> str:
    return json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]})


async def test_deepseek_prompt_cache_hit_tokens_count_as_cache_reads() -> None:
    usage = {"prompt_tokens": 200, "completion_tokens": 7, "prompt_cache_hit_tokens": 128}
    provider = _raw_provider(
        [_choice({"content": "hi"}, "stop"), json.dumps({"choices": [], "usage": usage}), "[DONE]"]
    )
    chunks = await collect(provider, _request(Message.user("x")))
    assert usage_of(chunks) == Usage(input_tokens=200, output_tokens=7, cache_read_tokens=128)


async def test_openai_style_cached_tokens_count_as_cache_reads() -> None:
    usage = {
        "prompt_tokens": 100,
        "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 64},
        "completion_tokens_details": {"reasoning_tokens": 2},
    }
    provider = _raw_provider(
        [_choice({"content": "hi"}, "stop"), json.dumps({"choices": [], "usage": usage}), "[DONE]"]
    )
    chunks = await collect(provider, _request(Message.user("x")))
    assert usage_of(chunks) == Usage(
        input_tokens=100, output_tokens=5, cache_read_tokens=64, reasoning_tokens=2
    )


async def test_an_error_event_mid_stream_is_a_retryable_stream_error() -> None:
    error = json.dumps({"error": {"message": "upstream overloaded", "type": "server_error"}})
    provider = _raw_provider([_choice({"content": "par"}), error])
    failure = _failure(await collect(provider, _request(Message.user("x"))))
    assert failure.code == "stream_error" and failure.retryable
    assert "upstream overloaded" in failure.message


async def test_an_unknown_finish_reason_fails_loudly() -> None:
    provider = _raw_provider([_choice({"content": "x"}, "gremlins"), "[DONE]"])
    failure = _failure(await collect(provider, _request(Message.user("x"))))
    assert failure.code == "unknown_finish_reason" and "'gremlins'" in failure.message


async def test_stop_after_tool_calls_still_asks_for_the_tools() -> None:
    call = {"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{}"}}
    provider = _raw_provider([_choice({"tool_calls": [call]}, "stop"), "[DONE]"])
    assert finish_of(await collect(provider, _request(Message.user("x")))).reason == "tool-calls"


async def test_a_wrongly_typed_field_is_a_malformed_event() -> None:
    provider = _raw_provider([_choice({"content": 42}), "[DONE]"])
    failure = _failure(await collect(provider, _request(Message.user("x"))))
    assert failure.code == "malformed_event" and "content is not a string" in failure.message


async def test_json_instead_of_a_stream_fails_loudly() -> None:
    provider = _raw_provider([], content_type="application/json")
    failure = _failure(await collect(provider, _request(Message.user("x"))))
    assert failure.code == "unexpected_content_type"


async def test_an_oversized_event_is_a_final_failure() -> None:
    engine = SimulatorEngine()
    provider = _mock_provider(engine, max_event_bytes=64)
    failure = _failure(await collect(provider, _request(Message.user("hi"))))
    assert failure.code == "event_too_large" and not failure.retryable


def _unescaped(delta: dict[str, Any]) -> str:
    """An event's data with non-ASCII text as UTF-8, so reads can split a character."""
    return json.dumps({"choices": [{"index": 0, "delta": delta}]}, ensure_ascii=False)


@st.composite
def _event_streams(draw: st.DrawFn) -> tuple[bytes, str, dict[int, str]]:
    """A chat-completions event stream (comments, keep-alives, usage anywhere, repeated
    tool-call names, LF or CRLF), with the text and tool-call arguments it carries."""
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    lines: list[str] = []
    text = ""
    arguments: dict[int, str] = {}
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["text", "call", "comment", "keep-alive", "usage"]))
        if kind == "text":
            piece = draw(st.text(max_size=8))
            text += piece
            lines.append("data: " + _unescaped({"content": piece}))
        elif kind == "call":
            index = draw(st.integers(0, 2))
            piece = draw(st.text(max_size=6))
            call: dict[str, Any] = {"index": index, "function": {"arguments": piece}}
            if index not in arguments or draw(st.booleans()):  # llama.cpp repeats them
                call["id"] = f"call{index}"
                call["function"]["name"] = "echo"
            arguments[index] = arguments.get(index, "") + piece
            lines.append("data: " + _unescaped({"tool_calls": [call]}))
        elif kind == "comment":
            lines.append(draw(st.sampled_from([": keep-alive", ": ping"])))
        elif kind == "keep-alive":
            lines.append("data: : keep-alive")
        else:
            usage = {"prompt_tokens": 3, "completion_tokens": 1}
            lines.append("data: " + json.dumps({"choices": [], "usage": usage}))
    lines += ["data: " + _choice({}, "stop"), "data: [DONE]"]
    return "".join(line + newline * 2 for line in lines).encode(), text, arguments


@given(_event_streams(), st.data())
def test_the_stream_parser_gives_the_same_chunks_for_any_split_into_reads(
    stream: tuple[bytes, str, dict[int, str]], draw: st.DataObject
) -> None:
    data, text, arguments = stream
    cuts = sorted(draw.draw(st.sets(st.integers(0, len(data)), max_size=20)))
    pieces = [data[a:b] for a, b in itertools.pairwise([0, *cuts, len(data)])]

    def parse(reads: list[bytes]) -> list[Any]:
        parser = StreamParser()
        chunks: list[Any] = []
        for read in reads:
            chunks += parser.feed(read)
        assert parser.done
        return chunks + parser.final_chunks()

    chunks = parse(pieces)
    whole = parse([data])
    assert _sum_of(chunks) == _sum_of(whole)
    # One read's deltas come joined: no two neighbours of the whole body go together.
    for one, two in itertools.pairwise(whole):
        assert not (isinstance(one, TextDelta) and isinstance(two, TextDelta))
        assert not (
            isinstance(one, ToolCallDelta)
            and isinstance(two, ToolCallDelta)
            and one.index == two.index
            and two.id is None
        )
    assert text_of(chunks) == text
    calls = calls_of(chunks)  # asserts each id and name came once
    assert {int(call.id.removeprefix("call")): call.arguments for call in calls} == arguments
    assert finish_of(chunks).reason == ("tool-calls" if arguments else "completed")


def test_an_event_nested_too_deeply_to_parse_is_a_malformed_event() -> None:
    parser = StreamParser()
    deep = "[" * 5000 + "]" * 5000
    assert parser.feed(f"data: {deep}\n\n".encode()) == []
    failure = parser.outcome.failure if parser.outcome is not None else None
    assert failure is not None and failure.code == "malformed_event"
    assert "recursion" in failure.message


@pytest.mark.parametrize(
    ("value", "count"),
    [
        # Beyond 64 bits: json reads an int (orjson would read a float, not a count).
        ("12345678901234567890123", 12345678901234567890123),
        ("NaN", 0),  # json reads a float (not a count); orjson refuses it
        ("3", 3),
    ],
)
def test_usage_counts_parse_as_the_json_module_reads_them(value: str, count: int) -> None:
    parser = StreamParser()
    usage = f'{{"prompt_tokens":{value},"completion_tokens":{value}}}'
    parser.feed(f'data: {{"choices":[],"usage":{usage}}}\n\ndata: [DONE]\n\n'.encode())
    chunk = parser.final_chunks()[0]
    assert isinstance(chunk, UsageChunk)
    assert chunk.usage.input_tokens == chunk.usage.output_tokens == count


def _joined_reference(chunks: list[Any]) -> list[Any]:
    """`chunks` with each run that goes together joined: adjacent text, adjacent reasoning, a
    tool call's argument pieces (same index, no id or name) after the piece before them."""
    out: list[Any] = []
    for chunk in chunks:
        last = out[-1] if out else None
        if type(chunk) is type(last) and isinstance(chunk, (TextDelta, ReasoningDelta)):
            out[-1] = type(chunk)(text=last.text + chunk.text)  # type: ignore[union-attr]
        elif (
            isinstance(chunk, ToolCallDelta)
            and isinstance(last, ToolCallDelta)
            and chunk.index == last.index
            and chunk.id is None
            and chunk.name is None
        ):
            out[-1] = attrs.evolve(last, arguments=last.arguments + chunk.arguments)
        else:
            out.append(chunk)
    return out


@given(_event_streams())
def test_one_reads_chunks_are_its_events_deltas_joined_wherever_they_go_together(
    stream: tuple[bytes, str, dict[int, str]],
) -> None:
    data, _, _ = stream
    events = [event + b"\n\n" for event in data.replace(b"\r\n", b"\n").split(b"\n\n") if event]
    one_by_one = StreamParser()
    separately = [chunk for event in events for chunk in one_by_one.feed(event)]
    assert StreamParser().feed(data) == _joined_reference(separately)


# --- clocks (autojump) ---------------------------------------------------------------------


async def test_slow_headers_hit_the_connect_timeout(autojump_clock: trio.testing.MockClock) -> None:
    engine = SimulatorEngine()
    engine.faults.queue(Fault(first_byte_delay=30.0))
    provider = _mock_provider(engine, timeouts=StreamTimeouts(connect=5.0))
    start = trio.current_time()
    failure = _failure(await collect(provider, _request(Message.user("hi"))))
    assert failure.code == "connect_timeout" and failure.retryable
    assert trio.current_time() - start == pytest.approx(5.0)
    assert engine.requests[0].outcome == "disconnected"


async def test_time_the_consumer_takes_counts_against_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    provider = _mock_provider(SimulatorEngine(), timeouts=StreamTimeouts(deadline=20.0))
    chunks = []
    async with aclosing(provider.stream(_request(Message.user("hi")))) as stream:
        async for chunk in stream:
            chunks.append(chunk)
            await trio.sleep(30.0)
    assert _failure(chunks).code == "deadline_exceeded"
    assert len(chunks) == 2


async def test_a_stall_hits_the_read_idle_timeout_and_the_server_sees_the_disconnect(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = SimulatorEngine()
    engine.faults.queue(Fault(stall_after_chunks=3))
    provider = _mock_provider(engine, timeouts=StreamTimeouts(read_idle=7.0))
    start = trio.current_time()
    chunks = await collect(provider, _request(Message.user("hi")))
    failure = _failure(chunks)
    assert failure.code == "read_timeout" and failure.retryable
    assert trio.current_time() - start == pytest.approx(7.0)
    assert engine.requests[0].outcome == "disconnected"
    assert provider.statistics().in_flight == 0


async def test_keep_alive_comments_reset_the_read_idle_timer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = SimulatorEngine()
    engine.faults.queue(Fault(keepalives=5, keepalive_interval=4.0))
    provider = _mock_provider(engine, timeouts=StreamTimeouts(read_idle=5.0))
    start = trio.current_time()
    chunks = await collect(provider, _request(Message.user("hi")))
    assert finish_of(chunks).reason == "completed"
    assert trio.current_time() - start == pytest.approx(20.0)


async def test_a_slow_but_steady_stream_hits_the_overall_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = SimulatorEngine(SimulatorConfig(reply_tokens=100, token_rate=2.0))
    provider = _mock_provider(engine, timeouts=StreamTimeouts(read_idle=5.0, deadline=20.0))
    start = trio.current_time()
    chunks = await collect(provider, _request(Message.user("hi")))
    failure = _failure(chunks)
    assert failure.code == "deadline_exceeded" and failure.retryable
    assert trio.current_time() - start == pytest.approx(20.0)
    assert 35 <= len(chunks) <= 42  # about 2 tokens a second for 20 s


async def test_the_deadline_bounds_waiting_for_headers_too(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = SimulatorEngine()
    engine.faults.queue(Fault(first_byte_delay=30.0))
    provider = _mock_provider(engine, timeouts=StreamTimeouts(connect=20.0, deadline=3.0))
    assert _failure(await collect(provider, _request(Message.user("hi")))).code == (
        "deadline_exceeded"
    )


# --- cancellation --------------------------------------------------------------------------


async def test_cancelling_the_consumer_closes_the_response_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = SimulatorEngine()
    engine.faults.queue(Fault(stall_after_chunks=3))
    provider = _mock_provider(engine)
    with trio.move_on_after(1.0) as scope:
        async with aclosing(provider.stream(_request(Message.user("hi")))) as stream:
            async for _ in stream:
                pass
    assert scope.cancelled_caught
    assert engine.requests[0].outcome == "disconnected"
    assert engine.statistics().streaming == 0
    assert provider.statistics().in_flight == 0


async def test_cancelling_while_waiting_for_headers_abandons_the_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = SimulatorEngine()
    engine.faults.queue(Fault(first_byte_delay=30.0))
    provider = _mock_provider(engine)
    with trio.move_on_after(1.0) as scope:
        await collect(provider, _request(Message.user("hi")))
    assert scope.cancelled_caught
    assert engine.requests[0].outcome == "disconnected"
    assert provider.statistics().in_flight == 0


async def test_a_v1_base_url_posts_to_v1_chat_completions() -> None:
    engine = SimulatorEngine()
    client = httpx.AsyncClient(transport=simulator_transport(engine))
    provider = OpenAICompatProvider(client, base_url="http://simulator.test/v1/", api_key=API_KEY)
    assert finish_of(await collect(provider, _request(Message.user("hi")))).reason == "completed"
    assert engine.requests[0].path == "/v1/chat/completions"


async def test_closing_the_generator_early_closes_the_response(frontend: Frontend) -> None:
    provider, engine = await frontend.provider()
    async with aclosing(provider.stream(_request(Message.user("hi")))) as stream:
        async for chunk in stream:
            if isinstance(chunk, TextDelta):
                break
    with trio.fail_after(5):
        assert await engine.requests[0].wait_settled() == "disconnected"
    assert provider.statistics().in_flight == 0


# --- real sockets, real time ---------------------------------------------------------------


async def test_a_stall_over_loopback_times_out_and_the_server_sees_the_disconnect(
    nursery: trio.Nursery,
) -> None:
    front = Frontend(kind="loopback", nursery=nursery)
    provider, engine = await front.provider(timeouts=StreamTimeouts(read_idle=0.3))
    engine.faults.queue(Fault(stall_after_chunks=2))
    failure = _failure(await collect(provider, _request(Message.user("hi"))))
    assert failure.code == "read_timeout"
    with trio.fail_after(5):
        assert await engine.requests[0].wait_settled() == "disconnected"
    await front.clients[0].aclose()


async def test_slow_headers_over_loopback_time_out_and_the_server_sees_the_disconnect(
    nursery: trio.Nursery,
) -> None:
    front = Frontend(kind="loopback", nursery=nursery)
    provider, engine = await front.provider(timeouts=StreamTimeouts(connect=0.3))
    engine.faults.queue(Fault(first_byte_delay=30.0))
    failure = _failure(await collect(provider, _request(Message.user("hi"))))
    assert failure.code == "connect_timeout"
    with trio.fail_after(5):
        assert await engine.requests[0].wait_settled() == "disconnected"
    await front.clients[0].aclose()


async def test_cancelling_over_loopback_closes_the_connection(nursery: trio.Nursery) -> None:
    front = Frontend(kind="loopback", nursery=nursery)
    provider, engine = await front.provider()
    engine.faults.queue(Fault(stall_after_chunks=2))
    with trio.CancelScope() as scope:
        async with aclosing(provider.stream(_request(Message.user("hi")))) as stream:
            async for chunk in stream:
                if isinstance(chunk, TextDelta):
                    scope.cancel()  # lands while the next read waits on the stalled server
    with trio.fail_after(5):
        assert await engine.requests[0].wait_settled() == "disconnected"
    await front.clients[0].aclose()


async def test_a_multi_turn_tool_workload_hits_the_cache_after_the_first_request(
    frontend: Frontend,
) -> None:
    provider, engine = await frontend.provider()
    tools = (ECHO,)
    history: list[Message] = [Message.user('Please echo this.\ncall echo {"text": "ping"}')]
    usages: list[Usage] = []

    async def step() -> Message:
        chunks = await collect(provider, _request(*history, system=SYSTEM, tools=tools))
        assert finish_of(chunks).reason in ("completed", "tool-calls"), finish_of(chunks)
        usage = usage_of(chunks)
        assert usage is not None
        usages.append(usage)
        message = assistant_of(chunks)
        history.append(message)
        return message

    asked = await step()
    history.append(tool_result(asked.tool_calls[0].id, "ping"))
    answer = await step()
    assert "ping" in answer.text
    history.append(Message.user("Thanks. One more question, briefly."))
    await step()
    history.append(Message.user('Echo again.\ncall echo {"text": "pong"}'))
    asked = await step()
    history.append(tool_result(asked.tool_calls[0].id, "pong"))
    await step()

    assert usages[0].cache_read_tokens == 0
    assert all(usage.cache_read_tokens > 0 for usage in usages[1:]), usages
    # Each request reuses the whole previous prompt, up to the last partial block.
    for before, after in itertools.pairwise(usages):
        assert after.cache_read_tokens >= before.input_tokens // 64 * 64
    assert [record.outcome for record in engine.requests] == ["completed"] * 5
