"""How a `MemoryStore` keeps a log: compact JSON per event, headers decoded and shared."""

from __future__ import annotations

import json
import sys
import tracemalloc

import attrs
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from actors.messages import UserSource
from actors.providers.chunks import Usage, UsageChunk
from actors.session import EVENT_TYPES, MemoryStore, SessionError
from actors.session.codec import event_to_json
from actors.session.events import (
    AssistantChunk,
    Event,
    ToolResult,
    TurnStart,
    UnknownData,
    UserMessage,
)
from tests.session.strategies import known_events


def _load_back(event: Event) -> list[Event]:
    async def run() -> list[Event]:
        store = MemoryStore()
        await store.create("s")
        await store.append("s", [event])
        return await store.load("s")

    return trio.run(run)


@pytest.mark.parametrize("type_", sorted(EVENT_TYPES))
@given(data=st.data())
def test_every_event_type_loads_back_exactly(type_: str, data: st.DataObject) -> None:
    event = data.draw(
        known_events(type_).map(
            lambda e: Event(
                type=e.type,
                seq=0,
                time=e.time,
                data=e.data,
                surface_op=e.surface_op,
                source_event_seqs=e.source_event_seqs,
                ignorable=e.ignorable,
            )
        )
    )
    (loaded,) = _load_back(event)
    assert loaded == event
    assert event_to_json(loaded) == event_to_json(event)


async def test_an_event_is_kept_as_its_compact_json_in_utf8_in_the_sessions_one_buffer() -> None:
    store = MemoryStore()
    await store.create("s")
    event = Event(
        type="user/message",
        seq=0,
        time=7,
        data=UserMessage(content="caf\u00e9 \U0001f600", source=UserSource()),
    )
    await store.append("s", [event])
    kept, _ = store._logs["s"].item(0)
    assert (
        kept == json.dumps(event_to_json(event), separators=(",", ":"), ensure_ascii=False).encode()
    )
    # Once flushed (as at the end of a turn), about the text's own bytes per event: no object
    # per event; and before, one of the text's size (not orjson's 4 KB buffer).
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        await store.append("s", [attrs.evolve(event, seq=1)])
        assert tracemalloc.get_traced_memory()[0] - before < sys.getsizeof(kept) + 128
        await store.flush("s")
        before = tracemalloc.get_traced_memory()[0]
        for seq in range(2, 102):
            await store.append("s", [attrs.evolve(event, seq=seq)])
            await store.flush("s")
        per_event = (tracemalloc.get_traced_memory()[0] - before) / 100
    finally:
        tracemalloc.stop()
    assert per_event < len(kept) * 1.25 + 16


@pytest.mark.parametrize(
    "raw",
    [
        {"big": 2**70},  # beyond orjson's 64-bit integers
        {"lone": "\ud800"},  # a lone surrogate: not UTF-8
        {"nothing": None},  # a null: orjson would also write NaN as one
    ],
)
async def test_what_orjson_cannot_write_exactly_is_kept_as_json_text_and_loads_back(
    raw: dict[str, object],
) -> None:
    store = MemoryStore()
    await store.create("s")
    event = Event(type="x/unknown", seq=0, time=0, data=UnknownData(raw=raw), ignorable=True)
    await store.append("s", [event])
    kept, _ = store._logs["s"].item(0)
    assert kept == json.dumps(event_to_json(event), separators=(",", ":")).encode()
    assert event_to_json((await store.load("s"))[0]) == event_to_json(event)


@pytest.mark.parametrize("content", [2**70, "lone \ud800", None])
async def test_a_known_event_orjson_cannot_write_exactly_is_kept_as_json_text(
    content: object,
) -> None:
    store = MemoryStore()
    await store.create("s")
    result = ToolResult(turn=0, step=0, call_id="c", content=content, is_error=False)  # type: ignore[arg-type]
    event = Event(type="tool/result", seq=0, time=0, data=result)
    await store.append("s", [event])
    kept, _ = store._logs["s"].item(0)
    assert kept == json.dumps(event_to_json(event), separators=(",", ":")).encode()


async def test_an_event_that_is_not_json_is_refused_and_nothing_of_its_append_is_stored() -> None:
    store = MemoryStore()
    await store.create("s")
    fine = Event(type="turn/start", seq=0, time=0, data=TurnStart(turn=0))
    broken = Event(
        type="x/unknown", seq=1, time=0, data=UnknownData(raw={"x": float("nan")}), ignorable=True
    )
    with pytest.raises(SessionError, match=r"session 's': event seq 1 \(x/unknown\) cannot be"):
        await store.append("s", [fine, broken])
    assert await store.load("s") == []
    assert store.durable_seq("s") == -1
    await store.append("s", [fine])
    assert await store.load("s") == [fine]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
async def test_a_known_event_with_a_non_finite_number_is_refused(value: float) -> None:
    store = MemoryStore()
    await store.create("s")
    usage = Usage(input_tokens=value)  # type: ignore[arg-type]
    broken = Event(
        type="assistant/chunk",
        seq=0,
        time=0,
        data=AssistantChunk(turn=0, step=0, chunk=UsageChunk(usage=usage)),
    )
    with pytest.raises(SessionError, match=r"event seq 0 \(assistant/chunk\) cannot be stored"):
        await store.append("s", [broken])
    assert await store.load("s") == []


async def test_an_append_does_not_yield_to_other_tasks() -> None:
    store = MemoryStore()
    await store.create("s")
    ran: list[str] = []

    async def other() -> None:
        ran.append("other")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        await store.append("s", [Event(type="turn/start", seq=0, time=0, data=TurnStart(turn=0))])
        assert ran == []  # storing never blocks: no scheduling point
    assert ran == ["other"]


async def test_a_cancelled_append_raises_and_stores_nothing() -> None:
    store = MemoryStore()
    await store.create("s")
    event = Event(type="turn/start", seq=0, time=0, data=TurnStart(turn=0))
    with trio.CancelScope() as scope:
        scope.cancel()
        await store.append("s", [event])
    assert scope.cancelled_caught
    assert await store.load("s") == []
    assert store.durable_seq("s") == -1
