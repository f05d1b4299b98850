"""Where the CPU of a sequential step goes, by phase, and what a wake costs against the log.

Part 1 runs one level of the parallel-session benchmark in this process
(the simulator in its own), then its sequential pass (each turn on a
different, hibernated session) under a `trio.abc.Instrument` that charges
every task step's `time.process_time` to the phase on top of that task:
wrappers mark the agent's wake and hibernate, the loop's assembly and
pre-step listeners, render and header, the session's appends and flushes,
the tool, and the provider call. CPU spent inside a blocking I/O wait
(`before_io_wait` with a timeout above 0) is its own row, and so is what
falls between task steps (the scheduler). The wrappers and the instrument
add their own cost: compare the rows with each other, not with
`parallel_sessions.py`'s figure.

Part 2 (`--wake-turns`) builds sessions of 1, 10, 100 and 500 turns of
`loop_overhead.py`'s workload in a MemoryStore and a SQLiteStore, and times
hibernate-then-wake in a loop.

Run: .venv/bin/python benchmarks/sequential_phases.py [--sessions 100] [--turns 100]
     [--store memory|sqlite] [--wake-turns 1 10 100 500]
"""

from __future__ import annotations

import argparse
import collections
import functools
import inspect
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import loop_overhead

from actors.agent import AgentOptions, open_agent
from actors.agent.agent import Agent
from actors.agent.loop import AgentLoop
from actors.agent.tools import ToolRegistry
from actors.providers import ScriptedProvider
from actors.session import MemoryStore, SessionStore, SQLiteStore
from actors.session.session import Session
from supervision.bench import harness_run
from supervision.bench.simulator_process import start_simulator_process


class PhaseClock(trio.abc.Instrument):
    """Charges CPU to the phase on top of the running task (see the module docstring)."""

    def __init__(self) -> None:
        self.on = False
        self.charged: collections.defaultdict[str, float] = collections.defaultdict(float)
        self.entered: collections.Counter[str] = collections.Counter()
        self._stacks: dict[trio.lowlevel.Task, list[str]] = {}
        self._mark: float | None = None
        self._wait_started = 0.0
        self._wait_timeout = 0.0

    def _top(self, task: trio.lowlevel.Task) -> str:
        stack = self._stacks.get(task)
        return stack[-1] if stack else "task " + task.name.rsplit(".", 1)[-1]

    def _charge(self) -> None:
        if self.on and self._mark is not None:
            now = time.process_time()
            self.charged[self._top(trio.lowlevel.current_task())] += now - self._mark
            self._mark = now

    def push(self, phase: str) -> None:
        """Enter `phase` in the current task."""
        self._charge()
        if self.on:
            self.entered[phase] += 1
        self._stacks.setdefault(trio.lowlevel.current_task(), []).append(phase)

    def pop(self) -> None:
        """Leave the current task's innermost phase."""
        self._charge()
        self._stacks[trio.lowlevel.current_task()].pop()

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._mark = time.process_time() if self.on else None

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if self.on and self._mark is not None:
            self.charged[self._top(task)] += time.process_time() - self._mark
        self._mark = None

    def before_io_wait(self, timeout: float) -> None:
        self._wait_started, self._wait_timeout = time.process_time(), timeout

    def after_io_wait(self, timeout: float) -> None:
        if self.on:
            kind = "I/O wait, blocking" if self._wait_timeout > 0 else "I/O poll, zero timeout"
            self.charged[kind] += time.process_time() - self._wait_started


def _wrap(clock: PhaseClock, owner: Any, name: str, phase: str) -> None:
    original: Callable[..., Any] = getattr(owner, name)
    wrapped: Callable[..., Any]
    if inspect.isasyncgenfunction(original):

        async def agen(*args: Any, **kwargs: Any) -> Any:
            clock.push(phase)
            source = original(*args, **kwargs)
            try:
                while True:
                    try:
                        item = await source.__anext__()
                    except StopAsyncIteration:
                        return
                    clock.pop()
                    try:
                        yield item
                    finally:
                        clock.push(phase)
            finally:
                try:
                    await source.aclose()
                finally:
                    clock.pop()

        wrapped = agen
    elif inspect.iscoroutinefunction(original):

        async def coroutine(*args: Any, **kwargs: Any) -> Any:
            clock.push(phase)
            try:
                return await original(*args, **kwargs)
            finally:
                clock.pop()

        wrapped = coroutine
    else:

        def plain(*args: Any, **kwargs: Any) -> Any:
            clock.push(phase)
            try:
                return original(*args, **kwargs)
            finally:
                clock.pop()

        wrapped = plain
    setattr(owner, name, functools.wraps(original)(wrapped))


def instrument(clock: PhaseClock) -> None:
    """Wrap the phases' functions (for this process's lifetime)."""
    import actors.agent.loop as loop_module

    for owner, name, phase in (
        (Agent, "_wake", "wake: reload the log"),
        (Agent, "_hibernate", "hibernate"),
        (Agent, "_settle_run", "agent: settle the turn"),
        (AgentLoop, "run_turn", "agent loop (own code)"),
        (AgentLoop, "_propose", "assembly + pre-step listeners"),
        (AgentLoop, "request_header", "render + header"),
        (loop_module, "render_prompt", "render + header"),
        (Session, "append", "session appends"),
        (Session, "extend", "session appends"),
        (Session, "flush", "session flushes"),
        (Session, "derive_messages", "derive messages"),
        (ToolRegistry, "run", "tool"),
        (harness_run._TimedProvider, "stream_batches", "provider path"),
    ):
        _wrap(clock, owner, name, phase)


def phases(sessions: int, turns: int, store: harness_run.StoreKind) -> None:
    """Part 1: print the sequential pass's CPU by phase."""
    clock = PhaseClock()
    instrument(clock)
    sequential = harness_run._sequential

    async def measured(agents: list[Agent], turns: int, offset: int) -> float:
        trio.lowlevel.add_instrument(clock)
        clock.on = True
        started = time.process_time()
        result = await sequential(agents, turns, offset)
        total = time.process_time() - started
        clock.on = False
        trio.lowlevel.remove_instrument(clock)
        steps = 2 * turns
        print(f"sequential pass: {total / steps * 1e3:.3f} ms CPU per step (instrumented)")
        for phase, cpu in sorted(clock.charged.items(), key=lambda item: -item[1]):
            entered = clock.entered[phase] / steps
            calls = f"  entered {entered:.1f}/step" if entered else ""
            print(f"  {phase:32s} {cpu / steps * 1e3:7.3f} ms/step{calls}")
        rest = total - sum(clock.charged.values())
        print(f"  {'scheduler, between task steps':32s} {rest / steps * 1e3:7.3f} ms/step")
        return result

    harness_run._sequential = measured
    settings = harness_run.LevelSettings(
        sessions=sessions, pools=128, sequential_turns=turns, store=store
    )
    with start_simulator_process(latency=0.05, reply_tokens=24) as sim:
        trio.run(harness_run.run_level, sim.url, settings)


async def _wake_cpu(store: SessionStore, turns: int) -> tuple[int, float]:
    """(events, CPU seconds per hibernate-then-wake) of a session of `turns` turns."""
    async with trio.open_nursery() as nursery:
        if not store.running:
            await nursery.start(store.serve)
        async with open_agent(
            system_prompt=loop_overhead.build_prompt({"now": 1}),
            provider=ScriptedProvider(loop_overhead.script_for(turns)),
            options=AgentOptions(model="bench-model"),
            store=store,
            tools=loop_overhead.TOOLS,
        ) as agent:
            for turn in range(turns):
                agent.followup(f"Please handle item {turn}.")
                await agent.when_idle()
            session = agent.session
            await session.flush()
            repeats = max(5, 2000 // max(1, len(session)))
            cpu = 0.0
            for _ in range(repeats):
                if not session.hibernate():
                    raise RuntimeError(f"session {session.id!r} did not hibernate")
                started = time.process_time()
                await session.wake()
                cpu += time.process_time() - started
            events = len(session)
        nursery.cancel_scope.cancel()
    return events, cpu / repeats


async def wakes(turn_counts: list[int]) -> None:
    """Part 2: print a wake's CPU against the log's length, per store."""
    print("turns  events  wake MemoryStore ms  wake SQLiteStore ms")
    for turns in turn_counts:
        events, memory = await _wake_cpu(MemoryStore(), turns)
        with tempfile.TemporaryDirectory() as directory:
            _, sqlite = await _wake_cpu(SQLiteStore(Path(directory) / "wake.sqlite"), turns)
        print(f"{turns:5d}  {events:6d}  {memory * 1e3:19.3f}  {sqlite * 1e3:19.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--turns", type=int, default=100, help="sequential turns")
    parser.add_argument("--store", choices=("memory", "sqlite"), default="memory")
    parser.add_argument("--wake-turns", type=int, nargs="*", default=[1, 10, 100, 500])
    args = parser.parse_args()
    if args.turns > 0:
        phases(args.sessions, args.turns, args.store)
    if args.wake_turns:
        trio.run(wakes, args.wake_turns)
