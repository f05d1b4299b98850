"""The turn/step machine: event order, headers, assembly frequency, inbox semantics."""

from __future__ import annotations

import json

import trio

from actors.agent import AgentOptions, Tool, open_agent
from actors.prompt import AssembleContext, PromptSection, SystemPrompt
from actors.providers import Reply, ScriptedProvider, ToolCall, Usage
from actors.session import MemoryStore
from tests.agent.helpers import data_of, turn_end_kinds, types


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
