"""The DeepSeek-compatible simulator: validation, cache accounting, the model, faults, serving."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from actors.providers.simulator import (
    ConnectionReset,
    Fault,
    FaultError,
    PrefixCache,
    SimReply,
    SimToolCall,
    SimulatorConfig,
    SimulatorEngine,
    serve_simulator,
    tokenize,
)
from actors.providers.simulator.tokens import render_message, render_prompt
from tests.providers.simulator_helpers import API_KEY, chat_body, events_of, post, read_body

USER: dict[str, Any] = {"role": "user", "content": "hello there"}
ROOT = Path(__file__).resolve().parents[2]


def _error(response_body: bytes) -> dict[str, Any]:
    error = json.loads(response_body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error, dict)
    return error


def _usage(events: list[Any]) -> dict[str, Any]:
    usages = [event["usage"] for event in events if isinstance(event, dict) and event.get("usage")]
    assert len(usages) == 1
    usage = usages[0]
    assert isinstance(usage, dict)
    return usage


async def _stream_events(engine: SimulatorEngine, body: object, **kwargs: Any) -> list[Any]:
    response = await post(engine, body, **kwargs)
    assert response.status == 200, response.body
    return events_of(await read_body(response))


def _deltas(events: list[Any]) -> list[dict[str, Any]]:
    return [
        event["choices"][0]["delta"]
        for event in events
        if isinstance(event, dict) and event["choices"]
    ]


# --- tokenizer and render ------------------------------------------------------------------


def test_tokenizer_round_trips_at_about_four_characters_per_token() -> None:
    text = "The quick brown fox jumps over the lazy dog, twice. " * 20
    tokens = tokenize(text)
    assert "".join(tokens) == text
    assert tokens == tokenize(text)
    assert 2.5 < len(text) / len(tokens) < 4.5


@given(st.text())
def test_tokens_join_back_into_any_text(text: str) -> None:
    tokens = tokenize(text)
    assert "".join(tokens) == text
    assert all(tokens)


def test_a_prompt_and_its_reply_prefix_the_next_prompt() -> None:
    first = [{"role": "system", "content": "rules"}, USER]
    reply = {"role": "assistant", "content": "hi", "reasoning_content": ""}
    second = [*first, reply, {"role": "user", "content": "more"}]
    tokens = render_prompt(None, first) + render_message(reply)
    assert render_prompt(None, second)[: len(tokens)] == tokens


# --- prefix cache ----------------------------------------------------------------------------


def _cache(**overrides: Any) -> tuple[PrefixCache, list[float]]:
    now = [0.0]
    options: dict[str, Any] = {"block_tokens": 64, "ttl": None, "max_blocks": 1000}
    options.update(overrides)
    return PrefixCache(clock=lambda: now[0], **options), now


@given(
    st.lists(st.sampled_from("abcd"), min_size=0, max_size=400),
    st.lists(st.sampled_from("abcd"), min_size=0, max_size=400),
)
def test_hit_is_the_common_prefix_rounded_down_to_whole_blocks(
    earlier: list[str], prompt: list[str]
) -> None:
    cache, _ = _cache()
    cache.insert("k", earlier)
    common = 0
    while common < min(len(earlier), len(prompt)) and earlier[common] == prompt[common]:
        common += 1
    assert cache.lookup("k", prompt) == common // 64 * 64


def test_the_best_of_several_earlier_prompts_counts() -> None:
    cache, _ = _cache()
    base = [str(i) for i in range(300)]
    cache.insert("k", base[:100])
    cache.insert("k", base[:200] + ["x"] * 50)
    assert cache.lookup("k", base) == 192


def test_cache_entries_are_keyed() -> None:
    cache, _ = _cache()
    tokens = [str(i) for i in range(128)]
    cache.insert("model-a", tokens)
    assert cache.lookup("model-b", tokens) == 0
    assert cache.lookup("model-a", tokens) == 128


def test_unused_blocks_expire_after_the_ttl() -> None:
    cache, now = _cache(ttl=10.0)
    tokens = [str(i) for i in range(128)]
    cache.insert("k", tokens)
    now[0] = 9.0
    assert cache.lookup("k", tokens) == 128  # a hit refreshes the blocks
    now[0] = 18.0
    assert cache.lookup("k", tokens) == 128
    now[0] = 28.5
    assert cache.lookup("k", tokens) == 0
    assert cache.statistics().blocks == 0


def test_least_recently_used_blocks_go_beyond_the_bound() -> None:
    cache, _ = _cache(max_blocks=2)
    old = [f"o{i}" for i in range(128)]
    new = [f"n{i}" for i in range(128)]
    cache.insert("k", old)
    cache.insert("k", new)
    assert cache.lookup("k", old) == 0
    assert cache.lookup("k", new) == 128
    assert cache.statistics().evictions == 2


# --- validation and routes -----------------------------------------------------------------


async def test_a_wrong_key_gets_401_with_a_deepseek_error_body() -> None:
    engine = SimulatorEngine()
    response = await post(
        engine, chat_body([USER]), headers={"authorization": "Bearer sk-nope1234"}
    )
    assert response.status == 401
    error = _error(response.body)
    assert error["type"] == "authentication_error"
    assert "****1234" in error["message"]
    assert engine.requests[0].outcome == "rejected"


async def test_bad_json_is_400() -> None:
    response = await post(SimulatorEngine(), b"{not json")
    assert response.status == 400
    assert "deserialize" in _error(response.body)["message"]


async def test_a_schema_error_is_422_naming_the_field() -> None:
    response = await post(SimulatorEngine(), chat_body([{"role": "robot", "content": "x"}]))
    assert response.status == 422
    assert "messages[0].role" in _error(response.body)["message"]


async def test_tool_calls_without_a_tool_message_for_each_id_are_400() -> None:
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        for i in (1, 2)
    ]
    messages = [
        USER,
        {"role": "assistant", "content": "", "reasoning_content": "", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "user", "content": "next"},
    ]
    response = await post(SimulatorEngine(), chat_body(messages))
    assert response.status == 400
    assert "missing c2" in _error(response.body)["message"]


async def test_a_tool_message_answering_no_call_is_400() -> None:
    messages = [USER, {"role": "tool", "tool_call_id": "ghost", "content": "x"}]
    response = await post(SimulatorEngine(), chat_body(messages))
    assert response.status == 400
    assert "'ghost'" in _error(response.body)["message"]


def _tool_turn(reasoning: str | None) -> list[dict[str, Any]]:
    assistant: dict[str, Any] = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }
    if reasoning is not None:
        assistant["reasoning_content"] = reasoning
    return [USER, assistant, {"role": "tool", "tool_call_id": "c1", "content": "ok"}]


@pytest.mark.parametrize(
    ("model", "thinking"),
    [("deepseek-chat", {"type": "enabled"}), ("deepseek-reasoner", None)],
)
async def test_thinking_mode_requires_reasoning_content_on_tool_call_messages(
    model: str, thinking: dict[str, str] | None
) -> None:
    engine = SimulatorEngine()
    fields: dict[str, Any] = {"model": model} | ({"thinking": thinking} if thinking else {})
    response = await post(engine, chat_body(_tool_turn(None), **fields))
    assert response.status == 400
    error = _error(response.body)
    assert "Missing `reasoning_content` field" in error["message"]
    assert "message index 1" in error["message"]
    assert (await post(engine, chat_body(_tool_turn(""), **fields))).status == 200


@pytest.mark.parametrize("reasoning", [None, "", "thought"])
async def test_without_thinking_reasoning_content_is_optional(reasoning: str | None) -> None:
    for thinking in (None, {"type": "disabled"}):
        body = chat_body(_tool_turn(reasoning), **({"thinking": thinking} if thinking else {}))
        assert (await post(SimulatorEngine(), body)).status == 200


async def test_r1_refuses_reasoning_content_on_input_messages() -> None:
    engine = SimulatorEngine(SimulatorConfig(profiles={"legacy-r1": "r1"}))
    response = await post(engine, chat_body(_tool_turn(""), model="legacy-r1"))
    assert response.status == 400
    assert "not allowed" in _error(response.body)["message"]
    assert (await post(engine, chat_body(_tool_turn(None), model="legacy-r1"))).status == 200


async def test_unknown_models_are_refused_as_deepseek_does() -> None:
    response = await post(SimulatorEngine(), chat_body([USER], model="gpt-x"))
    assert response.status == 400
    error = _error(response.body)
    assert "Model Not Exist" in error["message"] and error["param"] == "model"


async def test_a_default_profile_accepts_any_model() -> None:
    engine = SimulatorEngine(SimulatorConfig(default_profile="v4"))
    assert (await post(engine, chat_body([USER], model="gpt-x"))).status == 200


async def test_chat_is_served_on_both_paths() -> None:
    engine = SimulatorEngine()
    for path in ("/chat/completions", "/v1/chat/completions"):
        events = await _stream_events(engine, chat_body([USER]), path=path)
        assert events[-1] == "[DONE]" and _usage(events)["prompt_tokens"] > 0
    assert [record.path for record in engine.requests] == [
        "/chat/completions",
        "/v1/chat/completions",
    ]


async def test_models_are_listed_on_both_paths() -> None:
    engine = SimulatorEngine()
    for path in ("/models", "/v1/models"):
        response = await post(engine, b"", path=path, method="GET")
        assert response.status == 200
        ids = [model["id"] for model in json.loads(response.body)["data"]]
        assert ids == ["deepseek-chat", "deepseek-reasoner"]


async def test_unknown_routes_and_methods_are_refused() -> None:
    engine = SimulatorEngine()
    assert (await post(engine, b"", path="/nope")).status == 404
    assert (await post(engine, b"", path="/chat/completions", method="GET")).status == 405


async def test_an_oversized_body_is_413() -> None:
    engine = SimulatorEngine(SimulatorConfig(max_body_bytes=100))
    response = await post(engine, chat_body([{"role": "user", "content": "x" * 200}]))
    assert response.status == 413


# --- the deterministic model ---------------------------------------------------------------


async def test_call_lines_become_interleaved_tool_calls_in_fragments() -> None:
    text = 'please\ncall read {"path": "/etc/hostname"}\ncall grep {"pattern": "needle"}'
    events = await _stream_events(SimulatorEngine(), chat_body([{"role": "user", "content": text}]))
    fragments = [call for delta in _deltas(events) for call in delta.get("tool_calls", [])]
    order = [fragment["index"] for fragment in fragments]
    assert order[:4] == [0, 1, 0, 1]  # interleaved
    assert [f["function"]["name"] for f in fragments if "id" in f] == ["read", "grep"]
    for index, expected in enumerate(['{"path": "/etc/hostname"}', '{"pattern": "needle"}']):
        pieces = [f["function"]["arguments"] for f in fragments if f["index"] == index]
        assert "".join(pieces) == expected
        assert len([piece for piece in pieces if piece]) > 1
    assert events[-3]["choices"][0]["finish_reason"] == "tool_calls"


async def test_call_lines_are_found_before_a_trailing_context_snapshot() -> None:
    messages = [
        {"role": "user", "content": 'call read {"path": "a"}'},
        {"role": "user", "content": "Current runtime context. ..."},
    ]
    events = await _stream_events(SimulatorEngine(), chat_body(messages))
    assert events[-3]["choices"][0]["finish_reason"] == "tool_calls"


async def test_after_tool_results_the_model_cites_them() -> None:
    events = await _stream_events(SimulatorEngine(), chat_body(_tool_turn("")))
    text = "".join(delta.get("content") or "" for delta in _deltas(events))
    assert text == 'Tool results: c1 returned "ok".'


async def test_the_filler_reply_has_the_configured_length() -> None:
    engine = SimulatorEngine(SimulatorConfig(reply_tokens=7))
    events = await _stream_events(engine, chat_body([USER]))
    contents = [delta["content"] for delta in _deltas(events) if delta.get("content")]
    assert len(contents) == 7
    assert _usage(events)["completion_tokens"] == 7


async def test_replies_are_deterministic() -> None:
    first = await _stream_events(SimulatorEngine(wall_clock=lambda: 0.0), chat_body([USER]))
    second = await _stream_events(SimulatorEngine(wall_clock=lambda: 0.0), chat_body([USER]))
    assert first == second


async def test_scripted_replies_are_consumed_in_order() -> None:
    engine = SimulatorEngine()
    engine.replies.queue(
        SimReply(text="first"),
        SimReply(tool_calls=[SimToolCall(name="f", arguments="{}", id="fixed")]),
    )
    one = _deltas(await _stream_events(engine, chat_body([USER])))
    two = _deltas(await _stream_events(engine, chat_body([USER])))
    assert "".join(delta.get("content") or "" for delta in one) == "first"
    assert two[1]["tool_calls"][0]["id"] == "fixed"
    assert engine.replies.pending == 0


async def test_max_tokens_cuts_the_text_and_finishes_with_length() -> None:
    events = await _stream_events(SimulatorEngine(), chat_body([USER], max_tokens=3))
    contents = [delta["content"] for delta in _deltas(events) if delta.get("content")]
    assert len(contents) == 3
    assert events[-3]["choices"][0]["finish_reason"] == "length"


async def test_thinking_streams_reasoning_first_and_counts_it() -> None:
    body = chat_body([USER], thinking={"type": "enabled"})
    events = await _stream_events(SimulatorEngine(), body)
    deltas = _deltas(events)
    assert deltas[1].get("reasoning_content")
    assert _usage(events)["completion_tokens_details"]["reasoning_tokens"] > 0


# --- cache accounting through the engine ---------------------------------------------------


def _long_system() -> dict[str, Any]:
    return {"role": "system", "content": "Follow the house rules carefully. " * 30}


async def test_usage_reports_cache_hits_after_the_first_request() -> None:
    engine = SimulatorEngine()
    body = chat_body([_long_system(), USER])
    first = _usage(await _stream_events(engine, body))
    second = _usage(await _stream_events(engine, body))
    assert first["prompt_cache_hit_tokens"] == 0
    assert first["prompt_cache_miss_tokens"] == first["prompt_tokens"]
    hit = second["prompt_cache_hit_tokens"]
    assert hit == second["prompt_tokens"] // 64 * 64 > 0
    assert second["prompt_tokens_details"]["cached_tokens"] == hit
    assert second["prompt_cache_miss_tokens"] == second["prompt_tokens"] - hit


async def test_the_cache_is_keyed_by_thinking() -> None:
    engine = SimulatorEngine()
    await _stream_events(engine, chat_body([_long_system(), USER]))
    body = chat_body([_long_system(), USER], thinking={"type": "enabled"})
    assert _usage(await _stream_events(engine, body))["prompt_cache_hit_tokens"] == 0


async def test_the_cache_is_keyed_by_model_and_user() -> None:
    engine = SimulatorEngine(SimulatorConfig(profiles={"model-a": "v4", "model-b": "v4"}))
    await _stream_events(engine, chat_body([_long_system(), USER], model="model-a", user="u1"))
    for model, user in [("model-b", "u1"), ("model-a", "u2"), ("model-a", None)]:
        body = chat_body([_long_system(), USER], model=model, user=user)
        assert _usage(await _stream_events(engine, body))["prompt_cache_hit_tokens"] == 0
    body = chat_body([_long_system(), USER], model="model-a", user="u1")
    assert _usage(await _stream_events(engine, body))["prompt_cache_hit_tokens"] > 0


async def test_the_reply_is_cached_with_the_prompt_for_the_next_request() -> None:
    engine = SimulatorEngine(SimulatorConfig(reply_tokens=300))
    first_events = await _stream_events(engine, chat_body([_long_system(), USER]))
    first = _usage(first_events)
    reply = "".join(delta.get("content") or "" for delta in _deltas(first_events))
    history = [_long_system(), USER, {"role": "assistant", "content": reply}]
    second = _usage(
        await _stream_events(engine, chat_body([*history, {"role": "user", "content": "more"}]))
    )
    replayed = len(render_prompt(None, history))
    # The hit reaches into the replayed reply, past every block of the first prompt.
    assert second["prompt_cache_hit_tokens"] == replayed // 64 * 64
    assert second["prompt_cache_hit_tokens"] > first["prompt_tokens"] // 64 * 64 + 64


async def test_the_flush_route_empties_the_cache() -> None:
    engine = SimulatorEngine()
    body = chat_body([_long_system(), USER])
    await _stream_events(engine, body)
    flushed = await post(engine, b"", path="/_sim/flush")
    assert json.loads(flushed.body)["flushed_blocks"] > 0
    assert _usage(await _stream_events(engine, body))["prompt_cache_hit_tokens"] == 0


async def test_cache_blocks_expire_on_the_injected_clock() -> None:
    now = [0.0]
    engine = SimulatorEngine(SimulatorConfig(cache_ttl=60.0), clock=lambda: now[0])
    body = chat_body([_long_system(), USER])
    await _stream_events(engine, body)
    now[0] = 61.0
    assert _usage(await _stream_events(engine, body))["prompt_cache_hit_tokens"] == 0


async def test_cache_blocks_expire_on_trio_time_by_default(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = SimulatorEngine(SimulatorConfig(cache_ttl=60.0))
    body = chat_body([_long_system(), USER])
    await _stream_events(engine, body)
    await trio.sleep(30.0)
    assert _usage(await _stream_events(engine, body))["prompt_cache_hit_tokens"] > 0
    await trio.sleep(61.0)
    assert _usage(await _stream_events(engine, body))["prompt_cache_hit_tokens"] == 0
    assert engine.statistics().cache.evictions > 0


# --- faults --------------------------------------------------------------------------------


async def test_a_fault_header_applies_to_that_request() -> None:
    engine = SimulatorEngine()
    fault = json.dumps({"status": 429, "retry_after": "3"})
    response = await post(engine, chat_body([USER]), headers={"x-sim-fault": fault})
    assert response.status == 429
    assert ("retry-after", "3") in response.headers
    assert _error(response.body)["type"] == "rate_limit_error"


async def test_an_invalid_fault_header_is_400_naming_the_field() -> None:
    engine = SimulatorEngine()
    response = await post(engine, chat_body([USER]), headers={"x-sim-fault": '{"stauts": 500}'})
    assert response.status == 400
    assert "stauts" in _error(response.body)["message"]


async def test_faults_can_target_a_request_number() -> None:
    engine = SimulatorEngine()
    engine.faults.at(1, Fault(status=503))
    statuses = [(await post(engine, chat_body([USER]))).status for _ in range(3)]
    assert statuses == [200, 503, 200]


async def test_queued_faults_apply_in_order() -> None:
    engine = SimulatorEngine()
    engine.faults.queue(Fault(status=500), Fault(status=502))
    statuses = [(await post(engine, chat_body([USER]))).status for _ in range(3)]
    assert statuses == [500, 502, 200]


def test_fault_fields_are_validated_by_name() -> None:
    with pytest.raises(FaultError, match="status"):
        Fault(status=200)
    with pytest.raises(FaultError, match="finish_reason"):
        Fault.from_json({"finish_reason": "done"})
    with pytest.raises(FaultError, match="keepalive_line"):
        Fault(keepalive_line="a\nb")


async def test_reset_before_headers_raises_connection_reset() -> None:
    engine = SimulatorEngine()
    engine.faults.queue(Fault(reset_before_headers=True))
    with pytest.raises(ConnectionReset):
        await post(engine, chat_body([USER]))
    assert engine.requests[0].outcome == "reset"


async def test_reset_after_chunks_stops_the_stream_with_connection_reset() -> None:
    engine = SimulatorEngine()
    engine.faults.queue(Fault(reset_after_chunks=2))
    response = await post(engine, chat_body([USER]))
    with pytest.raises(ConnectionReset):
        await read_body(response)
    assert engine.statistics().resets == 1
    assert engine.statistics().disconnects == 0


async def test_the_llama_cpp_quirk_repeats_ids_and_names_and_omits_usage() -> None:
    engine = SimulatorEngine()
    engine.faults.queue(Fault(llama_cpp=True))
    body = chat_body([{"role": "user", "content": 'call echo {"text": "a long argument"}'}])
    raw = await read_body(await post(engine, body))
    assert b": ping\n\n" in raw
    events = events_of(raw)
    fragments = [call for delta in _deltas(events) for call in delta.get("tool_calls", [])]
    assert len(fragments) > 2
    assert all(f["id"] and f["function"]["name"] == "echo" for f in fragments)
    assert not any(isinstance(event, dict) and "usage" in event for event in events)


@pytest.mark.parametrize(
    ("fault", "check"),
    [
        (
            Fault(crlf=True),
            lambda raw: b"\r\n\r\n" in raw and b"\n\n" not in raw.replace(b"\r\n", b""),
        ),
        (
            Fault(keepalives=2, keepalive_interval=0.0),
            lambda raw: raw.startswith(b": keep-alive\n\n: keep-alive\n\n"),
        ),
        (Fault(omit_done=True), lambda raw: b"[DONE]" not in raw),
        (Fault(malformed_after_chunks=1), lambda raw: b'data: {"choices": [{"delta"\n\n' in raw),
    ],
)
async def test_stream_shape_faults(fault: Fault, check: Any) -> None:
    engine = SimulatorEngine()
    engine.faults.queue(fault)
    assert check(await read_body(await post(engine, chat_body([USER]))))


async def test_usage_can_ride_on_the_finish_chunk() -> None:
    engine = SimulatorEngine()
    engine.faults.queue(Fault(usage="final"))
    events = await _stream_events(engine, chat_body([USER]))
    finish = events[-2]
    assert finish["choices"][0]["finish_reason"] == "stop" and finish["usage"]["prompt_tokens"]


async def test_write_size_recuts_the_body_without_changing_it() -> None:
    whole = await read_body(await post(SimulatorEngine(wall_clock=lambda: 0.0), chat_body([USER])))
    engine = SimulatorEngine(wall_clock=lambda: 0.0)
    engine.faults.queue(Fault(write_size=5))
    response = await post(engine, chat_body([USER]))
    assert response.stream is not None
    pieces = [piece async for piece in response.stream]
    assert b"".join(pieces) == whole
    assert {len(piece) for piece in pieces[:-1]} == {5}


async def test_token_rate_paces_the_stream(autojump_clock: trio.testing.MockClock) -> None:
    engine = SimulatorEngine(SimulatorConfig(reply_tokens=10, token_rate=5.0))
    start = trio.current_time()
    await _stream_events(engine, chat_body([USER]))
    assert trio.current_time() - start == pytest.approx(2.0)


async def test_first_byte_delay_holds_the_headers(autojump_clock: trio.testing.MockClock) -> None:
    engine = SimulatorEngine()
    engine.faults.queue(Fault(first_byte_delay=30.0))
    start = trio.current_time()
    await post(engine, chat_body([USER]))
    assert trio.current_time() - start == pytest.approx(30.0)


async def test_a_stream_closed_early_is_recorded_as_a_disconnect() -> None:
    engine = SimulatorEngine()
    response = await post(engine, chat_body([USER]))
    assert response.stream is not None
    await anext(response.stream)
    await response.stream.aclose()
    assert engine.requests[0].outcome == "disconnected"
    assert engine.statistics().disconnects == 1


async def test_a_stream_closed_before_its_first_read_is_a_disconnect() -> None:
    engine = SimulatorEngine()
    response = await post(engine, chat_body([USER]))
    assert response.stream is not None
    await response.stream.aclose()
    assert await engine.requests[0].wait_settled() == "disconnected"


async def test_recorded_requests_are_bounded() -> None:
    engine = SimulatorEngine(SimulatorConfig(max_recorded=2))
    for _ in range(3):
        await read_body(await post(engine, chat_body([USER])))
    assert [record.number for record in engine.requests] == [1, 2]
    assert engine.statistics().chat_requests == 3
    assert engine.requests[-1].body["messages"] == [USER]
    assert engine.requests[-1].outcome == "completed"


# --- the served simulator ------------------------------------------------------------------


async def test_serve_simulator_reports_its_url_and_answers(nursery: trio.Nursery) -> None:
    engine = SimulatorEngine()
    url = await nursery.start(serve_simulator, engine)
    assert url.startswith("http://127.0.0.1:") and not url.endswith(":0")
    headers = {"authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(base_url=url, headers=headers) as client:
        models = await client.get("/v1/models")
        assert models.status_code == 200
        refused = await client.get("/models", headers={"authorization": "Bearer wrong"})
        assert refused.status_code == 401 and _error(refused.content)["message"]
        reply = await client.post("/chat/completions", json=chat_body([USER]))
        assert reply.headers["content-type"].startswith("text/event-stream")
        assert events_of(reply.content)[-1] == "[DONE]"


async def test_the_simulator_command_serves_until_sigint() -> None:
    code = "from actors.providers.simulator import run_simulator_cli; run_simulator_cli(0)"
    command = [sys.executable, "-c", code]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            process: trio.Process = await nursery.start(
                partial(trio.run_process, command, cwd=ROOT, stdout=subprocess.PIPE, check=False)
            )
            assert process.stdout is not None
            output = b""
            while b"\n" not in output:
                piece = await process.stdout.receive_some()
                assert piece, output
                output += piece
            match = re.search(
                r"listening on (http://127\.0\.0\.1:\d+) \(api key: (\S+)\)", output.decode()
            )
            assert match, output
            url, key = match.groups()
            async with httpx.AsyncClient(base_url=url) as client:
                models = await client.get("/models", headers={"authorization": f"Bearer {key}"})
            assert models.status_code == 200
            process.send_signal(signal.SIGINT)
            while piece := await process.stdout.receive_some():
                output += piece
            assert await process.wait() == 0
    assert b"simulator stopped (SIGINT)" in output
