"""Ten turns with time, policy changes and a fork: the stable half never changes.

Every request/header after the first would be a cache break; volatile facts
must land as user-role messages instead.
"""

from __future__ import annotations

import trio

from actors.agent import open_agent
from actors.context import Policies, TimeContext
from actors.messages import PluginSource
from actors.prompt import PromptSection, SystemPrompt
from actors.providers import Reply, ScriptedProvider, ToolCall
from actors.session import MemoryStore
from actors.session.events import RequestHeaderLogged, StepStart, UserMessage
from supervision import ForkProvider, open_subagents

TURNS = 10
FORK_TURN = 5


def parent_script() -> list[Reply]:
    replies: list[Reply] = []
    for turn in range(TURNS):
        if turn == FORK_TURN:
            replies.append(
                Reply.tool_calls(
                    [ToolCall(id="fork-1", name="subagent_fork", arguments={"prompt": "Check it."})]
                )
            )
        replies.append(Reply.text(f"answer {turn}"))
    return replies


async def test_ten_turns_with_time_policies_and_a_fork_keep_one_header(
    autojump_clock: trio.abc.Clock,
) -> None:
    wall = {"ms": 1_764_000_000_000}

    def clock() -> int:
        wall["ms"] += 61_000
        return wall["ms"]

    prompt = SystemPrompt(persona="You are {{model}}.")
    prompt.section(PromptSection(name="tool:guidance", order=100, text="Use tools carefully."))
    policies = Policies()
    policies.install(prompt)
    parent_provider = ScriptedProvider(parent_script())
    child_provider = ScriptedProvider([Reply.text("checked")])
    store = MemoryStore()
    async with (
        open_agent(system_prompt=prompt, provider=parent_provider, store=store) as parent,
        open_subagents(parent, system_prompt=prompt, provider=child_provider) as subagents,
    ):
        subagents.activate(ForkProvider())
        TimeContext(clock=clock).install(parent)
        for turn in range(TURNS):
            if turn == 3:
                policies.set_sandbox("read-only")
            if turn == 7:
                policies.set_approval("never")
            parent.followup(f"request {turn}")
            await parent.when_idle()

    events = parent.session.events
    headers = [e.data for e in events if isinstance(e.data, RequestHeaderLogged)]
    assert [h.reason for h in headers] == ["initial"]
    first = parent_provider.requests[0]
    assert len(parent_provider.requests) == TURNS + 1
    for request in parent_provider.requests[1:]:
        assert (request.system, request.tools) == (first.system, first.tools)
    assert first.system is not None and "read-only" not in first.system

    plugin_messages = [
        e.data.source
        for e in events
        if isinstance(e.data, UserMessage) and isinstance(e.data.source, PluginSource)
    ]
    steps = sum(1 for e in events if isinstance(e.data, StepStart))
    assert sum(1 for s in plugin_messages if s.plugin == "time") == steps
    snapshots = [s for s in plugin_messages if s.plugin == "runtime-context"]
    assert len(snapshots) == 3  # initial policies, sandbox change, approval change
    assert all(s.form == "snapshot" for s in snapshots)

    child_results = [e.data for e in events if e.type == "tool/result"]
    assert [r.content for r in child_results] == ["checked"]
    assert child_provider.requests[0].system == first.system
