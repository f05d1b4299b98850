"""Tmux context: first step only, needs the shell tool, a due refresh, a location, a change."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from actors.agent import Agent, Tool, open_agent
from actors.context import TmuxContext, TmuxLocation
from actors.messages import Message, PluginSource
from actors.prompt import SystemPrompt
from actors.providers import Reply, ScriptedProvider, ToolCall
from tests.agent.helpers import turn_end_kinds
from tests.context.helpers import entered, from_plugin, labels, run_turn, tool

LOCATION = "main\t1\teditor\t0\t/work/project\n"


class FakeTmux:
    """A location query command that prints a file and counts its runs."""

    def __init__(self, directory: Path, output: str = LOCATION) -> None:
        self.location = directory / "location"
        self.runs = directory / "runs"
        self.location.write_text(output)
        self.runs.write_text("")

    @property
    def command(self) -> tuple[str, ...]:
        return (
            "sh",
            "-c",
            'echo run >> "$1"; cat "$2"',
            "fake-tmux",
            str(self.runs),
            str(self.location),
        )

    def move_to(self, output: str) -> None:
        self.location.write_text(output)

    @property
    def run_count(self) -> int:
        return len(self.runs.read_text().splitlines())


@pytest.fixture
def fake_tmux(tmp_path: Path) -> FakeTmux:
    return FakeTmux(tmp_path)


def snapshots(agent: Agent) -> list[Message]:
    return from_plugin(entered(agent.session), "tmux")


async def test_location_is_prepended_to_the_first_step_when_the_shell_tool_exists(
    fake_tmux: FakeTmux,
) -> None:
    provider = ScriptedProvider(
        [Reply.tool_calls([ToolCall(id="1", name="bash")]), Reply.text("done")]
    )
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, tools=[tool("bash")]
    ) as agent:
        TmuxContext(command=fake_tmux.command).install(agent)
        await run_turn(agent, "hi")
    assert labels(provider.requests[0].messages) == ["tmux", "user:hi"]
    [message] = snapshots(agent)
    assert message.text == (
        "tmux location: session 'main', window 1 ('editor'), pane 0; "
        "the pane's working directory is /work/project."
    )
    assert message.source == PluginSource(plugin="tmux", form="snapshot")
    assert fake_tmux.run_count == 1


async def test_later_steps_of_a_turn_get_no_location(fake_tmux: FakeTmux) -> None:
    async def cd_elsewhere(arguments: dict[str, Any] | str, call: object) -> str:
        fake_tmux.move_to("main\t2\tlogs\t0\t/var/log\n")
        return "moved"

    bash = Tool(
        name="bash", description="shell", parameters={"type": "object"}, execute=cd_elsewhere
    )
    provider = ScriptedProvider(
        [Reply.tool_calls([ToolCall(id="1", name="bash")]), Reply.text("done")]
    )
    async with open_agent(system_prompt=SystemPrompt(), provider=provider, tools=[bash]) as agent:
        TmuxContext(command=fake_tmux.command, refresh_interval=0).install(agent)
        await run_turn(agent, "hi")
    assert fake_tmux.run_count == 1
    assert labels(provider.requests[1].messages) == ["tmux", "user:hi", "assistant", "tool"]


async def test_nothing_is_queried_without_the_shell_tool(fake_tmux: FakeTmux) -> None:
    provider = ScriptedProvider([Reply.text("a")])
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, tools=[tool("read")]
    ) as agent:
        TmuxContext(command=fake_tmux.command).install(agent)
        await run_turn(agent, "hi")
    assert fake_tmux.run_count == 0
    assert snapshots(agent) == []


async def test_the_shell_tool_name_is_configurable(fake_tmux: FakeTmux) -> None:
    provider = ScriptedProvider([Reply.text("a")])
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, tools=[tool("shell")]
    ) as agent:
        TmuxContext(command=fake_tmux.command, shell_tool="shell").install(agent)
        await run_turn(agent, "hi")
    assert len(snapshots(agent)) == 1


async def test_no_query_runs_until_the_refresh_interval_passed(
    fake_tmux: FakeTmux, autojump_clock: trio.abc.Clock
) -> None:
    provider = ScriptedProvider([Reply.text("a"), Reply.text("b"), Reply.text("c")])
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, tools=[tool("bash")]
    ) as agent:
        TmuxContext(command=fake_tmux.command, refresh_interval=30).install(agent)
        await run_turn(agent, "one")
        fake_tmux.move_to("main\t2\tlogs\t0\t/var/log\n")
        await trio.sleep(29)
        await run_turn(agent, "two")
        assert fake_tmux.run_count == 1
        await trio.sleep(1)
        await run_turn(agent, "three")
    assert fake_tmux.run_count == 2
    assert [m.text.split(";")[0] for m in snapshots(agent)] == [
        "tmux location: session 'main', window 1 ('editor'), pane 0",
        "tmux location: session 'main', window 2 ('logs'), pane 0",
    ]


async def test_an_unchanged_location_is_not_repeated(
    fake_tmux: FakeTmux, autojump_clock: trio.abc.Clock
) -> None:
    provider = ScriptedProvider([Reply.text("a"), Reply.text("b")])
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, tools=[tool("bash")]
    ) as agent:
        TmuxContext(command=fake_tmux.command, refresh_interval=30).install(agent)
        await run_turn(agent, "one")
        await trio.sleep(30)
        await run_turn(agent, "two")
    assert fake_tmux.run_count == 2
    assert len(snapshots(agent)) == 1


async def test_missing_tmux_is_skipped_cleanly() -> None:
    provider = ScriptedProvider([Reply.text("a")])
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, tools=[tool("bash")]
    ) as agent:
        TmuxContext(command=("harness-test-no-such-tmux", "display-message", "-p")).install(agent)
        await run_turn(agent, "hi")
    assert labels(provider.requests[0].messages) == ["user:hi"]
    assert turn_end_kinds(agent.session) == ["completed"]


async def test_a_failing_query_adds_nothing(tmp_path: Path) -> None:
    provider = ScriptedProvider([Reply.text("a")])
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, tools=[tool("bash")]
    ) as agent:
        TmuxContext(command=("sh", "-c", "echo 'no server running' >&2; exit 1")).install(agent)
        await run_turn(agent, "hi")
    assert labels(provider.requests[0].messages) == ["user:hi"]


def test_output_that_is_not_a_location_is_refused() -> None:
    assert TmuxLocation.parse("main\t1\teditor\t0\t/work\n") is not None
    assert TmuxLocation.parse("no server running on /tmp/tmux-0/default\n") is None
    assert TmuxLocation.parse("\t1\teditor\t0\t/work\n") is None
