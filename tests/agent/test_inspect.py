"""`Agent.inspect_next_step()`: a true dry run whose entries name the scope they came from."""

from __future__ import annotations

import hashlib

import pytest

from actors.agent import Tool, open_agent
from actors.agent.decisions import PreStepNext, StepDecision, StepProposal
from actors.agent.inspect import GLOBAL_SCOPE, LISTENER_SCOPE
from actors.prompt import (
    PERSONA_SECTION,
    AssembleContext,
    AssembledSection,
    NextListener,
    PromptAssembly,
    PromptContext,
    PromptError,
    PromptSection,
    SystemPrompt,
)
from actors.providers import Reply, ScriptedProvider


async def _echo(arguments: dict[str, object] | str, call: object) -> str:
    return "ok"


ECHO = Tool(name="echo", description="echo", parameters={"type": "object"}, execute=_echo)


async def test_inspect_logs_nothing_calls_no_provider_and_runs_no_pre_step_listener() -> None:
    calls: list[StepProposal] = []

    async def spy(proposal: StepProposal, next: PreStepNext) -> StepDecision:
        calls.append(proposal)
        return await next()

    provider = ScriptedProvider([])
    async with open_agent(system_prompt=SystemPrompt(persona="p"), provider=provider) as agent:
        agent.on_pre_step(spy)
        agent.inject("queued for the next step")
        before = agent.session.to_json()
        inspection = await agent.inspect_next_step()
        assert agent.session.to_json() == before
    assert provider.requests == []
    assert calls == []
    assert inspection.header_changed is True


async def test_sections_name_their_scope_so_per_agent_shadowing_is_visible() -> None:
    prompt = SystemPrompt(persona="global persona")
    async with open_agent(system_prompt=prompt, provider=ScriptedProvider([])) as agent:
        prompt.section(
            PromptSection(name=PERSONA_SECTION, order=0, text="agent persona"), scope=agent.scope
        )
        inspection = await agent.inspect_next_step()
    persona = next(s for s in inspection.sections if s.name == PERSONA_SECTION)
    assert persona.scope == agent.scope.name
    assert persona.shadows == (GLOBAL_SCOPE,)
    assert persona.text == "agent persona"
    assert persona.bytes == len(b"agent persona")
    assert persona.sha256 == hashlib.sha256(b"agent persona").hexdigest()
    identity = inspection.sections[0]
    assert identity.scope == GLOBAL_SCOPE and identity.shadows == ()


async def test_tools_contexts_and_variables_carry_their_origin() -> None:
    prompt = SystemPrompt()
    prompt.context(PromptContext(name="sandbox", order=5, text="model is {{model}}"))
    async with open_agent(
        system_prompt=prompt, provider=ScriptedProvider([]), tools=[ECHO]
    ) as agent:
        inspection = await agent.inspect_next_step()
    assert [(t.name, t.scope) for t in inspection.tools] == [("echo", agent.scope.name)]
    assert [(c.name, c.scope, c.text) for c in inspection.contexts] == [
        ("sandbox", GLOBAL_SCOPE, "model is m")
    ]
    assert inspection.variables["model"] == "m"


async def test_a_section_added_by_a_listener_is_labelled_as_such() -> None:
    async def add(assembly: PromptAssembly, ctx: AssembleContext, next: NextListener) -> object:
        assembly.sections.append(AssembledSection(name="extra", text="added"))
        return await next()

    prompt = SystemPrompt()
    prompt.on_assemble(add)  # type: ignore[arg-type]
    async with open_agent(system_prompt=prompt, provider=ScriptedProvider([])) as agent:
        inspection = await agent.inspect_next_step()
    extra = next(s for s in inspection.sections if s.name == "extra")
    assert (extra.scope, extra.order) == (LISTENER_SCOPE, None)


async def test_inspected_header_is_what_the_next_step_sends() -> None:
    provider = ScriptedProvider([Reply.text("a"), Reply.text("b")])
    async with open_agent(
        system_prompt=SystemPrompt(persona="p"), provider=provider, tools=[ECHO]
    ) as agent:
        first = await agent.inspect_next_step()
        agent.followup("hi")
        await agent.when_idle()
        second = await agent.inspect_next_step()
    sent = provider.requests[0]
    assert first.header.system == sent.system
    assert first.header.tools == sent.tools
    assert first.header_changed is True
    assert second.header == first.header
    assert second.header_changed is False


async def test_a_failing_assembly_raises_prompt_error_naming_the_section() -> None:
    def broken(ctx: AssembleContext) -> str:
        raise RuntimeError("boom")

    prompt = SystemPrompt()
    prompt.section(PromptSection(name="fragile", order=1, text=broken))
    async with open_agent(system_prompt=prompt, provider=ScriptedProvider([])) as agent:
        with pytest.raises(PromptError, match="fragile"):
            await agent.inspect_next_step()
