"""A turn leaves no reference cycles: everything it drops is freed by reference counting.

Cyclic garbage waits for the cyclic collector, whose every collection walks
the live heap; at thousands of concurrent sessions that walk is a large share
of a step's CPU (benchmarks/README.md, "Parallel sessions").
"""

from __future__ import annotations

import collections
import gc
from typing import Any

from actors.agent import Tool, open_agent
from actors.agent.decisions import PreStepNext, StepDecision, StepProposal
from actors.context import TimeContext
from actors.prompt import PromptSection, SystemPrompt
from actors.providers import Reply, ScriptedProvider, ToolCall
from actors.session import MemoryStore


async def _echo(arguments: dict[str, Any] | str, call: object) -> str:
    return "echoed"


async def _passing(proposal: StepProposal, next: PreStepNext) -> StepDecision:
    return await next()


async def test_turns_with_pre_step_listeners_and_a_tool_leave_no_cyclic_garbage() -> None:
    prompt = SystemPrompt()
    prompt.section(PromptSection(name="guide", order=100, text="Be brief."))
    provider = ScriptedProvider([])
    for turn in range(3):
        provider.push(
            Reply.tool_calls([ToolCall(id=f"c{turn}", name="echo", arguments="{}")]),
            Reply.text("done"),
        )
    async with open_agent(
        system_prompt=prompt,
        provider=provider,
        store=MemoryStore(),
        tools=[Tool(name="echo", description="Echo.", parameters={}, execute=_echo)],
    ) as agent:
        TimeContext(timezone="UTC").install(agent)
        agent.on_pre_step(_passing)
        agent.on_pre_step(_passing)
        agent.followup("warm up")  # first-use caches and imports are not the turn's garbage
        await agent.when_idle()
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for text in ("one", "two"):
                agent.followup(text)
                await agent.when_idle()
            gc.collect()
            garbage = collections.Counter(type(o).__qualname__ for o in gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    assert garbage == {}
