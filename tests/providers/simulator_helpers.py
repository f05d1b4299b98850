"""Helpers for the adapter and simulator tests: collect a stream, fold it into a message."""

from __future__ import annotations

import json
from contextlib import aclosing
from typing import Any

from actors.messages import Message, ReasoningBlock, TextBlock, ToolCallBlock, ToolSource
from actors.providers.chunks import (
    Chunk,
    FinishChunk,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
)
from actors.providers.openai_compat import OpenAICompatProvider
from actors.providers.request import GenerateRequest
from actors.providers.simulator import SimRequest, SimResponse, SimulatorEngine

API_KEY = "sk-simulator"


async def collect(provider: OpenAICompatProvider, request: GenerateRequest) -> list[Chunk]:
    """Every chunk of one stream, which must end with exactly one finish chunk."""
    async with aclosing(provider.stream(request)) as stream:
        chunks = [chunk async for chunk in stream]
    finishes = [chunk for chunk in chunks if isinstance(chunk, FinishChunk)]
    assert len(finishes) == 1 and chunks[-1] is finishes[0], chunks
    return chunks


def finish_of(chunks: list[Chunk]) -> FinishChunk:
    last = chunks[-1]
    assert isinstance(last, FinishChunk)
    return last


def usage_of(chunks: list[Chunk]) -> Usage | None:
    usages = [chunk.usage for chunk in chunks if isinstance(chunk, UsageChunk)]
    assert len(usages) <= 1
    if usages:
        assert isinstance(chunks[-2], UsageChunk), "usage must come right before the finish"
    return usages[0] if usages else None


def text_of(chunks: list[Chunk]) -> str:
    return "".join(chunk.text for chunk in chunks if isinstance(chunk, TextDelta))


def reasoning_of(chunks: list[Chunk]) -> str:
    return "".join(chunk.text for chunk in chunks if isinstance(chunk, ReasoningDelta))


def calls_of(chunks: list[Chunk]) -> list[ToolCallBlock]:
    """The tool calls, joined by index; each id and name must be announced exactly once."""
    ids: dict[int, list[str]] = {}
    names: dict[int, list[str]] = {}
    arguments: dict[int, str] = {}
    for chunk in chunks:
        if isinstance(chunk, ToolCallDelta):
            if chunk.id is not None:
                ids.setdefault(chunk.index, []).append(chunk.id)
            if chunk.name is not None:
                names.setdefault(chunk.index, []).append(chunk.name)
            arguments[chunk.index] = arguments.get(chunk.index, "") + chunk.arguments
    assert all(len(values) == 1 for values in [*ids.values(), *names.values()]), (ids, names)
    return [
        ToolCallBlock(id=ids[index][0], name=names[index][0], arguments=arguments[index])
        for index in sorted(arguments)
    ]


def assistant_of(chunks: list[Chunk]) -> Message:
    """The assistant message a loop would log for these chunks."""
    blocks: list[ReasoningBlock | TextBlock | ToolCallBlock] = []
    if reasoning_of(chunks):
        blocks.append(ReasoningBlock(text=reasoning_of(chunks)))
    if text_of(chunks):
        blocks.append(TextBlock(text=text_of(chunks)))
    blocks.extend(calls_of(chunks))
    return Message(role="assistant", content=tuple(blocks))


def tool_result(call_id: str, content: str) -> Message:
    return Message(role="user", content=content, source=ToolSource(call_id=call_id))


def chat_body(messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {
        "model": "deepseek-chat",
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        **fields,
    }


async def post(
    engine: SimulatorEngine,
    body: object,
    *,
    headers: dict[str, str] | None = None,
    path: str = "/chat/completions",
    method: str = "POST",
) -> SimResponse:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await engine.handle(
        SimRequest(
            method=method,
            path=path,
            headers={"authorization": f"Bearer {API_KEY}", **(headers or {})},
            body=raw,
        )
    )


async def read_body(response: SimResponse) -> bytes:
    if response.stream is None:
        return response.body
    async with aclosing(response.stream) as stream:
        return b"".join([piece async for piece in stream])


def events_of(body: bytes) -> list[Any]:
    """The JSON data of each event (`"[DONE]"` kept as a string), comments dropped."""
    out: list[Any] = []
    for block in body.decode().replace("\r\n", "\n").split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                out.append(data if data == "[DONE]" else json.loads(data))
    return out
