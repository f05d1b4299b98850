"""How a `MemoryStore` keeps a log: compact JSON text per event, headers decoded and shared."""

from __future__ import annotations

import json

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from actors.session import EVENT_TYPES, MemoryStore, SessionError
from actors.session.codec import event_to_json
from actors.session.events import Event, TurnStart, UnknownData
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


async def test_an_event_is_kept_as_its_compact_json_text() -> None:
    store = MemoryStore()
    await store.create("s")
    event = Event(type="turn/start", seq=0, time=7, data=TurnStart(turn=0))
    await store.append("s", [event])
    (kept,) = store._logs["s"]
    assert kept == json.dumps(event_to_json(event), separators=(",", ":"))


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
