"""The turn/step machine: event order, headers, assembly frequency, inbox semantics."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.agent import AgentOptions, Tool, open_agent
from actors.prompt import AssembleContext, PromptSection, SystemPrompt
from actors.providers import GenerateRequest, Reply, ScriptedProvider, ToolCall, Usage
from actors.providers.chunks import Chunk, TextDelta
from actors.scope import Scope
from actors.session import MemoryStore, Session, SQLiteStore
from actors.session.events import AssistantChunk, StepStart, TurnStart
from tests.agent.helpers import GatedProvider, data_of, request_texts, turn_end_kinds, types


async def echo(arguments: dict[str, object] | str, call: object) -> str:
    return json.dumps(arguments)


ECHO = Tool(
    name="echo", description="Echo the arguments.", parameters={"type": "object"}, execute=echo
)


async def test_step_events_follow_the_documented_order() -> None:
    provider = ScriptedProvider(
        [
            Reply.tool_calls([ToolCall(id="c1", name="echo", arguments='{"a":1}')]),
            Reply.text("done", usage=Usage(input_tokens=10, output_tokens=2)),
        ]
    )
    async with open_agent(
        system_prompt=SystemPrompt(persona="p"), provider=provider, tools=[ECHO]
    ) as agent:
        agent.followup("hi")
        await agent.when_idle()
    assert types(agent.session) == [
        "turn/start",
        "step/start",
        "user/message",
        "request/header",
        "assistant/chunk",
        "assistant/chunk",
        "assistant/message",
        "tool/call",
        "tool/result",
        "step/end",
        "step/start",
        "assistant/chunk",
        "assistant/chunk",
        "assistant/chunk",
        "assistant/message",
        "step/end",
        "turn/end",
    ]
    header = data_of(agent.session, "request/header")[0]
    assert header.reason == "initial"
    result = data_of(agent.session, "tool/result")[0]
    assert (result.content, result.is_error) == ('{"a": 1}', False)
    assert data_of(agent.session, "assistant/message")[1].usage == Usage(
        input_tokens=10, output_tokens=2
    )
    assert turn_end_kinds(agent.session) == ["completed"]


async def test_unchanged_prompt_logs_no_further_header() -> None:
    provider = ScriptedProvider([Reply.text("a"), Reply.text("b"), Reply.text("c")])
    async with open_agent(system_prompt=SystemPrompt(persona="p"), provider=provider) as agent:
        for text in ("one", "two", "three"):
            agent.followup(text)
            await agent.when_idle()
    assert [h.reason for h in data_of(agent.session, "request/header")] == ["initial"]
    assert len(provider.requests) == 3
    assert {r.system for r in provider.requests} == {provider.requests[0].system}


async def _logged_config(options: AgentOptions) -> Mapping[str, Any]:
    """The config of the first request header an agent with `options` logs."""
    provider = ScriptedProvider([Reply.text("a")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider, options=options) as a:
        a.followup("hi")
        await a.when_idle()
    config: Mapping[str, Any] = data_of(a.session, "request/header")[0].header.config
    return config


async def test_agents_with_equal_options_log_one_shared_frozen_config() -> None:
    configs = [
        await _logged_config(
            AgentOptions(model="m", temperature=0.5, extra={"thinking": {"type": "enabled"}})
        )
        for _ in range(2)
    ]
    assert configs[0] is configs[1]
    assert configs[0] == {
        "provider": "default",
        "model": "m",
        "temperature": 0.5,
        "thinking": {"type": "enabled"},
    }
    with pytest.raises(TypeError, match="immutable"):
        configs[0]["model"] = "other"  # type: ignore[index]


async def test_configs_equal_but_for_a_values_type_are_not_shared() -> None:
    # 1, 1.0 and True are equal in Python, but not the same JSON on the wire or in the log.
    configs = [
        await _logged_config(AgentOptions(model="m", temperature=temperature, extra={"flag": flag}))
        for temperature, flag in ((1, 1), (1.0, True))
    ]
    assert configs[0] is not configs[1]
    assert [(type(c["temperature"]), type(c["flag"])) for c in configs] == [
        (int, int),
        (float, bool),
    ]


async def test_changed_section_logs_a_change_header() -> None:
    prompt = SystemPrompt(persona="p")
    provider = ScriptedProvider([Reply.text("a"), Reply.text("b")])
    async with open_agent(system_prompt=prompt, provider=provider) as agent:
        agent.followup("one")
        await agent.when_idle()
        prompt.section(PromptSection(name="rules", order=50, text="Be brief."))
        agent.followup("two")
        await agent.when_idle()
    headers = data_of(agent.session, "request/header")
    assert [h.reason for h in headers] == ["initial", "change"]
    assert headers[1].header.system is not None
    assert headers[1].header.system.endswith("Be brief.")


async def test_new_agent_over_stored_session_resumes_numbering_and_logs_resume() -> None:
    store = MemoryStore()
    prompt = SystemPrompt(persona="p")
    async with open_agent(
        system_prompt=prompt, provider=ScriptedProvider([Reply.text("a")]), store=store
    ) as first:
        first.followup("one")
        await first.when_idle()
    async with open_agent(
        system_prompt=prompt,
        provider=ScriptedProvider([Reply.text("b")]),
        store=store,
        session_id=first.session.id,
    ) as second:
        second.followup("two")
        await second.when_idle()
    assert [d.turn for d in data_of(second.session, "turn/start")] == [0, 1]
    assert [h.reason for h in data_of(second.session, "request/header")] == ["initial", "resume"]


async def test_assembly_runs_once_per_proposed_step_not_per_retry() -> None:
    calls: list[AssembleContext] = []

    def counted(ctx: AssembleContext) -> str:
        calls.append(ctx)
        return "counted"

    prompt = SystemPrompt(persona="p")
    prompt.section(PromptSection(name="count", order=10, text=counted))
    provider = ScriptedProvider(
        [Reply.failure("overloaded", "busy", retryable=True), Reply.text("ok")]
    )
    async with open_agent(
        system_prompt=prompt,
        provider=provider,
        options=AgentOptions(model="m"),
    ) as agent:
        agent.followup("hi")
        await agent.when_idle()
    assert len(calls) == 1
    assert len(provider.requests) == 2
    assert provider.requests[0] == provider.requests[1]
    retry = data_of(agent.session, "request/retry")[0]
    assert (retry.turn, retry.step, retry.attempt, retry.failure.code) == (0, 0, 0, "overloaded")
    assert len(data_of(agent.session, "step/start")) == 1
    assert turn_end_kinds(agent.session) == ["completed"]


async def test_model_and_provider_variables_and_config_come_from_options() -> None:
    prompt = SystemPrompt(persona="You run on {{model}} via {{provider}}.")
    provider = ScriptedProvider([Reply.text("a")])
    options = AgentOptions(model="deepseek-chat", provider_name="deepseek", max_tokens=64)
    async with open_agent(system_prompt=prompt, provider=provider, options=options) as agent:
        agent.followup("hi")
        await agent.when_idle()
    request = provider.requests[0]
    assert request.system is not None
    assert request.system.endswith("You run on deepseek-chat via deepseek.")
    assert dict(request.config) == {
        "provider": "deepseek",
        "model": "deepseek-chat",
        "max_tokens": 64,
    }
    assert agent.scope.parent is None


async def test_two_followups_while_idle_make_two_turns() -> None:
    provider = ScriptedProvider([Reply.text("a"), Reply.text("b")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("one")
        agent.followup("two")
        await agent.when_idle()
    entered = [d.content[0].text for d in data_of(agent.session, "user/message")]
    assert entered == ["one", "two"]
    assert turn_end_kinds(agent.session) == ["completed", "completed"]


async def test_steer_during_a_step_adds_a_step_to_the_live_turn() -> None:
    release = trio.Event()

    async def slow(arguments: dict[str, object] | str, call: object) -> str:
        await release.wait()
        return "slow done"

    provider = ScriptedProvider(
        [
            Reply.tool_calls([ToolCall(id="c1", name="slow", arguments="{}")]),
            Reply.text("after tool"),
            Reply.text("after steer"),
        ]
    )
    tool = Tool(name="slow", description="d", parameters={"type": "object"}, execute=slow)
    async with open_agent(system_prompt=SystemPrompt(), provider=provider, tools=[tool]) as agent:
        agent.followup("go")
        await trio.testing.wait_all_tasks_blocked()
        agent.steer("also this")
        release.set()
        await agent.when_idle()
    assert len(data_of(agent.session, "turn/start")) == 1
    assert len(data_of(agent.session, "step/start")) == 2
    last_request = provider.requests[-1]
    assert last_request.messages[-1].text == "also this"
    assert len(provider.requests) == 2


async def test_inject_while_idle_does_not_wake_the_agent() -> None:
    provider = ScriptedProvider([Reply.text("a")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.inject("quiet note")
        await trio.testing.wait_all_tasks_blocked()
        assert agent.status == "idle"
        assert provider.requests == []
        agent.followup("now")
        await agent.when_idle()
    assert [m.text for m in provider.requests[0].messages] == ["now", "quiet note"]


async def test_cancel_aborts_the_live_turn_with_user_cause_and_drops_queued_input() -> None:
    provider = ScriptedProvider([Reply.hang("part"), Reply.text("never")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("one")
        await trio.testing.wait_all_tasks_blocked()
        agent.followup("two")
        await trio.testing.wait_all_tasks_blocked()
        agent.cancel()
        await agent.when_idle()
        assert agent.inbox.statistics().next_turn == 0
    end = data_of(agent.session, "turn/end")[0]
    assert end.reason.kind == "aborted"
    assert end.reason.reason is not None and end.reason.reason.kind == "user"
    assert len(provider.requests) == 1


async def test_cancel_keep_inbox_parks_input_until_the_next_wake() -> None:
    provider = ScriptedProvider([Reply.hang(), Reply.text("second"), Reply.text("third")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("one")
        await trio.testing.wait_all_tasks_blocked()
        agent.followup("two")
        await trio.testing.wait_all_tasks_blocked()
        agent.cancel(keep_inbox=True)
        await agent.when_idle()
        assert len(provider.requests) == 1
        assert agent.inbox.statistics().next_turn == 1
        agent.followup("three")
        await agent.when_idle()
    entered = [d.content[0].text for d in data_of(agent.session, "user/message")]
    assert entered == ["one", "two", "three"]


async def test_leaving_open_agent_aborts_a_live_turn_as_disposed() -> None:
    provider = ScriptedProvider([Reply.hang("partial")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("one")
        await trio.testing.wait_all_tasks_blocked()
        assert agent.status == "running"
    end = data_of(agent.session, "turn/end")[0]
    assert end.reason.reason is not None and end.reason.reason.kind == "disposed"
    assert agent.session.to_json()[-1]["type"] == "turn/end"


async def test_steer_during_the_last_step_continues_the_turn_with_another_step() -> None:
    gate = trio.Event()
    provider = GatedProvider([Reply.text("first"), Reply.text("after steer")], gate)
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("go")
        await trio.testing.wait_all_tasks_blocked()
        agent.steer("also this")
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
        await agent.when_idle()
    assert [(d.turn, d.step) for d in data_of(agent.session, "step/start")] == [(0, 0), (0, 1)]
    assert turn_end_kinds(agent.session) == ["completed"]
    assert request_texts(provider.requests[1]) == ["go", "first", "also this"]


async def test_followup_during_a_turn_runs_as_its_own_next_turn() -> None:
    gate = trio.Event()
    provider = GatedProvider([Reply.text("first"), Reply.text("second")], gate)
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("one")
        await trio.testing.wait_all_tasks_blocked()
        agent.followup("two")
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
        await agent.when_idle()
    assert [(d.turn, d.step) for d in data_of(agent.session, "step/start")] == [(0, 0), (1, 0)]
    assert request_texts(provider.requests[0]) == ["one"]
    assert request_texts(provider.requests[1]) == ["one", "first", "two"]


async def test_steer_while_idle_wakes_the_agent_for_a_turn() -> None:
    provider = ScriptedProvider([Reply.text("a")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.steer("nudge")
        await agent.when_idle()
    assert turn_end_kinds(agent.session) == ["completed"]
    assert request_texts(provider.requests[0]) == ["nudge"]


async def test_inject_during_a_live_turn_is_claimed_by_its_next_step() -> None:
    release = trio.Event()

    async def slow(arguments: dict[str, object] | str, call: object) -> str:
        await release.wait()
        return "slow done"

    tool = Tool(name="slow", description="d", parameters={"type": "object"}, execute=slow)
    provider = ScriptedProvider(
        [Reply.tool_calls([ToolCall(id="c1", name="slow")]), Reply.text("b"), Reply.text("c")]
    )
    async with open_agent(system_prompt=SystemPrompt(), provider=provider, tools=[tool]) as agent:
        agent.followup("go")
        await trio.testing.wait_all_tasks_blocked()
        agent.inject("quiet note")
        release.set()
        await agent.when_idle()
    assert len(provider.requests) == 2
    assert request_texts(provider.requests[1])[-1] == "quiet note"
    assert turn_end_kinds(agent.session) == ["completed"]


async def test_cancel_drops_input_queued_for_the_next_step() -> None:
    provider = ScriptedProvider([Reply.hang("part"), Reply.text("never")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("one")
        await trio.testing.wait_all_tasks_blocked()
        agent.steer("steered")
        agent.inject("injected")
        await trio.testing.wait_all_tasks_blocked()
        agent.cancel()
        await agent.when_idle()
        assert agent.inbox.statistics().next_step == 0
    assert len(provider.requests) == 1
    assert turn_end_kinds(agent.session) == ["aborted"]


async def test_followup_sent_before_cancel_keep_inbox_stays_parked() -> None:
    provider = ScriptedProvider([Reply.hang(), Reply.text("never")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("one")
        await trio.testing.wait_all_tasks_blocked()
        agent.followup("two")
        agent.cancel(keep_inbox=True)
        await agent.when_idle()
        assert agent.inbox.statistics().next_turn == 1
    assert len(provider.requests) == 1
    assert turn_end_kinds(agent.session) == ["aborted"]


@pytest.mark.parametrize("keep_inbox", [False, True])
async def test_followup_sent_right_after_cancel_runs_a_new_turn(keep_inbox: bool) -> None:
    provider = ScriptedProvider([Reply.hang("part"), Reply.text("second")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("one")
        await trio.testing.wait_all_tasks_blocked()
        agent.cancel(keep_inbox=keep_inbox)
        agent.followup("again")
        await agent.when_idle()
    assert turn_end_kinds(agent.session) == ["aborted", "completed"]
    assert request_texts(provider.requests[-1])[-1] == "again"


async def test_status_is_running_as_soon_as_followup_returns() -> None:
    provider = ScriptedProvider([Reply.text("a")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        assert agent.status == "idle"
        agent.followup("hi")
        assert agent.status == "running"
        await agent.when_idle()
        assert agent.status == "idle"
    assert turn_end_kinds(agent.session) == ["completed"]


async def test_when_idle_returns_at_once_for_an_idle_agent(autojump_clock: trio.abc.Clock) -> None:
    async with open_agent(system_prompt=SystemPrompt(), provider=ScriptedProvider([])) as agent:
        start = trio.current_time()
        with trio.fail_after(1):
            await agent.when_idle()
        assert trio.current_time() == start
    assert len(agent.session) == 0


async def test_open_agent_scope_becomes_the_parent_of_the_agent_scope() -> None:
    parent = Scope(name="team")
    prompt = SystemPrompt(persona="p")
    prompt.section(PromptSection(name="team:rule", order=5, text="Team rule."), scope=parent)
    provider = ScriptedProvider([Reply.text("a")])
    async with open_agent(system_prompt=prompt, provider=provider, scope=parent) as agent:
        agent.followup("hi")
        await agent.when_idle()
    assert agent.scope.parent is parent
    assert provider.requests[0].system is not None
    assert "Team rule." in provider.requests[0].system


async def test_agent_scope_registrations_die_with_the_agent() -> None:
    prompt = SystemPrompt(persona="p")
    async with open_agent(
        system_prompt=prompt, provider=ScriptedProvider([]), tools=[ECHO]
    ) as agent:
        prompt.section(PromptSection(name="mine", order=5, text="Mine."), scope=agent.scope)
        live = await prompt.assemble(AssembleContext(scope=agent.scope))
        assert "mine" in [s.name for s in live.sections]
        assert {"model", "provider"} <= set(live.variables)
    after = await prompt.assemble(AssembleContext(scope=agent.scope))
    assert "mine" not in [s.name for s in after.sections]
    assert "model" not in after.variables and "provider" not in after.variables
    assert after.tools == []


async def test_cancelling_the_owner_of_open_agent_aborts_the_turn_as_disposed(
    autojump_clock: trio.abc.Clock,
) -> None:
    provider = ScriptedProvider([Reply.hang("partial")])
    with trio.move_on_after(10):
        async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
            agent.followup("hi")
            await trio.sleep_forever()
    end = data_of(agent.session, "turn/end")[0]
    assert end.reason.reason is not None and end.reason.reason.kind == "disposed"


async def test_changed_tool_set_logs_a_change_header() -> None:
    provider = ScriptedProvider([Reply.text("a"), Reply.text("b")])
    async with open_agent(
        system_prompt=SystemPrompt(persona="p"), provider=provider, tools=[ECHO]
    ) as agent:
        agent.followup("one")
        await agent.when_idle()
        agent.tools.add(Tool(name="late", description="d", parameters={}, execute=echo))
        agent.followup("two")
        await agent.when_idle()
    headers = data_of(agent.session, "request/header")
    assert [h.reason for h in headers] == ["initial", "change"]
    assert [t.name for t in headers[1].header.tools] == ["echo", "late"]


async def test_prompt_change_during_a_tool_call_is_logged_before_the_next_step() -> None:
    prompt = SystemPrompt(persona="p")

    async def add_rule(arguments: dict[str, object] | str, call: object) -> str:
        prompt.section(PromptSection(name="rule", order=50, text="New rule."))
        return "added"

    tool = Tool(name="add_rule", description="d", parameters={}, execute=add_rule)
    provider = ScriptedProvider(
        [Reply.tool_calls([ToolCall(id="1", name="add_rule")]), Reply.text("ok")]
    )
    async with open_agent(system_prompt=prompt, provider=provider, tools=[tool]) as agent:
        agent.followup("go")
        await agent.when_idle()
    assert types(agent.session)[10:13] == ["step/start", "request/header", "assistant/chunk"]
    assert [h.reason for h in data_of(agent.session, "request/header")] == ["initial", "change"]
    assert provider.requests[1].system is not None
    assert provider.requests[1].system.endswith("New rule.")


async def test_header_and_user_messages_are_durable_before_the_request(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    durable_at_request: list[list[str]] = []

    class Checking(ScriptedProvider):
        async def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
            stored = await SQLiteStore(path).load(agent.session.id)
            durable_at_request.append([event.type for event in stored])
            async with aclosing(super().stream(request)) as chunks:
                async for chunk in chunks:
                    yield chunk

    async with open_agent(
        system_prompt=SystemPrompt(), provider=Checking([Reply.text("a")]), store=SQLiteStore(path)
    ) as agent:
        agent.followup("hi")
        await agent.when_idle()
    assert durable_at_request == [["turn/start", "step/start", "user/message", "request/header"]]


async def test_agent_resumes_a_session_from_a_fresh_sqlite_store(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    prompt = SystemPrompt(persona="p")
    async with open_agent(
        system_prompt=prompt, provider=ScriptedProvider([Reply.text("a")]), store=SQLiteStore(path)
    ) as first:
        first.followup("one")
        await first.when_idle()
    provider = ScriptedProvider([Reply.text("b")])
    async with open_agent(
        system_prompt=prompt,
        provider=provider,
        store=SQLiteStore(path),
        session_id=first.session.id,
    ) as second:
        second.followup("two")
        await second.when_idle()
    assert second.session.to_json()[: len(first.session)] == first.session.to_json()
    assert request_texts(provider.requests[0]) == ["one", "a", "two"]
    stored = await SQLiteStore(path).load(first.session.id)
    assert [event.seq for event in stored] == list(range(len(second.session)))


async def test_agent_over_a_crashed_session_closes_its_open_turn_and_continues() -> None:
    store = MemoryStore()
    crashed = await Session.create(store, "s")
    await crashed.append(TurnStart(turn=0))
    await crashed.append(StepStart(turn=0, step=0))
    await crashed.append(AssistantChunk(turn=0, step=0, chunk=TextDelta(text="par")))
    before = crashed.to_json()
    async with open_agent(
        system_prompt=SystemPrompt(),
        provider=ScriptedProvider([Reply.text("a")]),
        store=store,
        session_id="s",
    ) as agent:
        agent.followup("hi")
        await agent.when_idle()
    assert agent.session.to_json()[:3] == before
    assert types(agent.session)[3:5] == ["step/end", "turn/end"]
    assert turn_end_kinds(agent.session) == ["interrupted", "completed"]
    assert [d.turn for d in data_of(agent.session, "turn/start")] == [0, 1]


async def test_first_request_over_an_existing_log_without_a_header_logs_resume() -> None:
    store = MemoryStore()
    broken = SystemPrompt(tool_order=["ghost", "<unlisted-tools>"])
    async with open_agent(
        system_prompt=broken, provider=ScriptedProvider([]), store=store
    ) as first:
        first.followup("one")
        await first.when_idle()
    assert data_of(first.session, "request/header") == []
    async with open_agent(
        system_prompt=SystemPrompt(),
        provider=ScriptedProvider([Reply.text("a")]),
        store=store,
        session_id=first.session.id,
    ) as second:
        second.followup("two")
        await second.when_idle()
    assert [h.reason for h in data_of(second.session, "request/header")] == ["resume"]
