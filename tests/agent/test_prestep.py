"""Pre-step listeners see the claimed messages and the proposed context, and decide."""

from __future__ import annotations

from actors.agent import Enter, Reject, StepProposal, Tool, open_agent
from actors.agent.decisions import PreStepNext, StepDecision
from actors.messages import Message, PluginSource
from actors.prompt import PromptContext, SystemPrompt
from actors.providers import Reply, ScriptedProvider, ToolCall
from tests.agent.helpers import turn_end_kinds, types


async def test_listener_sees_claimed_messages_and_proposed_context() -> None:
    seen: list[StepProposal] = []

    async def spy(proposal: StepProposal, next: PreStepNext) -> StepDecision:
        seen.append(proposal)
        return await next()

    prompt = SystemPrompt()
    prompt.context(PromptContext(name="sandbox:policy", order=110, text="read-only"))
    async with open_agent(
        system_prompt=prompt, provider=ScriptedProvider([Reply.text("a")])
    ) as agent:
        agent.on_pre_step(spy)
        agent.followup("hi")
        await agent.when_idle()
    assert [m.text for m in seen[0].messages] == ["hi"]
    assert seen[0].context is not None and seen[0].context.text.endswith("read-only")
    assert (seen[0].turn, seen[0].step) == (0, 0)


async def test_listener_can_rewrite_and_reorder_messages() -> None:
    async def rewrite(proposal: StepProposal, next: PreStepNext) -> StepDecision:
        decision = await next()
        assert isinstance(decision, Enter)
        note = Message.user("plugin note", PluginSource(plugin="notes"))
        return Enter(messages=[note, *reversed(decision.messages)])

    provider = ScriptedProvider([Reply.text("a")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.on_pre_step(rewrite)
        agent.steer("first")
        agent.steer("second")
        await agent.when_idle()
    assert [m.text for m in provider.requests[0].messages] == ["plugin note", "second", "first"]


async def test_rejecting_listener_ends_the_turn_blocked_without_a_step() -> None:
    async def refuse(proposal: StepProposal, next: PreStepNext) -> StepDecision:
        return Reject(reason="policy")

    provider = ScriptedProvider([Reply.text("never")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.on_pre_step(refuse)
        agent.followup("hi")
        await agent.when_idle()
    assert types(agent.session) == ["turn/start", "turn/end"]
    assert turn_end_kinds(agent.session) == ["blocked"]
    assert provider.requests == []


async def test_listeners_nest_in_registration_order() -> None:
    order: list[str] = []

    def named(name: str):  # type: ignore[no-untyped-def]
        async def listener(proposal: StepProposal, next: PreStepNext) -> StepDecision:
            order.append(f"{name} before")
            decision = await next()
            order.append(f"{name} after")
            return decision

        return listener

    async with open_agent(
        system_prompt=SystemPrompt(), provider=ScriptedProvider([Reply.text("a")])
    ) as agent:
        agent.on_pre_step(named("outer"))
        agent.on_pre_step(named("inner"))
        agent.followup("hi")
        await agent.when_idle()
    assert order == ["outer before", "inner before", "inner after", "outer after"]


async def test_disposed_listener_is_no_longer_called() -> None:
    calls: list[int] = []

    async def counting(proposal: StepProposal, next: PreStepNext) -> StepDecision:
        calls.append(proposal.turn)
        return await next()

    provider = ScriptedProvider([Reply.text("a"), Reply.text("b")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        registration = agent.on_pre_step(counting)
        agent.followup("one")
        await agent.when_idle()
        registration.dispose()
        agent.followup("two")
        await agent.when_idle()
    assert calls == [0]


async def test_listener_is_consulted_for_every_proposed_step_of_a_turn() -> None:
    seen: list[tuple[int, int, list[str]]] = []

    async def spy(proposal: StepProposal, next: PreStepNext) -> StepDecision:
        seen.append((proposal.turn, proposal.step, [m.text for m in proposal.messages]))
        return await next()

    async def noop(arguments: dict[str, object] | str, call: object) -> str:
        return "ok"

    provider = ScriptedProvider(
        [Reply.tool_calls([ToolCall(id="1", name="noop")]), Reply.text("done")]
    )
    tool = Tool(name="noop", description="d", parameters={}, execute=noop)
    async with open_agent(system_prompt=SystemPrompt(), provider=provider, tools=[tool]) as agent:
        agent.on_pre_step(spy)
        agent.followup("hi")
        await agent.when_idle()
    assert seen == [(0, 0, ["hi"]), (0, 1, [])]


async def test_rejecting_a_later_step_ends_the_turn_blocked_after_the_tool_step() -> None:
    async def refuse_second(proposal: StepProposal, next: PreStepNext) -> StepDecision:
        return Reject(reason="enough") if proposal.step == 1 else await next()

    async def noop(arguments: dict[str, object] | str, call: object) -> str:
        return "ok"

    provider = ScriptedProvider(
        [Reply.tool_calls([ToolCall(id="1", name="noop")]), Reply.text("never")]
    )
    tool = Tool(name="noop", description="d", parameters={}, execute=noop)
    async with open_agent(system_prompt=SystemPrompt(), provider=provider, tools=[tool]) as agent:
        agent.on_pre_step(refuse_second)
        agent.followup("hi")
        await agent.when_idle()
    assert types(agent.session)[-3:] == ["tool/result", "step/end", "turn/end"]
    assert turn_end_kinds(agent.session) == ["blocked"]
    assert len(provider.requests) == 1
