"""What a provider streams: text, reasoning, tool-call deltas, usage and a finish.

Failures crossing the provider → loop → log → wire boundary are data
(`Failure`), never exceptions.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

import attrs


@attrs.frozen(kw_only=True)
class Usage:
    """Token accounting for one model request, as the provider reported it."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    reasoning_tokens: int | None = None


@attrs.frozen(kw_only=True)
class Failure:
    """A structured request failure.

    `retryable` says whether the same request may succeed later;
    `retry_after_ms` is the server's requested wait, when it named one.
    """

    code: str
    message: str = ""
    status: int | None = None
    retry_after_ms: int | None = None
    retryable: bool = False


@attrs.frozen(kw_only=True)
class TextDelta:
    """A piece of assistant text."""

    text: str


@attrs.frozen(kw_only=True)
class ReasoningDelta:
    """A piece of reasoning text."""

    text: str


@attrs.frozen(kw_only=True)
class ToolCallDelta:
    """A fragment of the tool call at `index`.

    `id` and `name` are set on the fragment that introduces the call (and
    never repeated by a well-behaved adapter); `arguments` is a piece of the
    raw JSON argument string, to be joined in order.
    """

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@attrs.frozen(kw_only=True)
class UsageChunk:
    """The request's token usage."""

    usage: Usage


FinishReason: TypeAlias = Literal["completed", "tool-calls", "max-tokens", "error"]


@attrs.frozen(kw_only=True)
class FinishChunk:
    """The end of a stream; `failure` is set exactly when `reason` is "error"."""

    reason: FinishReason
    failure: Failure | None = None

    def __attrs_post_init__(self) -> None:
        if (self.reason == "error") != (self.failure is not None):
            raise ValueError(
                f"finish reason {self.reason!r} and failure {self.failure!r} disagree: "
                "a failure is given exactly when the reason is 'error'"
            )


Chunk: TypeAlias = TextDelta | ReasoningDelta | ToolCallDelta | UsageChunk | FinishChunk
