"""Time context: a sourced snapshot per step, refresh interval, timezone, never the system text."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import trio

from actors.agent import open_agent
from actors.context import ContextPluginError, TimeContext
from actors.messages import PluginSource, TextBlock
from actors.prompt import PromptContext, SystemPrompt
from actors.providers import Reply, ScriptedProvider, ToolCall
from tests.agent.helpers import turn_end_kinds
from tests.context.helpers import (
    empty_turns,
    entered,
    from_plugin,
    labels,
    reject_turns,
    run_turn,
    tool,
    veto_turns,
)

NOON_UTC_MS = 1_700_000_000_000  # 2023-11-14T22:13:20Z, a Tuesday


def fixed(ms: int = NOON_UTC_MS) -> TimeContext:
    return TimeContext(timezone="UTC", clock=lambda: ms)


async def test_time_snapshot_is_appended_after_the_downstream_decision_on_every_step() -> None:
    prompt = SystemPrompt()
    prompt.context(PromptContext(name="sandbox:policy", order=110, text="read-only"))
    provider = ScriptedProvider(
        [Reply.tool_calls([ToolCall(id="1", name="read")]), Reply.text("done")]
    )
    async with open_agent(system_prompt=prompt, provider=provider, tools=[tool("read")]) as agent:
        fixed().install(agent)
        await run_turn(agent, "hi")
    assert labels(provider.requests[0].messages) == ["user:hi", "runtime-context", "time"]
    assert labels(provider.requests[1].messages)[-1] == "time"
    assert len(from_plugin(entered(agent.session), "time")) == 2


async def test_time_snapshot_is_sourced_and_in_the_configured_timezone() -> None:
    provider = ScriptedProvider([Reply.text("a")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        TimeContext(timezone="Asia/Tokyo", clock=lambda: NOON_UTC_MS).install(agent)
        await run_turn(agent, "hi")
    [message] = from_plugin(entered(agent.session), "time")
    assert message.text == "Current time: 2023-11-15T07:13:20+09:00 (Wednesday, Asia/Tokyo)."
    assert message.source == PluginSource(plugin="time", form="snapshot")


@pytest.fixture
def machine_in_kolkata(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("machine_in_kolkata")
async def test_machine_timezone_is_used_when_none_is_configured() -> None:
    provider = ScriptedProvider([Reply.text("a")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        TimeContext(clock=lambda: NOON_UTC_MS).install(agent)
        await run_turn(agent, "hi")
    [message] = from_plugin(entered(agent.session), "time")
    assert message.text == (
        "Current time: 2023-11-15T03:43:20+05:30 (Wednesday, IST, the machine's timezone)."
    )


async def test_session_clock_is_the_default_wall_clock() -> None:
    provider = ScriptedProvider([Reply.text("a")])
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, clock=lambda: NOON_UTC_MS
    ) as agent:
        TimeContext(timezone="UTC").install(agent)
        await run_turn(agent, "hi")
    [message] = from_plugin(entered(agent.session), "time")
    assert message.text.startswith("Current time: 2023-11-14T22:13:20+00:00")


async def test_refresh_interval_skips_steps_it_still_covers(autojump_clock: trio.abc.Clock) -> None:
    now = [NOON_UTC_MS]
    provider = ScriptedProvider([Reply.text("a"), Reply.text("b"), Reply.text("c")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        TimeContext(timezone="UTC", refresh_interval=60, clock=lambda: now[0]).install(agent)
        await run_turn(agent, "one")
        await trio.sleep(59)
        now[0] += 59_000
        await run_turn(agent, "two")
        await trio.sleep(1)
        now[0] += 1_000
        await run_turn(agent, "three")
    times = [m.text for m in from_plugin(entered(agent.session), "time")]
    assert times == [
        "Current time: 2023-11-14T22:13:20+00:00 (Tuesday, UTC).",
        "Current time: 2023-11-14T22:14:20+00:00 (Tuesday, UTC).",
    ]
    assert labels(provider.requests[1].messages)[-1] == "user:two"


async def test_a_time_snapshot_vetoed_by_an_outer_listener_does_not_count_as_delivered(
    autojump_clock: trio.abc.Clock,
) -> None:
    provider = ScriptedProvider([Reply.text("a")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.on_pre_step(veto_turns(0))
        TimeContext(timezone="UTC", refresh_interval=60, clock=lambda: NOON_UTC_MS).install(agent)
        await run_turn(agent, "vetoed")
        await run_turn(agent, "admitted")
    assert labels(provider.requests[0].messages) == ["user:admitted", "time"]


async def test_a_rejected_step_gets_no_time(autojump_clock: trio.abc.Clock) -> None:
    provider = ScriptedProvider([])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        fixed().install(agent)
        agent.on_pre_step(reject_turns(0))
        await run_turn(agent, "blocked")
    assert turn_end_kinds(agent.session) == ["blocked"]
    assert from_plugin(entered(agent.session), "time") == []


async def test_an_empty_first_step_gets_no_time_and_stays_closed() -> None:
    provider = ScriptedProvider([])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        fixed().install(agent)
        agent.on_pre_step(empty_turns(0))
        await run_turn(agent, "hi")
    assert [e.type for e in agent.session.events] == ["turn/start", "turn/end"]
    assert provider.requests == []


async def test_time_never_changes_the_system_text() -> None:
    now = [NOON_UTC_MS]

    def clock() -> int:
        now[0] += 61_000
        return now[0]

    provider = ScriptedProvider(
        [Reply.tool_calls([ToolCall(id="1", name="read")]), Reply.text("a"), Reply.text("b")]
    )
    async with open_agent(
        system_prompt=SystemPrompt(persona="p"), provider=provider, tools=[tool("read")]
    ) as agent:
        TimeContext(timezone="UTC", clock=clock).install(agent)
        await run_turn(agent, "one")
        await run_turn(agent, "two")
    assert len({m.text for m in from_plugin(entered(agent.session), "time")}) == 3
    assert len({request.system for request in provider.requests}) == 1
    assert [e.type for e in agent.session.events].count("request/header") == 1


def test_unknown_timezone_is_refused_naming_it() -> None:
    with pytest.raises(ContextPluginError, match="Mars/Olympus"):
        TimeContext(timezone="Mars/Olympus")


async def test_snapshots_of_one_second_in_a_timezone_are_one_shared_message() -> None:
    utc = TimeContext(timezone="UTC")
    first = utc.snapshot(NOON_UTC_MS + 100)
    assert TimeContext(timezone="UTC").snapshot(NOON_UTC_MS + 900) is first
    assert first.content == (
        TextBlock(text="Current time: 2023-11-14T22:13:20+00:00 (Tuesday, UTC)."),
    )
    assert first.source == PluginSource(plugin="time", form="snapshot")
    later = utc.snapshot(NOON_UTC_MS + 1000)
    assert later.content == (
        TextBlock(text="Current time: 2023-11-14T22:13:21+00:00 (Tuesday, UTC)."),
    )
    assert (
        utc.render(NOON_UTC_MS + 1000) == "Current time: 2023-11-14T22:13:21+00:00 (Tuesday, UTC)."
    )
    tokyo = TimeContext(timezone="Asia/Tokyo").snapshot(NOON_UTC_MS + 100)
    assert tokyo.content == (
        TextBlock(text="Current time: 2023-11-15T07:13:20+09:00 (Wednesday, Asia/Tokyo)."),
    )
