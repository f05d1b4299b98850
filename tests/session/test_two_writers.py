"""Two processes on one session: the second is refused, takes over after expiry, fences the first.

The first writer is a real process (`lease_holder.py`) with a 1 s lease;
this test process is the second writer.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio

from actors.agent import Agent, open_agent
from actors.prompt import SystemPrompt
from actors.providers.scripted import Reply, ScriptedProvider
from actors.session import SessionBusyError, SQLiteStore
from actors.session.events import TurnEnd, TurnStart

HOLDER = Path(__file__).with_name("lease_holder.py")
TTL = 1.0


@attrs.define
class Holder:
    process: trio.Process
    buffer: bytes = b""

    async def line(self) -> str:
        assert self.process.stdout is not None
        while b"\n" not in self.buffer:
            data = await self.process.stdout.receive_some(4096)
            assert data, "the first writer exited early"
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()

    async def send(self, line: str) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(line.encode() + b"\n")


@asynccontextmanager
async def first_writer(path: Path) -> AsyncIterator[Holder]:
    process = await trio.lowlevel.open_process(
        [sys.executable, str(HOLDER), str(path), "s", str(TTL)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    holder = Holder(process)
    try:
        with trio.fail_after(20):
            assert (await holder.line()) == f"ready {process.pid}"
            await holder.send("turn")
            assert (await holder.line()) == "turn completed"
        yield holder
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGCONT)
            process.send_signal(signal.SIGKILL)
        await process.wait()


@asynccontextmanager
async def second_writer(path: Path) -> AsyncIterator[Agent]:
    async with open_agent(
        system_prompt=SystemPrompt(),
        provider=ScriptedProvider([Reply.text(f"second {n}") for n in range(10)]),
        store=SQLiteStore(path),
        session_id="s",
    ) as agent:
        yield agent


async def run_turn(agent: Agent) -> str:
    agent.followup("from the second writer")
    with trio.fail_after(10):
        await agent.when_idle()
    end = agent.session.events[-1].data
    assert isinstance(end, TurnEnd)
    return end.reason.kind


async def test_the_second_process_is_refused_then_takes_over_once_the_killed_ones_lease_expired(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    async with first_writer(path) as holder:
        with pytest.raises(
            SessionBusyError, match=rf"session 's' is busy.*pid {holder.process.pid}"
        ):
            async with second_writer(path):
                raise AssertionError("the second writer must be refused while the first lives")
        holder.process.send_signal(signal.SIGKILL)
        await holder.process.wait()
        killed_at = trio.current_time()
        with trio.fail_after(10):
            while True:
                try:
                    async with second_writer(path) as agent:
                        waited = trio.current_time() - killed_at
                        assert await run_turn(agent) == "completed"
                        break
                except SessionBusyError:
                    await trio.sleep(0.1)
    assert waited <= TTL + 1.0
    events = await SQLiteStore(path).load("s")
    assert [e.seq for e in events] == list(range(len(events)))
    assert sum(isinstance(e.data, TurnStart) for e in events) == 2


async def test_a_stalled_first_writers_late_write_is_refused_not_interleaved(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    async with first_writer(path) as holder:
        os.kill(holder.process.pid, signal.SIGSTOP)  # a frozen VM, a long GC pause
        await trio.sleep(TTL + 0.3)
        async with second_writer(path) as agent:
            assert await run_turn(agent) == "completed"
            before = len(await SQLiteStore(path).load("s"))
            holder.process.send_signal(signal.SIGCONT)
            await holder.send("turn")
            with trio.fail_after(10):
                refused = await holder.line()
            assert refused.startswith("refused SessionFencedError: "), refused
            assert "'s'" in refused
            assert len(await SQLiteStore(path).load("s")) == before
            assert await run_turn(agent) == "completed"
        with trio.fail_after(10):
            await holder.process.wait()
        assert holder.process.returncode == 3
    events = await SQLiteStore(path).load("s")
    assert [e.seq for e in events] == list(range(len(events)))
    texts = [str(e.data) for e in events if e.type == "user/message"]
    assert [t.count("first writer") for t in texts] == [1, 0, 0]
