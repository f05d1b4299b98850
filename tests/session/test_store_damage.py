"""A damaged store file loads correctly or fails as a `SessionError` naming it, never silently.

Each case damages a copy of a real store file the way disks and crashes do:
zero length, garbage over the header, a page of garbage anywhere in the
middle, a same-length edit of one event's bytes, a WAL cut short. The one
outcome that is not an error is the WAL cut at a frame boundary: SQLite
cannot know the lost transactions existed, and the store loads the prefix
that was intact (the README's "Crash consistency" section says why).
"""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
from pathlib import Path

import pytest
import trio

from actors.agent import open_agent
from actors.messages import UserSource
from actors.prompt import SystemPrompt
from actors.providers.scripted import ScriptedProvider
from actors.session import (
    Event,
    Session,
    SessionError,
    SQLiteStore,
    UnknownSessionError,
)
from actors.session.events import StepEnd, StepStart, TurnEnd, TurnEndReason, TurnStart, UserMessage

PAGE = 4096
TURNS = 40


async def write_sample(path: Path, *, copy_wal_to: Path | None = None) -> list[Event]:
    """A session `s` of TURNS turns, one commit per turn; optionally copy the live files midway."""
    store = SQLiteStore(path)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.serve)
        session = await Session.create(store, "s")
        for turn in range(TURNS):
            await session.extend(
                [
                    TurnStart(turn=turn),
                    StepStart(turn=turn, step=0),
                    UserMessage(content=f"marker-{turn:03d} " + "x" * 120, source=UserSource()),
                    StepEnd(turn=turn, step=0),
                    TurnEnd(turn=turn, reason=TurnEndReason.completed()),
                ]
            )
            await session.flush()
        if copy_wal_to is not None:
            copy_live_files(path, copy_wal_to)
        nursery.cancel_scope.cancel()
    return list(session.events)


def copy_live_files(path: Path, target: Path) -> None:
    """The database and its WAL as they are now: what a SIGKILL would leave on disk."""
    target.mkdir()
    for name in (path.name, path.name + "-wal"):
        shutil.copyfile(path.with_name(name), target / name)


def damaged_copy(original: Path, target: Path, offset: int, data: bytes) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(original, target)
    with target.open("r+b") as file:
        file.seek(offset)
        file.write(data)
    return target


async def load_or_refuse(path: Path) -> list[Event] | SessionError:
    """What a fresh store makes of `path`: the events, or the `SessionError` (nothing else)."""
    try:
        return await SQLiteStore(path).load("s")
    except SessionError as error:
        assert str(path) in str(error), error
        assert not isinstance(error, sqlite3.Error)
        return error


async def test_a_zero_length_file_is_an_empty_store(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    path.write_bytes(b"")
    store = SQLiteStore(path)
    assert await store.list_sessions() == []
    with pytest.raises(UnknownSessionError, match=str(path)):
        await store.load("s")
    async with open_agent(
        system_prompt=SystemPrompt(), provider=ScriptedProvider([]), store=store, session_id="s"
    ) as agent:
        assert len(agent.session) == 0


async def test_a_garbage_header_is_a_session_error_naming_the_file(tmp_path: Path) -> None:
    original = tmp_path / "s.db"
    await write_sample(original)
    path = damaged_copy(original, tmp_path / "bad" / "s.db", 0, random.Random(1).randbytes(100))
    outcome = await load_or_refuse(path)
    assert isinstance(outcome, SessionError)
    with pytest.raises(SessionError, match="not a database") as raised:
        async with open_agent(
            system_prompt=SystemPrompt(),
            provider=ScriptedProvider([]),
            store=SQLiteStore(path),
            session_id="s",
        ):
            raise AssertionError("a damaged store must not open")
    assert str(path) in str(raised.value)


async def test_a_page_of_garbage_anywhere_loads_the_same_events_or_fails_naming_the_file(
    tmp_path: Path,
) -> None:
    original = tmp_path / "s.db"
    events = await write_sample(original)
    pages = original.stat().st_size // PAGE
    assert pages >= 5
    refused = 0
    for page in range(1, pages):
        garbage = random.Random(page).randbytes(PAGE)
        path = damaged_copy(original, tmp_path / f"page{page}" / "s.db", page * PAGE, garbage)
        outcome = await load_or_refuse(path)
        if isinstance(outcome, SessionError):
            refused += 1
        else:
            assert outcome == events, f"page {page}: loaded different events"
    assert refused > 0


async def test_a_same_length_edit_of_an_event_fails_its_checksum(tmp_path: Path) -> None:
    original = tmp_path / "s.db"
    events = await write_sample(original)
    offset = original.read_bytes().index(b"marker-017")
    path = damaged_copy(original, tmp_path / "edit" / "s.db", offset, b"marker-71")
    seq = next(e.seq for e in events if "marker-017" in str(e.data))
    with pytest.raises(
        SessionError, match=rf"session 's': stored event seq {seq} fails its checksum"
    ):
        await SQLiteStore(path).load("s")


async def test_a_truncated_wal_loads_an_intact_prefix_or_fails_naming_the_file(
    tmp_path: Path,
) -> None:
    image = tmp_path / "image"
    events = await write_sample(tmp_path / "live" / "s.db", copy_wal_to=image)
    wal = (image / "s.db-wal").read_bytes()
    lengths = sorted({0, 32, len(wal) - 1, *random.Random(7).sample(range(len(wal)), 12)})
    shorter = 0
    for length in lengths:
        cut = tmp_path / f"cut{length}"
        cut.mkdir()
        shutil.copyfile(image / "s.db", cut / "s.db")
        (cut / "s.db-wal").write_bytes(wal[:length])
        outcome = await load_or_refuse(cut / "s.db")
        if isinstance(outcome, SessionError):
            continue
        assert outcome == events[: len(outcome)], f"WAL cut at {length}: not a prefix"
        shorter += len(outcome) < len(events)
    # The transactions after the cut are gone without a trace: SQLite cannot know of them.
    assert shorter > 0


@pytest.mark.parametrize("kind", ["parent-is-a-file", "path-is-a-directory"])
async def test_a_bad_store_path_leaves_open_agent_as_one_session_error(
    tmp_path: Path, kind: str
) -> None:
    if kind == "parent-is-a-file":
        (tmp_path / "file").write_text("")
        path = tmp_path / "file" / "s.db"
    else:
        path = tmp_path / "dir"
        os.mkdir(path)
    with pytest.raises(SessionError, match="cannot open the database") as raised:
        async with open_agent(
            system_prompt=SystemPrompt(), provider=ScriptedProvider([]), store=SQLiteStore(path)
        ):
            raise AssertionError("a bad path must not open")
    assert str(path) in str(raised.value)
