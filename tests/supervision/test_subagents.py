"""Subagents: spawn and fork, the tools that expose them, child actors and delegation context."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing

from actors.agent import Agent, Tool, open_agent
from actors.context import Policies
from actors.prompt import (
    PERSONA_ORDER,
    PERSONA_SECTION,
    AssembleContext,
    PromptAssembly,
    PromptContext,
    PromptSection,
    SystemPrompt,
    ToolSchema,
)
from actors.providers import Provider, Reply, ScriptedProvider, ToolCall
from actors.session import MemoryStore
from actors.session.events import TurnEndReason
from supervision import (
    DELEGATION_CONTEXT,
    ForkProvider,
    SpawnProvider,
    Subagents,
    open_subagents,
)
from tests.agent.helpers import data_of, turn_end_kinds
from tests.supervision.helpers import GatedProvider, WatchedProvider


@asynccontextmanager
async def parent_and_subagents(
    prompt: SystemPrompt,
    parent_provider: Provider,
    child_provider: Provider,
    *,
    setup: Callable[[Agent], None] | None = None,
    child_tools: Sequence[Tool] = (),
) -> AsyncIterator[tuple[Agent, Subagents]]:
    async with (
        open_agent(system_prompt=prompt, provider=parent_provider, store=MemoryStore()) as parent,
        open_subagents(
            parent, system_prompt=prompt, provider=child_provider, setup=setup, tools=child_tools
        ) as subagents,
    ):
        yield parent, subagents


def delegate(tool: str, prompt: str, call_id: str = "c1", **extra: Any) -> Reply:
    return Reply.tool_calls(
        [ToolCall(id=call_id, name=tool, arguments={"prompt": prompt, **extra})]
    )


async def assemble_for(prompt: SystemPrompt, agent: Agent) -> PromptAssembly:
    return await prompt.assemble(AssembleContext(scope=agent.scope, agent=agent))


def tool_named(assembly: PromptAssembly, name: str) -> ToolSchema | None:
    return next((tool for tool in assembly.tools if tool.name == name), None)


def texts(messages: Sequence[Any]) -> list[str]:
    return [message.text for message in messages]


async def test_spawned_child_starts_from_a_fresh_session(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = SystemPrompt()
    parent_provider = ScriptedProvider(
        [Reply.text("hello"), delegate("subagent", "count the files"), Reply.text("done")]
    )
    child_provider = ScriptedProvider([Reply.text("42 files")])
    async with parent_and_subagents(prompt, parent_provider, child_provider) as (parent, subs):
        subs.activate(SpawnProvider())
        parent.followup("first")
        await parent.when_idle()
        parent.followup("second")
        await parent.when_idle()
    child_messages = texts(child_provider.requests[0].messages)
    assert child_messages[0] == "count the files"
    assert "first" not in child_messages and "hello" not in child_messages


async def test_forked_child_starts_with_the_parents_completed_turns_only(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = SystemPrompt()
    parent_provider = ScriptedProvider(
        [Reply.text("answer one"), delegate("subagent_fork", "check it"), Reply.text("done")]
    )
    child_provider = ScriptedProvider([Reply.text("checked")])
    async with parent_and_subagents(prompt, parent_provider, child_provider) as (parent, subs):
        subs.activate(ForkProvider())
        parent.followup("first")
        await parent.when_idle()
        parent.followup("second")
        await parent.when_idle()
    child_messages = texts(child_provider.requests[0].messages)
    assert child_messages[:3] == ["first", "answer one", "check it"]
    assert "second" not in child_messages


async def test_fork_tool_says_the_child_inherits_the_conversation(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = SystemPrompt()
    async with parent_and_subagents(prompt, ScriptedProvider([]), ScriptedProvider([])) as (
        parent,
        subs,
    ):
        subs.activate(ForkProvider())
        tool = tool_named(await assemble_for(prompt, parent), "subagent_fork")
    assert tool is not None
    assert "inherits this conversation's completed turns" in tool.description
    assert "not the turn in progress" in tool.description
    assert "state only what is new" in tool.parameters["properties"]["prompt"]["description"]


async def test_spawn_tool_says_the_child_does_not_see_the_conversation(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = SystemPrompt()
    async with parent_and_subagents(prompt, ScriptedProvider([]), ScriptedProvider([])) as (
        parent,
        subs,
    ):
        subs.activate(SpawnProvider())
        tool = tool_named(await assemble_for(prompt, parent), "subagent")
    assert tool is not None
    assert "does not see this conversation" in tool.description
    assert (
        "does not see this conversation" in tool.parameters["properties"]["prompt"]["description"]
    )


async def test_child_is_an_actor_under_the_parents_supervisor_in_a_child_scope(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = SystemPrompt()
    parent_provider = ScriptedProvider([delegate("subagent", "work"), Reply.text("done")])
    child_provider = GatedProvider(text="worked")
    async with parent_and_subagents(prompt, parent_provider, child_provider) as (parent, subs):
        subs.activate(SpawnProvider())
        parent.followup("go")
        await child_provider.wait_requests(1)
        (child,) = subs.supervisor.children()
        assert child.spec.restart == "temporary"
        assert child.value.scope.parent is parent.scope
        child_provider.gate.set()
        await parent.when_idle()
        assert subs.supervisor.children() == []
    assert subs.statistics().completed == 1


async def test_cancelling_the_parents_turn_aborts_the_childs_turn_with_cause_parent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = SystemPrompt()
    parent_provider = ScriptedProvider([delegate("subagent", "work forever")])
    child_provider = WatchedProvider(script=[Reply.hang("partial")])
    async with parent_and_subagents(prompt, parent_provider, child_provider) as (parent, subs):
        subs.activate(SpawnProvider())
        parent.followup("go")
        await child_provider.wait_requests(1)
        child_agent = subs.supervisor.children()[0].value
        parent.cancel()
        await parent.when_idle()
        assert subs.supervisor.children() == []
    assert data_of(child_agent.session, "turn/end")[-1].reason == TurnEndReason.aborted("parent")
    assert data_of(parent.session, "turn/end")[-1].reason == TurnEndReason.aborted("user")
    assert data_of(parent.session, "tool/result")[0].error.code == "cancelled"
    assert subs.statistics().aborted == 1


async def test_child_inherits_parent_scoped_registrations(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = SystemPrompt()
    parent_provider = ScriptedProvider([delegate("subagent", "work"), Reply.text("done")])
    child_provider = ScriptedProvider([Reply.text("worked")])
    async with parent_and_subagents(prompt, parent_provider, child_provider) as (parent, subs):
        prompt.section(
            PromptSection(name="project:rules", order=50, text="Never push to main."),
            scope=parent.scope,
        )
        subs.activate(SpawnProvider())
        parent.followup("go")
        await parent.when_idle()
    system = child_provider.requests[0].system
    assert system is not None and "Never push to main." in system


async def test_child_persona_shadows_without_evaluating_the_displaced_provider(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = SystemPrompt(persona="deployment persona")
    evaluated_for: list[object] = []

    def parent_persona(ctx: AssembleContext) -> str:
        evaluated_for.append(ctx.agent)
        return "parent persona"

    def child_persona(child: Agent) -> None:
        section = PromptSection(name=PERSONA_SECTION, order=PERSONA_ORDER, text="child persona")
        prompt.section(section, scope=child.scope)

    parent_provider = ScriptedProvider([delegate("subagent", "work"), Reply.text("done")])
    child_provider = ScriptedProvider([Reply.text("worked")])
    async with parent_and_subagents(
        prompt, parent_provider, child_provider, setup=child_persona
    ) as (parent, subs):
        prompt.section(
            PromptSection(name=PERSONA_SECTION, order=PERSONA_ORDER, text=parent_persona),
            scope=parent.scope,
        )
        subs.activate(SpawnProvider())
        parent.followup("go")
        await parent.when_idle()
    system = child_provider.requests[0].system
    assert system is not None and "child persona" in system
    assert "parent persona" not in system and "deployment persona" not in system
    assert evaluated_for and all(agent is parent for agent in evaluated_for)


async def test_childs_final_text_returns_to_the_parent_as_the_tool_result(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = SystemPrompt()
    parent_provider = ScriptedProvider([delegate("subagent", "count"), Reply.text("done")])
    child_provider = ScriptedProvider(
        [
            Reply.tool_calls([ToolCall(id="l1", name="ls")], text="Let me look."),
            Reply.text("42 files"),
        ]
    )

    async def ls(arguments: dict[str, Any] | str, call: object) -> str:
        return "a.py b.py"

    ls_tool = Tool(name="ls", description="List files.", parameters={"type": "object"}, execute=ls)
    async with parent_and_subagents(
        prompt, parent_provider, child_provider, child_tools=[ls_tool]
    ) as (parent, subs):
        subs.activate(SpawnProvider())
        parent.followup("go")
        await parent.when_idle()
    (result,) = data_of(parent.session, "tool/result")
    assert (result.content, result.is_error) == ("42 files", False)
    assert texts(parent_provider.requests[1].messages)[-1] == "42 files"


async def test_child_turn_that_fails_gives_an_error_tool_result(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = SystemPrompt()
    parent_provider = ScriptedProvider([delegate("subagent", "count"), Reply.text("done")])
    child_provider = ScriptedProvider([Reply.failure("unauthorized", "bad key", status=401)])
    async with parent_and_subagents(prompt, parent_provider, child_provider) as (parent, subs):
        subs.activate(SpawnProvider())
        parent.followup("go")
        await parent.when_idle()
    (result,) = data_of(parent.session, "tool/result")
    assert result.is_error
    assert "ended its turn error: bad key" in result.content
    assert turn_end_kinds(parent.session) == ["completed"]
    assert subs.statistics().failed == 1


async def test_tool_call_without_a_prompt_gives_an_error_naming_the_argument(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = SystemPrompt()
    parent_provider = ScriptedProvider(
        [
            Reply.tool_calls([ToolCall(id="c1", name="subagent", arguments={"label": "x"})]),
            Reply.text("done"),
        ]
    )
    async with parent_and_subagents(prompt, parent_provider, ScriptedProvider([])) as (
        parent,
        subs,
    ):
        subs.activate(SpawnProvider())
        parent.followup("go")
        await parent.when_idle()
    (result,) = data_of(parent.session, "tool/result")
    assert result.is_error and result.error is not None
    assert result.error.code == "invalid_arguments"
    assert "'subagent': missing required parameter 'prompt'" in result.content


async def test_delegation_context_lists_running_delegations_and_goes_when_none_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = SystemPrompt()
    parent_provider = ScriptedProvider(
        [
            Reply.tool_calls(
                [
                    ToolCall(
                        id="c1", name="subagent", arguments={"prompt": "a", "label": "count files"}
                    ),
                    ToolCall(
                        id="c2", name="subagent", arguments={"prompt": "b", "label": "read docs"}
                    ),
                ]
            ),
            Reply.text("done"),
        ]
    )
    child_provider = GatedProvider(text="ok")
    async with parent_and_subagents(prompt, parent_provider, child_provider) as (parent, subs):
        subs.activate(SpawnProvider())
        parent.followup("go")
        await child_provider.wait_requests(2)
        contexts = (await assemble_for(prompt, parent)).contexts
        (delegation,) = [c for c in contexts if c.name == DELEGATION_CONTEXT]
        assert "count files" in delegation.text and "read docs" in delegation.text
        assert sorted(d.label for d in subs.delegations()) == ["count files", "read docs"]
        for request in child_provider.requests:
            own_prompt, *_, snapshot = texts(request.messages)
            assert {"a": "count files", "b": "read docs"}[own_prompt] in snapshot
        child_provider.gate.set()
        await parent.when_idle()
        assert (await assemble_for(prompt, parent)).contexts == []
    assert prompt.statistics().contexts == 0


async def test_delegation_context_is_ordered_at_120_after_the_policy_contexts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = SystemPrompt()
    Policies().install(prompt)
    prompt.context(PromptContext(name="test:119", order=119, text="just before"))
    prompt.context(PromptContext(name="test:121", order=121, text="just after"))
    parent_provider = ScriptedProvider([delegate("subagent", "work"), Reply.text("done")])
    child_provider = GatedProvider(text="ok")
    async with parent_and_subagents(prompt, parent_provider, child_provider) as (parent, subs):
        subs.activate(SpawnProvider())
        parent.followup("go")
        await child_provider.wait_requests(1)
        contexts = (await assemble_for(prompt, parent)).contexts
        child_provider.gate.set()
        await parent.when_idle()
    assert [c.name for c in contexts] == [
        "sandbox:policy",
        "approval:policy",
        "test:119",
        DELEGATION_CONTEXT,
        "test:121",
    ]


async def test_subagent_tool_is_absent_before_activation_and_present_after(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = SystemPrompt()
    async with parent_and_subagents(prompt, ScriptedProvider([]), ScriptedProvider([])) as (
        parent,
        subs,
    ):
        assert tool_named(await assemble_for(prompt, parent), "subagent") is None
        subs.activate(SpawnProvider())
        assert tool_named(await assemble_for(prompt, parent), "subagent") is not None
        assert subs.statistics().tools == ("subagent",)


async def test_subagent_tool_is_absent_after_its_provider_unloads(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = SystemPrompt()
    async with parent_and_subagents(prompt, ScriptedProvider([]), ScriptedProvider([])) as (
        parent,
        subs,
    ):
        activation = subs.activate(ForkProvider())
        activation.dispose()
        assert tool_named(await assemble_for(prompt, parent), "subagent_fork") is None
        assert "subagent_fork" not in parent.tools.names()


async def test_subagent_tool_is_reworded_from_a_replacement_provider(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = SystemPrompt()
    async with parent_and_subagents(prompt, ScriptedProvider([]), ScriptedProvider([])) as (
        parent,
        subs,
    ):
        subs.activate(SpawnProvider(tool_name="delegate")).dispose()
        subs.activate(ForkProvider(tool_name="delegate"))
        tool = tool_named(await assemble_for(prompt, parent), "delegate")
    assert tool is not None and "inherits this conversation" in tool.description
    assert "state only what is new" in tool.parameters["properties"]["prompt"]["description"]


async def test_leaving_open_subagents_removes_its_tools(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = SystemPrompt()
    async with open_agent(system_prompt=prompt, provider=ScriptedProvider([])) as parent:
        async with open_subagents(
            parent, system_prompt=prompt, provider=ScriptedProvider([])
        ) as subs:
            subs.activate(SpawnProvider())
        assert parent.tools.names() == []
        assert not subs.supervisor.running
