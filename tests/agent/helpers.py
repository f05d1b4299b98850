"""Shared helpers for agent tests."""

from __future__ import annotations

from typing import Any

from actors.session import Session


def types(session: Session) -> list[str]:
    """The event types of a session, in order."""
    return [event.type for event in session.events]


def data_of(session: Session, type_: str) -> list[Any]:
    """The data of every event of one type, in order."""
    return [event.data for event in session.events if event.type == type_]


def turn_end_kinds(session: Session) -> list[str]:
    """The kind of every turn/end reason, in order."""
    return [data.reason.kind for data in data_of(session, "turn/end")]
