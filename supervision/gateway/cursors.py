"""Subscription cursors: positions in a session log that turn durable events into frames.

A cursor is never a queue of copies: it holds `next_seq`, and the
connection's follow task reads durable events from there (live log or
store) at the pace the socket drains, asks the cursor for the frames they
make, and moves on. Kinds:

- `LogCursor` (`_harness/log/subscribe`): every event as
  `_harness/log/event`, or (`batch`) consecutive events together as
  `_harness/log/events`, or (`merge`) as batches of a `_harness/log/merged`
  notification that the connection's other merged subscriptions share
  (optionally only some types), then one `_harness/log/caughtUp` when it
  first reaches the durable head.
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
from supervision.gateway.encoding import encode_event
from supervision.gateway.outbox import MERGED_END, MERGED_HEAD
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


@attrs.define(eq=False)
class EventBatch:
    """Contiguous durable events of one session, read once, each event's JSON encoded once.

    `texts[i]` is `events[i]`'s JSON as in `session.to_json()` (compact,
    ASCII), made on first use by `encode` and then shared by every cursor
    the batch is handed to; `joined()` is those texts joined by commas, also
    made once (the body of a batched subscription's `events` array).
    `head` is the session's durable seq when the events were read.
    """

    events: Sequence[Event]
    head: int
    encode: Callable[[Event], bytes] = encode_event
    _texts: list[bytes] | None = attrs.field(default=None, init=False)
    _joined: bytes | None = attrs.field(default=None, init=False)

    @property
    def texts(self) -> Sequence[bytes]:
        """Each event's encoded JSON, in order."""
        texts = self._texts
        if texts is None:
            encode = self.encode
            texts = self._texts = [encode(event) for event in self.events]
        return texts

    def joined(self) -> bytes:
        """`b",".join(texts)`."""
        joined = self._joined
        if joined is None:
            joined = self._joined = b",".join(self.texts)
        return joined


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
_EVENTS_END = b"]}}"

BATCH_MAX_BYTES = 256 * 1024
"""Most bytes of event JSON in one `_harness/log/events` notification (larger events go alone)."""


@attrs.define(eq=False)
class LogCursor:
    """The durable events of one session, in seq order, gap-free, once each.

    Unbatched, each event is one `_harness/log/event` notification; with
    `batch`, consecutive events go out together as one `_harness/log/events`
    notification (`events`: their JSON, in order, at most `batch_max_bytes`
    of it unless a single event is larger), as many as were read at once.
    With `merge` (which implies `batch`), each such batch (the same params
    object) is one entry of a `_harness/log/merged` notification's
    `batches`: the fan-out adds it to the connection's open merged frame
    (`whole` and `batch_prefix`, see `Outbox.offer_merged`), and every
    other frame (`frames`) is a merged notification of one batch.
    Either way each event's JSON is exactly the stored event's, and the
    first time the cursor reaches the durable head one `_harness/log/caughtUp`
    follows.

    Events before `next_seq` (already delivered) are skipped, so the
    fan-out may hand a cursor a batch that starts before it.
    """

    subscription: str
    session_id: str
    next_seq: int
    texts: EventTexts
    types: frozenset[str] | None = None
    batch: bool = False
    merge: bool = False
    batch_max_bytes: int = BATCH_MAX_BYTES
    caught_up: bool = False
    finished: bool = False
    delivered: int = 0
    batch_prefix: bytes = attrs.field(init=False)
    """A batch's params object up to its `events` array's body (what merged frames hold)."""
    _prefix: bytes = attrs.field(init=False)
    _end: bytes = attrs.field(init=False)
    _around: int = attrs.field(init=False)
    _caught_up_head: bytes = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        # The envelope around each event (or each batch's array), written once per subscription.
        self.batch = self.batch or self.merge
        ids = f'{{"subscription":{dumps(self.subscription)},"sessionId":{dumps(self.session_id)}'
        self.batch_prefix = (ids + ',"events":[').encode()
        if self.merge:
            self._prefix, self._end = MERGED_HEAD + self.batch_prefix, MERGED_END
        elif self.batch:
            head = '{"jsonrpc":"2.0","method":"_harness/log/events","params":'
            self._prefix, self._end = head.encode() + self.batch_prefix, _EVENTS_END
        else:
            head = '{"jsonrpc":"2.0","method":"_harness/log/event","params":'
            self._prefix, self._end = (head + ids + ',"event":').encode(), _EVENT_END
        self._around = len(self._prefix) + len(self._end)
        # `encode(notification("_harness/log/caughtUp", {...}))` up to the seq, made once.
        self._caught_up_head = (
            '{"jsonrpc":"2.0","method":"_harness/log/caughtUp","params":{"subscription":'
            f'{dumps(self.subscription)},"seq":'
        ).encode()

    def whole(self, batch: EventBatch) -> bytes | None:
        """The batch's joined JSON when this cursor takes the batch whole, else None.

        Whole means: batched, every type, the batch starting at `next_seq`
        and within `batch_max_bytes`; the cursor then advances past it (the
        caller must send the returned bytes, then `caught_up_frame`'s when
        there is one).
        """
        events = batch.events
        if self.batch and self.types is None and events[0].seq == self.next_seq:
            joined = batch.joined()
            if len(joined) <= self.batch_max_bytes:
                self.next_seq = events[-1].seq + 1
                self.delivered += len(events)
                return joined
        return None

    def caught_up_frame(self, head: int, framing: Framing) -> bytes | None:
        """The `_harness/log/caughtUp` frame the first time the cursor is past `head` (the
        durable seq when its last events were read), to send after those events; else None."""
        if self.caught_up or self.next_seq <= head:
            return None
        self.caught_up = True
        return framing.frame(b"%b%d}}" % (self._caught_up_head, self.next_seq - 1))

    def take(self, events: Sequence[Event], head: int, framing: Framing) -> list[bytes]:
        """The frames of `events` (see the class docstring), then `caughtUp` once at the head."""
        texts, session_id = self.texts, self.session_id
        return self.frames(
            EventBatch(events, head, lambda event: texts.text(session_id, event)), framing
        )

    def frames(self, batch: EventBatch, framing: Framing) -> list[bytes]:
        """As `take`, for a batch whose encoded JSON may be shared with other cursors.

        Each frame is one join of its header, the subscription's envelope,
        the shared event bytes and the envelope's end.
        """
        events = batch.events
        if not events:
            return []
        # The fan-out's usual case: the whole batch in one frame, around the joined JSON
        # that every subscriber of the session shares.
        joined = self.whole(batch)
        if joined is not None:
            header = framing.header(self._around + len(joined))
            frames = [b"".join((header, self._prefix, joined, self._end, framing.trailer))]
        else:
            start = self.next_seq - events[0].seq
            if start >= len(events):
                return []
            if self.batch:
                frames = self._batched(batch, max(start, 0), framing)
            else:
                frames = self._single(batch, max(start, 0), framing)
            self.next_seq = events[-1].seq + 1
        caught_up = self.caught_up_frame(batch.head, framing)
        if caught_up is not None:
            frames.append(caught_up)
        return frames

    def _single(self, batch: EventBatch, start: int, framing: Framing) -> list[bytes]:
        texts: Sequence[bytes] = batch.texts
        events = batch.events
        if start > 0:
            events, texts = events[start:], texts[start:]
        prefix, header = self._prefix, framing.header
        end = self._end + framing.trailer
        around = self._around
        join = b"".join
        if self.types is None:
            frames = [join((header(around + len(text)), prefix, text, end)) for text in texts]
        else:
            types = self.types
            frames = [
                join((header(around + len(text)), prefix, text, end))
                for event, text in zip(events, texts, strict=True)
                if event.type in types
            ]
        self.delivered += len(frames)
        return frames

    def _batched(self, batch: EventBatch, start: int, framing: Framing) -> list[bytes]:
        end, around = self._end + framing.trailer, self._around
        texts: Sequence[bytes] = batch.texts
        events = batch.events
        if start > 0:
            events, texts = events[start:], texts[start:]
        if self.types is not None:
            types = self.types
            texts = [text for event, text in zip(events, texts, strict=True) if event.type in types]
        frames: list[bytes] = []
        group: list[bytes] = []
        size = 0
        for text in texts:
            if group and size + len(text) + len(group) > self.batch_max_bytes:
                frames.append(self._batch_frame(group, framing, around, end))
                group, size = [], 0
            group.append(text)
            size += len(text)
        if group:
            frames.append(self._batch_frame(group, framing, around, end))
        self.delivered += len(texts)
        return frames

    def _batch_frame(self, texts: list[bytes], framing: Framing, around: int, end: bytes) -> bytes:
        body = b",".join(texts)
        return b"".join((framing.header(around + len(body)), self._prefix, body, end))


def _texts(blocks: Sequence[Block]) -> tuple[str, ...]:
    return tuple(block.text for block in blocks if isinstance(block, TextBlock))


@attrs.define(eq=False)
class PromptCursor:
    """The updates of the turn that took one prompt, then the prompt's reply.

    The turn is the first one starting at or after `next_seq` whose first
    user message (typed by a user) has the prompt's text (or, given
    `message_request_id`, carries that `source.request_id`: a cluster node's
    prompts) and that no other pending prompt has claimed (`claim(turn)`
    returns False when taken), or the one the agent reports (`adopt`) when
    its message never reached the log.
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
    message_request_id: str | None = None
    _candidate: int | None = None
    _current: int | None = None
    """The turn whose events are being read (between its `turn/start` and `turn/end`)."""
    _ends: dict[int, Event] = attrs.field(factory=dict)
    """The `turn/end`s read while no turn was the prompt's (see `adopt`)."""

    def take(self, events: Sequence[Event], head: int, framing: Framing) -> list[bytes]:
        """`session/update`s of the prompt's turn; the reply at its `turn/end`."""
        frames: list[bytes] = []
        for event in events:
            self.next_seq = event.seq + 1
            if self.finished:
                break
            data = event.data
            if isinstance(data, TurnStart):
                self._current = data.turn
            if self.turn is None:
                if isinstance(data, TurnStart):
                    self._candidate = data.turn
                elif (
                    isinstance(data, UserMessage)
                    and self._candidate is not None
                    and isinstance(data.source, UserSource)
                ):
                    candidate, self._candidate = self._candidate, None
                    if self._is_prompt(data) and self.claim(candidate):
                        self.turn = candidate
                elif isinstance(data, TurnEnd):
                    self._candidate = self._current = None
                    self._ends[data.turn] = event
                continue
            if isinstance(data, TurnEnd):
                if data.turn == self.turn:
                    frames.append(framing.frame(self._reply(event, data)))
                    break
                self._current = None
                continue
            if self._current != self.turn:
                continue  # an earlier turn's events, read after `adopt` named a later one
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

    def _is_prompt(self, message: UserMessage) -> bool:
        if self.message_request_id is not None:
            source = message.source
            return isinstance(source, UserSource) and source.request_id == self.message_request_id
        return _texts(message.content) == self.texts

    def adopt(self, turn: int, framing: Framing) -> list[bytes]:
        """Make `turn` the prompt's turn, as the agent reports it (`Agent.run`), when the log
        did not show it: its first step never opened (refused by a pre-step listener, or its
        assembly failed), so the prompt's message was not logged, or the cursor has not read
        that far yet (then it streams that turn's updates, and only that turn's, as it reads
        them). Returns the reply when that turn's end was read already; else the reply comes
        at its `turn/end`. Nothing when the cursor has a turn or finished, or another prompt
        claimed `turn`."""
        if self.finished or self.turn is not None or not self.claim(turn):
            return []
        self.turn = turn
        end = self._ends.get(turn)
        if end is None or not isinstance(end.data, TurnEnd):
            return []
        return [framing.frame(self._reply(end, end.data))]

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
