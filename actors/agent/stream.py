"""Folding a provider's chunk stream into an assistant message."""

from __future__ import annotations

import attrs

from actors.messages import Block, Message, ReasoningBlock, TextBlock, ToolCallBlock
from actors.providers.chunks import (
    Chunk,
    Failure,
    FinishChunk,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
)


@attrs.define
class _PendingCall:
    id: str | None = None
    name: str | None = None
    arguments: list[str] = attrs.field(factory=list)


@attrs.define
class StreamAccumulator:
    """Accumulates chunks: text, reasoning, tool calls per index, usage and the finish.

    A tool call's id and name are taken from the first fragment that carries
    them and never concatenated; argument fragments are joined in order.
    """

    _text: list[str] = attrs.field(factory=list)
    _reasoning: list[str] = attrs.field(factory=list)
    _calls: dict[int, _PendingCall] = attrs.field(factory=dict)
    usage: Usage | None = None
    finish: FinishChunk | None = None

    def add(self, chunk: Chunk) -> None:
        """Fold one chunk in."""
        if isinstance(chunk, TextDelta):
            self._text.append(chunk.text)
        elif isinstance(chunk, ReasoningDelta):
            self._reasoning.append(chunk.text)
        elif isinstance(chunk, ToolCallDelta):
            call = self._calls.setdefault(chunk.index, _PendingCall())
            if call.id is None and chunk.id:
                call.id = chunk.id
            if call.name is None and chunk.name:
                call.name = chunk.name
            if chunk.arguments:
                call.arguments.append(chunk.arguments)
        elif isinstance(chunk, UsageChunk):
            self.usage = chunk.usage
        else:
            self.finish = chunk

    @property
    def has_content(self) -> bool:
        """True when any text, reasoning or tool-call fragment arrived."""
        return bool(self._text or self._reasoning or self._calls)

    @property
    def reason(self) -> FinishReason | None:
        """The finish reason, once the finish chunk arrived."""
        return None if self.finish is None else self.finish.reason

    @property
    def failure(self) -> Failure | None:
        """The failure the finish chunk reported, if any."""
        return None if self.finish is None else self.finish.failure

    def message(self, *, with_tool_calls: bool) -> Message:
        """The assistant message: reasoning, then text, then tool calls by index.

        With `with_tool_calls=False` (an interrupted or truncated answer)
        tool calls are left out, so the log never holds a call without its
        result.

        Raises:
            ValueError: a tool call never received its id or name.
        """
        blocks: list[Block] = []
        if self._reasoning:
            blocks.append(ReasoningBlock(text="".join(self._reasoning)))
        if self._text:
            blocks.append(TextBlock(text="".join(self._text)))
        if with_tool_calls:
            for index in sorted(self._calls):
                call = self._calls[index]
                if call.id is None or call.name is None:
                    raise ValueError(
                        f"tool call at index {index} arrived without "
                        f"{'an id' if call.id is None else 'a name'}"
                    )
                blocks.append(
                    ToolCallBlock(id=call.id, name=call.name, arguments="".join(call.arguments))
                )
        return Message(role="assistant", content=tuple(blocks))
