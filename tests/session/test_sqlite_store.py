"""Session stores: durable round trips, WAL, group commit, flush, backpressure and shutdown.

Behaviour every `SessionStore` shares runs against `MemoryStore` and
`SQLiteStore`; the writer's group commit, backpressure and shutdown are
SQLite-only. Tests that need the writer to be stuck hold SQLite's write lock
from another connection, which makes the writer's commit wait
deterministically until the test releases it.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, closing, contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from actors.messages import (
    Message,
    PluginSource,
    ReasoningBlock,
    TextBlock,
    ToolCallBlock,
    UserSource,
)
from actors.prompt.types import ToolSchema
from actors.providers.chunks import (
    Failure,
    FinishChunk,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
)
from actors.session import (
    EVENT_TYPES,
    MemoryStore,
    RequestHeader,
    Session,
    SessionError,
    SessionExistsError,
    SessionStore,
    SQLiteStore,
    UnknownEventError,
    UnknownSessionError,
    sqlite_store,
)
from actors.session.checksum import event_checksum
from actors.session.events import (
    AssistantChunk,
    AssistantMessage,
    CompactionEnded,
    CompactionRequested,
    Event,
    RequestHeaderLogged,
    RequestRetry,
    StepEnd,
    StepStart,
    ToolCallRequested,
    ToolError,
    ToolResult,
    TurnEnd,
    TurnEndReason,
    TurnError,
    TurnStart,
    UnknownData,
    UserMessage,
)

StoreFactory = Callable[[], SessionStore]
"""A store over the test's storage (a new object per call when the store is a file)."""


@pytest.fixture(params=["memory", "sqlite"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    if request.param == "memory":
        store = MemoryStore()
        return lambda: store
    return lambda: SQLiteStore(tmp_path / "sessions.db")


@asynccontextmanager
async def serving(store: SessionStore) -> AsyncIterator[SessionStore]:
    """Run the store's writer for the body; leaving cancels it (and so commits what it accepted)."""
    async with trio.open_nursery() as nursery:
        await nursery.start(store.serve)
        yield store
        nursery.cancel_scope.cancel()


@contextmanager
def write_locked(path: Path) -> Iterator[None]:
    """Hold the database's write lock from another connection for the body."""
    with closing(sqlite3.connect(path, isolation_level=None)) as connection:
        connection.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            connection.execute("ROLLBACK")


def stored_rows(path: Path, session_id: str) -> int:
    """How many events of `session_id` another connection sees committed."""
    with closing(sqlite3.connect(path)) as connection:
        (count,) = connection.execute(
            "SELECT COUNT(*) FROM events WHERE session_id = ?", (session_id,)
        ).fetchone()
    return int(count)


def turn_start(seq: int, turn: int = 0) -> Event:
    return Event(type="turn/start", seq=seq, time=0, data=TurnStart(turn=turn))


def user(text: str) -> UserMessage:
    return UserMessage(content=text, source=UserSource())


async def append_sample_log(session: Session) -> None:
    """One completed turn holding every event type, a replacement and an ignorable unknown."""
    tools = [ToolSchema(name="read", description="Read a file.", parameters={"type": "object"})]
    header = RequestHeader(
        config={"model": "m", "temperature": 0.25}, system="Be brief ☃", tools=tools
    )
    await session.append(TurnStart(turn=0))
    await session.append(RequestHeaderLogged(header=header, reason="initial"))
    await session.append(
        UserMessage(
            content="snapshot with \x00 and \ud800",
            source=PluginSource(plugin="runtime-context", form="snapshot", sections=("cwd",)),
        )
    )
    await session.append(user("question"))
    await session.append(StepStart(turn=0, step=0))
    for chunk in (
        TextDelta(text="par"),
        ToolCallDelta(index=0, id="c1", name="read", arguments='{"p'),
        UsageChunk(usage=Usage(input_tokens=3)),
        FinishChunk(reason="error", failure=Failure(code="overloaded", status=529)),
    ):
        await session.append(AssistantChunk(turn=0, step=0, chunk=chunk))
    failure = Failure(code="overloaded", retry_after_ms=10, retryable=True)
    await session.append(RequestRetry(turn=0, step=0, attempt=0, delay_ms=10, failure=failure))
    answer = Message(
        role="assistant",
        content=(
            ReasoningBlock(text="think"),
            TextBlock(text="reading"),
            ToolCallBlock(id="c1", name="read", arguments='{"p":1}'),
        ),
    )
    await session.append(
        AssistantMessage(turn=0, step=0, message=answer, usage=Usage(output_tokens=2))
    )
    await session.append(
        ToolCallRequested(turn=0, step=0, call_id="c1", name="read", arguments='{"p":1}')
    )
    await session.append(
        ToolResult(
            turn=0,
            step=0,
            call_id="c1",
            content="no such file",
            is_error=True,
            error=ToolError(name="FileNotFoundError", code="tool_error"),
        )
    )
    await session.append(StepEnd(turn=0, step=0))
    await session.append(
        CompactionRequested(compaction=0, turn=0, step=1, replaces=[3], instruction="Summarise."),
        ignorable=True,
    )
    await session.append(
        user("the question, compacted"), surface_op="replace", source_event_seqs=[3]
    )
    await session.append(
        CompactionEnded(compaction=0, usage=Usage(input_tokens=9, cache_read_tokens=0)),
        ignorable=True,
    )
    await session.append(UnknownData(raw={"note": [1, 2.5]}), type="memory/note", ignorable=True)
    error = TurnError(message="tool 'read' failed", code="tool_error", status=500)
    await session.append(TurnEnd(turn=0, reason=TurnEndReason.failed(error)))


# Every store.


async def test_reopening_a_session_restores_its_events_exactly(open_store: StoreFactory) -> None:
    async with serving(open_store()) as store:
        session = await Session.create(store, "s")
        await append_sample_log(session)
    assert set(EVENT_TYPES) <= {event.type for event in session.events}

    async with serving(open_store()) as reopened:
        loaded = await Session.load(reopened, "s")

    assert loaded.to_json() == session.to_json()
    assert loaded.events == session.events
    assert loaded.derive_messages() == session.derive_messages()


async def test_flushed_events_are_loaded_by_a_fresh_store_object(open_store: StoreFactory) -> None:
    async with serving(open_store()) as store:
        await store.create("s")
        await store.append("s", [turn_start(0), turn_start(1, turn=1)])
        await store.flush()
        assert [event.seq for event in await open_store().load("s")] == [0, 1]


async def test_load_sees_the_stores_own_accepted_appends(open_store: StoreFactory) -> None:
    async with serving(open_store()) as store:
        await store.create("s")
        await store.append("s", [turn_start(0)])
        assert [event.seq for event in await store.load("s")] == [0]


async def test_sessions_are_listed_in_creation_order(open_store: StoreFactory) -> None:
    store = open_store()
    for session_id in ["b", "a", "c"]:
        await store.create(session_id)
    assert await open_store().list_sessions() == ["b", "a", "c"]
    assert await store.exists("a")
    assert not await store.exists("z")


async def test_creating_an_existing_session_is_refused(open_store: StoreFactory) -> None:
    store = open_store()
    await store.create("s")
    with pytest.raises(SessionExistsError, match="session 's' already exists"):
        await open_store().create("s")


async def test_loading_an_unknown_session_is_refused(open_store: StoreFactory) -> None:
    with pytest.raises(UnknownSessionError, match="session 'nope' is not in"):
        await open_store().load("nope")


async def test_appending_to_an_unknown_session_is_refused(open_store: StoreFactory) -> None:
    async with serving(open_store()) as store:
        with pytest.raises(UnknownSessionError, match="session 'nope' is not in"):
            await store.append("nope", [turn_start(0)])


async def test_appending_a_seq_that_does_not_continue_the_session_is_refused(
    open_store: StoreFactory,
) -> None:
    async with serving(open_store()) as store:
        await store.create("s")
        await store.append("s", [turn_start(0)])
        with pytest.raises(
            SessionError, match="session 's': event turn/start has seq 2, expected 1"
        ):
            await store.append("s", [turn_start(2)])
        await store.append("s", [turn_start(1)])
        await store.flush()
        assert [event.seq for event in await open_store().load("s")] == [0, 1]


async def test_a_session_resumed_from_the_store_continues_its_numbering(
    open_store: StoreFactory,
) -> None:
    async with serving(open_store()) as store:
        session = await Session.create(store, "s")
        await session.append(TurnStart(turn=0))
    async with serving(open_store()) as store:
        resumed = await Session.open(store, "s")
        await resumed.append(user("after the crash"))
    async with serving(open_store()) as store:
        loaded = await Session.load(store, "s")
    assert [(event.seq, event.type) for event in loaded.events] == [
        (0, "turn/start"),
        (1, "turn/end"),
        (2, "user/message"),
    ]


# SQLiteStore.


async def test_sqlite_store_uses_wal_mode(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "sessions.db")
    await store.create("s")
    with closing(sqlite3.connect(store.path)) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_sqlite_store_creates_parent_directories(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "a" / "b" / "sessions.db")
    await store.create("s")
    assert store.path.is_file()


async def test_append_before_serve_raises(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "sessions.db")
    await store.create("s")
    with pytest.raises(SessionError, match=r"is not running; start it with .*nursery\.start"):
        await store.append("s", [turn_start(0)])


async def test_running_is_true_only_while_serve_runs(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "sessions.db")
    assert not store.running
    async with serving(store):
        assert store.running
    assert not store.running


async def test_a_second_concurrent_serve_is_refused(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "sessions.db")
    async with serving(store):
        with pytest.raises(SessionError, match=r"serve\(\) is already running"):
            await store.serve()


async def test_a_stopped_store_can_be_served_again(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "sessions.db")
    async with serving(store):
        await store.create("s")
        await store.append("s", [turn_start(0)])
    async with serving(store):
        await store.append("s", [turn_start(1, turn=1)])
    assert stored_rows(store.path, "s") == 2


async def test_a_fresh_store_object_continues_a_session_it_did_not_load(tmp_path: Path) -> None:
    async with serving(SQLiteStore(tmp_path / "sessions.db")) as store:
        await store.create("s")
        await store.append("s", [turn_start(0)])
    async with serving(SQLiteStore(tmp_path / "sessions.db")) as fresh:
        with pytest.raises(SessionError, match="event turn/start has seq 0, expected 1"):
            await fresh.append("s", [turn_start(0)])
        await fresh.append("s", [turn_start(1, turn=1)])
    assert stored_rows(tmp_path / "sessions.db", "s") == 2


async def test_concurrent_appenders_share_commits(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "sessions.db")
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
        assert (await SQLiteStore(store.path).load(session.id)) == list(session.events)


async def test_flush_waits_until_appends_are_durable(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "sessions.db")
    flushed = trio.Event()

    async def flush() -> None:
        await store.flush()
        flushed.set()

    async with serving(store):
        await store.create("s")
        with write_locked(store.path):
            await store.append("s", [turn_start(0)])
            async with trio.open_nursery() as nursery:
                nursery.start_soon(flush)
                await trio.testing.wait_all_tasks_blocked()
                assert not flushed.is_set()
                assert store.statistics().pending_appends == 1
                assert stored_rows(store.path, "s") == 0
                nursery.cancel_scope.cancel()
        await store.flush()
        assert stored_rows(store.path, "s") == 1
        assert store.statistics().pending_appends == 0


async def test_flush_with_nothing_pending_returns_without_a_writer(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "sessions.db")
    with trio.fail_after(1):
        await store.flush()


async def test_cancelling_serve_commits_the_events_it_accepted(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "sessions.db")
    async with trio.open_nursery() as nursery:
        await nursery.start(store.serve)
        session = await Session.create(store, "s")
        with write_locked(store.path):
            for turn in range(5):
                await session.append(TurnStart(turn=turn))
            assert store.statistics().commits == 0
            assert store.statistics().pending_appends == 5
            nursery.cancel_scope.cancel()
    assert not store.running
    assert store.statistics().pending_appends == 0
    assert (await SQLiteStore(store.path).load("s")) == list(session.events)


async def test_full_channel_blocks_the_appender(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "sessions.db", max_pending_appends=1)
    done: list[str] = []

    async def append_one(session_id: str) -> None:
        await store.append(session_id, [turn_start(0)])
        done.append(session_id)

    async with serving(store):
        for session_id in "abc":
            await store.create(session_id)
        async with trio.open_nursery() as nursery:
            with write_locked(store.path):
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


async def test_appenders_blocked_at_shutdown_are_accepted_and_committed(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "sessions.db", max_pending_appends=1)
    async with trio.open_nursery() as appenders, trio.open_nursery() as writer:
        await writer.start(store.serve)
        for session_id in "abc":
            await store.create(session_id)
        with write_locked(store.path):
            for session_id in "abc":
                appenders.start_soon(store.append, session_id, [turn_start(0)])
                await trio.testing.wait_all_tasks_blocked()
            assert store.statistics().blocked_appenders == 1
            writer.cancel_scope.cancel()
    assert [stored_rows(store.path, session_id) for session_id in "abc"] == [1, 1, 1]


async def test_an_append_cancelled_while_blocked_leaves_its_seq_free(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "sessions.db", max_pending_appends=1)
    async with serving(store):
        for session_id in "abc":
            await store.create(session_id)
        with write_locked(store.path):
            await store.append("a", [turn_start(0)])
            await trio.testing.wait_all_tasks_blocked()
            await store.append("b", [turn_start(0)])
            with trio.move_on_after(0.01) as blocked:
                await store.append("c", [turn_start(0)])
            assert blocked.cancelled_caught
        await store.append("c", [turn_start(0)])
        await store.flush()
    assert [stored_rows(store.path, session_id) for session_id in "abc"] == [1, 1, 1]


async def test_a_conflicting_commit_fails_that_session_only(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "sessions.db")
    await store.create("s")
    await store.create("other")
    with closing(sqlite3.connect(store.path)) as connection:
        # Another writer took seq 0 behind the store's back: the store's commit must refuse it.
        connection.execute("INSERT INTO events VALUES ('s', 0, '{}', 0)")
        connection.commit()
    async with serving(store):
        with write_locked(store.path):  # both appends go into one batch
            await store.append("s", [turn_start(0)])
            await store.append("other", [turn_start(0)])
        with pytest.raises(
            SessionError, match=r"refused session 's' seq 0\.\.0: the store's next seq .* is 1"
        ):
            await store.flush("s")
        await store.flush("other")
        with pytest.raises(SessionError, match=r"refused session 's'"):
            await store.append("s", [turn_start(1, turn=1)])
        await store.append("other", [turn_start(1, turn=1)])
        await store.flush("other")
        assert store.running
        with pytest.raises(SessionError, match=r"1 session\(s\) hold accepted appends"):
            await store.flush()
    assert store.statistics().failed_appends == 1
    assert stored_rows(store.path, "other") == 2


async def test_a_shutdown_commit_past_the_grace_fails_loud(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SQLiteStore(tmp_path / "sessions.db", shutdown_grace=0.05)
    original = sqlite_store._insert_batch_and_close

    def slow_final_commit(connection: sqlite3.Connection, groups: list[Any], now: int) -> Any:
        time.sleep(0.5)
        return original(connection, groups, now)

    monkeypatch.setattr(sqlite_store, "_insert_batch_and_close", slow_final_commit)
    await store.create("s")
    missed = r"committing session 's' seq 1\.\.1 at shutdown took longer than 0\.05 s"
    with pytest.RaisesGroup(pytest.RaisesExc(SessionError, match=missed)):
        async with trio.open_nursery() as writer:
            await writer.start(store.serve)
            with write_locked(store.path):
                await store.append("s", [turn_start(0)])
                await trio.testing.wait_all_tasks_blocked()  # seq 0 is in the stuck commit
                await store.append("s", [turn_start(1, turn=1)])  # seq 1 waits in the channel
                writer.cancel_scope.cancel()
    with pytest.raises(SessionError, match=r"1 session\(s\) hold accepted appends"):
        await store.flush()


async def test_a_stored_event_of_unknown_type_names_session_and_seq(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "sessions.db")
    await store.create("s")
    row = json.dumps({"type": "memory/compacted", "seq": 0, "time": 0, "data": {}})
    with closing(sqlite3.connect(store.path)) as connection:
        connection.execute(
            "INSERT INTO events VALUES ('s', 0, ?, ?)", (row, event_checksum("s", 0, row))
        )
        connection.commit()
    with pytest.raises(UnknownEventError, match=r"session 's': event seq 0 has unknown type"):
        await store.load("s")


async def test_a_stored_event_that_is_not_json_names_session_and_seq(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "sessions.db")
    await store.create("s")
    with closing(sqlite3.connect(store.path)) as connection:
        connection.execute(
            "INSERT INTO events VALUES ('s', 0, 'not json', ?)",
            (event_checksum("s", 0, "not json"),),
        )
        connection.commit()
    with pytest.raises(SessionError, match=r"session 's': stored event seq 0 is not valid JSON"):
        await store.load("s")
