"""A deterministic provider driven by a script of replies, for tests and examples."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Iterable, Sequence
from typing import Any, Literal

import attrs
import trio

from actors.providers.base import ChunkBatch, unbatched
from actors.providers.chunks import (
    Chunk,
    Failure,
    FinishChunk,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
)
from actors.providers.request import GenerateRequest


def _arguments(value: str | dict[str, Any]) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


@attrs.frozen  # positional, as DESIGN §8 writes ToolCall(...)
class ToolCall:
    """A tool call a scripted reply makes; `arguments` is the raw JSON string.

    A dict passed as `arguments` is serialised compactly.
    """

    id: str
    name: str
    arguments: str = attrs.field(default="{}", converter=_arguments)


ReplyKind = Literal["text", "tool-calls", "max-tokens", "failure", "hang"]


def _tool_calls(value: Iterable[ToolCall]) -> tuple[ToolCall, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class Reply:
    """One scripted model response; build it with the class methods.

    `Reply.text(...)`, `Reply.tool_calls(...)`, `Reply.max_tokens(...)`,
    `Reply.failure(...)` and `Reply.hang(...)` are the constructors.
    """

    kind: ReplyKind
    body: str | None = None
    reasoning: str | None = None
    calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_tool_calls)
    usage: Usage | None = None
    problem: Failure | None = None

    @classmethod
    def text(cls, text: str, usage: Usage | None = None, *, reasoning: str | None = None) -> Reply:
        """A plain text answer."""
        return cls(kind="text", body=text, usage=usage, reasoning=reasoning)

    @classmethod
    def tool_calls(
        cls,
        calls: Sequence[ToolCall],
        text: str | None = None,
        usage: Usage | None = None,
        *,
        reasoning: str | None = None,
    ) -> Reply:
        """An answer asking for tool calls (with optional leading text)."""
        return cls(kind="tool-calls", calls=calls, body=text, usage=usage, reasoning=reasoning)

    @classmethod
    def max_tokens(cls, text: str, usage: Usage | None = None) -> Reply:
        """An answer cut off by the token limit."""
        return cls(kind="max-tokens", body=text, usage=usage)

    @classmethod
    def failure(
        cls,
        code: str,
        message: str = "",
        retryable: bool = False,
        *,
        status: int | None = None,
        retry_after_ms: int | None = None,
    ) -> Reply:
        """A request failure reported as data."""
        return cls(
            kind="failure",
            problem=Failure(
                code=code,
                message=message,
                retryable=retryable,
                status=status,
                retry_after_ms=retry_after_ms,
            ),
        )

    @classmethod
    def hang(cls, partial_text: str = "") -> Reply:
        """Stream `partial_text`, then wait until the caller is cancelled."""
        return cls(kind="hang", body=partial_text)


@attrs.define(eq=False)
class ScriptedProvider:
    """A `Provider` that answers each request with the next scripted `Reply`.

    Every request received is recorded in `requests`, in order. When the
    script is exhausted the request fails with code "script_exhausted".
    """

    _script: list[Reply] = attrs.field(alias="script", converter=list)
    requests: list[GenerateRequest] = attrs.field(factory=list, init=False)

    def push(self, *replies: Reply) -> None:
        """Append replies to the script."""
        self._script.extend(replies)

    @property
    def remaining(self) -> int:
        """How many scripted replies are left."""
        return len(self._script)

    def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
        """Record `request` and stream the next reply's chunks."""
        return unbatched(self.stream_batches(request))

    async def stream_batches(self, request: GenerateRequest) -> AsyncGenerator[ChunkBatch, None]:
        """Record `request` and stream the next reply's chunks as one batch.

        A `hang` reply's partial text comes as a batch of its own before the wait.
        """
        self.requests.append(request)
        await trio.lowlevel.checkpoint()
        if not self._script:
            failure = Failure(
                code="script_exhausted",
                message=f"the script has no reply for request {len(self.requests) - 1}",
            )
            yield (FinishChunk(reason="error", failure=failure),)
            return
        reply = self._script.pop(0)
        if reply.kind == "failure":
            yield (FinishChunk(reason="error", failure=reply.problem),)
            return
        chunks: list[Chunk] = []
        if reply.reasoning:
            chunks.append(ReasoningDelta(text=reply.reasoning))
        if reply.body:
            chunks.append(TextDelta(text=reply.body))
        if reply.kind == "hang":
            if chunks:
                yield tuple(chunks)
            await trio.sleep_forever()
        for index, call in enumerate(reply.calls):
            chunks.append(
                ToolCallDelta(index=index, id=call.id, name=call.name, arguments=call.arguments)
            )
        if reply.usage is not None:
            chunks.append(UsageChunk(usage=reply.usage))
        reason: Literal["completed", "tool-calls", "max-tokens"] = (
            "tool-calls"
            if reply.calls
            else "max-tokens"
            if reply.kind == "max-tokens"
            else "completed"
        )
        chunks.append(FinishChunk(reason=reason))
        yield tuple(chunks)
