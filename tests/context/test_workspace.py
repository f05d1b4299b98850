"""Workspace instructions: AGENTS.md from the root to touched paths, bounded, on change only."""

from __future__ import annotations

from pathlib import Path, PurePath

import pytest

from actors.agent import Agent, Enter, StepProposal, open_agent
from actors.agent.decisions import PreStepNext, StepDecision
from actors.context import ContextPluginError, InstructionFile, WorkspaceInstructions
from actors.messages import Message, PluginSource, UserSource
from actors.prompt import PromptContext, SystemPrompt
from actors.providers import Reply, ScriptedProvider, ToolCall
from actors.session.events import UserMessage
from tests.context.helpers import (
    empty_turns,
    entered,
    from_plugin,
    labels,
    reject_turns,
    run_turn,
    sections,
    tool,
)

PLUGIN = "workspace-instructions"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "AGENTS.md").write_text("root rules")
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "AGENTS.md").write_text("pkg rules")
    (tmp_path / "pkg" / "sub" / "AGENTS.md").write_text("sub rules")
    (tmp_path / "pkg" / "sub" / "mod.py").write_text("x = 1")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "AGENTS.md").write_text("other rules")
    return tmp_path


def instructions(agent: Agent) -> list[Message]:
    return from_plugin(entered(agent.session), PLUGIN)


async def test_root_instructions_go_after_the_claimed_batch_and_before_the_runtime_context(
    workspace: Path,
) -> None:
    prompt = SystemPrompt()
    prompt.context(PromptContext(name="sandbox:policy", order=110, text="read-only"))
    provider = ScriptedProvider([Reply.text("a")])
    async with open_agent(system_prompt=prompt, provider=provider) as agent:
        WorkspaceInstructions(root=workspace).install(agent)
        agent.steer("one")
        agent.steer("two")
        await agent.when_idle()
    assert labels(provider.requests[0].messages) == [
        "user:one",
        "user:two",
        PLUGIN,
        "runtime-context",
    ]
    [message] = instructions(agent)
    assert message.text.endswith("## AGENTS.md\n\nroot rules")
    assert message.source == PluginSource(plugin=PLUGIN, form="snapshot", sections=("AGENTS.md",))


async def test_instructions_of_directories_touched_by_tools_are_composed_root_first(
    workspace: Path,
) -> None:
    provider = ScriptedProvider(
        [
            Reply.tool_calls([ToolCall(id="1", name="read", arguments={"path": "pkg/sub/mod.py"})]),
            Reply.text("done"),
        ]
    )
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, tools=[tool("read")]
    ) as agent:
        WorkspaceInstructions(root=workspace).install(agent)
        await run_turn(agent, "read it")
    first, second = instructions(agent)
    assert sections(first) == ("AGENTS.md",)
    assert sections(second) == (
        "AGENTS.md",
        "pkg/AGENTS.md",
        "pkg/sub/AGENTS.md",
    )
    assert (
        second.text.index("root rules")
        < second.text.index("pkg rules")
        < second.text.index("sub rules")
    )
    assert "other rules" not in second.text


async def test_a_touched_directory_contributes_its_own_instructions(workspace: Path) -> None:
    provider = ScriptedProvider(
        [
            Reply.tool_calls([ToolCall(id="1", name="ls", arguments={"path": "other"})]),
            Reply.text("done"),
        ]
    )
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, tools=[tool("ls")]
    ) as agent:
        WorkspaceInstructions(root=workspace).install(agent)
        await run_turn(agent, "list it")
    assert sections(instructions(agent)[-1]) == ("AGENTS.md", "other/AGENTS.md")


async def test_configured_path_keys_are_the_ones_tracked(workspace: Path) -> None:
    provider = ScriptedProvider(
        [
            Reply.tool_calls(
                [
                    ToolCall(id="1", name="edit", arguments={"target": "pkg/x.py"}),
                    ToolCall(id="2", name="edit", arguments={"path": "other/y.py"}),
                ]
            ),
            Reply.text("done"),
        ]
    )
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, tools=[tool("edit")]
    ) as agent:
        WorkspaceInstructions(root=workspace, path_keys={"target"}).install(agent)
        await run_turn(agent, "edit")
    assert sections(instructions(agent)[-1]) == ("AGENTS.md", "pkg/AGENTS.md")


def test_paths_outside_the_workspace_are_ignored(workspace: Path) -> None:
    plugin = WorkspaceInstructions(root=workspace)
    arguments = '{"path": "../elsewhere/a.py", "file_path": ["/etc/passwd", "pkg/../pkg/b.py", 3]}'
    assert plugin.paths_of(arguments) == [PurePath("pkg/b.py")]
    assert plugin.paths_of("not json") == []


async def test_instructions_are_reinjected_only_when_their_content_changes(workspace: Path) -> None:
    provider = ScriptedProvider([Reply.text("a"), Reply.text("b"), Reply.text("c")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        WorkspaceInstructions(root=workspace).install(agent)
        await run_turn(agent, "one")
        await run_turn(agent, "two")
        (workspace / "AGENTS.md").write_text("new root rules")
        await run_turn(agent, "three")
    assert [m.text.rsplit("\n\n", 1)[-1] for m in instructions(agent)] == [
        "root rules",
        "new root rules",
    ]
    assert labels(provider.requests[1].messages)[-1] == "user:two"


async def test_removed_instructions_are_cleared_once(workspace: Path) -> None:
    provider = ScriptedProvider([Reply.text("a"), Reply.text("b"), Reply.text("c")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        WorkspaceInstructions(root=workspace).install(agent)
        await run_turn(agent, "one")
        (workspace / "AGENTS.md").unlink()
        await run_turn(agent, "two")
        await run_turn(agent, "three")
    _, cleared = instructions(agent)
    assert cleared.source == PluginSource(plugin=PLUGIN)
    assert "no AGENTS.md file applies any more" in cleared.text


async def test_an_oversized_file_is_truncated_and_the_text_says_so(workspace: Path) -> None:
    (workspace / "AGENTS.md").write_text("r" * 50)
    provider = ScriptedProvider([Reply.text("a")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        WorkspaceInstructions(root=workspace, max_file_chars=20).install(agent)
        await run_turn(agent, "hi")
    [message] = instructions(agent)
    assert "r" * 20 + "\n\n[AGENTS.md is truncated: only its first 20 characters" in message.text
    assert "r" * 21 not in message.text


def test_files_beyond_the_total_budget_are_cut_then_left_out_and_the_text_says_so(
    workspace: Path,
) -> None:
    plugin = WorkspaceInstructions(root=workspace, max_total_chars=15)
    text = plugin.compose(
        [
            InstructionFile(label="AGENTS.md", text="a" * 10),
            InstructionFile(label="pkg/AGENTS.md", text="b" * 10),
            InstructionFile(label="pkg/sub/AGENTS.md", text="c" * 10),
        ]
    )
    assert "## AGENTS.md\n\naaaaaaaaaa\n\n## pkg/AGENTS.md\n\nbbbbb\n\n" in text
    assert "[pkg/AGENTS.md is truncated: only its first 5 characters are shown" in text
    assert "ccc" not in text
    assert "[pkg/sub/AGENTS.md is left out: the 15-character limit" in text


async def test_instructions_stay_pending_when_the_first_step_is_rejected(workspace: Path) -> None:
    provider = ScriptedProvider([Reply.text("a")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        WorkspaceInstructions(root=workspace).install(agent)
        agent.on_pre_step(reject_turns(0))
        await run_turn(agent, "blocked")
        await run_turn(agent, "admitted")
    assert labels(provider.requests[0].messages) == ["user:admitted", PLUGIN]


async def test_instructions_stay_pending_when_the_first_step_enters_nothing(
    workspace: Path,
) -> None:
    provider = ScriptedProvider([Reply.text("a")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        WorkspaceInstructions(root=workspace).install(agent)
        agent.on_pre_step(empty_turns(0))
        await run_turn(agent, "dropped")
        assert [e.type for e in agent.session.events] == ["turn/start", "turn/end"]
        await run_turn(agent, "admitted")
    assert labels(provider.requests[0].messages) == ["user:admitted", PLUGIN]


async def test_instructions_dropped_by_an_outer_listener_are_offered_again(workspace: Path) -> None:
    async def drop_instructions(proposal: StepProposal, next: PreStepNext) -> StepDecision:
        decision = await next()
        if proposal.turn == 0 and isinstance(decision, Enter):
            return Enter(messages=[m for m in decision.messages if m.source == UserSource()])
        return decision

    provider = ScriptedProvider([Reply.text("a"), Reply.text("b")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.on_pre_step(drop_instructions)
        WorkspaceInstructions(root=workspace).install(agent)
        await run_turn(agent, "one")
        await run_turn(agent, "two")
    assert labels(provider.requests[0].messages) == ["user:one"]
    assert labels(provider.requests[1].messages)[-1] == PLUGIN


async def test_instructions_are_reasserted_after_compaction_replaced_them(workspace: Path) -> None:
    provider = ScriptedProvider([Reply.text("a"), Reply.text("b")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        WorkspaceInstructions(root=workspace).install(agent)
        await run_turn(agent, "one")
        cited = [
            e.seq for e in agent.session.events if e.type in ("user/message", "assistant/message")
        ]
        await agent.session.append(
            UserMessage(content="summary", source=PluginSource(plugin="compaction")),
            surface_op="replace",
            source_event_seqs=cited,
        )
        await run_turn(agent, "two")
    assert labels(provider.requests[1].messages) == ["compaction", "user:two", PLUGIN]


def test_a_relative_root_is_refused_naming_it() -> None:
    with pytest.raises(ContextPluginError, match="'some/dir'"):
        WorkspaceInstructions(root="some/dir")
