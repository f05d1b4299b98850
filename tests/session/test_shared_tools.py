"""One decoded copy of a deployment's tool schemas, shared by every session of a MemoryStore."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given

from actors.jsonvalue import freeze_object
from actors.prompt.types import ToolSchema
from actors.session import MemoryStore, codec
from actors.session.codec import event_to_json, event_to_shared_json
from actors.session.events import Event, RequestHeaderLogged
from actors.session.header import RequestHeader
from tests.session.strategies import known_events

TOOLS = tuple(
    ToolSchema(
        name=f"tool_{index}",
        description="does a thing",
        parameters={"type": "object", "properties": {"a": {"type": "string"}}},
    )
    for index in range(3)
)


def _header_event(tools: tuple[ToolSchema, ...] = TOOLS) -> Event:
    return Event(
        type="request/header",
        seq=0,
        time=0,
        data=RequestHeaderLogged(
            header=RequestHeader(config={"model": "m"}, system="s", tools=tools),
            reason="initial",
        ),
    )


def test_headers_with_the_same_schemas_share_one_decoded_tools_list() -> None:
    first = event_to_shared_json(_header_event())["data"]["header"]["tools"]
    second = event_to_shared_json(_header_event())["data"]["header"]["tools"]
    assert first is second
    assert first == event_to_json(_header_event())["data"]["header"]["tools"]


def test_the_public_json_form_is_a_fresh_copy_every_time() -> None:
    shared = event_to_shared_json(_header_event())["data"]["header"]["tools"]
    public = event_to_json(_header_event())["data"]["header"]["tools"]
    assert public is not shared
    public[0]["name"] = "changed"
    assert shared[0]["name"] == "tool_0"


def test_different_schemas_get_their_own_list() -> None:
    other = tuple(ToolSchema(name=t.name, description="other", parameters={}) for t in TOOLS)
    mine = event_to_shared_json(_header_event())["data"]["header"]["tools"]
    theirs = event_to_shared_json(_header_event(other))["data"]["header"]["tools"]
    assert mine is not theirs
    assert theirs[0]["description"] == "other"


async def test_a_memory_store_keeps_one_copy_across_sessions_and_loads_them_exactly() -> None:
    store = MemoryStore()
    for session in ("a", "b"):
        await store.create(session)
        await store.append(session, [_header_event()])
    # The header by reference: one stored copy.
    assert store._logs["a"].item(0) == store._logs["b"].item(0)
    (header,) = store._headers
    assert header["tools"] is event_to_shared_json(_header_event())["data"]["header"]["tools"]
    assert json.dumps(TOOLS[0].name).encode() not in store._logs["a"].item(0)[0]
    loaded = [await store.load(s) for s in ("a", "b")]
    assert loaded[0] == loaded[1] == [_header_event()]
    data = loaded[0][0].data
    assert isinstance(data, RequestHeaderLogged)
    assert data.header.tools == TOOLS


async def test_loading_a_shared_tools_list_gives_back_the_very_schemas_logged() -> None:
    store = MemoryStore()
    await store.create("a")
    await store.append("a", [_header_event()])
    (event,) = await store.load("a")
    assert isinstance(event.data, RequestHeaderLogged)
    assert all(a is b for a, b in zip(event.data.header.tools, TOOLS, strict=True))


def test_the_shared_form_is_the_public_form_key_for_key_and_decodes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    public = event_to_json(_header_event())
    event_to_shared_json(_header_event())  # caches the tool list's text and decoded copy
    decoded: list[str] = []
    real_loads = json.loads

    def counting_loads(text: str, **kwargs: Any) -> Any:
        decoded.append(text)
        return real_loads(text, **kwargs)

    monkeypatch.setattr(codec.json, "loads", counting_loads)
    shared = event_to_shared_json(_header_event())
    assert not [text for text in decoded if '"tool_0"' in text]  # the tool list is not decoded
    assert json.dumps(shared) == json.dumps(public)  # same keys, same order, same values


@given(event=known_events("request/header"))
def test_the_shared_form_of_any_header_event_is_its_public_form(event: Event) -> None:
    assert json.dumps(event_to_shared_json(event)) == json.dumps(event_to_json(event))


def test_headers_with_the_same_config_object_share_one_decoded_config() -> None:
    config = freeze_object({"model": "m", "extra": {"a": [1, 2]}}, where="config")

    def header(system: str) -> Event:
        return Event(
            type="request/header",
            seq=0,
            time=0,
            data=RequestHeaderLogged(
                header=RequestHeader(config=config, system=system, tools=TOOLS), reason="initial"
            ),
        )

    first = event_to_shared_json(header("s1"))["data"]["header"]
    second = event_to_shared_json(header("s2"))["data"]["header"]
    assert first["config"] is second["config"]
    assert first["config"] == {"model": "m", "extra": {"a": [1, 2]}}
    assert event_to_json(header("s1"))["data"]["header"]["config"] is not first["config"]
