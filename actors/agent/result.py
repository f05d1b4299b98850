"""What `Agent.run()` returns or raises: one turn's outcome, read back from the log."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import trio

from actors.messages import Message
from actors.providers.chunks import Usage
from actors.session.events import (
    AssistantMessage,
    CompactionEnded,
    Event,
    ToolResult,
    TurnEnd,
    TurnEndReason,
    UserMessage,
)

RETURNING_KINDS = frozenset({"completed", "max-tokens"})
"""Turn-end kinds `run()` returns; every other kind raises `TurnFailedError`."""


class AgentClosedError(RuntimeError):
    """Input was sent to an agent whose `open_agent` context has exited (it is never dropped)."""


@attrs.frozen(kw_only=True)
class TurnResult:
    """One finished turn, as the log records it.

    Attributes:
        turn: the turn's number.
        reason: the `turn/end` reason ("completed" or "max-tokens").
        text: the text of the turn's last assistant message ("" when none).
        messages: the turn's surface messages, in log order (user input,
            plugin context, assistant answers, tool results; not a
            compaction's summary, which stands in for earlier turns).
        usage: token usage summed over the turn's requests (its steps' and
            any compaction's summary request).
    """

    turn: int
    reason: TurnEndReason
    text: str
    messages: tuple[Message, ...]
    usage: Usage


class TurnFailedError(RuntimeError):
    """The turn `run()` waited for ended `error`, `blocked` or `aborted`.

    `reason` is the `turn/end` reason; `turn` the turn's number (None when
    the input was dropped before any turn took it).
    """

    def __init__(self, message: str, *, reason: TurnEndReason, turn: int | None) -> None:
        super().__init__(message)
        self.reason = reason
        self.turn = turn


@attrs.define(eq=False)
class TurnTicket:
    """How the turn that took one queued input ended (`Agent.submit`).

    The agent settles the ticket once, whether or not anyone awaits it: when
    the turn that took the input ends, when the input is dropped before any
    turn took it, or when the agent closes first. Any number of tasks may
    await `outcome()`, before or after it settled.
    """

    message: Message
    _done: trio.Event = attrs.field(factory=trio.Event)
    _result: TurnResult | None = None
    _error: TurnFailedError | AgentClosedError | None = None
    _requeued: bool = False

    @property
    def settled(self) -> bool:
        """True once the outcome is known."""
        return self._done.is_set()

    @property
    def turn(self) -> int | None:
        """The turn that took the input, once settled; None before, or when no turn took it
        (dropped, or the agent closed first)."""
        if self._result is not None:
            return self._result.turn
        return self._error.turn if isinstance(self._error, TurnFailedError) else None

    @property
    def requeued(self) -> bool:
        """True when the turn that took the input failed or was aborted before its first
        step opened and the input went back to the inbox, parked: it is not logged yet and
        runs at the agent's next wake (`outcome()` still reports that first turn)."""
        return self._requeued

    def settle(
        self,
        result: TurnResult | None = None,
        error: TurnFailedError | AgentClosedError | None = None,
        *,
        requeued: bool = False,
    ) -> None:
        """Record the outcome (the agent does this); later calls are ignored."""
        if not self._done.is_set():
            self._result, self._error, self._requeued = result, error, requeued
            self._done.set()

    async def outcome(self) -> TurnResult:
        """Wait for the outcome: the `TurnResult` of a turn that ended "completed" or
        "max-tokens".

        Cancellation: stops the wait only; the input keeps its place.

        Raises:
            TurnFailedError: the turn ended "error", "blocked" or "aborted", or
                the input was dropped before a turn took it (`turn` None).
            AgentClosedError: the agent closed before its input got a turn.
        """
        await self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


def add_usage(total: Usage, more: Usage | None) -> Usage:
    """`total` plus `more` (input, output and cache-read tokens)."""
    if more is None:
        return total
    return Usage(
        input_tokens=total.input_tokens + more.input_tokens,
        output_tokens=total.output_tokens + more.output_tokens,
        cache_read_tokens=total.cache_read_tokens + more.cache_read_tokens,
    )


def turn_result(session_id: str, events: Sequence[Event]) -> TurnResult:
    """The result of the turn whose events (from `turn/start` to `turn/end`) are `events`.

    Raises:
        TurnFailedError: the turn ended `error`, `blocked` or `aborted`; the
            message names the session, the turn and the cause.
    """
    end = events[-1].data
    if not isinstance(end, TurnEnd):
        raise ValueError(f"session {session_id!r}: the events do not end with a turn/end")
    messages: list[Message] = []
    text = ""
    usage = Usage()
    for event in events:
        data = event.data
        if isinstance(data, UserMessage | ToolResult):
            # A replacement (a compaction's summary) stands in for earlier turns.
            if event.surface_op is None:
                messages.append(data.to_message())
        elif isinstance(data, AssistantMessage):
            messages.append(data.message)
            usage = add_usage(usage, data.usage)
            if not data.interrupted:
                text = data.message.text
        elif isinstance(data, CompactionEnded):
            usage = add_usage(usage, data.usage)
    reason = end.reason
    if reason.kind not in RETURNING_KINDS:
        raise TurnFailedError(
            failure_message(session_id, end.turn, reason), reason=reason, turn=end.turn
        )
    return TurnResult(
        turn=end.turn, reason=reason, text=text, messages=tuple(messages), usage=usage
    )


def failure_message(session_id: str, turn: int | None, reason: TurnEndReason) -> str:
    """Why a turn failed, in words naming the session, turn and cause."""
    which = f"session {session_id!r} turn {turn}" if turn is not None else f"session {session_id!r}"
    if reason.error is not None:
        return f"{which} failed ({reason.error.code}): {reason.error.message}"
    if reason.kind == "aborted" and reason.reason is not None:
        return f"{which} was aborted (by {reason.reason.kind})"
    if reason.kind == "blocked":
        return f"{which} was blocked: a pre-step listener rejected its step"
    return f"{which} ended {reason.kind}"
