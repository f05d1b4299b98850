"""Rebuilding any past request from the session log alone."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from actors.providers.request import GenerateRequest
from actors.session.codec import event_from_json
from actors.session.errors import SessionError
from actors.session.events import (
    AssistantChunk,
    AssistantMessage,
    Event,
    RequestHeaderLogged,
    RequestRetry,
    StepEnd,
    StepStart,
    TurnEnd,
    UserMessage,
)
from actors.session.reducers import derive_messages, fold_request_header

RENDER_FAILED = "render_failed"
"""The turn-error code the loop writes when the system text failed to render."""


def _events(events: Sequence[Mapping[str, Any] | Event]) -> list[Event]:
    return [e if isinstance(e, Event) else event_from_json(e) for e in events]


def _attempt_starts(events: list[Event], start: int, end: int) -> list[int]:
    """Indices where each attempt of the step at `events[start]` began building its request."""
    index = start + 1
    while index < end and isinstance(events[index].data, UserMessage):
        index += 1
    starts = [index]
    for position in range(index, end):
        if isinstance(events[position].data, RequestRetry):
            starts.append(position + 1)
    return starts


def _request_was_sent(events: list[Event], start: int, end: int, turn: int) -> bool:
    if any(
        isinstance(e.data, AssistantChunk | AssistantMessage | RequestRetry)
        for e in events[start:end]
    ):
        return True
    for event in events[end:]:
        if isinstance(event.data, TurnEnd) and event.data.turn == turn:
            error = event.data.reason.error
            return error is None or error.code != RENDER_FAILED
    return True


def _step_end(events: list[Event], start: int) -> int:
    """Index just past the step opened at `events[start]` (its `step/end`, or the log's end)."""
    return next(
        (
            i
            for i in range(start + 1, len(events))
            if isinstance(events[i].data, StepEnd | StepStart)
        ),
        len(events),
    )


def request_attempts(events: Sequence[Mapping[str, Any] | Event]) -> list[tuple[int, int, int]]:
    """`(turn, step, attempt)` of every request the log says was sent, in sending order.

    A step whose system text failed to render sent nothing and is left out;
    each `request/retry` marks one more attempt of its step. These are
    exactly the arguments under which `rebuild_request` succeeds.
    """
    log = _events(events)
    out: list[tuple[int, int, int]] = []
    for start, event in enumerate(log):
        data = event.data
        if not isinstance(data, StepStart):
            continue
        end = _step_end(log, start)
        if _request_was_sent(log, start, end, data.turn):
            attempts = len(_attempt_starts(log, start, end))
            out.extend((data.turn, data.step, attempt) for attempt in range(attempts))
    return out


def rebuild_request(
    events: Sequence[Mapping[str, Any] | Event], turn: int, step: int, attempt: int = -1
) -> GenerateRequest:
    """The exact request sent for attempt `attempt` of step `step` of turn `turn`.

    `events` is the durable JSON list (`session.to_json()`) or `Event`
    objects. `attempt` indexes the step's attempts from 0; -1 means the
    last. The header is the latest one logged before the attempt's request,
    the messages are the surface as it stood then.

    Raises:
        SessionError: no such step, no such attempt, no request was sent for
            the step (its system text failed to render), or no header logged.
    """
    log = _events(events)
    start = next(
        (
            i
            for i, e in enumerate(log)
            if isinstance(e.data, StepStart) and e.data.turn == turn and e.data.step == step
        ),
        None,
    )
    if start is None:
        raise SessionError(f"the log has no step {step} in turn {turn}")
    end = next(
        (i for i in range(start + 1, len(log)) if isinstance(log[i].data, StepEnd | StepStart)),
        len(log),
    )
    if not _request_was_sent(log, start, end, turn):
        raise SessionError(
            f"no request was sent for turn {turn} step {step}: its system text failed to render"
        )
    starts = _attempt_starts(log, start, end)
    index = attempt if attempt >= 0 else len(starts) + attempt
    if not 0 <= index < len(starts):
        raise SessionError(
            f"turn {turn} step {step} has {len(starts)} attempt(s); "
            f"attempt {attempt} does not exist"
        )
    cut = starts[index]
    while cut < end and isinstance(log[cut].data, RequestHeaderLogged):
        cut += 1
    prefix = log[:cut]
    header = fold_request_header(prefix)
    if header is None:
        raise SessionError(f"no request header was logged before turn {turn} step {step}")
    return GenerateRequest(
        config=header.config,
        system=header.system,
        tools=header.tools,
        messages=derive_messages(prefix),
    )
