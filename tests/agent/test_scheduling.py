"""How often a turn's loop task is scheduled: each pass costs the resumption of its whole stack.

With a provider that answers each request after one checkpoint, a two-step
turn (a tool call, then text) on a `MemoryStore` yields only where the
turn waits: the start of its loop task, the two assemblies (a public
checkpoint), and the two requests. Appending, flushing and waking an awake
session do not yield (they never block).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import pytest
import trio

from actors.agent import AgentOptions, Tool, open_agent
from actors.prompt import SystemPrompt
from actors.providers import FinishChunk, GenerateRequest, TextDelta, ToolCallDelta
from actors.providers.base import ChunkBatch
from actors.session import MemoryStore


class OneCheckpointProvider:
    """Answers a request with a tool call, the next with text: one checkpoint, one batch each."""

    def __init__(self) -> None:
        self.requests = 0

    def stream(self, request: GenerateRequest) -> AsyncGenerator[Any, None]:
        """Never called: the loop reads a batching provider through `stream_batches`."""
        raise AssertionError("the loop read this provider through stream(), not stream_batches()")

    async def stream_batches(self, request: GenerateRequest) -> AsyncGenerator[ChunkBatch, None]:
        self.requests += 1
        await trio.lowlevel.checkpoint()
        if self.requests % 2:
            yield (
                ToolCallDelta(index=0, id=f"c{self.requests}", name="echo", arguments="{}"),
                FinishChunk(reason="tool-calls"),
            )
        else:
            yield (TextDelta(text="done"), FinishChunk(reason="completed"))


class LoopSteps(trio.abc.Instrument):
    """Counts the scheduling passes of every task but the test's own."""

    def __init__(self, own: trio.lowlevel.Task) -> None:
        self.own = own
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is not self.own:
            self.steps += 1


async def _echo(arguments: dict[str, Any] | str, call: object) -> str:
    return "echoed"


@pytest.mark.parametrize("hibernate", [False, True])
async def test_a_two_step_turn_schedules_its_loop_task_five_times(hibernate: bool) -> None:
    async with open_agent(
        system_prompt=SystemPrompt(),
        provider=OneCheckpointProvider(),
        options=AgentOptions(model="m", hibernate=hibernate),
        store=MemoryStore(),
        tools=[Tool(name="echo", description="Echo.", parameters={}, execute=_echo)],
    ) as agent:
        agent.followup("warm up")
        await agent.when_idle()
        counter = LoopSteps(trio.lowlevel.current_task())
        trio.lowlevel.add_instrument(counter)
        try:
            agent.followup("go")
            await agent.when_idle()
        finally:
            trio.lowlevel.remove_instrument(counter)
        assert agent.session.hibernating is hibernate
    # start, assembly, request, assembly, request; a woken session's load is one more.
    assert counter.steps == (6 if hibernate else 5)
