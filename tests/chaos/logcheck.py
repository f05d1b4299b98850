"""The chaos test's verdicts, read straight from PostgreSQL (psycopg), never through harness.

`read_log(dsn)` fetches every stored event row (session, seq, exact JSON
text, checksum) and `read_leases(dsn)` the lease rows. Each `check_*`
function returns a list of problems (empty: the property holds), each one
sentence naming the session, seq, turn or nonce at fault, so one failing
run says everything that went wrong at once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import psycopg

from actors.session.checksum import event_checksum


@attrs.frozen
class StoredEvent:
    """One row of `harness_events`: the event's exact text and its parsed JSON."""

    seq: int
    text: str
    checksum: int
    value: Any


Log = Mapping[str, Sequence[StoredEvent]]


def read_log(dsn: str) -> dict[str, list[StoredEvent]]:
    """Every session's events in seq order (sessions without events included, empty)."""
    log: dict[str, list[StoredEvent]] = {}
    with psycopg.connect(dsn) as connection:
        for (session_id,) in connection.execute("SELECT id FROM harness_sessions"):
            log[session_id] = []
        rows = connection.execute(
            "SELECT session_id, seq, event, checksum FROM harness_events ORDER BY session_id, seq"
        )
        for session_id, seq, text, checksum in rows:
            log.setdefault(session_id, []).append(
                StoredEvent(seq=seq, text=text, checksum=checksum, value=json.loads(text))
            )
    return log


def read_leases(dsn: str) -> dict[str, tuple[str | None, int]]:
    """Each session's lease row: (owner, epoch)."""
    with psycopg.connect(dsn) as connection:
        rows = connection.execute("SELECT session_id, owner, epoch FROM harness_leases")
        return {session_id: (owner, epoch) for session_id, owner, epoch in rows}


def check_contiguous(log: Log) -> list[str]:
    """Every session's seqs are 0, 1, 2, ... and every row's checksum matches its text."""
    problems = []
    for session_id, events in log.items():
        for index, event in enumerate(events):
            if event.seq != index:
                problems.append(
                    f"session {session_id}: seq {event.seq} stored where {index} was due "
                    f"(gap or hole after seq {index - 1})"
                )
                break
            if event_checksum(session_id, event.seq, event.text) != event.checksum:
                problems.append(f"session {session_id}: seq {event.seq} fails its checksum")
    return problems


@attrs.define
class Turn:
    """One turn as the log tells it."""

    number: int
    start_seq: int
    user_texts: list[str] = attrs.field(factory=list)
    end: str | None = None


def turns_of(events: Sequence[StoredEvent]) -> list[Turn]:
    """The turns of one session's log, in order; a user message belongs to the open turn."""
    turns: list[Turn] = []
    current: Turn | None = None
    for event in events:
        kind, data = event.value["type"], event.value["data"]
        if kind == "turn/start":
            current = Turn(number=data["turn"], start_seq=event.seq)
            turns.append(current)
        elif kind == "user/message" and current is not None:
            current.user_texts.extend(
                block["text"] for block in data["content"] if block.get("type") == "text"
            )
        elif kind == "turn/end" and current is not None:
            current.end = data["reason"]["kind"]
            current = None
    return turns


def check_prompts(log: Log, prompts: Mapping[str, Sequence[str]]) -> tuple[list[str], int]:
    """Each prompt sent has exactly one completed turn in its session; every turn is closed.

    A turn cut off by a crash (ended `interrupted` by the takeover) before the
    completed one is allowed: the model call may be repeated once after a
    crash. Returns the problems and how many such repeated turns there were.
    """
    problems = []
    repeated = 0
    for session_id, texts in prompts.items():
        turns = turns_of(log.get(session_id, ()))
        for turn in turns:
            if turn.end is None:
                problems.append(f"session {session_id}: turn {turn.number} never ended")
        by_text: dict[str, list[Turn]] = {}
        for turn in turns:
            for text in turn.user_texts:
                by_text.setdefault(text, []).append(turn)
        for text in texts:
            found = by_text.get(text, [])
            completed = [t for t in found if t.end == "completed"]
            others = [t for t in found if t.end != "completed"]
            if len(completed) != 1:
                ends = [(t.number, t.end) for t in found]
                problems.append(
                    f"session {session_id}: prompt {text!r} has {len(completed)} completed "
                    f"turns (turns and their ends: {ends})"
                )
            elif any(t.end != "interrupted" or t.number > completed[0].number for t in others):
                ends = [(t.number, t.end) for t in found]
                problems.append(
                    f"session {session_id}: prompt {text!r} ran in more than one turn: {ends}"
                )
            repeated += len(others)
        unknown = set(by_text) - set(texts)
        if unknown:
            problems.append(
                f"session {session_id}: turns for prompts never sent: {sorted(unknown)}"
            )
    return problems, repeated


def compact(value: Any) -> str:
    """`value` as the store writes an event's text (compact separators, ASCII escapes)."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def check_subscriber(
    name: str, session_id: str, from_seq: int, seen: Sequence[Any], log: Log
) -> list[str]:
    """A subscriber's stream: seqs `from_seq`, +1, ... to the log's head, each byte-equal to it."""
    events = log.get(session_id, ())
    problems = []
    expected = from_seq
    for value in seen:
        seq = value.get("seq")
        if seq != expected:
            kind = "duplicate" if isinstance(seq, int) and seq < expected else "gap"
            problems.append(
                f"{name} on session {session_id}: {kind}: got seq {seq} where {expected} was due"
            )
            return problems
        if seq >= len(events):
            problems.append(
                f"{name} on session {session_id}: saw seq {seq}, which is not in the log "
                f"(the log ends at {len(events) - 1})"
            )
            return problems
        if compact(value) != events[seq].text:
            problems.append(
                f"{name} on session {session_id}: seq {seq} differs from the log: "
                f"saw {compact(value)[:200]} stored {events[seq].text[:200]}"
            )
            return problems
        expected += 1
    if expected != len(events):
        problems.append(
            f"{name} on session {session_id}: stream stopped at seq {expected - 1}, "
            f"the log holds up to {len(events) - 1}"
        )
    return problems


_NONCE = re.compile(r"ok ([0-9a-f]{12})")


def nonces_in_log(log: Log, nonces: Iterable[str]) -> dict[str, list[tuple[str, int]]]:
    """Where each of `nonces` appears in the log: `nonce -> [(session, seq), ...]` (found ones).

    A tool result's text `ok NONCE` is found in its `tool/result` event and in
    the model's reply that cites it.
    """
    wanted = set(nonces)
    found: dict[str, list[tuple[str, int]]] = {}
    for session_id, events in log.items():
        for event in events:
            for nonce in _NONCE.findall(event.text):
                if nonce in wanted:
                    found.setdefault(nonce, []).append((session_id, event.seq))
    return found


def first_step_end_after(events: Sequence[StoredEvent], time_ms: int) -> int | None:
    """The wall time (ms) of the first `step/end` logged at or after `time_ms`, if any."""
    for event in events:
        if event.value["type"] == "step/end" and event.value["time"] >= time_ms:
            return int(event.value["time"])
    return None
