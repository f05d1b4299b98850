"""One writer per session: leases, takeover, fencing, renewal; a conflict fails one session only.

Two `SQLiteStore` objects on one file stand for two processes (the
two-process tests with real kills are in `test_two_writers.py`). Lease
expiry reads an injected wall clock, so "the lease expired" is a clock step,
not a wait; renewal runs on Trio's clock, with short real timeouts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from actors.agent import open_agent
from actors.prompt import SystemPrompt
from actors.providers.scripted import Reply, ScriptedProvider
from actors.session import (
    Event,
    MemoryStore,
    PostgresStore,
    SessionBusyError,
    SessionError,
    SessionFencedError,
    SessionStore,
    SQLiteStore,
)
from actors.session.events import TurnStart
from actors.session.lease import wall_clock_ms


def turn_start(seq: int) -> Event:
    return Event(type="turn/start", seq=seq, time=0, data=TurnStart(turn=seq))


@asynccontextmanager
async def serving(*stores: SessionStore) -> AsyncIterator[None]:
    async with trio.open_nursery() as nursery:
        for store in stores:
            await nursery.start(store.serve)
        yield
        nursery.cancel_scope.cancel()


class Clock:
    """A wall clock that starts at the real time and moves only when told."""

    def __init__(self) -> None:
        self.now = wall_clock_ms()

    def __call__(self) -> int:
        return self.now


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def two_stores(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[SessionStore, SessionStore]:
    if request.param == "memory":
        store = MemoryStore()
        return store, store
    if request.param == "postgres":
        dsn = request.getfixturevalue("postgres_dsn")
        return PostgresStore(dsn), PostgresStore(dsn)
    return SQLiteStore(tmp_path / "s.db"), SQLiteStore(tmp_path / "s.db")


async def test_a_second_writer_is_refused_naming_the_session_and_the_holder(
    two_stores: tuple[SessionStore, SessionStore],
) -> None:
    first, second = two_stores
    lease = await first.acquire_lease("s", owner="worker-1")
    with pytest.raises(SessionBusyError, match=r"session 's' is busy.*worker-1") as busy:
        await second.acquire_lease("s", owner="worker-2")
    assert (busy.value.session_id, busy.value.holder) == ("s", "worker-1")
    await first.release_lease(lease)
    again = await second.acquire_lease("s", owner="worker-2")
    assert again.epoch == lease.epoch + 1


async def test_a_released_lease_stays_fenced(
    two_stores: tuple[SessionStore, SessionStore],
) -> None:
    first, second = two_stores
    await first.create("s")
    old = await first.acquire_lease("s")
    await first.release_lease(old)
    new = await second.acquire_lease("s")
    async with serving(*{first, second}):
        await second.append("s", [turn_start(0)], lease=new)
        await second.flush("s")
        with pytest.raises(SessionFencedError, match=f"epoch {old.epoch}"):
            await first.append("s", [turn_start(1)], lease=old)
            await first.flush("s")
    assert [e.seq for e in await second.load("s")] == [0]


async def test_a_write_without_the_lease_is_refused_while_someone_holds_it(
    two_stores: tuple[SessionStore, SessionStore],
) -> None:
    first, second = two_stores
    await first.create("s")
    await first.acquire_lease("s", owner="holder")
    async with serving(*{first, second}):
        with pytest.raises(SessionBusyError, match="holder"):
            await second.append("s", [turn_start(0)])
            await second.flush("s")
    assert await first.load("s") == []


async def test_an_expired_lease_is_taken_over_and_the_old_writer_is_fenced(
    tmp_path: Path,
) -> None:
    clock = Clock()
    old_store = SQLiteStore(tmp_path / "s.db", lease_ttl=5, wall_clock=clock)
    new_store = SQLiteStore(tmp_path / "s.db", lease_ttl=5, wall_clock=clock)
    for session_id in ("s", "other"):
        await old_store.create(session_id)
    old = await old_store.acquire_lease("s", owner="old")
    other = await old_store.acquire_lease("other", owner="old")
    with pytest.raises(SessionBusyError):
        await new_store.acquire_lease("s", owner="new")
    clock.now += 5_001  # the old writer stalled past its expiry
    new = await new_store.acquire_lease("s", owner="new")
    assert new.epoch == old.epoch + 1
    async with serving(old_store, new_store):
        await new_store.append("s", [turn_start(0)], lease=new)
        await new_store.flush("s")
        # The old writer's late write shares a batch with a healthy session.
        await old_store.append("s", [turn_start(1)], lease=old)
        await old_store.append("other", [turn_start(0)], lease=other)
        with pytest.raises(SessionFencedError, match=r"refused session 's' seq 1\.\.1.*new"):
            await old_store.flush("s")
        await old_store.flush("other")
        with pytest.raises(SessionFencedError):
            await old_store.append("s", [turn_start(2)], lease=old)
        await new_store.append("s", [turn_start(1)], lease=new)
        await new_store.flush("s")
    # The refused commit and the append refused after it, never the healthy session's.
    assert old_store.statistics().fenced_appends == 2
    assert new_store.statistics().fenced_appends == 0
    assert [e.seq for e in await new_store.load("s")] == [0, 1]
    assert [e.seq for e in await new_store.load("other")] == [0]


async def test_an_expired_lease_nobody_took_keeps_accepting_its_holder(tmp_path: Path) -> None:
    clock = Clock()
    store = SQLiteStore(tmp_path / "s.db", lease_ttl=1, wall_clock=clock)
    await store.create("s")
    lease = await store.acquire_lease("s")
    clock.now += 60_000
    async with serving(store):
        await store.append("s", [turn_start(0)], lease=lease)
        await store.flush("s")
    assert len(await store.load("s")) == 1


async def test_a_living_holder_renews_its_lease(tmp_path: Path) -> None:
    holder = SQLiteStore(tmp_path / "s.db", lease_ttl=0.3)
    async with serving(holder):
        await holder.acquire_lease("s")
        await trio.sleep(1.0)  # more than three lease lifetimes
        with pytest.raises(SessionBusyError):
            await SQLiteStore(tmp_path / "s.db").acquire_lease("s")


async def test_a_holder_learns_of_a_takeover_at_its_next_renewal(tmp_path: Path) -> None:
    holder = SQLiteStore(tmp_path / "s.db", lease_ttl=0.3)
    await holder.create("s")
    lease = await holder.acquire_lease("s")
    async with serving(holder):
        later = SQLiteStore(tmp_path / "s.db", wall_clock=lambda: wall_clock_ms() + 60_000)
        await later.acquire_lease("s")
        await trio.sleep(1.0)  # renewals run every 0.1 s
        assert holder.statistics().leases_held == 0
        with pytest.raises(SessionFencedError, match="taken over by another writer"):
            await holder.append("s", [turn_start(0)], lease=lease)
        assert holder.statistics().broken_sessions == 1


async def test_open_agent_refuses_a_second_live_writer_before_accepting_input(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    async with open_agent(
        system_prompt=SystemPrompt(),
        provider=ScriptedProvider([Reply.text("a"), Reply.text("b")]),
        store=SQLiteStore(path),
        session_id="s",
    ) as first:
        with pytest.raises(SessionBusyError, match=r"session 's' is busy.*pid \d+") as busy:
            async with open_agent(
                system_prompt=SystemPrompt(),
                provider=ScriptedProvider([]),
                store=SQLiteStore(path),
                session_id="s",
            ):
                raise AssertionError("the second writer must not get an agent")
        assert isinstance(busy.value, SessionError)
        first.followup("still mine")
        await first.when_idle()
    types = [e.type for e in await SQLiteStore(path).load("s")]
    assert types.count("turn/end") == 1
    async with open_agent(
        system_prompt=SystemPrompt(),
        provider=ScriptedProvider([Reply.text("c")]),
        store=SQLiteStore(path),
        session_id="s",
    ) as after:
        after.followup("released on exit, so this opens at once")
        await after.when_idle()


async def test_a_fenced_session_fails_alone_and_other_agents_on_the_store_go_on(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "s.db", lease_ttl=0.3)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.serve)
        async with open_agent(
            system_prompt=SystemPrompt(),
            provider=ScriptedProvider([Reply.text("x"), Reply.text("y")]),
            store=store,
            session_id="healthy",
        ) as healthy:
            with pytest.raises(SessionFencedError):
                async with open_agent(
                    system_prompt=SystemPrompt(),
                    provider=ScriptedProvider([Reply.text("never")]),
                    store=store,
                    session_id="victim",
                ) as victim:
                    intruder = SQLiteStore(
                        tmp_path / "s.db", wall_clock=lambda: wall_clock_ms() + 60_000
                    )
                    await intruder.acquire_lease("victim")
                    await trio.sleep(1.0)  # renewals run every 0.1 s
                    await victim.session.flush()
            healthy.followup("one")
            await healthy.when_idle()
            healthy.followup("two")
            await healthy.when_idle()
        nursery.cancel_scope.cancel()
    kinds = [e.data.reason.kind for e in await store.load("healthy") if e.type == "turn/end"]  # type: ignore[union-attr]
    assert kinds == ["completed", "completed"]
