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


async def test_watching_ends_cleanly_when_the_context_closes() -> None:
    session = await Session.create(MemoryStore())
    async with session.watch() as events:
        pass
    await session.append(TurnStart(turn=0))
    assert events.statistics().open_send_channels == 0
