"""The official `openai` client against the simulator on a loopback port, used as its docs use it.

Nothing here tells the client anything about the simulator: a base URL, a
key, and the client's defaults (its own retries included). The model is
scripted on the server side (`SimulatorConfig.script`), so the prompts are
the docs' prompts.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
import trio

from actors.providers.simulator import Fault, SimulatorConfig, SimulatorEngine, serve_simulator

# The client stops reading at `data: [DONE]` and leaves its SSE async generators to
# the garbage collector; asyncio finalizes those quietly, Trio warns. Not ours to close.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <async_generator object:pytest.PytestUnraisableExceptionWarning"
)

KEY = "sk-simulator"
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get current temperature for provided coordinates in celsius.",
            "parameters": {
                "type": "object",
                "properties": {"latitude": {"type": "number"}, "longitude": {"type": "number"}},
                "required": ["latitude", "longitude"],
                "additionalProperties": False,
            },
            "strict": True,
        },
    }
]
PARIS = {"name": "get_weather", "arguments": {"latitude": 48.8566, "longitude": 2.3522}}
BOGOTA = {"name": "get_weather", "arguments": {"latitude": 4.711, "longitude": -74.0721}}
SCRIPT = {
    "rules": [
        {"when": {"input": "tool"}, "reply": {"text": "It is 14 degrees in Paris today."}},
        {"when": {"contains": "Paris and Bogotá"}, "reply": {"tool_calls": [PARIS, BOGOTA]}},
        {"when": {"contains": "weather"}, "reply": {"tool_calls": [PARIS]}},
    ]
}
SYSTEM = "You are a meticulous assistant. Answer briefly and cite your sources. " * 20


def get_weather(latitude: float, longitude: float) -> float:
    return round(latitude / 4 + longitude / 10, 1)


@pytest.fixture
async def engine(nursery: trio.Nursery) -> SimulatorEngine:
    return SimulatorEngine(SimulatorConfig(script=SCRIPT))


@pytest.fixture
async def client(
    engine: SimulatorEngine, nursery: trio.Nursery
) -> AsyncIterator[openai.AsyncOpenAI]:
    base_url = await nursery.start(serve_simulator, engine)
    async with openai.AsyncOpenAI(base_url=base_url, api_key=KEY) as client:
        yield client


async def test_a_completion_without_streaming(client: openai.AsyncOpenAI) -> None:
    completion = await client.chat.completions.create(
        model="deepseek-chat",
        messages=[
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Hello!"},
        ],
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant" and choice.message.content
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 24
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 24


async def test_a_streamed_completion_with_usage(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model="deepseek-chat",
        messages=[{"role": "user", "content": "Say this is a test"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text = ""
    usage = None
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage is not None:
            usage = chunk.usage
    assert text and usage is not None and usage.completion_tokens == 24


async def test_a_textbook_stream_loop_needs_no_guard_without_include_usage(
    client: openai.AsyncOpenAI,
) -> None:
    stream = await client.chat.completions.create(
        model="deepseek-chat", messages=[{"role": "user", "content": "Hi"}], stream=True
    )
    pieces = [chunk.choices[0].delta.content or "" async for chunk in stream]
    assert "".join(pieces)


async def test_cached_tokens_are_reported_on_a_repeated_prefix(client: openai.AsyncOpenAI) -> None:
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Hello!"},
    ]
    first = await client.chat.completions.create(model="deepseek-chat", messages=messages)
    second = await client.chat.completions.create(model="deepseek-chat", messages=messages)
    assert first.usage is not None and second.usage is not None
    assert first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached == second.usage.prompt_tokens // 64 * 64 > 0


@pytest.mark.parametrize("model", ["deepseek-chat", "deepseek-reasoner"])
async def test_the_function_calling_guide_loop(client: openai.AsyncOpenAI, model: str) -> None:
    messages: list[Any] = [{"role": "user", "content": "What's the weather like in Paris today?"}]
    completion = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
    tool_call = completion.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert completion.choices[0].finish_reason == "tool_calls"
    args = json.loads(tool_call.function.arguments)  # type: ignore[union-attr]
    result = get_weather(args["latitude"], args["longitude"])
    messages.append(completion.choices[0].message)  # the model's function-call message
    messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": str(result)})
    completion_2 = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
    assert completion_2.choices[0].message.content == "It is 14 degrees in Paris today."


async def test_the_thinking_mode_loop_of_deepseeks_docs(client: openai.AsyncOpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "What's the weather like in Paris today?"}]
    thinking = {"thinking": {"type": "enabled"}}
    response = await client.chat.completions.create(
        model="deepseek-chat", messages=messages, tools=TOOLS, extra_body=thinking
    )
    message = response.choices[0].message
    assert getattr(message, "reasoning_content", None)
    messages.append(message)  # reasoning_content goes back with the call, as the docs require
    for call in message.tool_calls or ():
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "14"})
    final = await client.chat.completions.create(
        model="deepseek-chat", messages=messages, tools=TOOLS, extra_body=thinking
    )
    assert final.choices[0].message.content
    stripped = [
        {"role": "assistant", "content": "", "tool_calls": message.model_dump()["tool_calls"]}
        if index == 1
        else entry
        for index, entry in enumerate(messages)
    ]
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model="deepseek-chat", messages=stripped, tools=TOOLS, extra_body=thinking
        )
    assert "Missing `reasoning_content` field" in caught.value.message


async def test_parallel_tool_calls_streamed_and_joined_by_index(
    client: openai.AsyncOpenAI,
) -> None:
    stream = await client.chat.completions.create(
        model="deepseek-chat",
        messages=[{"role": "user", "content": "What's the weather like in Paris and Bogotá?"}],
        tools=TOOLS,
        stream=True,
    )
    final_tool_calls: dict[int, Any] = {}
    async for chunk in stream:
        for tool_call in chunk.choices[0].delta.tool_calls or []:
            index = tool_call.index
            if index not in final_tool_calls:
                final_tool_calls[index] = tool_call
            else:
                final_tool_calls[index].function.arguments += tool_call.function.arguments
    assert sorted(final_tool_calls) == [0, 1]
    arguments = [json.loads(final_tool_calls[i].function.arguments) for i in (0, 1)]
    assert arguments == [PARIS["arguments"], BOGOTA["arguments"]]
    assert len({final_tool_calls[i].id for i in (0, 1)}) == 2
    assert {final_tool_calls[i].function.name for i in (0, 1)} == {"get_weather"}


async def test_parallel_tool_calls_in_a_completion(client: openai.AsyncOpenAI) -> None:
    completion = await client.chat.completions.create(
        model="deepseek-chat",
        messages=[{"role": "user", "content": "What's the weather like in Paris and Bogotá?"}],
        tools=TOOLS,
    )
    calls = completion.choices[0].message.tool_calls or []
    assert [json.loads(call.function.arguments) for call in calls] == [  # type: ignore[union-attr]
        PARIS["arguments"],
        BOGOTA["arguments"],
    ]


async def test_a_forced_function_and_json_output(client: openai.AsyncOpenAI) -> None:
    forced = await client.chat.completions.create(
        model="deepseek-chat",
        messages=[{"role": "user", "content": "Hello!"}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    (call,) = forced.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    answer = await client.chat.completions.create(
        model="deepseek-chat",
        messages=[{"role": "user", "content": "Reply in json."}],
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(answer.choices[0].message.content or ""), dict)


@pytest.mark.parametrize(
    ("fields", "error", "status", "needle"),
    [
        ({"model": "gpt-4o"}, openai.BadRequestError, 400, "Model Not Exist"),
        ({"max_tokens": 9000}, openai.BadRequestError, 400, "valid range of max_tokens"),
        ({"temperature": 3}, openai.BadRequestError, 400, "valid range of temperature"),
        ({"tool_choice": "required"}, openai.BadRequestError, 400, "needs tools"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            openai.BadRequestError,
            400,
            "response_format type is unavailable",
        ),
        ({"messages": []}, openai.UnprocessableEntityError, 422, "messages must be a non-empty"),
    ],
)
async def test_bad_requests_raise_the_clients_typed_errors(
    client: openai.AsyncOpenAI,
    engine: SimulatorEngine,
    fields: dict[str, Any],
    error: type[openai.APIStatusError],
    status: int,
    needle: str,
) -> None:
    request: dict[str, Any] = {
        "model": "deepseek-chat",
        "messages": [{"role": "user", "content": "Hi"}],
    }
    with pytest.raises(error) as caught:
        await client.chat.completions.create(**(request | fields))
    assert caught.value.status_code == status
    assert needle in caught.value.message
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["type"] == "invalid_request_error"
    assert len(engine.requests) == 1  # 4xx other than 408/409/429: no retry


async def test_a_wrong_key_is_an_authentication_error(
    engine: SimulatorEngine, nursery: trio.Nursery
) -> None:
    base_url = await nursery.start(serve_simulator, engine)
    async with openai.AsyncOpenAI(base_url=base_url, api_key="sk-wrong") as client:
        with pytest.raises(openai.AuthenticationError) as caught:
            await client.chat.completions.create(
                model="deepseek-chat", messages=[{"role": "user", "content": "Hi"}]
            )
        with pytest.raises(openai.AuthenticationError):
            await client.models.list()
    assert caught.value.status_code == 401
    assert "Authentication Fails" in caught.value.message


async def test_the_clients_own_retry_honours_retry_after(
    client: openai.AsyncOpenAI, engine: SimulatorEngine
) -> None:
    engine.faults.queue(Fault(status=429, retry_after="1"))
    start = trio.current_time()
    completion = await client.chat.completions.create(
        model="deepseek-chat", messages=[{"role": "user", "content": "Hi"}]
    )
    assert trio.current_time() - start >= 1.0
    assert completion.choices[0].message.content
    assert [record.status for record in engine.requests] == [429, 200]


async def test_a_stream_is_retried_after_retry_after_ms(
    client: openai.AsyncOpenAI, engine: SimulatorEngine
) -> None:
    engine.faults.queue(Fault(status=503, retry_after_ms=300))
    start = trio.current_time()
    stream = await client.chat.completions.create(
        model="deepseek-chat", messages=[{"role": "user", "content": "Hi"}], stream=True
    )
    async for _ in stream:
        pass
    assert trio.current_time() - start >= 0.3
    assert [record.status for record in engine.requests] == [503, 200]


async def test_the_client_gives_up_after_its_retries(
    client: openai.AsyncOpenAI, engine: SimulatorEngine
) -> None:
    engine.faults.queue(*[Fault(status=429, retry_after_ms=20)] * 3)
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(
            model="deepseek-chat", messages=[{"role": "user", "content": "Hi"}]
        )
    assert caught.value.status_code == 429
    assert "Rate Limit Reached" in caught.value.message
    assert [record.status for record in engine.requests] == [429, 429, 429]


async def test_models_are_listed(client: openai.AsyncOpenAI) -> None:
    models = [model.id async for model in client.models.list()]
    assert models == ["deepseek-chat", "deepseek-reasoner"]
