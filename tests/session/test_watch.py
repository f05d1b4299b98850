"""Watching a session: only durable events, in order, from a cursor that never blocks the log."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs
import pytest
import trio

from actors.session import Event, Lease, MemoryStore, Session, SessionError, SQLiteStore
from actors.session.durability import DurableMarks
from actors.session.events import TurnStart


@attrs.define(eq=False)
class GatedStore:
    """A memory store whose appends become durable only when the test calls `commit()`."""

    inner: MemoryStore = attrs.field(factory=MemoryStore)
    accepted: dict[str, int] = attrs.field(factory=dict)
    marks: DurableMarks = attrs.field(factory=DurableMarks)

    @property
    def running(self) -> bool:
        return True

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep_forever()

    async def create(self, session_id: str) -> None:
        await self.inner.create(session_id)

    async def exists(self, session_id: str) -> bool:
        return await self.inner.exists(session_id)

    async def load(self, session_id: str) -> list[Event]:
        return await self.inner.load(session_id)

    async def acquire_lease(self, session_id: str, *, owner: str | None = None) -> Lease:
        return await self.inner.acquire_lease(session_id, owner=owner)

    async def release_lease(self, lease: Lease) -> None:
        await self.inner.release_lease(lease)

    async def append(
        self, session_id: str, events: Sequence[Event], *, lease: Lease | None = None
    ) -> None:
        await self.inner.append(session_id, events, lease=lease)
        self.accepted[session_id] = events[-1].seq

    async def flush(self, session_id: str | None = None) -> None:
        await trio.lowlevel.checkpoint()

    async def list_sessions(self) -> list[str]:
        return await self.inner.list_sessions()

    def durable_seq(self, session_id: str) -> int:
        return self.marks.seq(session_id)

    async def wait_durable(self, session_id: str, seq: int) -> None:
        await self.marks.wait(session_id, seq)

    def commit(self, session_id: str) -> None:
        self.marks.advance(session_id, self.accepted.get(session_id, -1))

    def fail(self, session_id: str) -> None:
        self.marks.fail(session_id, SessionError("disk on fire"))


async def test_watcher_receives_appended_events_in_order() -> None:
    session = await Session.create(MemoryStore())
    async with session.watch() as events:
        for turn in range(3):
            await session.append(TurnStart(turn=turn))
        received = [(await events.receive()).seq for _ in range(3)]
    assert received == [0, 1, 2]


async def test_watcher_sees_an_event_only_once_it_is_durable() -> None:
    store = GatedStore()
    session = await Session.create(store)
    async with session.watch() as events:
        await session.append(TurnStart(turn=0))
        await session.append(TurnStart(turn=1))
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(trio.WouldBlock):
            events.receive_nowait()
        assert session.durable_seq == -1
        store.commit(session.id)
        assert session.durable_seq == 1
        assert [(await events.receive()).seq for _ in range(2)] == [0, 1]


async def test_events_a_crash_takes_back_are_never_delivered() -> None:
    store = GatedStore()
    session = await Session.create(store)
    async with session.watch() as events:
        await session.append(TurnStart(turn=0))
        store.commit(session.id)
        await session.append(TurnStart(turn=1))  # accepted, never durable: the process "dies"
        await trio.testing.wait_all_tasks_blocked()
    assert [event.seq async for event in events] == [0]


async def test_slow_watcher_lags_but_loses_nothing_and_never_blocks_the_log() -> None:
    session = await Session.create(MemoryStore())
    async with session.watch(buffer=2) as events:
        with trio.fail_after(5):
            for turn in range(500):
                await session.append(TurnStart(turn=turn))
        received = [(await events.receive()).seq for _ in range(500)]
    assert received == list(range(500))


async def test_watch_from_a_seq_replays_history_then_follows() -> None:
    session = await Session.create(MemoryStore())
    for turn in range(3):
        await session.append(TurnStart(turn=turn))
    async with session.watch(from_seq=1) as events:
        await session.append(TurnStart(turn=3))
        received = [(await events.receive()).seq for _ in range(3)]
    assert received == [1, 2, 3]


async def test_watch_from_a_negative_seq_is_refused() -> None:
    session = await Session.create(MemoryStore())
    with pytest.raises(SessionError, match="seq -1"):
        async with session.watch(from_seq=-1):
            pass


async def test_leaving_the_watch_lets_the_consumer_drain_then_end() -> None:
    session = await Session.create(MemoryStore())
    async with session.watch() as events:
        await session.append(TurnStart(turn=0))
        await trio.testing.wait_all_tasks_blocked()
    await session.append(TurnStart(turn=1))
    assert [event.seq async for event in events] == [0]


async def test_wait_durable_raises_when_the_store_fails_the_session() -> None:
    store = GatedStore()
    session = await Session.create(store)
    await session.append(TurnStart(turn=0))
    async with trio.open_nursery() as nursery:
        failed = trio.Event()

        async def waiter() -> None:
            with pytest.raises(SessionError, match="disk on fire"):
                await session.wait_durable(0)
            failed.set()

        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        store.fail(session.id)
    assert failed.is_set()


async def test_durable_seq_is_minus_one_for_an_empty_log() -> None:
    session = await Session.create(MemoryStore())
    assert session.durable_seq == -1
    assert session.durable_events(0) == ()


async def test_sqlite_watch_delivers_after_the_group_commit(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.sqlite")
    async with trio.open_nursery() as nursery:
        await nursery.start(store.serve)
        session = await Session.create(store)
        async with session.watch() as events:
            for turn in range(5):
                await session.append(TurnStart(turn=turn))
            with trio.fail_after(10):
                received = [(await events.receive()).seq for _ in range(5)]
        assert received == list(range(5))
        assert store.durable_seq(session.id) == 4
        reloaded = await Session.load(store, session.id)  # closes the open turn 4
        assert reloaded.durable_seq == len(reloaded) - 1 == 5
        nursery.cancel_scope.cancel()


async def test_durable_changes_report_a_failed_session_with_its_failure() -> None:
    marks = DurableMarks()
    changes = marks.changes()
    marks.advance("s", 0)
    marks.advance("s", 0)  # not an advance: reported once
    assert changes.take() == ["s"]
    async with trio.open_nursery() as nursery:
        woken = trio.Event()

        async def waiter() -> None:
            await changes.wait()
            woken.set()

        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        marks.fail("s", SessionError("disk on fire"))
    assert woken.is_set() and changes.take() == ["s"]
    failure = changes.failure("s")
    assert failure is not None and "disk on fire" in str(failure)
    changes.close()
    changes.close()  # idempotent
