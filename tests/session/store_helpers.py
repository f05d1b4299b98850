"""Helpers for the store tests: sample events, a serving context, and one backend per store.

A backend wraps one kind of store over the test's storage and knows how to
look behind the store's back: count committed rows from another connection,
and hold the database's write lock so the writer's commit waits
deterministically until the test releases it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, closing, contextmanager
from pathlib import Path
from typing import Protocol

import attrs
import psycopg
import trio

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
    MemoryStore,
    PostgresStore,
    RequestHeader,
    Session,
    SessionStore,
    SQLiteStore,
)
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


class Backend(Protocol):
    """One kind of store over one test's storage."""

    name: str

    def open_store(self) -> SessionStore:
        """A store over the test's storage (a new object per call when it is a database)."""
        ...


class WriterBackend(Backend, Protocol):
    """A store with a writer task and a database another connection can lock and read."""

    def open_store(self) -> SQLiteStore | PostgresStore:
        """A new store object over the test's database."""
        ...

    def write_locked(self) -> AbstractContextManager[None]:
        """Hold the database's write lock from another connection for the body."""
        ...

    def stored_rows(self, session_id: str) -> int:
        """How many events of `session_id` another connection sees committed."""
        ...


@attrs.define
class MemoryBackend:
    name: str = "memory"
    store: MemoryStore = attrs.field(factory=MemoryStore)

    def open_store(self) -> MemoryStore:
        return self.store


@attrs.define
class SQLiteBackend:
    path: Path
    name: str = "sqlite"

    def open_store(self) -> SQLiteStore:
        return SQLiteStore(self.path)

    @contextmanager
    def write_locked(self) -> Iterator[None]:
        with closing(sqlite3.connect(self.path, isolation_level=None)) as connection:
            connection.execute("BEGIN IMMEDIATE")
            try:
                yield
            finally:
                connection.execute("ROLLBACK")

    def stored_rows(self, session_id: str) -> int:
        with closing(sqlite3.connect(self.path)) as connection:
            (count,) = connection.execute(
                "SELECT COUNT(*) FROM events WHERE session_id = ?", (session_id,)
            ).fetchone()
        return int(count)


@attrs.define
class PostgresBackend:
    dsn: str
    name: str = "postgres"

    def open_store(self) -> PostgresStore:
        return PostgresStore(self.dsn)

    @contextmanager
    def write_locked(self) -> Iterator[None]:
        # EXCLUSIVE blocks INSERT (and the lease row's share lock), not plain reads.
        with psycopg.connect(self.dsn) as connection:
            connection.execute("LOCK TABLE harness_events IN EXCLUSIVE MODE")
            try:
                yield
            finally:
                connection.rollback()

    def stored_rows(self, session_id: str) -> int:
        with psycopg.connect(self.dsn) as connection:
            row = connection.execute(
                "SELECT COUNT(*) FROM harness_events WHERE session_id = %s", (session_id,)
            ).fetchone()
        assert row is not None
        return int(row[0])


@asynccontextmanager
async def serving(store: SessionStore) -> AsyncIterator[SessionStore]:
    """Run the store's writer for the body; leaving cancels it (and so commits what it accepted)."""
    async with trio.open_nursery() as nursery:
        await nursery.start(store.serve)
        yield store
        nursery.cancel_scope.cancel()


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
