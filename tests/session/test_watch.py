"""Watching a session: every appended event in order; a slow watcher is disconnected."""

from __future__ import annotations

from actors.session import MemoryStore, Session
from actors.session.events import TurnStart


async def test_watcher_receives_appended_events_in_order() -> None:
    session = await Session.create(MemoryStore())
    async with session.watch() as events:
        for turn in range(3):
            await session.append(TurnStart(turn=turn))
        received = [events.receive_nowait().seq for _ in range(3)]
    assert received == [0, 1, 2]


async def test_slow_watcher_is_disconnected_instead_of_blocking_the_log() -> None:
    session = await Session.create(MemoryStore())
    async with session.watch(buffer=2) as events:
        for turn in range(5):
            await session.append(TurnStart(turn=turn))
        received = [event.seq async for event in events]
    assert received == [0, 1]
    assert len(session) == 5


async def test_leaving_the_watch_lets_the_consumer_drain_then_end() -> None:
    session = await Session.create(MemoryStore())
    async with session.watch() as events:
        await session.append(TurnStart(turn=0))
    await session.append(TurnStart(turn=1))
    assert [event.seq async for event in events] == [0]
