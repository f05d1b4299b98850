"""Pure reducers over session events: the model-visible surface and the current header."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from actors.messages import Message
from actors.session.errors import ReplacementError
from actors.session.events import (
    AssistantMessage,
    Event,
    RequestHeaderLogged,
    ToolResult,
    UserMessage,
)
from actors.session.header import RequestHeader, canonical_header


def message_of(event: Event) -> Message:
    """The model-visible message of one surface event."""
    data = event.data
    if isinstance(data, UserMessage | ToolResult):
        return data.to_message()
    if isinstance(data, AssistantMessage):
        return data.message
    raise ReplacementError(f"event seq {event.seq} ({event.type}) is not a surface event")


def surface_events(events: Sequence[Event]) -> list[Event]:
    """The surface events that are currently model-visible, in surface order.

    A replacement event takes the place of the first event it cites and
    removes the others.

    Raises:
        ReplacementError: a replacement cites no seq, a seq twice, or a seq that
            is missing, later than itself, not a surface event, or no longer on
            the surface.
    """
    by_seq = {event.seq: event for event in events}
    surface: list[Event] = []
    for event in events:
        if not event.is_surface:
            continue
        if event.surface_op != "replace":
            surface.append(event)
            continue
        cited = event.source_event_seqs or ()
        if not cited:
            raise ReplacementError(f"replacement event seq {event.seq} cites no events")
        if len(set(cited)) != len(cited):
            raise ReplacementError(
                f"replacement event seq {event.seq} cites a seq more than once: {list(cited)}"
            )
        positions: list[int] = []
        for seq in cited:
            target = by_seq.get(seq)
            if target is None or seq >= event.seq:
                raise ReplacementError(
                    f"replacement event seq {event.seq} cites seq {seq}, "
                    "which is not an earlier event of this session"
                )
            if not target.is_surface:
                raise ReplacementError(
                    f"replacement event seq {event.seq} cites seq {seq} ({target.type}), "
                    "which is not a surface event"
                )
            index = next((i for i, e in enumerate(surface) if e.seq == seq), None)
            if index is None:
                raise ReplacementError(
                    f"replacement event seq {event.seq} cites seq {seq}, "
                    "which an earlier replacement already removed from the surface"
                )
            positions.append(index)
        first = min(positions)
        for index in sorted(positions, reverse=True):
            del surface[index]
        surface.insert(first, event)
    return surface


def derive_messages(events: Sequence[Event]) -> list[Message]:
    """The model-visible message list rebuilt from the surface events."""
    return [message_of(event) for event in surface_events(events)]


def fold_request_header(
    events: Iterable[Event], start: RequestHeader | None = None
) -> RequestHeader | None:
    """The latest canonical header logged in `events` (`start` when there is none)."""
    state = start
    for event in events:
        if isinstance(event.data, RequestHeaderLogged):
            state = canonical_header(event.data.header)
    return state
