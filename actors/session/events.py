"""The event vocabulary of the session log.

Every event is an `Event` envelope (`type`, `seq`, `time`, `data`) whose
`data` is one of the frozen classes below; `EVENT_TYPES` maps each type
string to its data class. Surface events (`user/message`,
`assistant/message`, `tool/result`) are what the model sees; a surface event
with `surface_op="replace"` stands in for the earlier surface events it cites
in `source_event_seqs` (compaction).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal, TypeAlias

import attrs

from actors.messages import Block, Message, Source, TextBlock, ToolSource
from actors.providers.chunks import Chunk, Failure, Usage
from actors.session.header import RequestHeader


@attrs.frozen(kw_only=True)
class TurnStart:
    """`turn/start`: a turn begins."""

    turn: int


@attrs.frozen(kw_only=True)
class StepStart:
    """`step/start`: a model step begins inside `turn`."""

    turn: int
    step: int


def _blocks(value: Any) -> tuple[Block, ...]:
    if isinstance(value, str):
        return (TextBlock(text=value),)
    return tuple(value)


@attrs.frozen(kw_only=True)
class UserMessage:
    """`user/message`: a user-role message entered into the conversation."""

    content: tuple[Block, ...] = attrs.field(converter=_blocks)
    source: Source

    def to_message(self) -> Message:
        """The model-visible message."""
        return Message(role="user", content=self.content, source=self.source)


HeaderReason: TypeAlias = Literal["initial", "resume", "change"]


@attrs.frozen(kw_only=True)
class RequestHeaderLogged:
    """`request/header`: the stable half of the requests that follow."""

    header: RequestHeader
    reason: HeaderReason


@attrs.frozen(kw_only=True)
class AssistantChunk:
    """`assistant/chunk`: one streamed chunk of an attempt."""

    turn: int
    step: int
    chunk: Chunk


@attrs.frozen(kw_only=True)
class AssistantMessage:
    """`assistant/message`: the model's complete (or interrupted) answer for a step."""

    turn: int
    step: int
    message: Message
    usage: Usage | None = None
    interrupted: bool = False


@attrs.frozen(kw_only=True)
class ToolCallRequested:
    """`tool/call`: the model asked for a tool; `arguments` is the raw JSON string."""

    turn: int
    step: int
    call_id: str
    name: str
    arguments: str


@attrs.frozen(kw_only=True)
class ToolError:
    """Why a tool result is an error: the exception's class name and a code."""

    name: str
    code: str


@attrs.frozen(kw_only=True)
class ToolResult:
    """`tool/result`: what a tool returned (or the error it raised)."""

    turn: int
    step: int
    call_id: str
    content: str
    is_error: bool
    error: ToolError | None = None

    def to_message(self) -> Message:
        """The model-visible message: a user-role message sourced from the call."""
        return Message(
            role="user",
            content=self.content,
            source=ToolSource(call_id=self.call_id),
            is_error=self.is_error,
        )


@attrs.frozen(kw_only=True)
class RequestRetry:
    """`request/retry`: attempt `attempt` of a step failed and will be retried after a wait."""

    turn: int
    step: int
    attempt: int
    delay_ms: int
    failure: Failure


@attrs.frozen(kw_only=True)
class StepEnd:
    """`step/end`: the step closed (always written once a step started)."""

    turn: int
    step: int


@attrs.frozen(kw_only=True)
class AbortCause:
    """Who aborted a turn: "user", "parent" or "disposed"."""

    kind: Literal["user", "parent", "disposed"]


@attrs.frozen(kw_only=True)
class TurnError:
    """What failed a turn; `message` names the offending section, variable or tool."""

    message: str
    code: str
    status: int | None = None
    retry_after_ms: int | None = None


TurnEndKind: TypeAlias = Literal[
    "completed", "aborted", "blocked", "error", "max-tokens", "interrupted"
]


@attrs.frozen(kw_only=True)
class TurnEndReason:
    """Why a turn ended; `reason` is set for "aborted", `error` for "error"."""

    kind: TurnEndKind
    reason: AbortCause | None = None
    error: TurnError | None = None

    def __attrs_post_init__(self) -> None:
        if (self.kind == "aborted") != (self.reason is not None):
            raise ValueError(f"turn end {self.kind!r}: an abort cause goes with 'aborted' only")
        if (self.kind == "error") != (self.error is not None):
            raise ValueError(f"turn end {self.kind!r}: an error goes with 'error' only")

    @classmethod
    def completed(cls) -> TurnEndReason:
        """`{"kind": "completed"}`."""
        return cls(kind="completed")

    @classmethod
    def aborted(cls, by: Literal["user", "parent", "disposed"]) -> TurnEndReason:
        """`{"kind": "aborted", "reason": {"kind": by}}`."""
        return cls(kind="aborted", reason=AbortCause(kind=by))

    @classmethod
    def failed(cls, error: TurnError) -> TurnEndReason:
        """`{"kind": "error", "error": {...}}`."""
        return cls(kind="error", error=error)


@attrs.frozen(kw_only=True)
class TurnEnd:
    """`turn/end`: the turn is over, for `reason`."""

    turn: int
    reason: TurnEndReason


def _int_tuple(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class CompactionRequested:
    """`compaction/request`: a summary request is about to be sent (logged before model I/O).

    The request is the header in effect, the messages of the surface events
    `replaces` (a prefix of the surface, so it reuses the provider's prefix
    cache), then `instruction` as a user message. `compaction` numbers the
    session's compactions from 0; `turn` and `step` are the step it precedes.
    """

    compaction: int
    turn: int
    step: int
    replaces: tuple[int, ...] = attrs.field(converter=_int_tuple)
    instruction: str


@attrs.frozen(kw_only=True)
class CompactionEnded:
    """`compaction/end`: the summary request finished; `failure` when it produced no summary."""

    compaction: int
    usage: Usage | None = None
    failure: Failure | None = None


@attrs.frozen(kw_only=True)
class UnknownData:
    """The raw data of an ignorable event whose type this version does not know."""

    raw: Mapping[str, Any]


EventData: TypeAlias = (
    TurnStart
    | StepStart
    | UserMessage
    | RequestHeaderLogged
    | AssistantChunk
    | AssistantMessage
    | ToolCallRequested
    | ToolResult
    | RequestRetry
    | StepEnd
    | TurnEnd
    | CompactionRequested
    | CompactionEnded
    | UnknownData
)

EVENT_TYPES: Mapping[str, type[EventData]] = {
    "turn/start": TurnStart,
    "step/start": StepStart,
    "user/message": UserMessage,
    "request/header": RequestHeaderLogged,
    "assistant/chunk": AssistantChunk,
    "assistant/message": AssistantMessage,
    "tool/call": ToolCallRequested,
    "tool/result": ToolResult,
    "request/retry": RequestRetry,
    "step/end": StepEnd,
    "turn/end": TurnEnd,
    "compaction/request": CompactionRequested,
    "compaction/end": CompactionEnded,
}
TYPE_OF: Mapping[type[EventData], str] = {cls: name for name, cls in EVENT_TYPES.items()}
SURFACE_TYPES = frozenset({"user/message", "assistant/message", "tool/result"})
"""Event types whose data becomes a model-visible message."""


def _seqs(value: Iterable[int] | None) -> tuple[int, ...] | None:
    return None if value is None else tuple(value)


@attrs.frozen(kw_only=True)
class Event:
    """One immutable, numbered entry of a session log.

    `seq` is contiguous from 0 within a session, `time` is epoch
    milliseconds. `surface_op="replace"` with `source_event_seqs` marks a
    surface event that replaces the cited earlier surface events.
    `ignorable` lets older readers skip a type they do not know.
    """

    type: str
    seq: int
    time: int
    data: EventData
    surface_op: Literal["replace"] | None = None
    source_event_seqs: tuple[int, ...] | None = attrs.field(default=None, converter=_seqs)
    ignorable: bool = False

    def __attrs_post_init__(self) -> None:
        expected = TYPE_OF.get(type(self.data))
        if expected is not None and expected != self.type:
            raise ValueError(f"event seq {self.seq}: type {self.type!r} carries {expected} data")
        if (self.surface_op is None) != (self.source_event_seqs is None):
            raise ValueError(
                f"event seq {self.seq} ({self.type}): surface_op and source_event_seqs go together"
            )
        if self.surface_op is not None and self.type not in SURFACE_TYPES:
            raise ValueError(f"event seq {self.seq}: a {self.type} event cannot replace surface")

    @property
    def is_surface(self) -> bool:
        """True for events whose data becomes a model-visible message."""
        return self.type in SURFACE_TYPES


def type_of(data: EventData) -> str:
    """The event type string for a data object (not for `UnknownData`)."""
    try:
        return TYPE_OF[type(data)]
    except KeyError:
        raise ValueError(f"{type(data).__name__} is not a known event data class") from None
