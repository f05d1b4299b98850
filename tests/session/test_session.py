"""`Session`: numbering, clock, fork, crash recovery on load, and the incremental surface."""

from __future__ import annotations

import itertools
import time

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from actors.messages import UserSource
from actors.providers.chunks import TextDelta
from actors.session import MemoryStore, ReplacementError, Session, SessionError, derive_messages
from actors.session.events import (
    AssistantChunk,
    StepEnd,
    StepStart,
    TurnEnd,
    TurnEndReason,
    TurnStart,
    UserMessage,
)
from tests.session.strategies import non_surface_data, surface_data


def ticking_clock(start: int = 1_000, step: int = 7) -> itertools.count[int]:
    return itertools.count(start, step)


def user(text: str) -> UserMessage:
    return UserMessage(content=text, source=UserSource())


async def complete_turn(session: Session, turn: int) -> None:
    await session.append(TurnStart(turn=turn))
    await session.append(user(f"question {turn}"))
    await session.append(StepStart(turn=turn, step=0))
    await session.append(StepEnd(turn=turn, step=0))
    await session.append(TurnEnd(turn=turn, reason=TurnEndReason.completed()))


async def test_append_numbers_events_contiguously_from_zero() -> None:
    session = await Session.create(MemoryStore(), "s")
    events = [await session.append(TurnStart(turn=0)), await session.append(user("hi"))]
    events.append(await session.append(StepStart(turn=0, step=0)))
    assert [event.seq for event in events] == [0, 1, 2]
    assert [event.seq for event in session.events] == [0, 1, 2]


async def test_append_takes_time_from_the_injected_clock() -> None:
    clock = ticking_clock()
    session = await Session.create(MemoryStore(), "s", clock=clock.__next__)
    await session.append(TurnStart(turn=0))
    await session.append(user("hi"))
    assert [event.time for event in session.events] == [1_000, 1_007]


async def test_rejected_replacement_leaves_the_log_unchanged() -> None:
    session = await Session.create(MemoryStore(), "s")
    await session.append(TurnStart(turn=0))
    with pytest.raises(ReplacementError, match="cites seq 0"):
        await session.append(user("x"), surface_op="replace", source_event_seqs=[0])
    assert len(session) == 1
    assert await session.store.load("s") == list(session.events)


async def test_fork_copies_exactly_the_completed_turns() -> None:
    store = MemoryStore()
    parent = await Session.create(store, "parent")
    await complete_turn(parent, 0)
    end_of_turn_0 = len(parent)
    await complete_turn(parent, 1)
    await parent.append(TurnStart(turn=2))

    child = await parent.fork(0, session_id="child")

    assert child.id == "child"
    assert child.to_json() == parent.to_json()[:end_of_turn_0]
    assert (await Session.load(store, "child")).to_json() == child.to_json()
    assert child.derive_messages() == derive_messages(child.events)


async def test_fork_by_default_copies_up_to_the_last_completed_turn() -> None:
    parent = await Session.create(MemoryStore(), "parent")
    await complete_turn(parent, 0)
    await complete_turn(parent, 1)
    end_of_turn_1 = len(parent)
    await parent.append(TurnStart(turn=2))
    await parent.append(user("in flight"))

    child = await parent.fork()

    assert child.to_json() == parent.to_json()[:end_of_turn_1]
    assert child.open_turn() is None


@pytest.mark.parametrize("turn", [1, 7], ids=["in-flight", "missing"])
async def test_fork_refuses_a_turn_that_has_not_completed(turn: int) -> None:
    store = MemoryStore()
    parent = await Session.create(store, "parent")
    await complete_turn(parent, 0)
    await parent.append(TurnStart(turn=1))
    with pytest.raises(
        SessionError, match=rf"cannot fork up to turn {turn}; completed turns are \[0\]"
    ):
        await parent.fork(turn, session_id="child")
    assert await store.list_sessions() == ["parent"]


async def test_load_closes_an_interrupted_step_and_turn() -> None:
    store = MemoryStore()
    crashed = await Session.create(store, "s", clock=ticking_clock().__next__)
    await complete_turn(crashed, 0)
    await crashed.append(TurnStart(turn=1))
    await crashed.append(StepStart(turn=1, step=0))
    await crashed.append(AssistantChunk(turn=1, step=0, chunk=TextDelta(text="par")))
    before = crashed.to_json()

    loaded = await Session.load(store, "s", clock=ticking_clock(5_000).__next__)

    assert loaded.to_json()[: len(before)] == before
    assert [(e.type, e.data, e.time) for e in loaded.events[len(before) :]] == [
        ("step/end", StepEnd(turn=1, step=0), 5_000),
        ("turn/end", TurnEnd(turn=1, reason=TurnEndReason(kind="interrupted")), 5_000),
    ]
    assert (await Session.load(store, "s")).to_json() == loaded.to_json()


async def test_load_closes_an_interrupted_turn_between_steps() -> None:
    store = MemoryStore()
    crashed = await Session.create(store, "s")
    await crashed.append(TurnStart(turn=0))
    await crashed.append(StepStart(turn=0, step=0))
    await crashed.append(StepEnd(turn=0, step=0))

    loaded = await Session.load(store, "s")

    assert [e.type for e in loaded.events] == [
        "turn/start",
        "step/start",
        "step/end",
        "turn/end",
    ]
    assert loaded.open_turn() is None


async def test_load_leaves_a_completed_session_unchanged() -> None:
    store = MemoryStore()
    session = await Session.create(store, "s")
    await complete_turn(session, 0)
    assert (await Session.load(store, "s")).to_json() == session.to_json()


@given(data=st.data())
async def test_incremental_surface_equals_derive_messages(data: st.DataObject) -> None:
    session = await Session.create(MemoryStore(), "s")
    for _ in range(data.draw(st.integers(min_value=1, max_value=20), label="appends")):
        kind = data.draw(st.sampled_from(["surface", "other", "replace", "any-citation"]))
        visible = [event.seq for event in session.surface_events()]
        if kind == "surface":
            await session.append(data.draw(surface_data))
        elif kind == "other":
            await session.append(data.draw(non_surface_data))
        elif kind == "replace" and visible:
            cited = data.draw(st.lists(st.sampled_from(visible), min_size=1, unique=True))
            await session.append(
                data.draw(surface_data), surface_op="replace", source_event_seqs=cited
            )
        elif kind == "any-citation":
            cited = data.draw(st.lists(st.integers(min_value=0, max_value=len(session) + 1)))
            before = len(session)
            try:
                await session.append(
                    data.draw(surface_data), surface_op="replace", source_event_seqs=cited
                )
            except ReplacementError:
                assert len(session) == before
        assert session.derive_messages() == derive_messages(session.events)
    loaded = await Session.load(session.store, "s")
    # Loading only appends (it may close an open turn, answering its calls).
    assert loaded.derive_messages()[: len(session.derive_messages())] == session.derive_messages()


async def test_default_clock_stamps_epoch_milliseconds() -> None:
    session = await Session.create(MemoryStore(), "s")
    before = time.time_ns() // 1_000_000
    event = await session.append(TurnStart(turn=0))
    after = time.time_ns() // 1_000_000
    assert before <= event.time <= after


async def test_open_creates_a_missing_session_and_loads_an_existing_one() -> None:
    store = MemoryStore()
    created = await Session.open(store, "s")
    await complete_turn(created, 0)
    loaded = await Session.open(store, "s")
    assert loaded.to_json() == created.to_json()
    fresh = await Session.open(store)
    assert fresh.id != "s" and len(fresh) == 0


async def test_concurrent_appends_from_several_tasks_keep_seqs_contiguous() -> None:
    store = MemoryStore()
    session = await Session.create(store)

    async def writer(turn: int) -> None:
        for step in range(20):
            await session.append(StepStart(turn=turn, step=step))

    async with trio.open_nursery() as nursery:
        for turn in range(5):
            nursery.start_soon(writer, turn)
    assert [e.seq for e in session.events] == list(range(100))
    reloaded = await Session.load(store, session.id)
    assert reloaded.to_json() == session.to_json()
