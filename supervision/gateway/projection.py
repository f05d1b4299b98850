"""ACP `session/update`s as a pure projection of log events.

Live (during a prompt): `assistant/chunk` text → `agent_message_chunk`,
reasoning → `agent_thought_chunk`; `tool/call` → `tool_call` (status
`in_progress`, `rawInput` the parsed arguments when they are a JSON
object, else the raw string); `tool/result` → `tool_call_update`
(`completed` / `failed`, with the content). On `session/load` replay the
conversation is rebuilt from surface events instead of chunks: user
messages → `user_message_chunk`, assistant messages → thought and message
chunks, then the same tool updates. Plugin messages, headers and step
markers are not part of ACP's view (supervisors read them with `_harness/log/*`).
"""

from __future__ import annotations

import json
from typing import Any

from actors.messages import ReasoningBlock, TextBlock, UserSource
from actors.providers.chunks import ReasoningDelta, TextDelta
from actors.session import Event
from actors.session.events import (
    AssistantChunk,
    AssistantMessage,
    ToolCallRequested,
    ToolResult,
    TurnEndReason,
    UserMessage,
)

STOP_REASONS = {
    "completed": "end_turn",
    "max-tokens": "max_tokens",
    "aborted": "cancelled",
    "blocked": "refusal",
    "interrupted": "cancelled",
}
"""ACP stop reason per `turn/end` kind; "error" answers with a JSON-RPC error instead."""


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _tool_call(data: ToolCallRequested) -> dict[str, Any]:
    raw: Any = data.arguments
    try:
        parsed = json.loads(data.arguments)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        raw = parsed
    return {
        "sessionUpdate": "tool_call",
        "toolCallId": data.call_id,
        "title": data.name,
        "kind": "other",
        "status": "in_progress",
        "rawInput": raw,
    }


def _tool_result(data: ToolResult) -> dict[str, Any]:
    return {
        "sessionUpdate": "tool_call_update",
        "toolCallId": data.call_id,
        "status": "failed" if data.is_error else "completed",
        "content": [{"type": "content", "content": _text(data.content)}],
    }


def live_updates(event: Event) -> list[dict[str, Any]]:
    """The `update` objects a prompting client gets for `event` while its turn runs."""
    data = event.data
    if isinstance(data, AssistantChunk):
        chunk = data.chunk
        if isinstance(chunk, TextDelta) and chunk.text:
            return [{"sessionUpdate": "agent_message_chunk", "content": _text(chunk.text)}]
        if isinstance(chunk, ReasoningDelta) and chunk.text:
            return [{"sessionUpdate": "agent_thought_chunk", "content": _text(chunk.text)}]
        return []
    if isinstance(data, ToolCallRequested):
        return [_tool_call(data)]
    if isinstance(data, ToolResult):
        return [_tool_result(data)]
    return []


def replay_updates(event: Event) -> list[dict[str, Any]]:
    """The `update` objects `session/load` replays for `event` (the conversation, not chunks)."""
    data = event.data
    if isinstance(data, UserMessage):
        if not isinstance(data.source, UserSource):
            return []
        return [
            {"sessionUpdate": "user_message_chunk", "content": _text(block.text)}
            for block in data.content
            if isinstance(block, TextBlock)
        ]
    if isinstance(data, AssistantMessage):
        updates = []
        for block in data.message.content:
            if isinstance(block, ReasoningBlock) and block.text:
                updates.append(
                    {"sessionUpdate": "agent_thought_chunk", "content": _text(block.text)}
                )
            elif isinstance(block, TextBlock) and block.text:
                updates.append(
                    {"sessionUpdate": "agent_message_chunk", "content": _text(block.text)}
                )
        return updates
    if isinstance(data, ToolCallRequested):
        return [_tool_call(data)]
    if isinstance(data, ToolResult):
        return [_tool_result(data)]
    return []


def stop_reason(reason: TurnEndReason) -> str | None:
    """The ACP stop reason of a `turn/end`, or None for an error (answered as -32603)."""
    return STOP_REASONS.get(reason.kind)
