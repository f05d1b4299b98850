"""Policies: sandbox and approval modes change mid-session as runtime contexts, not system text."""

from __future__ import annotations

from typing import Any

import pytest

from actors.agent import Tool, open_agent
from actors.context import (
    APPROVAL_TEXTS,
    SANDBOX_TEXTS,
    ContextPluginError,
    Policies,
)
from actors.messages import PluginSource
from actors.prompt import AssembleContext, PromptContext, SystemPrompt
from actors.providers import Reply, ScriptedProvider, ToolCall
from tests.agent.helpers import data_of
from tests.context.helpers import entered, from_plugin, run_turn

PREAMBLE = "Current runtime context. This snapshot supersedes earlier runtime-context snapshots."


def snapshot(sandbox: str, approval: str) -> str:
    return f"{PREAMBLE}\n\n{SANDBOX_TEXTS[sandbox]}\n\n{APPROVAL_TEXTS[approval]}"


async def test_policy_changes_land_as_snapshots_while_the_system_text_stays_the_same() -> None:
    prompt = SystemPrompt(persona="You help.")
    policies = Policies()
    policies.install(prompt)
    provider = ScriptedProvider([Reply.text("a"), Reply.text("b"), Reply.text("c")])
    async with open_agent(system_prompt=prompt, provider=provider) as agent:
        await run_turn(agent, "one")
        policies.set_sandbox("read-only")
        await run_turn(agent, "two")
        policies.set_approval("never")
        await run_turn(agent, "three")
    snapshots = from_plugin(entered(agent.session), "runtime-context")
    assert [m.text for m in snapshots] == [
        snapshot("workspace-write", "on-request"),
        snapshot("read-only", "on-request"),
        snapshot("read-only", "never"),
    ]
    assert {m.source for m in snapshots} == {
        PluginSource(
            plugin="runtime-context",
            form="snapshot",
            sections=("sandbox:policy", "approval:policy"),
        )
    }
    headers = data_of(agent.session, "request/header")
    assert [header.reason for header in headers] == ["initial"]
    assert {request.system for request in provider.requests} == {headers[0].header.system}
    assert "Sandbox policy" not in headers[0].header.system


async def test_a_change_made_during_a_step_lands_in_the_next_step() -> None:
    prompt = SystemPrompt()
    policies = Policies(sandbox="danger-full-access")

    async def lock_down(arguments: dict[str, Any] | str, call: object) -> str:
        policies.set_sandbox("read-only")
        return "locked"

    tool = Tool(name="lock", description="d", parameters={"type": "object"}, execute=lock_down)
    provider = ScriptedProvider(
        [Reply.tool_calls([ToolCall(id="1", name="lock")]), Reply.text("done")]
    )
    async with open_agent(system_prompt=prompt, provider=provider, tools=[tool]) as agent:
        policies.install(prompt, scope=agent.scope)
        await run_turn(agent, "go")
    last = provider.requests[1].messages[-1]
    assert last.text == snapshot("read-only", "on-request")
    assert provider.requests[0].system == provider.requests[1].system


async def test_policies_are_runtime_contexts_at_orders_110_and_115() -> None:
    prompt = SystemPrompt()
    Policies().install(prompt)
    prompt.context(PromptContext(name="between", order=112, text="x"))
    assembly = await prompt.assemble(AssembleContext())
    assert [(c.name, c.text) for c in assembly.contexts] == [
        ("sandbox:policy", SANDBOX_TEXTS["workspace-write"]),
        ("between", "x"),
        ("approval:policy", APPROVAL_TEXTS["on-request"]),
    ]
    assert [s.name for s in assembly.sections] == ["harness:identity", "deployment:persona"]


async def test_disposing_the_registration_removes_both_contexts() -> None:
    prompt = SystemPrompt()
    registration = Policies().install(prompt)
    registration.dispose()
    assert (await prompt.assemble()).contexts == []


def test_an_unknown_mode_is_refused_naming_it_and_the_known_ones() -> None:
    policies = Policies()
    with pytest.raises(ContextPluginError, match=r"'yolo'.*read-only, workspace-write"):
        policies.set_sandbox("yolo")  # type: ignore[arg-type]
    with pytest.raises(ContextPluginError, match="unknown approval mode 'sometimes'"):
        Policies(approval="sometimes")  # type: ignore[arg-type]
    assert policies.sandbox == "workspace-write"
