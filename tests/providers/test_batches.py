"""Chunk batches: the chunks of one read travel, and are logged, together."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing

import httpx
import trio

from actors.agent import open_agent
from actors.messages import Message
from actors.prompt import SystemPrompt
from actors.providers import (
    Chunk,
    FinishChunk,
    GenerateRequest,
    Reply,
    ScriptedProvider,
    TextDelta,
)
from actors.providers.actor import ProviderActor
from actors.providers.base import ChunkBatch, chunk_batches
from actors.providers.openai_compat import OpenAICompatProvider
from actors.providers.simulator import Fault, SimulatorEngine, simulator_transport
from actors.session import MemoryStore
from actors.session.events import Event
from actors.session.lease import Lease
from tests.providers.simulator_helpers import API_KEY

REQUEST = GenerateRequest(config={"provider": "p", "model": "m"})


class CountingStore(MemoryStore):
    """A memory store that records the event types of each append."""

    def __init__(self) -> None:
        super().__init__()
        self.appends: list[list[str]] = []

    async def append(
        self, session_id: str, events: Sequence[Event], *, lease: Lease | None = None
    ) -> None:
        self.appends.append([event.type for event in events])
        await super().append(session_id, events, lease=lease)


class TwoReads:
    """A batching provider whose reply arrives in two reads."""

    def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
        raise AssertionError("a batching provider's stream() is not used by the loop")

    async def stream_batches(self, request: GenerateRequest) -> AsyncGenerator[ChunkBatch, None]:
        await trio.lowlevel.checkpoint()
        yield (TextDelta(text="a"), TextDelta(text="b"), TextDelta(text="c"))
        yield (TextDelta(text="d"), FinishChunk(reason="completed"), TextDelta(text="late"))


async def collect(batches: AsyncGenerator[ChunkBatch, None]) -> list[ChunkBatch]:
    async with aclosing(batches) as stream:
        return [batch async for batch in stream]


async def test_the_chunks_of_one_batch_are_logged_in_one_append_up_to_the_finish() -> None:
    store = CountingStore()
    async with open_agent(system_prompt=SystemPrompt(), provider=TwoReads(), store=store) as agent:
        agent.followup("hi")
        await agent.when_idle()
    chunk_appends = [types for types in store.appends if "assistant/chunk" in types]
    # The finishing batch goes out with the answer that follows it, in the same append.
    assert chunk_appends == [
        ["assistant/chunk"] * 3,
        ["assistant/chunk"] * 2 + ["assistant/message"],
    ]
    (message,) = [e.data.message for e in agent.session.events if e.type == "assistant/message"]
    assert message.text == "abcd"  # nothing after the finish is logged or kept


async def test_a_subclass_that_overrides_stream_is_streamed_through_its_own_stream() -> None:
    class Shouting(ScriptedProvider):
        async def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
            async with aclosing(super().stream(request)) as chunks:
                async for chunk in chunks:
                    if isinstance(chunk, TextDelta):
                        chunk = TextDelta(text=chunk.text.upper())
                    yield chunk

    batches = await collect(chunk_batches(Shouting([Reply.text("quiet")]), REQUEST))
    assert [len(batch) for batch in batches] == [1, 1]  # one per chunk: its own stream
    assert batches[0] == (TextDelta(text="QUIET"),)
    native = await collect(chunk_batches(ScriptedProvider([Reply.text("quiet")]), REQUEST))
    assert [len(batch) for batch in native] == [2]


async def test_the_actor_hands_over_what_one_read_of_the_body_carried_as_one_batch() -> None:
    engine = SimulatorEngine()
    engine.faults.queue(Fault(write_size=1 << 20))  # the whole body in one write: one read
    engine.faults.queue(Fault())  # one write per event
    async with httpx.AsyncClient(transport=simulator_transport(engine)) as mock_client:
        actor = ProviderActor(
            name="sim",
            factory=lambda client: OpenAICompatProvider(
                mock_client, base_url="http://simulator.test", api_key=API_KEY
            ),
        )
        request = GenerateRequest(
            config={"provider": "sim", "model": "deepseek-chat"}, messages=[Message.user("hi")]
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(actor.serve)
            whole = await collect(actor.stream_batches(request))
            split = await collect(actor.stream_batches(request))
            nursery.cancel_scope.cancel()
    content = [batch for batch in whole if isinstance(batch[0], TextDelta)]
    assert len(content) == 1 and len(content[0]) > 1
    assert isinstance(whole[-1][-1], FinishChunk)
    assert all(len(batch) == 1 for batch in split if isinstance(batch[0], TextDelta))
    # The same chunks either way, in the same order, as `stream()` gives them one by one.
    flat = [chunk for batch in whole for chunk in batch]
    assert flat == [chunk for batch in split for chunk in batch]
    assert len(content[0]) == sum(isinstance(batch[0], TextDelta) for batch in split)
