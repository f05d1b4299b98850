"""`SQLiteStore` specifics: WAL, directories, refused and slow commits, damaged rows.

The contract every store shares (and the writer's group commit, flush,
backpressure and shutdown) is in `test_store_contract.py`. Tests that need
the writer to be stuck hold SQLite's write lock from another connection,
which makes the writer's commit wait deterministically until the test
releases it.
"""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from actors.session import SessionError, SQLiteStore, UnknownEventError, sqlite_store
from actors.session.checksum import event_checksum
from tests.session.store_helpers import SQLiteBackend, serving, turn_start


def write_locked(path: Path) -> Any:
    """Hold the database's write lock from another connection for the body."""
    return SQLiteBackend(path).write_locked()


def stored_rows(path: Path, session_id: str) -> int:
    """How many events of `session_id` another connection sees committed."""
    return SQLiteBackend(path).stored_rows(session_id)


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
