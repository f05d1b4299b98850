"""The simulator's API surface beyond streaming: JSON completions, tool_choice, response_format,
parameter ranges, stop sequences, latency and model scripts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.providers.simulator import (
    Fault,
    ModelScript,
    ScriptError,
    SimReply,
    SimulatorConfig,
    SimulatorEngine,
)
from actors.providers.simulator.choice import placeholder_arguments
from tests.providers.simulator_helpers import chat_body, events_of, post, read_body

USER: dict[str, Any] = {"role": "user", "content": "hello there"}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}
ECHO = {"type": "function", "function": {"name": "echo", "parameters": {"type": "object"}}}


def _plain(messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    """A non-streamed chat body (no `stream` field: the API's default)."""
    return {"model": "deepseek-chat", "messages": messages, **fields}


async def _completion(engine: SimulatorEngine, body: dict[str, Any]) -> dict[str, Any]:
    response = await post(engine, body)
    assert response.status == 200, response.body
    assert response.stream is None
    assert dict(response.headers)["content-type"] == "application/json"
    completion = json.loads(response.body)
    assert isinstance(completion, dict)
    return completion


async def _error(engine: SimulatorEngine, body: object, status: int) -> dict[str, Any]:
    response = await post(engine, body)
    assert response.status == status, response.body
    error = json.loads(response.body)["error"]
    assert isinstance(error, dict)
    return error


def _message(completion: dict[str, Any]) -> dict[str, Any]:
    message = completion["choices"][0]["message"]
    assert isinstance(message, dict)
    return message


# --- non-streamed completions ------------------------------------------------------------


@pytest.mark.parametrize("stream", [None, False])
async def test_a_request_without_stream_gets_one_chat_completion(stream: bool | None) -> None:
    engine = SimulatorEngine(wall_clock=lambda: 5.0)
    body = _plain([USER]) | ({} if stream is None else {"stream": stream})
    completion = await _completion(engine, body)
    assert completion["object"] == "chat.completion"
    assert completion["model"] == "deepseek-chat" and completion["created"] == 5
    choice = completion["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["index"] == 0
    assert choice["message"]["role"] == "assistant"
    assert "reasoning_content" not in choice["message"]
    usage = completion["usage"]
    assert usage["completion_tokens"] == 24
    assert usage["total_tokens"] == usage["prompt_tokens"] + 24
    assert engine.requests[-1].outcome == "completed"


async def test_the_completion_text_equals_the_streamed_text() -> None:
    streamed = events_of(await read_body(await post(SimulatorEngine(), chat_body([USER]))))
    text = "".join(
        event["choices"][0]["delta"].get("content") or ""
        for event in streamed
        if isinstance(event, dict) and event["choices"]
    )
    assert _message(await _completion(SimulatorEngine(), _plain([USER])))["content"] == text


async def test_a_completion_carries_tool_calls_and_reasoning() -> None:
    user = {"role": "user", "content": 'call echo {"text": "a"}\ncall echo {"text": "b"}'}
    completion = await _completion(
        SimulatorEngine(), _plain([user], model="deepseek-reasoner", tools=[ECHO])
    )
    message = _message(completion)
    assert completion["choices"][0]["finish_reason"] == "tool_calls"
    assert message["reasoning_content"]
    assert [call["function"]["arguments"] for call in message["tool_calls"]] == [
        '{"text": "a"}',
        '{"text": "b"}',
    ]
    assert all(call["id"].startswith("call_") for call in message["tool_calls"])
    assert completion["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0


async def test_a_completion_honours_status_and_finish_faults() -> None:
    engine = SimulatorEngine()
    engine.faults.queue(Fault(status=429, retry_after="2"), Fault(finish_reason="length"))
    response = await post(engine, _plain([USER]))
    assert response.status == 429 and ("retry-after", "2") in response.headers
    completion = await _completion(engine, _plain([USER]))
    assert completion["choices"][0]["finish_reason"] == "length"


async def test_stream_only_faults_are_refused_for_a_completion() -> None:
    engine = SimulatorEngine()
    engine.faults.queue(Fault(reset_after_chunks=2, crlf=True))
    error = await _error(engine, _plain([USER]), 400)
    assert error["message"].startswith("fault field(s) crlf, reset_after_chunks need a streamed")
    assert error["param"] == "X-Sim-Fault"


async def test_a_completion_takes_as_long_as_its_tokens_would_stream(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = SimulatorEngine(SimulatorConfig(reply_tokens=10, token_rate=5.0, latency=0.5))
    start = trio.current_time()
    await _completion(engine, _plain([USER]))
    assert trio.current_time() - start == pytest.approx(0.5 + 10 / 5.0)


async def test_latency_delays_the_headers_of_every_chat_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = SimulatorEngine(SimulatorConfig(latency=0.05))
    engine.faults.queue(Fault(first_byte_delay=1.0))
    start = trio.current_time()
    await post(engine, chat_body([USER]))
    assert trio.current_time() - start == pytest.approx(1.05)
    start = trio.current_time()
    await post(engine, _plain([USER]))
    assert trio.current_time() - start == pytest.approx(0.05)


async def test_a_client_leaving_during_the_wait_is_a_disconnect(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = SimulatorEngine(SimulatorConfig(reply_tokens=10, token_rate=1.0))
    with trio.move_on_after(3.0):
        await post(engine, _plain([USER]))
    assert engine.requests[-1].outcome == "disconnected"
    assert engine.statistics().disconnects == 1


# --- tool_choice -------------------------------------------------------------------------


async def test_tool_choice_none_ignores_call_lines() -> None:
    user = {"role": "user", "content": 'call echo {"text": "a"}'}
    completion = await _completion(
        SimulatorEngine(), _plain([user], tools=[ECHO], tool_choice="none")
    )
    assert "tool_calls" not in _message(completion)
    assert completion["choices"][0]["finish_reason"] == "stop"


async def test_tool_choice_required_calls_the_first_tool_with_placeholder_arguments() -> None:
    body = _plain([USER], tools=[WEATHER, ECHO], tool_choice="required")
    (call,) = _message(await _completion(SimulatorEngine(), body))["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city":"","days":0}'}


async def test_a_named_tool_choice_keeps_only_its_calls_or_forces_one() -> None:
    named = {"type": "function", "function": {"name": "echo"}}
    user = {"role": "user", "content": 'call get_weather {"city": "x"}\ncall echo {"text": "e"}'}
    body = _plain([user], tools=[WEATHER, ECHO], tool_choice=named)
    calls = _message(await _completion(SimulatorEngine(), body))["tool_calls"]
    assert [call["function"]["name"] for call in calls] == ["echo"]
    forced = _plain([USER], tools=[WEATHER, ECHO], tool_choice=named)
    (call,) = _message(await _completion(SimulatorEngine(), forced))["tool_calls"]
    assert call["function"] == {"name": "echo", "arguments": "{}"}


async def test_a_forced_choice_streams_its_call() -> None:
    body = chat_body([USER], tools=[ECHO], tool_choice="required")
    events = events_of(await read_body(await post(SimulatorEngine(), body)))
    finishes = [
        e["choices"][0]["finish_reason"] for e in events if isinstance(e, dict) and e["choices"]
    ]
    assert finishes[-1] == "tool_calls"


@pytest.mark.parametrize(
    ("fields", "status", "needle"),
    [
        ({"tool_choice": "required"}, 400, "needs tools"),
        ({"tool_choice": "sometimes", "tools": [ECHO]}, 422, "tool_choice: invalid type"),
        (
            {"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": [ECHO]},
            400,
            "'nope', which is not in tools: echo",
        ),
        ({"tools": [ECHO] * 129}, 400, "at most 128"),
    ],
)
async def test_bad_tool_choices_are_refused(
    fields: dict[str, Any], status: int, needle: str
) -> None:
    error = await _error(SimulatorEngine(), _plain([USER], **fields), status)
    assert needle in error["message"]
    assert error["param"] in ("tool_choice", "tools")


def test_placeholder_arguments_follow_the_declared_types() -> None:
    tool = {
        "function": {
            "parameters": {
                "properties": {
                    "s": {"type": "string"},
                    "n": {"type": ["number", "null"]},
                    "b": {"type": "boolean"},
                    "a": {"type": "array"},
                    "o": {"type": "object"},
                    "u": {},
                },
                "required": ["s", "n", "b", "a", "o", "u"],
            }
        }
    }
    assert json.loads(placeholder_arguments(tool)) == {
        "s": "",
        "n": 0,
        "b": False,
        "a": [],
        "o": {},
        "u": None,
    }


# --- response_format, stop, parameter ranges ---------------------------------------------


@pytest.mark.parametrize("tool_result", [False, True])
async def test_json_object_mode_answers_a_json_object(tool_result: bool) -> None:
    messages: list[dict[str, Any]] = [USER]
    if tool_result:
        call = {"id": "c1", "type": "function", "function": {"name": "echo", "arguments": "{}"}}
        messages = [
            USER,
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": 'say "hi"'},
        ]
    body = _plain(messages, response_format={"type": "json_object"})
    content = _message(await _completion(SimulatorEngine(), body))["content"]
    assert isinstance(json.loads(content), dict)


async def test_text_response_format_is_plain_text() -> None:
    body = _plain([USER], response_format={"type": "text"})
    content = _message(await _completion(SimulatorEngine(), body))["content"]
    with pytest.raises(ValueError):
        json.loads(content)


async def test_the_text_ends_before_the_first_stop_sequence() -> None:
    engine = SimulatorEngine()
    engine.replies.queue(SimReply(text="alpha END beta STOP gamma"))
    body = _plain([USER], stop=["STOP", "END"])
    completion = await _completion(engine, body)
    assert _message(completion)["content"] == "alpha "
    assert completion["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("fields", "status", "message"),
    [
        (
            {"temperature": 2.5},
            400,
            "Invalid temperature value, the valid range of temperature is [0, 2]",
        ),
        ({"top_p": 1.01}, 400, "Invalid top_p value, the valid range of top_p is [0, 1]"),
        (
            {"presence_penalty": -2.5},
            400,
            "Invalid presence_penalty value, the valid range of presence_penalty is [-2, 2]",
        ),
        (
            {"frequency_penalty": 3},
            400,
            "Invalid frequency_penalty value, the valid range of frequency_penalty is [-2, 2]",
        ),
        (
            {"max_tokens": 8193},
            400,
            "Invalid max_tokens value, the valid range of max_tokens is [1, 8192]",
        ),
        (
            {"max_tokens": 0},
            400,
            "Invalid max_tokens value, the valid range of max_tokens is [1, 8192]",
        ),
        (
            {"model": "deepseek-reasoner", "max_tokens": 65537},
            400,
            "Invalid max_tokens value, the valid range of max_tokens is [1, 65536]",
        ),
        ({"top_logprobs": 21, "logprobs": True}, 400, "top_logprobs is [0, 20]"),
        ({"top_logprobs": 2}, 400, "top_logprobs requires logprobs"),
        ({"model": "deepseek-reasoner", "logprobs": True}, 400, "not supported in thinking mode"),
        ({"stop": ["x"] * 17}, 400, "at most 16"),
        ({"response_format": {"type": "json_schema"}}, 400, "response_format type is unavailable"),
        ({"temperature": "1.3"}, 422, "temperature: invalid type: string '1.3', expected f32"),
        ({"max_tokens": 1.5}, 422, "max_tokens: invalid type"),
        ({"stream": "yes"}, 422, "stream: invalid type"),
        ({"stop": 3}, 422, "stop: invalid type"),
        ({"logprobs": 1}, 422, "logprobs: invalid type"),
        ({"response_format": "json"}, 422, "response_format: invalid type"),
    ],
)
async def test_out_of_range_and_mistyped_parameters_are_refused(
    fields: dict[str, Any], status: int, message: str
) -> None:
    error = await _error(SimulatorEngine(), _plain([USER], **fields), status)
    assert message in error["message"]
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": 0, "top_p": 1, "presence_penalty": -2, "frequency_penalty": 2},
        {"temperature": 2.0, "max_tokens": 8192, "logprobs": True, "top_logprobs": 20},
        {"model": "deepseek-reasoner", "max_tokens": 65536, "temperature": 1.5},
        {"stop": "x", "stream_options": {"include_usage": True}},
    ],
)
async def test_parameters_at_their_limits_are_accepted(fields: dict[str, Any]) -> None:
    await _completion(SimulatorEngine(), _plain([USER], **fields))


# --- reasoning_content and the cache -----------------------------------------------------


async def test_ignored_reasoning_content_does_not_change_cache_hits() -> None:
    system = {"role": "system", "content": "Rules of the house. " * 80}
    call = {"id": "c1", "type": "function", "function": {"name": "echo", "arguments": "{}"}}

    def history(reasoning: str | None) -> list[dict[str, Any]]:
        assistant: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": [call]}
        if reasoning is not None:
            assistant["reasoning_content"] = reasoning
        return [system, USER, assistant, {"role": "tool", "tool_call_id": "c1", "content": "ok"}]

    engine = SimulatorEngine()
    await _completion(engine, _plain(history("")))
    first = (await _completion(engine, _plain(history(""))))["usage"]
    second = (await _completion(engine, _plain(history(None))))["usage"]
    assert first["prompt_tokens"] == second["prompt_tokens"]
    assert first["prompt_cache_hit_tokens"] == second["prompt_cache_hit_tokens"] > 0


# --- model scripts -----------------------------------------------------------------------

SCRIPT = {
    "rules": [
        {"when": {"input": "tool"}, "reply": {"text": "All done."}},
        {
            "when": {"input": "user", "contains": "weather"},
            "reply": {
                "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "days": 1}}]
            },
        },
    ]
}


async def test_a_script_drives_a_two_step_turn() -> None:
    engine = SimulatorEngine(SimulatorConfig(script=SCRIPT))
    user = {"role": "user", "content": "what is the weather?"}
    message = _message(await _completion(engine, _plain([user], tools=[WEATHER])))
    (call,) = message["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city":"Paris","days":1}'}
    history = [
        user,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "sunny"},
    ]
    assert _message(await _completion(engine, _plain(history, tools=[WEATHER])))["content"] == (
        "All done."
    )
    unmatched = _message(await _completion(engine, _plain([USER])))
    assert unmatched["content"] and "tool_calls" not in unmatched


async def test_queued_replies_come_before_the_script() -> None:
    engine = SimulatorEngine(SimulatorConfig(script={"rules": [{"reply": {"text": "rule"}}]}))
    engine.replies.queue(SimReply(text="queued"))
    assert _message(await _completion(engine, _plain([USER])))["content"] == "queued"
    assert _message(await _completion(engine, _plain([USER])))["content"] == "rule"


def test_a_script_loads_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(SCRIPT))
    script = ModelScript.load(path)
    assert len(script.rules) == 2 and script.rules[1].contains == "weather"
    path.write_text("{")
    with pytest.raises(ScriptError, match="cannot read model script"):
        ModelScript.load(path)


@pytest.mark.parametrize(
    ("script", "needle"),
    [
        ([], "must be a JSON object"),
        ({"rules": {}}, "rules must be a list"),
        ({"rules": [{"when": {}}]}, "rules[0] must be an object"),
        ({"rules": [{"when": {"input": "robot"}, "reply": {}}]}, "rules[0].when.input"),
        ({"rules": [{"when": {"regex": "x"}, "reply": {}}]}, "may hold only"),
        ({"rules": [{"reply": {"text": 1}}]}, "rules[0].reply.text must be a string"),
        ({"rules": [{"reply": {"finish_reason": "done"}}]}, "finish_reason must be one of"),
        ({"rules": [{"reply": {"tool_calls": [{"name": ""}]}}]}, "tool_calls[0].name"),
        ({"rules": [{"reply": {"tool_calls": [{"name": "f", "arguments": 3}]}}]}, "arguments"),
        ({"rules": [{"reply": {"tool_calls": [{"name": "f", "id": 3}]}}]}, "id must be a string"),
        ({"rules": [{"reply": {"colour": "red"}}]}, "reply must be an object of"),
    ],
)
def test_bad_scripts_are_refused_naming_the_field(script: object, needle: str) -> None:
    with pytest.raises(ScriptError) as caught:
        ModelScript.from_json(script)
    assert needle in str(caught.value)


def test_bad_config_values_are_refused() -> None:
    with pytest.raises(ValueError, match="latency"):
        SimulatorConfig(latency=-1.0)
    with pytest.raises(ValueError, match="default_profile"):
        SimulatorConfig(default_profile="gpt")  # type: ignore[arg-type]


async def test_a_stream_carries_usage_only_when_asked() -> None:
    for include in (None, False):
        body = chat_body([USER])
        del body["stream_options"]
        if include is not None:
            body["stream_options"] = {"include_usage": include}
        events = events_of(await read_body(await post(SimulatorEngine(), body)))
        assert events[-1] == "[DONE]"
        chunks = [event for event in events if isinstance(event, dict)]
        assert all(chunk["choices"] and "usage" not in chunk for chunk in chunks)


async def test_bad_stream_options_are_refused() -> None:
    body = chat_body([USER], stream_options={"include_usage": "yes"})
    error = await _error(SimulatorEngine(), body, 422)
    assert "stream_options: invalid type" in error["message"]


async def test_a_rules_reasoning_follows_the_mode() -> None:
    rules = {"rules": [{"reply": {"text": "t", "reasoning": "mine"}}, {"reply": {"text": "u"}}]}
    engine = SimulatorEngine(SimulatorConfig(script=rules))
    assert "reasoning_content" not in _message(await _completion(engine, _plain([USER])))
    thinking = _plain([USER], model="deepseek-reasoner")
    assert _message(await _completion(engine, thinking))["reasoning_content"] == "mine"
    bare = SimulatorEngine(SimulatorConfig(script={"rules": [{"reply": {"text": "u"}}]}))
    assert _message(await _completion(bare, thinking))["reasoning_content"]
