"""The chaos test's own machinery: process handling by PID, and checks that catch what they must."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.chaos import logcheck
from tests.chaos.processes import ChildFailed, open_processes
from tests.chaos.workload import prompt_text

PRINT_AND_WAIT = "import time; print('ready at 7', flush=True); time.sleep(600)"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_children_are_stopped_by_pid_even_when_paused_or_the_body_fails(
    tmp_path: Path,
) -> None:
    pids = []
    with pytest.raises(RuntimeError, match="the body failed"):
        async with open_processes(tmp_path / "logs", dict(os.environ)) as group:
            running = await group.start("a", [sys.executable, "-c", PRINT_AND_WAIT], ready="at 7")
            paused = await group.start("b", [sys.executable, "-c", PRINT_AND_WAIT], ready="at 7")
            assert running.ready_match is not None and running.cpu_seconds() >= 0
            paused.pause()
            pids = [running.pid, paused.pid]
            raise RuntimeError("the body failed")
    assert pids and not any(alive(pid) for pid in pids)
    assert "ready at 7" in (tmp_path / "logs" / "a.log").read_text()


async def test_a_child_that_exits_before_its_ready_line_fails_with_its_output(
    tmp_path: Path,
) -> None:
    async with open_processes(tmp_path, dict(os.environ)) as group:
        with pytest.raises(ChildFailed, match=r"exited with status 3(.|\n)*no config here"):
            await group.start(
                "early",
                [sys.executable, "-c", "print('no config here'); raise SystemExit(3)"],
                ready="listening",
            )


async def test_a_killed_child_is_reaped(tmp_path: Path) -> None:
    async with open_processes(tmp_path, dict(os.environ)) as group:
        child = await group.start("k", [sys.executable, "-c", PRINT_AND_WAIT], ready="ready")
        child.kill()
        assert await child.process.wait() == -9
        assert not child.running


def event(seq: int, kind: str, data: dict[str, object]) -> logcheck.StoredEvent:
    value = {"type": kind, "seq": seq, "time": 1000 + seq, "data": data}
    text = logcheck.compact(value)
    return logcheck.StoredEvent(
        seq=seq, text=text, checksum=logcheck.event_checksum("s", seq, text), value=value
    )


def turn(start: int, number: int, text: str, end: str) -> list[logcheck.StoredEvent]:
    content = [{"type": "text", "text": text}]
    return [
        event(start, "turn/start", {"turn": number}),
        event(start + 1, "user/message", {"content": content, "source": {"kind": "user"}}),
        event(start + 2, "step/end", {"turn": number, "step": 0}),
        event(start + 3, "turn/end", {"turn": number, "reason": {"kind": end}}),
    ]


def test_the_log_checks_catch_holes_bad_checksums_and_repeated_turns() -> None:
    first, second = prompt_text("s", 0), prompt_text("s", 1)
    good = turn(0, 0, first, "completed") + turn(4, 1, second, "completed")
    assert logcheck.check_contiguous({"s": good}) == []
    assert logcheck.check_prompts({"s": good}, {"s": [first, second]}) == ([], 0)

    holed = good[:3] + good[4:]
    assert "seq 4 stored where 3 was due" in logcheck.check_contiguous({"s": holed})[0]
    damaged = [*good[:-1], logcheck.StoredEvent(7, good[-1].text + " ", 0, good[-1].value)]
    assert "fails its checksum" in logcheck.check_contiguous({"s": damaged})[0]

    twice = good + turn(8, 2, second, "completed")
    problems, _ = logcheck.check_prompts({"s": twice}, {"s": [first, second]})
    assert "has 2 completed turns" in problems[0]
    retried = turn(0, 0, first, "interrupted") + turn(4, 1, first, "completed")
    assert logcheck.check_prompts({"s": retried}, {"s": [first]}) == ([], 1)
    unsent = logcheck.check_prompts({"s": good}, {"s": [first]})[0]
    assert "never sent" in unsent[0]


def test_the_subscriber_check_catches_gaps_duplicates_changes_and_a_short_stream() -> None:
    log = {"s": turn(0, 0, prompt_text("s", 0), "completed")}
    values = [json.loads(e.text) for e in log["s"]]
    assert logcheck.check_subscriber("sub", "s", 0, values, log) == []
    assert "gap" in logcheck.check_subscriber("sub", "s", 0, values[:1] + values[2:], log)[0]
    assert "duplicate" in logcheck.check_subscriber("sub", "s", 0, values[:2] + values[1:], log)[0]
    changed = [*values[:3], {**values[3], "time": 1}]
    assert "differs from the log" in logcheck.check_subscriber("sub", "s", 0, changed, log)[0]
    assert "stream stopped at seq 2" in logcheck.check_subscriber("sub", "s", 0, values[:3], log)[0]


def test_nonces_are_found_where_a_result_or_its_citation_landed() -> None:
    result = event(0, "tool/result", {"content": "ok 0123456789ab", "is_error": False})
    assert logcheck.nonces_in_log({"s": [result]}, ["0123456789ab", "ffffffffffff"]) == {
        "0123456789ab": [("s", 0)]
    }
