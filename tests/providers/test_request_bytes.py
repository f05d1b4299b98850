"""The request body's bytes: the same as before its stable parts were cached, for any request.

`request_bodies.jsonl` holds, one per line, the bodies the encoder wrote
for `golden_requests()` before it kept the head (model and system message)
and the tools as encoded bytes (each body is JSON, so it holds no raw
newline). Today's encoder must write exactly those bytes, in any order and
through its caches, and in general exactly `json.dumps` of the whole body.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from actors.messages import Message, ReasoningBlock, TextBlock, ToolCallBlock, ToolSource
from actors.prompt.types import ToolSchema
from actors.providers.openai_wire import R1_PROFILE, V4_PROFILE, RequestEncoder
from actors.providers.request import GenerateRequest

GOLDEN = Path(__file__).with_name("request_bodies.jsonl")

_SYSTEM = (
    'You are "careful"\\ and brief.\nRules:\n\t1. Answer in kind: ünïcödé, 漢字, 𝄞, \u0001.\n' * 3
)
_TOOLS = tuple(
    ToolSchema(
        name=f"tool_{index}",
        description=f'Tool {index}: does "thing" #{index} — carefully.',
        parameters={
            "type": "object",
            "properties": {"text": {"type": "string"}, "repeat": {"type": "integer"}},
            "required": ["text"],
        },
    )
    for index in range(3)
)


def _tool_result(call_id: str, text: str) -> Message:
    return Message(role="user", content=(TextBlock(text=text),), source=ToolSource(call_id=call_id))


def _history() -> tuple[Message, ...]:
    return (
        Message.user('look it up: «quoted» "x"'),
        Message(
            role="assistant",
            content=(
                ReasoningBlock(text="I should call both."),
                TextBlock(text="Calling."),
                ToolCallBlock(id="c1", name="tool_0", arguments='{"text":"hi"}'),
                ToolCallBlock(id="c2", name="tool_1", arguments='{"text":"ho","repeat":2}'),
            ),
        ),
        _tool_result("c1", "hi"),
        _tool_result("c2", "hoho"),
        Message(role="assistant", content=(TextBlock(text="done 𝄞"),)),
        Message.user("The time is 2026-12-02T05:00:00Z."),
    )


def golden_requests() -> list[GenerateRequest]:
    """Requests covering every part of a body, the shared prefix among them."""
    config: dict[str, Any] = {"provider": "sim", "model": "deepseek-chat"}
    options = {
        "max_tokens": 50,
        "temperature": 0.5,
        "thinking": {"type": "enabled"},
        "reasoning_effort": "high",
        "tool_choice": {"type": "function", "function": {"name": "tool_0"}},
        "parallel_tool_calls": False,
        "response_format": {"type": "json_object"},
        "stop": ["END", "ÉND"],
        "unrelated": "not sent",
    }
    history = _history()
    return [
        GenerateRequest(config=config, system=_SYSTEM, tools=_TOOLS, messages=history[:1]),
        GenerateRequest(config=config, system=_SYSTEM, tools=_TOOLS, messages=history),
        GenerateRequest(
            config={**config, **options}, system=_SYSTEM, tools=_TOOLS, messages=history
        ),
        GenerateRequest(config=config, messages=history[:1]),
        GenerateRequest(config=config, system=_SYSTEM),
        GenerateRequest(config=config),
        GenerateRequest(config=config, system="", tools=_TOOLS[:1], messages=history[:2]),
        GenerateRequest(
            config={**config, "model": "deepseek-reasoner"}, system=_SYSTEM, messages=history
        ),
    ]


def _encoder() -> RequestEncoder:
    return RequestEncoder(profiles={"deepseek-reasoner": R1_PROFILE}, default_profile=V4_PROFILE)


def test_every_body_is_byte_identical_to_the_recorded_one_in_any_order() -> None:
    golden = GOLDEN.read_bytes().splitlines()
    requests = golden_requests()
    assert len(golden) == len(requests)
    encoder = _encoder()
    for _ in range(2):  # the second round comes from the caches
        assert [encoder.encode(request) for request in requests] == golden
    reverse = _encoder()
    assert [reverse.encode(request) for request in reversed(requests)] == golden[::-1]
    assert encoder.tool_encodings == 2  # two distinct tool tuples


_texts = st.text(max_size=20)
_messages = st.lists(
    st.one_of(
        _texts.map(Message.user),
        st.builds(_tool_result, st.sampled_from(["c1", "c2"]), _texts),
        st.builds(
            lambda text, calls: Message(
                role="assistant",
                content=(
                    TextBlock(text=text),
                    *(ToolCallBlock(id=f"c{n}", name="f", arguments=a) for n, a in calls),
                ),
            ),
            _texts,
            st.lists(st.tuples(st.integers(0, 9), _texts), max_size=2),
        ),
    ),
    max_size=4,
)


@settings(max_examples=60, deadline=None)
@given(
    system=st.one_of(st.none(), _texts),
    tool_count=st.integers(0, 3),
    messages=st.lists(_messages, min_size=1, max_size=3),
    max_tokens=st.one_of(st.none(), st.integers(1, 100)),
)
def test_any_body_is_exactly_json_dumps_of_the_whole_request(
    system: str | None, tool_count: int, messages: list[list[Message]], max_tokens: int | None
) -> None:
    encoder = _encoder()
    config = {"provider": "sim", "model": "deepseek-chat", "max_tokens": max_tokens}
    for history in messages:  # the same head and tools each time: cached after the first
        request = GenerateRequest(
            config={k: v for k, v in config.items() if v is not None},
            system=system,
            tools=_TOOLS[:tool_count],
            messages=history,
        )
        body = encoder.encode(request)
        assert body == _reference(json.loads(body), request)


def _reference(parsed: dict[str, Any], request: GenerateRequest) -> bytes:
    """`json.dumps` of the whole body, its messages checked against the request's."""
    expected_messages = len(request.messages) + (1 if request.system else 0)
    assert len(parsed["messages"]) == expected_messages
    return json.dumps(parsed, separators=(",", ":"), ensure_ascii=False).encode()
