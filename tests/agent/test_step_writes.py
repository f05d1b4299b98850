"""How a step's events reach the store: events with nothing to wait for between them go together."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Any

import trio
import trio.testing

from actors.agent import Tool, open_agent
from actors.prompt import SystemPrompt
from actors.providers import (
    Chunk,
    FinishChunk,
    GenerateRequest,
    Reply,
    ScriptedProvider,
    TextDelta,
    ToolCall,
)
from actors.providers.base import ChunkBatch
from actors.session import MemoryStore
from actors.session.events import Event
from actors.session.lease import Lease
from tests.agent.helpers import data_of, turn_end_kinds, types


class CountingStore(MemoryStore):
    """A memory store that records the event types of each append; one append can be held."""

    def __init__(self) -> None:
        super().__init__()
        self.appends: list[list[str]] = []
        self.hold_type: str | None = None
        self.held = trio.Event()

    async def append(
        self, session_id: str, events: Sequence[Event], *, lease: Lease | None = None
    ) -> None:
        if self.hold_type is not None and any(e.type == self.hold_type for e in events):
            self.held.set()
            await trio.sleep_forever()  # until cancelled: the store never takes these
        self.appends.append([event.type for event in events])
        await super().append(session_id, events, lease=lease)


class TwoReads:
    """A batching provider whose reply arrives in two reads: "abc", then "d" and the finish."""

    def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
        raise AssertionError("a batching provider's stream() is not used by the loop")

    async def stream_batches(self, request: GenerateRequest) -> AsyncGenerator[ChunkBatch, None]:
        await trio.lowlevel.checkpoint()
        yield (TextDelta(text="a"), TextDelta(text="b"), TextDelta(text="c"))
        yield (TextDelta(text="d"), FinishChunk(reason="completed"))


async def _echo(arguments: dict[str, Any] | str, call: object) -> str:
    return "echoed"


ECHO = Tool(name="echo", description="Echo.", parameters={"type": "object"}, execute=_echo)


async def test_a_tool_turn_takes_one_append_per_group_of_events_and_logs_them_in_order() -> None:
    store = CountingStore()
    provider = ScriptedProvider(
        [Reply.tool_calls([ToolCall(id="c1", name="echo", arguments="{}")]), Reply.text("done")]
    )
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, store=store, tools=[ECHO]
    ) as agent:
        agent.followup("go")
        await agent.when_idle()
    chunks = ["assistant/chunk"] * 2  # each scripted reply: its content and the finish
    assert store.appends == [
        ["turn/start"],
        ["step/start", "user/message", "request/header"],
        [*chunks, "assistant/message", "tool/call"],
        ["tool/result", "step/end"],
        ["step/start"],
        [*chunks, "assistant/message"],
        ["step/end", "turn/end"],
    ]
    assert types(agent.session) == [kind for append in store.appends for kind in append]
    assert [event.seq for event in agent.session.events] == list(range(len(agent.session)))
    assert turn_end_kinds(agent.session) == ["completed"]


async def test_a_header_change_between_steps_is_written_with_the_next_steps_opening() -> None:
    store = CountingStore()
    prompt = SystemPrompt()

    async def register_a_tool(arguments: dict[str, Any] | str, call: object) -> str:
        agent.tools.add(ECHO)
        return "registered"

    adder = Tool(
        name="add_tool",
        description="Adds one.",
        parameters={"type": "object"},
        execute=register_a_tool,
    )
    provider = ScriptedProvider(
        [Reply.tool_calls([ToolCall(id="c1", name="add_tool", arguments="{}")]), Reply.text("ok")]
    )
    async with open_agent(
        system_prompt=prompt, provider=provider, store=store, tools=[adder]
    ) as agent:
        agent.followup("go")
        await agent.when_idle()
    assert ["step/start", "request/header"] in store.appends
    reasons = [data.reason for data in data_of(agent.session, "request/header")]
    assert reasons == ["initial", "change"]
    assert [tool.name for tool in provider.requests[1].tools] == ["add_tool", "echo"]


async def test_cancelling_the_write_of_the_finishing_batch_keeps_the_logged_prefix_only() -> None:
    store = CountingStore()
    store.hold_type = "assistant/message"
    async with open_agent(system_prompt=SystemPrompt(), provider=TwoReads(), store=store) as agent:
        agent.followup("hi")
        await store.held.wait()  # the batch "d" + finish and the answer: not taken by the store
        store.hold_type = None
        agent.cancel()
        await agent.when_idle()
    chunks = [data.chunk for data in data_of(agent.session, "assistant/chunk")]
    assert chunks == [TextDelta(text="a"), TextDelta(text="b"), TextDelta(text="c")]
    (answer,) = data_of(agent.session, "assistant/message")
    assert (answer.interrupted, answer.message.text) == (True, "abc")
    assert types(agent.session)[-2:] == ["step/end", "turn/end"]
    assert turn_end_kinds(agent.session) == ["aborted"]


async def test_cancelling_the_write_of_a_whole_reply_in_one_batch_logs_no_answer() -> None:
    store = CountingStore()
    store.hold_type = "assistant/message"
    provider = ScriptedProvider([Reply.text("all at once")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider, store=store) as agent:
        agent.followup("hi")
        await store.held.wait()
        store.hold_type = None
        agent.cancel()
        await agent.when_idle()
    assert "assistant/chunk" not in types(agent.session)
    assert "assistant/message" not in types(agent.session)
    assert turn_end_kinds(agent.session) == ["aborted"]


async def test_a_tool_call_is_run_only_once_the_call_and_its_answer_are_logged() -> None:
    seen: list[list[str]] = []
    store = CountingStore()

    async def look(arguments: dict[str, Any] | str, call: object) -> str:
        seen.append(types(agent.session))
        return "looked"

    tool = Tool(name="look", description="Looks.", parameters={"type": "object"}, execute=look)
    provider = ScriptedProvider(
        [Reply.tool_calls([ToolCall(id="c1", name="look", arguments="{}")]), Reply.text("ok")]
    )
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, store=store, tools=[tool]
    ) as agent:
        agent.followup("go")
        await agent.when_idle()
    (at_run,) = seen
    assert at_run[-2:] == ["assistant/message", "tool/call"]
    assert agent.session.durable_seq >= at_run.index("tool/call")
