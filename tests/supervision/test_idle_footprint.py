"""A turn on a hibernating agent leaves nothing of its own allocated behind.

After a burst of concurrent turns, memory goes back to the operating system
only where the allocator's pages (CPython's 1 MiB arenas) hold no live
object at all, so every object a turn allocates and then keeps for the
whole idle period (a plan cached per agent, a header per agent, a
timestamp, a list replacing an emptied one) pins an arena the burst used.
These tests trace the allocations made by the runtime's code during a burst
of turns on hibernating agents and check that no allocation site still
holds one block per session once the agents are idle (what a burst leaves
per burst, such as a container grown to the burst's size or a worker
thread, is not per session), with `SQLiteStore`, whose log lives on disk,
and with `MemoryStore`, which keeps each log in the process.
"""

from __future__ import annotations

import gc
import sys
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import trio
import trio.testing

from actors.agent import Agent, AgentOptions, Tool
from actors.context import TimeContext
from actors.prompt import PromptSection, SystemPrompt
from actors.providers import Reply, ScriptedProvider, ToolCall
from actors.session import MemoryStore, SessionStore, SQLiteStore
from supervision import open_runtime
from supervision.awake import TRIM_QUIET_SECONDS

SESSIONS = 200
"""Agents in the burst: twice as many as the largest CPython free list holds (80 of a kind),
so that a site keeping half a block per session is not a free list's bounded leftovers."""
ROOT = Path(__file__).resolve().parents[2]
RUNTIME_CODE = (str(ROOT / "actors"), str(ROOT / "supervision"))
"""The runtime's own code: an allocation with one of these in its traceback is the runtime's."""


async def _echo(arguments: dict[str, Any] | str, call: object) -> str:
    return "echoed"


def _tools() -> list[Tool]:
    parameters = {"type": "object", "properties": {"text": {"type": "string"}}}
    return [
        Tool(name=f"tool_{n}", description=f"Tool {n}.", parameters=parameters, execute=_echo)
        for n in range(8)
    ]


def _prompt() -> SystemPrompt:
    prompt = SystemPrompt(include_harness_identity=False)
    for n in range(4):
        prompt.section(PromptSection(name=f"guide:{n}", order=100 + n, text=f"Guideline {n}."))
    return prompt


def _script(turns: int) -> list[Reply]:
    replies: list[Reply] = []
    for turn in range(turns):
        call = ToolCall(id=f"call-{turn}", name="tool_0", arguments='{"text":"hi"}')
        replies += [Reply.tool_calls([call]), Reply.text("done")]
    return replies


async def _kept_by_turns(store: SessionStore) -> list[tracemalloc.StatisticDiff]:
    """What the runtime's code allocated during one turn on each of `SESSIONS` fresh agents
    (a tool call, then text; the time context on every step) and still holds once they idle."""
    provider = ScriptedProvider(_script(SESSIONS + 1))
    options = AgentOptions(model="m", hibernate=True)
    tools = _tools()
    time_context = TimeContext(timezone="UTC")
    async with open_runtime(
        system_prompt=_prompt(), store=store, providers={"default": provider}
    ) as runtime:

        async def start() -> Agent:
            child = await runtime.start_agent(
                options=options, tools=tools, setup=time_context.install
            )
            return child.value

        warm = await start()  # the first turn fills the shared caches (header, tool schemas)
        await warm.run("warm up")
        agents = [await start() for _ in range(SESSIONS)]
        texts = [f"hello {n}" for n in range(SESSIONS)]
        gc.collect()
        tracemalloc.start(25)
        try:
            before = tracemalloc.take_snapshot()
            async with trio.open_nursery() as nursery:
                for agent, text in zip(agents, texts, strict=True):
                    nursery.start_soon(agent.run, text)
            await _drop_stale_deadlines()
            provider.requests.clear()
            # CPython's method cache keeps the method names C code looked up last (datetime
            # builds a new "utcoffset" string per call): the runtime's trimmer clears it
            # after a burst (`supervision.awake`); this test has too few agents for one.
            sys._clear_type_cache()
            gc.collect()
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        assert all(agent.session.hibernating for agent in agents)
    runtime_code = [
        tracemalloc.Filter(True, f"{directory}/*", all_frames=True) for directory in RUNTIME_CODE
    ]
    diff = after.filter_traces(runtime_code).compare_to(
        before.filter_traces(runtime_code), "traceback"
    )
    return [stat for stat in diff if stat.count_diff > 0]


async def _drop_stale_deadlines() -> None:
    """Let Trio drop the deadlines of the turns' exited cancel scopes (their shielded writes').

    Trio removes an exited scope's deadline from its heap lazily, when the
    run loop is idle and it is the nearest one; the runtime's trimmer waits
    `TRIM_QUIET_SECONDS` after a burst with a nearer deadline of its own.
    """
    await trio.sleep(TRIM_QUIET_SECONDS + 0.1)
    await trio.testing.wait_all_tasks_blocked()


def _describe(kept: list[tracemalloc.StatisticDiff]) -> str:
    return "\n".join(
        f"+{stat.count_diff} blocks, {stat.size_diff} B:\n" + "\n".join(stat.traceback.format())
        for stat in kept
    )


def _per_session(kept: list[tracemalloc.StatisticDiff]) -> list[tracemalloc.StatisticDiff]:
    """The allocation sites still holding about a block per session (or more)."""
    return [stat for stat in kept if stat.count_diff >= SESSIONS // 2]


async def test_turns_on_hibernating_agents_keep_nothing_per_session_with_an_sqlite_log(
    tmp_path: Path,
) -> None:
    # A lease renewal (every third of the TTL, in a worker thread) in flight while the
    # heap is read would show its per-lease objects; the TTL is past the test's length.
    kept = await _kept_by_turns(SQLiteStore(tmp_path / "log.sqlite", lease_ttl=3600.0))
    assert not _per_session(kept), _describe(_per_session(kept))


async def test_a_memory_store_keeps_only_each_logs_own_record() -> None:
    kept = await _kept_by_turns(MemoryStore())
    outside_the_log = [
        stat
        for stat in _per_session(kept)
        if not any(frame.filename.endswith("actors/session/store.py") for frame in stat.traceback)
    ]
    assert not outside_the_log, _describe(outside_the_log)


async def test_an_idle_hosted_agent_is_a_few_dozen_objects() -> None:
    """An idle agent's own objects (actor, loop, session, registrations, supervisor child):
    each is a small record, not closures with their cells (it was 128 before they went)."""
    agents = 100
    provider = ScriptedProvider([Reply.text("done")] * (agents + 1))
    options = AgentOptions(model="m", hibernate=True)
    tools = _tools()
    time_context = TimeContext(timezone="UTC")
    async with open_runtime(system_prompt=_prompt(), providers={"default": provider}) as runtime:

        async def start() -> Agent:
            child = await runtime.start_agent(
                options=options, tools=tools, setup=time_context.install
            )
            return child.value

        await (await start()).run("warm up")
        provider.requests.clear()
        await _drop_stale_deadlines()
        gc.collect()
        before = Counter(type(o).__qualname__ for o in gc.get_objects())
        started = [await start() for _ in range(agents)]
        for agent in started:
            await agent.run("hello")
        provider.requests.clear()
        await _drop_stale_deadlines()
        gc.collect()
        kept = Counter(type(o).__qualname__ for o in gc.get_objects()) - before
    assert sum(kept.values()) <= 45 * agents, sorted(kept.items(), key=lambda item: -item[1])
