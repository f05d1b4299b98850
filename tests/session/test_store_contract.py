"""The `SessionStore` contract, run against every store.

Round trips, creation, listing and seq checks run on `MemoryStore`,
`SQLiteStore` and `PostgresStore`; the writer's group commit, flush,
backpressure and shutdown run on the two stores with a writer task. Tests
that need the writer to be stuck hold the database's write lock from
another connection (`WriterBackend.write_locked`), which makes the writer's
commit wait deterministically until the test releases it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from actors.session import (
    EVENT_TYPES,
    Session,
    SessionError,
    SessionExistsError,
    SessionStore,
    UnknownSessionError,
)
from actors.session.events import TurnStart
from tests.session.store_helpers import (
    Backend,
    MemoryBackend,
    PostgresBackend,
    SQLiteBackend,
    WriterBackend,
    append_sample_log,
    serving,
    turn_start,
    user,
)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "memory":
        return MemoryBackend()
    if request.param == "sqlite":
        return SQLiteBackend(tmp_path / "sessions.db")
    return PostgresBackend(request.getfixturevalue("postgres_dsn"))


@pytest.fixture(params=["sqlite", "postgres"])
def writer_backend(request: pytest.FixtureRequest, tmp_path: Path) -> WriterBackend:
    if request.param == "sqlite":
        return SQLiteBackend(tmp_path / "sessions.db")
    return PostgresBackend(request.getfixturevalue("postgres_dsn"))


# Every store.


def test_every_store_implements_the_protocol(backend: Backend) -> None:
    assert isinstance(backend.open_store(), SessionStore)


async def test_reopening_a_session_restores_its_events_exactly(backend: Backend) -> None:
    async with serving(backend.open_store()) as store:
        session = await Session.create(store, "s")
        await append_sample_log(session)
    assert set(EVENT_TYPES) <= {event.type for event in session.events}

    async with serving(backend.open_store()) as reopened:
        loaded = await Session.load(reopened, "s")

    assert loaded.to_json() == session.to_json()
    assert loaded.events == session.events
    assert loaded.derive_messages() == session.derive_messages()


async def test_flushed_events_are_loaded_by_a_fresh_store_object(backend: Backend) -> None:
    async with serving(backend.open_store()) as store:
        await store.create("s")
        await store.append("s", [turn_start(0), turn_start(1, turn=1)])
        await store.flush()
        assert [event.seq for event in await backend.open_store().load("s")] == [0, 1]


async def test_load_sees_the_stores_own_accepted_appends(backend: Backend) -> None:
    async with serving(backend.open_store()) as store:
        await store.create("s")
        await store.append("s", [turn_start(0)])
        assert [event.seq for event in await store.load("s")] == [0]


async def test_sessions_are_listed_in_creation_order(backend: Backend) -> None:
    store = backend.open_store()
    for session_id in ["b", "a", "c"]:
        await store.create(session_id)
    assert await backend.open_store().list_sessions() == ["b", "a", "c"]
    assert await store.exists("a")
    assert not await store.exists("z")


async def test_creating_an_existing_session_is_refused(backend: Backend) -> None:
    store = backend.open_store()
    await store.create("s")
    with pytest.raises(SessionExistsError, match="session 's' already exists"):
        await backend.open_store().create("s")


async def test_loading_an_unknown_session_is_refused(backend: Backend) -> None:
    with pytest.raises(UnknownSessionError, match="session 'nope' is not in"):
        await backend.open_store().load("nope")


async def test_appending_to_an_unknown_session_is_refused(backend: Backend) -> None:
    async with serving(backend.open_store()) as store:
        with pytest.raises(UnknownSessionError, match="session 'nope' is not in"):
            await store.append("nope", [turn_start(0)])


async def test_appending_a_seq_that_does_not_continue_the_session_is_refused(
    backend: Backend,
) -> None:
    async with serving(backend.open_store()) as store:
        await store.create("s")
        await store.append("s", [turn_start(0)])
        with pytest.raises(
            SessionError, match="session 's': event turn/start has seq 2, expected 1"
        ):
            await store.append("s", [turn_start(2)])
        await store.append("s", [turn_start(1)])
        await store.flush()
        assert [event.seq for event in await backend.open_store().load("s")] == [0, 1]


async def test_a_session_resumed_from_the_store_continues_its_numbering(
    backend: Backend,
) -> None:
    async with serving(backend.open_store()) as store:
        session = await Session.create(store, "s")
        await session.append(TurnStart(turn=0))
    async with serving(backend.open_store()) as store:
        resumed = await Session.open(store, "s")
        await resumed.append(user("after the crash"))
    async with serving(backend.open_store()) as store:
        loaded = await Session.load(store, "s")
    assert [(event.seq, event.type) for event in loaded.events] == [
        (0, "turn/start"),
        (1, "turn/end"),
        (2, "user/message"),
    ]


# Stores with a writer task.


async def test_append_before_serve_raises(writer_backend: WriterBackend) -> None:
    store = writer_backend.open_store()
    await store.create("s")
    with pytest.raises(SessionError, match=r"is not running; start it with .*nursery\.start"):
        await store.append("s", [turn_start(0)])


async def test_running_is_true_only_while_serve_runs(writer_backend: WriterBackend) -> None:
    store = writer_backend.open_store()
    assert not store.running
    async with serving(store):
        assert store.running
    assert not store.running


async def test_a_second_concurrent_serve_is_refused(writer_backend: WriterBackend) -> None:
    store = writer_backend.open_store()
    async with serving(store):
        with pytest.raises(SessionError, match=r"serve\(\) is already running"):
            await store.serve()


async def test_a_stopped_store_can_be_served_again(writer_backend: WriterBackend) -> None:
    store = writer_backend.open_store()
    async with serving(store):
        await store.create("s")
        await store.append("s", [turn_start(0)])
    async with serving(store):
        await store.append("s", [turn_start(1, turn=1)])
    assert writer_backend.stored_rows("s") == 2


async def test_a_fresh_store_object_continues_a_session_it_did_not_load(
    writer_backend: WriterBackend,
) -> None:
    async with serving(writer_backend.open_store()) as store:
        await store.create("s")
        await store.append("s", [turn_start(0)])
    async with serving(writer_backend.open_store()) as fresh:
        with pytest.raises(SessionError, match="event turn/start has seq 0, expected 1"):
            await fresh.append("s", [turn_start(0)])
        await fresh.append("s", [turn_start(1, turn=1)])
    assert writer_backend.stored_rows("s") == 2


async def test_concurrent_appenders_share_commits(writer_backend: WriterBackend) -> None:
    store = writer_backend.open_store()
    sessions, events_each = 6, 20

    async def append_all(session: Session) -> None:
        for turn in range(events_each):
            await session.append(TurnStart(turn=turn))

    async with serving(store):
        created = [await Session.create(store, f"s{i}") for i in range(sessions)]
        async with trio.open_nursery() as nursery:
            for session in created:
                nursery.start_soon(append_all, session)
        await store.flush()
        stats = store.statistics()

    assert stats.events_written == sessions * events_each
    assert stats.commits < sessions * events_each
    assert stats.largest_batch > 1
    assert stats.pending_appends == 0
    for session in created:
        assert (await writer_backend.open_store().load(session.id)) == list(session.events)


async def test_flush_waits_until_appends_are_durable(writer_backend: WriterBackend) -> None:
    store = writer_backend.open_store()
    flushed = trio.Event()

    async def flush() -> None:
        await store.flush()
        flushed.set()

    async with serving(store):
        await store.create("s")
        with writer_backend.write_locked():
            await store.append("s", [turn_start(0)])
            async with trio.open_nursery() as nursery:
                nursery.start_soon(flush)
                await trio.testing.wait_all_tasks_blocked()
                assert not flushed.is_set()
                assert store.statistics().pending_appends == 1
                assert writer_backend.stored_rows("s") == 0
                nursery.cancel_scope.cancel()
        await store.flush()
        assert writer_backend.stored_rows("s") == 1
        assert store.statistics().pending_appends == 0


async def test_flush_with_nothing_pending_returns_without_a_writer(
    writer_backend: WriterBackend,
) -> None:
    store = writer_backend.open_store()
    with trio.fail_after(1):
        await store.flush()


async def test_cancelling_serve_commits_the_events_it_accepted(
    writer_backend: WriterBackend,
) -> None:
    store = writer_backend.open_store()
    async with trio.open_nursery() as nursery:
        await nursery.start(store.serve)
        session = await Session.create(store, "s")
        with writer_backend.write_locked():
            for turn in range(5):
                await session.append(TurnStart(turn=turn))
            assert store.statistics().commits == 0
            assert store.statistics().pending_appends == 5
            nursery.cancel_scope.cancel()
    assert not store.running
    assert store.statistics().pending_appends == 0
    assert (await writer_backend.open_store().load("s")) == list(session.events)


async def test_full_channel_blocks_the_appender(writer_backend: WriterBackend) -> None:
    store = writer_backend.open_store()
    store.max_pending_appends = 1
    done: list[str] = []

    async def append_one(session_id: str) -> None:
        await store.append(session_id, [turn_start(0)])
        done.append(session_id)

    async with serving(store):
        for session_id in "abc":
            await store.create(session_id)
        async with trio.open_nursery() as nursery:
            with writer_backend.write_locked():
                for session_id in "abc":
                    nursery.start_soon(append_one, session_id)
                    # One append in the stuck commit, one in the buffer, one blocked.
                    await trio.testing.wait_all_tasks_blocked()
                assert len(done) == 2
                assert store.statistics().blocked_appenders == 1
            # Releasing the lock lets the commit finish, so the blocked appender gets in.
        await store.flush()
    assert sorted(done) == ["a", "b", "c"]
    assert store.statistics().events_written == 3


async def test_appenders_blocked_at_shutdown_are_accepted_and_committed(
    writer_backend: WriterBackend,
) -> None:
    store = writer_backend.open_store()
    store.max_pending_appends = 1
    async with trio.open_nursery() as appenders, trio.open_nursery() as writer:
        await writer.start(store.serve)
        for session_id in "abc":
            await store.create(session_id)
        with writer_backend.write_locked():
            for session_id in "abc":
                appenders.start_soon(store.append, session_id, [turn_start(0)])
                await trio.testing.wait_all_tasks_blocked()
            assert store.statistics().blocked_appenders == 1
            writer.cancel_scope.cancel()
    assert [writer_backend.stored_rows(session_id) for session_id in "abc"] == [1, 1, 1]


async def test_an_append_cancelled_while_blocked_leaves_its_seq_free(
    writer_backend: WriterBackend,
) -> None:
    store = writer_backend.open_store()
    store.max_pending_appends = 1
    async with serving(store):
        for session_id in "abc":
            await store.create(session_id)
        with writer_backend.write_locked():
            await store.append("a", [turn_start(0)])
            await trio.testing.wait_all_tasks_blocked()
            await store.append("b", [turn_start(0)])
            with trio.move_on_after(0.01) as blocked:
                await store.append("c", [turn_start(0)])
            assert blocked.cancelled_caught
        await store.append("c", [turn_start(0)])
        await store.flush()
    assert [writer_backend.stored_rows(session_id) for session_id in "abc"] == [1, 1, 1]


async def test_durable_changes_reports_every_session_that_advanced(backend: Backend) -> None:
    async with serving(backend.open_store()) as store:
        changes = store.durable_changes()
        await store.create("a")
        await store.create("b")
        await store.append("a", [turn_start(0)])
        await store.append("b", [turn_start(0), turn_start(1, turn=1)])
        await store.flush()
        with trio.fail_after(10):
            await changes.wait()
        assert changes.take() == ["a", "b"]
        assert (changes.seq("a"), changes.seq("b")) == (0, 1)
        assert changes.take() == [] and changes.failure("a") is None
        changes.close()
        await store.append("a", [turn_start(1, turn=1)])
        await store.flush()
        assert changes.take() == []  # a closed listener hears nothing more
