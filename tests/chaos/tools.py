"""The tool the chaos test's sessions call, imported by every node process from the config.

`chaos_step(session, turn)` appends a `start` line to the journal file
`$CHAOS_JOURNAL_DIR/PID.jsonl`, waits `CHAOS_TOOL_SECONDS` (a turn is then
mid-tool for that long, so a signal lands mid-turn), appends an `end` line
naming the process that ran it, when it started and finished and a random
nonce, and returns `ok NONCE`. The journal is the side channel the test checks the log
against: a result a stopped node finished after it lost its lease must
never be found in the log.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path

import trio

JOURNAL_ENV = "CHAOS_JOURNAL_DIR"
SECONDS_ENV = "CHAOS_TOOL_SECONDS"


def _append(path: Path, line: str) -> None:
    # One write of a short line to an O_APPEND file: never interleaved with another's.
    with path.open("a") as journal:
        journal.write(line)


async def chaos_step(session: str, turn: int) -> str:
    """Do one step of chaos-test work and say which process did it.

    Args:
        session: The session this call belongs to.
        turn: The prompt number within the session.
    """
    started = time.time()
    path = Path(os.environ[JOURNAL_ENV]) / f"{os.getpid()}.jsonl"
    begun = {"phase": "start", "pid": os.getpid(), "session": session, "turn": turn}
    await trio.to_thread.run_sync(_append, path, json.dumps({**begun, "started": started}) + "\n")
    await trio.sleep(float(os.environ.get(SECONDS_ENV, "0.2")))
    nonce = secrets.token_hex(6)
    entry = {**begun, "phase": "end", "nonce": nonce, "started": started, "finished": time.time()}
    await trio.to_thread.run_sync(_append, path, json.dumps(entry) + "\n")
    return f"ok {nonce}"


def read_journal(directory: Path) -> list[dict[str, object]]:
    """Every complete entry of every process's journal under `directory`.

    A line still being written (no newline yet) is left for the next read.
    """
    entries = []
    for path in sorted(directory.glob("*.jsonl")):
        *complete, _partial = path.read_text().split("\n")
        entries.extend(json.loads(line) for line in complete)
    return entries


def in_flight_at(journal: list[dict[str, object]], pid: int, moment: float) -> int:
    """How many tool calls process `pid` had started by `moment` and not finished by then."""
    ended = {
        (e["session"], e["turn"], e["started"])
        for e in journal
        if e["phase"] == "end" and float(str(e["finished"])) <= moment
    }
    return sum(
        1
        for e in journal
        if e["phase"] == "start"
        and e["pid"] == pid
        and float(str(e["started"])) < moment
        and (e["session"], e["turn"], e["started"]) not in ended
    )


def owners_at(journal: list[dict[str, object]], moment: float) -> dict[str, int]:
    """Each session's process at `moment`: the PID that started its latest tool call before it."""
    latest: dict[str, tuple[float, int]] = {}
    for entry in journal:
        session, pid = str(entry["session"]), int(str(entry["pid"]))
        started = float(str(entry["started"]))
        if started < moment and (session not in latest or latest[session][0] < started):
            latest[session] = (started, pid)
    return {session: pid for session, (_, pid) in latest.items()}
