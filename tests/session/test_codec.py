"""The log's JSON: exact round trips, written tags, and refusal of unknown event types."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.messages import (
    Message,
    PluginSource,
    ReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolSource,
)
from actors.prompt.types import ToolSchema
from actors.providers import Chunk, Failure, FinishChunk, GenerateRequest, Usage, UsageChunk
from actors.session import EVENT_TYPES, SessionError, UnknownEventError
from actors.session.codec import converter, event_from_json, event_to_json
from actors.session.events import (
    AssistantChunk,
    AssistantMessage,
    Event,
    RequestHeaderLogged,
    UserMessage,
)
from actors.session.header import RequestHeader
from tests.session.strategies import DATA, known_events, unknown_events


def through_text(event: Event) -> Event:
    """The event after the durable round trip: JSON object, compact text, and back."""
    text = json.dumps(event_to_json(event), separators=(",", ":"))
    return event_from_json(json.loads(text))


def test_strategies_cover_every_event_type() -> None:
    assert set(DATA) == set(EVENT_TYPES)


@pytest.mark.parametrize("type_", sorted(EVENT_TYPES))
@given(data=st.data())
def test_every_event_type_round_trips_exactly(type_: str, data: st.DataObject) -> None:
    event = data.draw(known_events(type_))
    loaded = through_text(event)
    assert loaded == event
    assert event_to_json(loaded) == event_to_json(event)


@given(event=unknown_events)
def test_ignorable_unknown_event_round_trips_exactly(event: Event) -> None:
    loaded = through_text(event)
    assert loaded == event
    assert event_to_json(loaded) == event_to_json(event)


def test_unknown_event_type_is_refused_naming_type_and_seq() -> None:
    obj = {"type": "memory/compacted", "seq": 7, "time": 0, "data": {}}
    with pytest.raises(UnknownEventError, match=r"event seq 7 has unknown type 'memory/compacted'"):
        event_from_json(obj)


def test_unknown_event_type_marked_ignorable_is_kept_raw() -> None:
    obj = {"type": "memory/compacted", "seq": 7, "time": 0, "data": {"a": [1]}, "ignorable": True}
    event = event_from_json(obj)
    assert event.ignorable
    assert event_to_json(event) == obj


def test_malformed_known_event_names_seq_and_type() -> None:
    obj = {"type": "turn/start", "seq": 3, "time": 0, "data": {"turn": 0, "extra": 1}}
    with pytest.raises(SessionError, match=r"event seq 3 \(turn/start\) is malformed"):
        event_from_json(obj)


def test_user_message_json_writes_block_and_source_tags() -> None:
    event = Event(
        type="user/message",
        seq=0,
        time=5,
        data=UserMessage(
            content=(
                TextBlock(text="hi"),
                ReasoningBlock(text="r"),
                ToolCallBlock(id="c", name="n", arguments="{}"),
            ),
            source=PluginSource(plugin="runtime-context", form="snapshot", sections=("cwd",)),
        ),
    )
    assert event_to_json(event) == {
        "type": "user/message",
        "seq": 0,
        "time": 5,
        "data": {
            "content": [
                {"type": "text", "text": "hi"},
                {"type": "reasoning", "text": "r"},
                {"type": "tool-call", "id": "c", "name": "n", "arguments": "{}"},
            ],
            "source": {
                "kind": "plugin",
                "plugin": "runtime-context",
                "form": "snapshot",
                "sections": ["cwd"],
            },
        },
    }


def test_empty_system_text_and_tools_are_written_absent() -> None:
    event = Event(
        type="request/header",
        seq=0,
        time=0,
        data=RequestHeaderLogged(
            header=RequestHeader(config={"model": "m"}, system=""), reason="initial"
        ),
    )
    assert event_to_json(event)["data"] == {
        "header": {"config": {"model": "m"}},
        "reason": "initial",
    }


def _chunk_event(chunk: Chunk) -> Event:
    return Event(
        type="assistant/chunk", seq=0, time=0, data=AssistantChunk(turn=0, step=0, chunk=chunk)
    )


@pytest.mark.parametrize(
    ("chunk", "key", "expected"),
    [
        (
            UsageChunk(usage=Usage()),
            "usage",
            {"input_tokens": 0, "output_tokens": 0, "cache_read_tokens": 0},
        ),
        (
            FinishChunk(reason="error", failure=Failure(code="c")),
            "failure",
            {"code": "c", "message": "", "retryable": False},
        ),
    ],
    ids=["usage", "failure"],
)
def test_usage_and_failure_are_written_in_full_inside_a_chunk(
    chunk: Chunk, key: str, expected: dict[str, object]
) -> None:
    assert event_to_json(_chunk_event(chunk))["data"]["chunk"][key] == expected


def test_usage_is_written_in_full_in_an_assistant_message() -> None:
    event = Event(
        type="assistant/message",
        seq=0,
        time=0,
        data=AssistantMessage(
            turn=0, step=0, message=Message(role="assistant", content="x"), usage=Usage()
        ),
    )
    assert event_to_json(event)["data"]["usage"] == {
        "input_tokens": 0,
        "output_tokens": 0,
        "cache_read_tokens": 0,
    }


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (Message.user("hi"), {"kind": "user"}),
        (
            Message(role="user", content="r", source=ToolSource(call_id="c1")),
            {"kind": "tool", "call_id": "c1"},
        ),
        (
            Message.user("s", PluginSource(plugin="runtime-context", form="snapshot")),
            {"kind": "plugin", "plugin": "runtime-context", "form": "snapshot"},
        ),
    ],
    ids=["user", "tool", "plugin"],
)
def test_request_json_messages_carry_tagged_sources(
    message: Message, expected: dict[str, object]
) -> None:
    request = GenerateRequest(config={"provider": "p", "model": "m"}, messages=[message])
    assert request.to_json()["messages"][0]["source"] == expected


def test_logged_tool_lists_are_fresh_copies_even_when_served_from_the_cache() -> None:
    tools = (
        ToolSchema(name="a", description="first", parameters={"type": "object", "required": ["x"]}),
        ToolSchema(name="b", description="second ✓", parameters={}),
    )
    header = RequestHeader(config={"provider": "p", "model": "m"}, tools=tools)
    first = converter.unstructure(header, RequestHeader)
    first["tools"][0]["parameters"]["required"].append("mutated")
    second = converter.unstructure(header, RequestHeader)
    assert second["tools"] == [
        {"name": "a", "description": "first", "parameters": {"type": "object", "required": ["x"]}},
        {"name": "b", "description": "second ✓", "parameters": {}},
    ]
    assert second["tools"][0] is not first["tools"][0]


def test_a_request_header_config_must_be_a_json_object() -> None:
    with pytest.raises(TypeError, match="config must be a JSON object"):
        RequestHeader(config=["provider", "model"])  # type: ignore[arg-type]


CHUNK_EVENT = {"type": "assistant/chunk", "seq": 4, "time": 0, "data": {"turn": 0, "step": 0}}


@pytest.mark.parametrize(
    ("chunk", "complaint"),
    [
        ({"type": "text", "text": "hi", "extra": 1}, "extra"),  # a key the member lacks
        ({"type": "sparkle", "text": "hi"}, "sparkle"),  # an unknown tag
        ({"text": "hi"}, "type"),  # no tag at all
        ({"type": "tool-call-delta", "index": "first"}, "first"),  # a value of the wrong type
        ({"type": "usage", "usage": {"input_tokens": 1, "bogus": 2}}, "bogus"),  # nested
    ],
)
def test_a_malformed_tagged_union_member_is_refused_with_the_checked_error(
    chunk: dict[str, object], complaint: str
) -> None:
    obj = {**CHUNK_EVENT, "data": {**CHUNK_EVENT["data"], "chunk": chunk}}  # type: ignore[dict-item]
    with pytest.raises(SessionError, match=r"event seq 4 \(assistant/chunk\) is malformed") as info:
        event_from_json(obj)
    assert complaint in repr(info.value.__cause__) + str(info.value)


@given(data=st.data())
def test_a_well_formed_chunk_decodes_the_same_in_place_as_through_the_checked_hook(
    data: st.DataObject,
) -> None:
    # The checked hook is cattrs' own tagged-union hook; the in-place path must agree with it.
    event = data.draw(known_events("assistant/chunk"))
    obj = event_to_json(event)
    assert event_from_json(obj) == event
    assert obj == event_to_json(event)  # decoding read the object in place, never changed it


def test_an_envelope_with_optional_keys_keeps_them_and_one_without_gets_the_defaults() -> None:
    plain = {"type": "turn/start", "seq": 0, "time": 5, "data": {"turn": 0}}
    event = event_from_json(plain)
    assert (event.surface_op, event.source_event_seqs, event.ignorable) == (None, None, False)
    replacing = {
        "type": "user/message",
        "seq": 9,
        "time": 5,
        "data": {"content": [{"type": "text", "text": "summary"}], "source": {"kind": "user"}},
        "surface_op": "replace",
        "source_event_seqs": [2, 3],
    }
    event = event_from_json(replacing)
    assert (event.surface_op, event.source_event_seqs) == ("replace", (2, 3))
    assert event_to_json(event) == replacing
