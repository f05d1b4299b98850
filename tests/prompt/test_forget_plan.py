"""`SystemPrompt.forget_plan`: an idle agent keeps no assembly plan in the prompt's cache."""

from __future__ import annotations

from actors.agent import AgentOptions
from actors.prompt import AssembleContext, PromptSection, SystemPrompt
from actors.providers import Reply, ScriptedProvider
from actors.scope import Scope
from supervision import open_runtime


async def test_a_forgotten_plan_is_rebuilt_and_assembles_the_same() -> None:
    prompt = SystemPrompt()
    scope = Scope(name="agent")
    prompt.section(PromptSection(name="mine", order=10, text="in scope"), scope=scope)
    first = await prompt.assemble(AssembleContext(scope=scope))
    assert scope in prompt._plans._plans
    prompt.forget_plan(scope)
    assert scope not in prompt._plans._plans
    again = await prompt.assemble(AssembleContext(scope=scope))
    assert again.sections == first.sections
    prompt.forget_plan(scope)
    prompt.forget_plan(scope)  # nothing cached: nothing happens


async def test_a_hibernating_agent_leaves_no_plan_cached() -> None:
    prompt = SystemPrompt()
    provider = ScriptedProvider([Reply.text("a")])
    async with open_runtime(system_prompt=prompt, providers={"default": provider}) as runtime:
        agent = (await runtime.start_agent(options=AgentOptions(model="m", hibernate=True))).value
        await agent.run("hello")
        assert agent.session.hibernating
        assert agent.scope not in prompt._plans._plans
