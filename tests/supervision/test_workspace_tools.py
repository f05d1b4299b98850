"""The default profile's read-only workspace tools stay inside their root."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.agent import AgentOptions, open_agent
from actors.prompt import SystemPrompt
from actors.providers import Reply, ScriptedProvider, ToolCall
from supervision.workspace_tools import workspace_tools


async def run_calls(root: Path, *calls: ToolCall) -> list[tuple[str, bool]]:
    provider = ScriptedProvider([Reply.tool_calls(list(calls)), Reply.text("done")])
    async with open_agent(
        system_prompt=SystemPrompt(),
        provider=provider,
        options=AgentOptions(model="m"),
        tools=workspace_tools(root),
    ) as agent:
        agent.followup("go")
        await agent.when_idle()
    return [
        (e["data"]["content"], e["data"]["is_error"])
        for e in agent.session.to_json()
        if e["type"] == "tool/result"
    ]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("alpha")
    (tmp_path.parent / "secret.txt").write_text("no")
    return tmp_path


async def test_list_and_read_inside_the_root(root: Path) -> None:
    results = await run_calls(
        root,
        ToolCall(id="1", name="list_files", arguments="{}"),
        ToolCall(id="2", name="read_file", arguments='{"path": "sub/a.txt"}'),
    )
    assert results == [("sub/", False), ("alpha", False)]


async def test_paths_outside_the_root_are_refused(root: Path) -> None:
    (root / "link").symlink_to(root.parent / "secret.txt")
    results = await run_calls(
        root,
        ToolCall(id="1", name="read_file", arguments='{"path": "../secret.txt"}'),
        ToolCall(id="2", name="read_file", arguments='{"path": "link"}'),
        ToolCall(id="3", name="list_files", arguments='{"path": "/"}'),
    )
    assert all(is_error for _, is_error in results)
    assert all("outside the workspace" in content for content, _ in results)


async def test_a_missing_path_argument_is_an_invalid_arguments_error(root: Path) -> None:
    ((content, is_error),) = await run_calls(
        root, ToolCall(id="1", name="read_file", arguments="{}")
    )
    assert is_error and "path" in content
