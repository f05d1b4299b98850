"""The failure matrix: what is logged, and what never happens, for each failure point."""

from __future__ import annotations

import trio

from actors.agent import Enter, StepProposal, open_agent
from actors.agent.decisions import PreStepNext, StepDecision
from actors.prompt import (
    AssembleContext,
    PromptAssembly,
    PromptContext,
    PromptSection,
    SystemPrompt,
    ToolProviderResult,
    ToolSchema,
)
from actors.providers import Reply, ScriptedProvider
from tests.agent.helpers import data_of, turn_end_kinds, types


async def test_assembly_failure_ends_the_turn_before_any_step() -> None:
    def broken(ctx: AssembleContext) -> str:
        raise RuntimeError("disk on fire")

    prompt = SystemPrompt()
    prompt.section(PromptSection(name="broken", order=5, text=broken))
    provider = ScriptedProvider([Reply.text("never")])
    async with open_agent(system_prompt=prompt, provider=provider) as agent:
        agent.followup("hi")
        await agent.when_idle()
    assert types(agent.session) == ["turn/start", "turn/end"]
    error = data_of(agent.session, "turn/end")[0].reason.error
    assert "broken" in error.message
    assert provider.requests == []


async def test_tool_order_failure_ends_the_turn_before_any_step() -> None:
    prompt = SystemPrompt(tool_order=["ghost", "<unlisted-tools>"])
    provider = ScriptedProvider([Reply.text("never")])
    async with open_agent(system_prompt=prompt, provider=provider) as agent:
        agent.followup("hi")
        await agent.when_idle()
    assert types(agent.session) == ["turn/start", "turn/end"]
    assert "ghost" in data_of(agent.session, "turn/end")[0].reason.error.message
    assert provider.requests == []


async def test_system_render_failure_keeps_step_and_messages_but_sends_nothing() -> None:
    prompt = SystemPrompt(persona="Hello {{modle}}")
    provider = ScriptedProvider([Reply.text("never")])
    async with open_agent(system_prompt=prompt, provider=provider) as agent:
        agent.followup("hi")
        await agent.when_idle()
    assert types(agent.session) == [
        "turn/start",
        "step/start",
        "user/message",
        "step/end",
        "turn/end",
    ]
    error = data_of(agent.session, "turn/end")[0].reason.error
    assert "modle" in error.message and "deployment:persona" in error.message
    assert provider.requests == []


async def test_empty_initial_message_list_completes_the_turn_without_a_step() -> None:
    async def swallow(proposal: StepProposal, next: PreStepNext) -> StepDecision:
        return Enter(messages=[])

    provider = ScriptedProvider([Reply.text("never")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.on_pre_step(swallow)
        agent.followup("hi")
        await agent.when_idle()
    assert types(agent.session) == ["turn/start", "turn/end"]
    assert turn_end_kinds(agent.session) == ["completed"]


async def test_cancel_while_assembly_is_blocked_aborts_with_no_step_or_request() -> None:
    gate = trio.Event()

    async def slow_listener(
        assembly: PromptAssembly, ctx: AssembleContext, next: object
    ) -> PromptAssembly:
        await gate.wait()
        return assembly

    prompt = SystemPrompt()
    prompt.on_assemble(slow_listener)  # type: ignore[arg-type]
    provider = ScriptedProvider([Reply.text("never")])
    async with open_agent(system_prompt=prompt, provider=provider) as agent:
        agent.followup("hi")
        await trio.testing.wait_all_tasks_blocked()
        agent.cancel()
        await agent.when_idle()
    assert types(agent.session) == ["turn/start", "turn/end"]
    assert turn_end_kinds(agent.session) == ["aborted"]
    assert provider.requests == []


async def test_cancel_mid_stream_saves_the_streamed_prefix_as_interrupted() -> None:
    provider = ScriptedProvider([Reply.hang("half an ans")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("hi")
        await trio.testing.wait_all_tasks_blocked()
        agent.cancel()
        await agent.when_idle()
    message = data_of(agent.session, "assistant/message")[0]
    assert message.interrupted is True
    assert message.message.text == "half an ans"
    assert types(agent.session)[-3:] == ["assistant/message", "step/end", "turn/end"]


async def test_non_retryable_failure_ends_the_turn_with_the_failure() -> None:
    provider = ScriptedProvider([Reply.failure("unauthorized", "bad key", status=401)])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("hi")
        await agent.when_idle()
    error = data_of(agent.session, "turn/end")[0].reason.error
    assert (error.code, error.message, error.status) == ("unauthorized", "bad key", 401)
    assert data_of(agent.session, "request/retry") == []
    assert "assistant/message" not in types(agent.session)


async def test_exhausted_script_fails_the_request_with_script_exhausted() -> None:
    provider = ScriptedProvider([])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("hi")
        await agent.when_idle()
    assert data_of(agent.session, "turn/end")[0].reason.error.code == "script_exhausted"


async def test_max_tokens_ends_the_turn_max_tokens() -> None:
    provider = ScriptedProvider([Reply.max_tokens("cut o")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("hi")
        await agent.when_idle()
    assert turn_end_kinds(agent.session) == ["max-tokens"]
    assert data_of(agent.session, "assistant/message")[0].message.text == "cut o"


async def test_session_json_stays_readable_after_the_agent_exits() -> None:
    provider = ScriptedProvider([Reply.text("a")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("hi")
        await agent.when_idle()
    dumped = agent.session.to_json()
    assert [e["seq"] for e in dumped] == list(range(len(dumped)))
    assert dumped[-1]["data"]["reason"] == {"kind": "completed"}


async def test_input_of_a_turn_that_failed_before_its_step_waits_for_the_next_wake() -> None:
    prompt = SystemPrompt(tool_order=["ghost", "<unlisted-tools>"])
    provider = ScriptedProvider([Reply.text("first answer"), Reply.text("second answer")])
    async with open_agent(system_prompt=prompt, provider=provider) as agent:
        agent.followup("keep me")
        await agent.when_idle()
        assert turn_end_kinds(agent.session) == ["error"]
        assert agent.inbox.statistics().next_turn == 1
        prompt.tools(
            lambda ctx: ToolProviderResult(
                schemas=[ToolSchema(name="ghost", description="d", parameters={})]
            )
        )
        agent.followup("and me")
        await agent.when_idle()
    entered = [d.content[0].text for d in data_of(agent.session, "user/message")]
    assert entered == ["keep me", "and me"]
    assert turn_end_kinds(agent.session) == ["error", "completed", "completed"]


async def test_cancel_keep_inbox_while_assembly_blocks_returns_the_claimed_input() -> None:
    gate = trio.Event()

    async def slow_listener(
        assembly: PromptAssembly, ctx: AssembleContext, next: object
    ) -> PromptAssembly:
        await gate.wait()
        return assembly

    prompt = SystemPrompt()
    registration = prompt.on_assemble(slow_listener)  # type: ignore[arg-type]
    provider = ScriptedProvider([Reply.text("answer")])
    async with open_agent(system_prompt=prompt, provider=provider) as agent:
        agent.followup("keep me")
        await trio.testing.wait_all_tasks_blocked()
        agent.cancel(keep_inbox=True)
        await agent.when_idle()
        assert agent.inbox.statistics().next_turn == 1
        registration.dispose()
        agent.steer("wake up")
        await agent.when_idle()
    assert [m.text for m in provider.requests[0].messages] == ["keep me", "wake up"]


async def test_runtime_context_render_failure_ends_the_turn_before_any_step() -> None:
    prompt = SystemPrompt()
    prompt.context(PromptContext(name="sandbox:policy", order=110, text="mode {{modee}}"))
    provider = ScriptedProvider([Reply.text("never")])
    async with open_agent(system_prompt=prompt, provider=provider) as agent:
        agent.followup("hi")
        await agent.when_idle()
    assert types(agent.session) == ["turn/start", "turn/end"]
    error = data_of(agent.session, "turn/end")[0].reason.error
    assert "modee" in error.message and "sandbox:policy" in error.message
    assert provider.requests == []


async def test_disposal_while_assembly_is_blocked_aborts_disposed_with_no_step() -> None:
    gate = trio.Event()

    async def slow_listener(
        assembly: PromptAssembly, ctx: AssembleContext, next: object
    ) -> PromptAssembly:
        await gate.wait()
        return assembly

    prompt = SystemPrompt()
    prompt.on_assemble(slow_listener)  # type: ignore[arg-type]
    provider = ScriptedProvider([Reply.text("never")])
    async with open_agent(system_prompt=prompt, provider=provider) as agent:
        agent.followup("hi")
        await trio.testing.wait_all_tasks_blocked()
    assert types(agent.session) == ["turn/start", "turn/end"]
    end = data_of(agent.session, "turn/end")[0]
    assert end.reason.reason is not None and end.reason.reason.kind == "disposed"
    assert provider.requests == []


async def test_disposal_mid_stream_saves_the_streamed_prefix_as_interrupted() -> None:
    provider = ScriptedProvider([Reply.hang("half an ans")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("hi")
        await trio.testing.wait_all_tasks_blocked()
    message = data_of(agent.session, "assistant/message")[0]
    assert (message.interrupted, message.message.text) == (True, "half an ans")
    assert types(agent.session)[-3:] == ["assistant/message", "step/end", "turn/end"]


async def test_cancel_before_anything_streamed_writes_no_assistant_message() -> None:
    provider = ScriptedProvider([Reply.hang("")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("hi")
        await trio.testing.wait_all_tasks_blocked()
        agent.cancel()
        await agent.when_idle()
    assert "assistant/message" not in types(agent.session)
    assert types(agent.session)[-2:] == ["step/end", "turn/end"]
    assert turn_end_kinds(agent.session) == ["aborted"]


async def test_failing_pre_step_listener_ends_the_turn_with_its_message() -> None:
    async def broken(proposal: StepProposal, next: PreStepNext) -> StepDecision:
        raise RuntimeError("listener exploded")

    provider = ScriptedProvider([Reply.text("never"), Reply.text("later")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        registration = agent.on_pre_step(broken)
        agent.followup("hi")
        await agent.when_idle()
        registration.dispose()
        agent.followup("again")
        await agent.when_idle()
    error = data_of(agent.session, "turn/end")[0].reason.error
    assert "listener exploded" in error.message
    assert turn_end_kinds(agent.session) == ["error", "completed", "completed"]
    assert [d.content[0].text for d in data_of(agent.session, "user/message")] == ["hi", "again"]
