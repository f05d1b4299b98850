"""Subscription cursors: positions in a session log that turn durable events into frames.

A cursor is never a queue of copies: it holds `next_seq`, and the
connection's follow task reads durable events from there (live log or
store) at the pace the socket drains, asks the cursor for the frames they
make, and moves on. Kinds:

- `LogCursor` (`_harness/log/subscribe`): every event as
  `_harness/log/event` (optionally only some types), then one
  `_harness/log/caughtUp` when it first reaches the durable head.
- `PromptCursor` (`session/prompt`): finds the turn that took the prompt,
  projects it to `session/update`s, and ends with the prompt's reply.
- `ReplayCursor` (`session/load`): replays the conversation up to the head
  at load time, then the load's reply (`null`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs

from actors.messages import Block, TextBlock, UserSource
from actors.session import Event, event_to_json
from actors.session.events import TurnEnd, TurnStart, UserMessage
from supervision.gateway.projection import live_updates, replay_updates, stop_reason
from supervision.gateway.protocol import (
    INTERNAL_ERROR,
    JsonId,
    RpcError,
    dumps,
    encode,
    error_response,
    notification,
    response,
)
from supervision.gateway.transport import Framing


def encode_event(event: Event) -> bytes:
    """The JSON of `event` as in `session.to_json()`, compact, as UTF-8 (ASCII) bytes."""
    return dumps(event_to_json(event)).encode()


@attrs.define(eq=False)
class EventTexts:
    """The encoded JSON of recently read events, shared by the catching-up cursors of a gateway.

    A cursor reading the same events as another (two supervisors replaying
    one session) encodes each once: `text(session_id, event)` returns the
    cached bytes when they were made for this very event object (a new
    incarnation's event of the same seq is encoded afresh). At most
    `capacity` texts are kept; the oldest is evicted. Live delivery does not
    come here: the session fan-out encodes each event once for all its
    subscribers.
    """

    capacity: int = 65_536
    _texts: OrderedDict[tuple[str, int], tuple[Event, bytes]] = attrs.field(factory=OrderedDict)

    def text(self, session_id: str, event: Event) -> bytes:
        """`encode_event(event)`, from the cache when possible."""
        key = (session_id, event.seq)
        cached = self._texts.get(key)
        if cached is not None and cached[0] is event:
            return cached[1]
        text = encode_event(event)
        self._texts[key] = (event, text)
        if len(self._texts) > self.capacity:
            self._texts.popitem(last=False)
        return text


class Cursor(Protocol):
    """What a follow task needs from a cursor."""

    session_id: str
    next_seq: int
    finished: bool

    def take(self, events: Sequence[Event], head: int, framing: Framing) -> list[bytes]:
        """Frames for `events` (from `next_seq` on, contiguous); advances `next_seq`.

        `head` is the session's durable seq when the events were read.
        """
        ...


_EVENT_END = b"}}"


@attrs.define(eq=False)
class LogCursor:
    """`_harness/log/event` for each durable event, in seq order, gap-free, once each.

    Events before `next_seq` (already delivered) are skipped, so the
    fan-out may hand a cursor a batch that starts before it.
    """

    subscription: str
    session_id: str
    next_seq: int
    texts: EventTexts
    types: frozenset[str] | None = None
    caught_up: bool = False
    finished: bool = False
    delivered: int = 0
    _prefix: bytes = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        # The envelope around each event, written once per subscription.
        self._prefix = (
            '{"jsonrpc":"2.0","method":"_harness/log/event","params":{"subscription":'
            + dumps(self.subscription)
            + ',"sessionId":'
            + dumps(self.session_id)
            + ',"event":'
        ).encode()

    def take(self, events: Sequence[Event], head: int, framing: Framing) -> list[bytes]:
        """One `_harness/log/event` per matching event, then `caughtUp` once at the head."""
        texts = self.texts
        encoded = [texts.text(self.session_id, event) for event in events]
        return self.frames(events, encoded, head, framing)

    def frames(
        self, events: Sequence[Event], encoded: Sequence[bytes], head: int, framing: Framing
    ) -> list[bytes]:
        """As `take`, with each event's JSON already encoded (`encoded[i]` is `events[i]`'s).

        Each frame is one join of its header, the subscription's envelope,
        the shared event bytes and the envelope's end.
        """
        if len(events) == 1 and self.caught_up and self.types is None:
            # The fan-out's usual case (one commit, one event): the same frame, fewer steps.
            (event,) = events
            if event.seq < self.next_seq:
                return []
            self.next_seq = event.seq + 1
            self.delivered += 1
            text, prefix = encoded[0], self._prefix
            size = len(prefix) + len(text) + len(_EVENT_END)
            return [b"".join((framing.header(size), prefix, text, _EVENT_END, framing.trailer))]
        start = self.next_seq - events[0].seq if events else 0
        if start >= len(events):
            return []
        if start > 0:
            events, encoded = events[start:], encoded[start:]
        prefix, header = self._prefix, framing.header
        end = _EVENT_END + framing.trailer
        around = len(prefix) + len(_EVENT_END)
        join = b"".join
        if self.types is None:
            frames = [join((header(around + len(text)), prefix, text, end)) for text in encoded]
        else:
            types = self.types
            frames = [
                join((header(around + len(text)), prefix, text, end))
                for event, text in zip(events, encoded, strict=True)
                if event.type in types
            ]
        self.next_seq = events[-1].seq + 1
        self.delivered += len(frames)
        if not self.caught_up and self.next_seq > head:
            self.caught_up = True
            frames.append(
                framing.frame(
                    encode(
                        notification(
                            "_harness/log/caughtUp",
                            {"subscription": self.subscription, "seq": self.next_seq - 1},
                        )
                    )
                )
            )
        return frames


def _texts(blocks: Sequence[Block]) -> tuple[str, ...]:
    return tuple(block.text for block in blocks if isinstance(block, TextBlock))


@attrs.define(eq=False)
class PromptCursor:
    """The updates of the turn that took one prompt, then the prompt's reply.

    The turn is the first one starting at or after `next_seq` whose first
    user message (typed by a user) has the prompt's text and that no other
    pending prompt has claimed (`claim(turn)` returns False when taken).
    """

    request_id: JsonId
    session_id: str
    next_seq: int
    texts: tuple[str, ...]
    claim: Callable[[int], bool]
    on_done: Callable[[], None]
    turn: int | None = None
    finished: bool = False
    cancelled: bool = False
    _candidate: int | None = None

    def take(self, events: Sequence[Event], head: int, framing: Framing) -> list[bytes]:
        """`session/update`s of the prompt's turn; the reply at its `turn/end`."""
        frames: list[bytes] = []
        for event in events:
            self.next_seq = event.seq + 1
            if self.finished:
                break
            data = event.data
            if self.turn is None:
                if isinstance(data, TurnStart):
                    self._candidate = data.turn
                elif (
                    isinstance(data, UserMessage)
                    and self._candidate is not None
                    and isinstance(data.source, UserSource)
                ):
                    candidate, self._candidate = self._candidate, None
                    if _texts(data.content) == self.texts and self.claim(candidate):
                        self.turn = candidate
                elif isinstance(data, TurnEnd):
                    self._candidate = None
                continue
            if isinstance(data, TurnEnd) and data.turn == self.turn:
                frames.append(framing.frame(self._reply(event, data)))
                break
            for update in live_updates(event):
                frames.append(
                    framing.frame(
                        encode(
                            notification(
                                "session/update", {"sessionId": self.session_id, "update": update}
                            )
                        )
                    )
                )
        return frames

    def cancel_if_waiting(self, framing: Framing) -> list[bytes]:
        """When the prompt has no turn yet: finish it as `cancelled` and return the reply."""
        if self.turn is not None or self.finished:
            return []
        self.finished = True
        self.on_done()
        return [framing.frame(encode(response(self.request_id, {"stopReason": "cancelled"})))]

    def _reply(self, event: Event, end: TurnEnd) -> bytes:
        self.finished = True
        self.on_done()
        reason = stop_reason(end.reason)
        if reason is None:
            error = end.reason.error
            message = error.message if error is not None else end.reason.kind
            turn_end: Any = event_to_json(event)["data"]["reason"]
            failure = RpcError(
                INTERNAL_ERROR,
                f"session {self.session_id!r} turn {end.turn} failed: {message}",
                {"turnEnd": turn_end},
            )
            return encode(error_response(self.request_id, failure))
        return encode(
            response(
                self.request_id,
                {"stopReason": reason, "_meta": {"harness": {"turn": end.turn}}},
            )
        )


@attrs.define(eq=False)
class ReplayCursor:
    """`session/load`: the conversation up to `end_seq` as `session/update`s, then `null`."""

    request_id: JsonId
    session_id: str
    next_seq: int
    end_seq: int
    on_done: Callable[[], None]
    finished: bool = False

    def take(self, events: Sequence[Event], head: int, framing: Framing) -> list[bytes]:
        """Replay updates for events up to `end_seq`; the reply after it."""
        frames = []
        for event in events:
            if event.seq > self.end_seq:
                break
            self.next_seq = event.seq + 1
            for update in replay_updates(event):
                frames.append(
                    framing.frame(
                        encode(
                            notification(
                                "session/update", {"sessionId": self.session_id, "update": update}
                            )
                        )
                    )
                )
        if self.next_seq > self.end_seq:
            self.finished = True
            self.on_done()
            frames.append(framing.frame(encode(response(self.request_id, None))))
        return frames
