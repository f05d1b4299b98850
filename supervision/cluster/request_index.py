"""Where each request id is in a hosted session's log: the node's exactly-once lookup.

A node logs the user message of every `session/prompt` and
`_harness/session/send` carrying a request id with it
(`source.request_id`). Before it queues such a message it asks the
session's `RequestIndex` whether that id is already in the log, or queued
here and not logged yet, so a retry is never logged twice. A queued prompt
whose message can no longer be logged stops counting as queued, so a retry
runs it again instead of waiting for it: its `TurnTicket` settled without a
turn (dropped by a cancel), or with a turn whose durable end came without
the message and without putting it back in the inbox (refused by a
pre-step listener). A message put back (its turn failed or was aborted
before its first step opened) is still queued: it runs at the next wake.

The index of a session is built on first use from its durable events and
brought up to date from the events appended since, each event read once
(`request_index(session)`): a lookup costs the events appended since the
previous one, not a scan of the whole log. It lives as long as the
`Session` object (a new incarnation of the agent starts a new one, whose
queued input is gone with the old agent).
"""

from __future__ import annotations

import weakref

import attrs

from actors.agent import TurnTicket
from actors.messages import UserSource
from actors.session import Session
from actors.session.events import StepStart, TurnEnd, TurnStart, UserMessage


@attrs.frozen(kw_only=True)
class LoggedPrompt:
    """Where a request id's latest attempt is in a session log.

    Attributes:
        turn: the turn that took it.
        start_seq: the seq of that turn's `turn/start`.
        end: its `turn/end`, None while it runs.
    """

    turn: int
    start_seq: int
    end: TurnEnd | None


@attrs.frozen(kw_only=True)
class QueuedAttempt:
    """A request id's message queued here and not logged yet.

    Attributes:
        at: the session's length when it was queued.
        ticket: the outcome of a prompt's turn (None for a send).
    """

    at: int
    ticket: TurnTicket | None


@attrs.define(eq=False)
class RequestIndex:
    """Request id → its latest logged attempt, and the ids queued here but not yet logged."""

    session: Session
    next_seq: int = 0
    """The first durable seq not read yet."""
    _logged: dict[str, LoggedPrompt] = attrs.field(factory=dict)
    _open: dict[int, list[str]] = attrs.field(factory=dict)
    """Turn without a `turn/end` yet → the request ids logged in it."""
    _turn: int | None = None
    _turn_start: int = 0
    _queued: dict[str, QueuedAttempt] = attrs.field(factory=dict)
    _ended_through: int = -1
    """The highest turn whose durable `turn/end` was read."""

    def find(self, request_id: str) -> LoggedPrompt | None:
        """The latest turn whose user message carries `request_id` (durable), or None."""
        self._catch_up()
        return self._logged.get(request_id)

    def queued(self, request_id: str) -> QueuedAttempt | None:
        """`request_id`'s message queued here while it may still be logged; None when it
        is logged (durably), or can no longer be: its ticket settled without a turn, or
        with a turn whose durable `turn/end` was read without the message, which did not
        go back to the inbox."""
        self._catch_up()
        attempt = self._queued.get(request_id)
        ticket = attempt.ticket if attempt is not None else None
        if ticket is None or not ticket.settled or ticket.requeued:
            return attempt
        turn = ticket.turn
        if turn is not None and turn > self._ended_through:
            return attempt
        del self._queued[request_id]
        return None

    def queue(self, request_id: str, ticket: TurnTicket | None) -> None:
        """Record that `request_id`'s message was just queued to the agent (with the
        ticket of its turn, for a prompt)."""
        self._queued[request_id] = QueuedAttempt(at=len(self.session), ticket=ticket)

    def _catch_up(self) -> None:
        events = self.session.durable_events(self.next_seq)
        for event in events:
            data = event.data
            if isinstance(data, TurnStart):
                self._turn, self._turn_start = data.turn, event.seq
            elif isinstance(data, StepStart):
                if data.turn != self._turn:
                    self._turn, self._turn_start = data.turn, 0
            elif isinstance(data, UserMessage):
                source = data.source
                if (
                    isinstance(source, UserSource)
                    and source.request_id is not None
                    and self._turn is not None
                ):
                    request_id = source.request_id
                    self._queued.pop(request_id, None)
                    self._logged[request_id] = LoggedPrompt(
                        turn=self._turn, start_seq=self._turn_start, end=None
                    )
                    self._open.setdefault(self._turn, []).append(request_id)
            elif isinstance(data, TurnEnd):
                self._ended_through = max(self._ended_through, data.turn)
                for request_id in self._open.pop(data.turn, ()):
                    logged = self._logged[request_id]
                    if logged.turn == data.turn:
                        self._logged[request_id] = attrs.evolve(logged, end=data)
        if events:
            self.next_seq = events[-1].seq + 1


_indexes: weakref.WeakKeyDictionary[Session, RequestIndex] = weakref.WeakKeyDictionary()


def request_index(session: Session) -> RequestIndex:
    """The request index of `session` (made on first use, kept while the session lives)."""
    index = _indexes.get(session)
    if index is None:
        index = _indexes[session] = RequestIndex(session=session)
    return index
