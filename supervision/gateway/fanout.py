"""The session fan-out: one pump hands every watched session's durable events out.

The store reports each commit to one listener (`SessionStore.durable_changes`):
the sessions whose durable mark advanced. The pump waits for that (the
agents never wait for it), lets the runtime commit for another `linger`
(5 ms, so a streamed step goes out in one batch, not one per chunk;
longer when the last round took long to hand out, see `FEED_LINGER_PER_WORK`:
a saturated runtime gets fewer, larger rounds; and while commits keep coming
in its last `FEED_LINGER_QUIET_SECONDS`, until they pause, see
`FEED_LINGER_STREAMING_SECONDS`: a step still streaming goes out whole),
takes every session reported since (in the order they first committed),
and for each one that has a feed reads
its new durable events from the live log, without waiting, and hands the
batch to each of its subscribers synchronously: a live log subscription
turns it into frames that share the batch's encoded bytes, a status
watcher looks for turn starts and ends. So committed events cost one
wakeup per commit batch of the whole runtime, whatever the number of
sessions and subscribers, and one encoding each (none where the store
keeps each event's JSON already, `stored_json`).

A session whose events are not in a live log (no running agent, a
hibernating session, a log that has not recorded the store's commit yet)
is read by a task of its own (`read`, from the store), and the pump leaves
it alone until that read has been handed out.

Subscribers that queue for a writer (a connection's log subscriptions) may
ask for a callback once the round's hand-out ends (`after_round`): the
connection then writes the whole round at once, itself, instead of waking
its writer task once per round.

A feed delivers every durable event from its `next_seq` on, in order, with
no gap and no duplicate, so a subscriber attaches only at or after it
(`attach` refuses one that is behind; it catches up on its own first).
A subscriber whose `deliver` returns False leaves the feed; a feed without
subscribers ends. A session whose commits failed ends its feed: its
subscribers get `fail(reason)`; a bug in one feed's delivery ends that
feed only.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import attrs
import trio

from actors.session import DurableChanges, Event, SessionError
from supervision.gateway.cursors import EventBatch
from supervision.gateway.encoding import encode_event

log = logging.getLogger(__name__)

FEED_BATCH = 1024
"""Most events a feed reads and hands out per round."""

FEED_LINGER_SECONDS = 0.005
"""How long the woken pump waits at least for more commits before it reads and hands out."""

FEED_LINGER_MAX_SECONDS = 0.25
"""How long the woken pump waits at most (see `FEED_LINGER_PER_WORK`)."""

FEED_LINGER_QUIET_SECONDS = 0.002
"""The pump's wait ends only after this long without a commit (or at
`FEED_LINGER_STREAMING_SECONDS`): a step whose events are still being committed when the
linger ends goes out in this round, whole, rather than in two."""

FEED_LINGER_STREAMING_SECONDS = 0.02
"""How long the pump waits at most while commits keep coming (a runtime that never pauses,
or a step streaming for longer, goes out at least this often)."""

FEED_LINGER_PER_WORK = 20.0
"""Between two rounds at least this many times the CPU the last two rounds each took to hand out
(the smaller) passes, counting the wait for the first commit, so the fan-out's rounds take at
most ~1/21 of the process's time: a saturated runtime gets fewer, larger rounds (less work per
event), an unsaturated one the minimum linger; one slow round (a garbage collection inside it)
changes nothing."""

ReadNow = Callable[[str, int, int], tuple[Sequence[Event], int] | None]
"""`read_now(session_id, from_seq, limit)`: durable events from `from_seq` (at least one) and the
head when the live log has them; None when they must be read from the store (`ReadDurable`)."""

ReadDurable = Callable[[str, int, int], Awaitable[tuple[Sequence[Event], int]]]
"""`read(session_id, from_seq, limit)`: waits until `from_seq` is durable; events and head."""

StoredJson = Callable[[str, int, int], Sequence[bytes | None]]
"""`stored_json(session_id, first, last)`: for each durable event `first` to `last`, the JSON
the store keeps for it when it is exactly `encode_event`'s bytes, or None (then the event is
encoded)."""


class Subscriber(Protocol):
    """One consumer of a session's durable events."""

    def deliver(self, batch: EventBatch) -> bool:
        """Take a contiguous batch (its JSON is encoded on first use, once); False to leave.

        Must not block, and must not attach or detach subscribers.
        """
        ...

    def fail(self, reason: str) -> None:
        """The feed ended for good (the store failed this session's commits)."""
        ...


@attrs.define(eq=False)
class _Feed:
    session_id: str
    next_seq: int
    subscribers: list[Subscriber] = attrs.field(factory=list)
    reading: bool = False
    """A task reads this feed's events from the store; the pump leaves the feed alone."""


@attrs.define(eq=False)
class Fanout:
    """The gateway's session feeds (see the module docstring). Serve them with `run`."""

    changes: Callable[[], DurableChanges]
    """Opens the store's durability listener (`SessionStore.durable_changes`)."""
    read_now: ReadNow
    read: ReadDurable
    stored_json: StoredJson | None = None
    """The store's own JSON of durable events (`MemoryStore.durable_json_range`), used instead
    of encoding them again; None: every event is encoded."""
    linger: float = FEED_LINGER_SECONDS
    linger_max: float = FEED_LINGER_MAX_SECONDS
    linger_quiet: float = FEED_LINGER_QUIET_SECONDS
    linger_streaming: float = FEED_LINGER_STREAMING_SECONDS
    work_clock: Callable[[], float] = time.process_time
    """Measures a round's hand-out (the process's CPU seconds: descheduling does not count)."""
    rounds: int = attrs.field(default=0, init=False)
    """Batches handed out so far (with `events`: how many events a batch carries on average)."""
    events: int = attrs.field(default=0, init=False)
    """Events handed out so far (each counted once, whatever the number of subscribers)."""
    round_work: tuple[float, float] = attrs.field(default=(0.0, 0.0), init=False)
    """What the last two rounds took to hand out (`work_clock`), older first."""
    _feeds: dict[str, _Feed] = attrs.field(factory=dict, init=False)
    _after_round: list[Callable[[], None]] = attrs.field(factory=list, init=False)
    _in_round: bool = attrs.field(default=False, init=False)
    _listener: DurableChanges | None = attrs.field(default=None, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)

    @property
    def feeds(self) -> int:
        """Sessions with a feed."""
        return len(self._feeds)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the pump until cancelled (`task_status.started()` once feeds can be attached).

        Cancellation: every feed stops; subscribers are not told (their
        connections are closing with the gateway).
        """
        listener = self.changes()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery, self._listener = nursery, listener
                task_status.started()
                ended = -math.inf
                while True:
                    await listener.wait()
                    if self.linger:
                        # The first commit wakes the pump; what the runtime commits in the
                        # next moment (the rest of a streamed step) goes out with it.
                        await self._linger(listener, self.next_linger(trio.current_time() - ended))
                    started = self.work_clock()
                    self._in_round = True
                    for session_id in listener.take():
                        feed = self._feeds.get(session_id)
                        if feed is None or feed.reading:
                            continue
                        try:
                            self._pump(feed, listener)
                        except Exception:
                            # A bug in one feed ends that feed (its subscribers' connections),
                            # never the server.
                            log.exception("the feed of session %r failed", session_id)
                            self._fail(feed, f"session {session_id!r}: the gateway's feed failed")
                    self._end_round()
                    self.round_work = (self.round_work[1], self.work_clock() - started)
                    ended = trio.current_time()
        finally:
            listener.close()
            self._nursery = self._listener = None
            self._feeds.clear()

    async def _linger(self, listener: DurableChanges, wait: float) -> None:
        """Sleep `wait`, and on while its last `linger_quiet` saw commits (a step still
        streaming), until a `linger_quiet` without any, `linger_streaming` in all at most.

        A bounded timer, not a poll for a condition: each `linger_quiet` is slept whole, so
        a streaming step wakes the pump once per `linger_quiet` whatever its commits
        (commits wake nothing here; a sleep re-armed at each commit's quiet deadline, tried,
        woke it up to twice as often).
        """
        start = trio.current_time()
        quiet = min(self.linger_quiet, wait)
        await trio.sleep(wait - quiet)
        while True:
            notes = listener.notes
            await trio.sleep(quiet)
            if listener.notes == notes or trio.current_time() - start >= self.linger_streaming:
                return

    def next_linger(self, idle: float) -> float:
        """How long the pump woken `idle` seconds after its last round waits: `linger`, or what
        is left of `FEED_LINGER_PER_WORK` times the smaller of the last two rounds' hand-out
        work when that is longer, at most `linger_max`."""
        spacing = FEED_LINGER_PER_WORK * min(self.round_work) - idle
        return max(self.linger, min(self.linger_max, spacing))

    def after_round(self, callback: Callable[[], None]) -> None:
        """Call `callback()` once the current hand-out ends (the pump's round, or one batch
        read from the store); at once when no hand-out is running.

        For subscribers (inside `deliver`); `callback` must not block. One
        that raises is logged and the others still run.
        """
        if self._in_round:
            self._after_round.append(callback)
        else:
            callback()

    def _end_round(self) -> None:
        self._in_round = False
        callbacks, self._after_round = self._after_round, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("a fan-out round's end callback failed")

    def attach(self, session_id: str, next_seq: int, subscriber: Subscriber) -> bool:
        """Add `subscriber` from `next_seq` on; False when the feed is already past it.

        Raises:
            RuntimeError: the fan-out is not running.
        """
        if self._listener is None:
            raise RuntimeError("the gateway's fan-out is not running")
        feed = self._feeds.get(session_id)
        if feed is None:
            feed = self._feeds[session_id] = _Feed(session_id=session_id, next_seq=next_seq)
            # Events may be durable already: the pump looks at the new feed at once.
            self._listener.note(session_id)
        elif next_seq < feed.next_seq:
            return False
        feed.subscribers.append(subscriber)
        return True

    def join(self, session_id: str, start: int, subscriber: Subscriber) -> None:
        """Add `subscriber` wherever the session's feed is, or from `start` when it has none.

        For subscribers that need no gap-free history (status watchers).

        Raises:
            RuntimeError: the fan-out is not running.
        """
        feed = self._feeds.get(session_id)
        self.attach(session_id, start if feed is None else feed.next_seq, subscriber)

    def detach(self, session_id: str, subscriber: Subscriber) -> None:
        """Remove `subscriber` (a no-op when it is not attached); a feed left empty ends."""
        feed = self._feeds.get(session_id)
        if feed is None or subscriber not in feed.subscribers:
            return
        feed.subscribers.remove(subscriber)
        if not feed.subscribers:
            self._end(feed)

    def _end(self, feed: _Feed) -> None:
        feed.subscribers = []
        if self._feeds.get(feed.session_id) is feed:
            del self._feeds[feed.session_id]

    def _pump(self, feed: _Feed, listener: DurableChanges) -> None:
        """Hand out what is durable past the feed, from the live log or by a store read."""
        session_id = feed.session_id
        while feed.subscribers and listener.seq(session_id) >= feed.next_seq:
            read = self.read_now(session_id, feed.next_seq, FEED_BATCH)
            if read is None:
                feed.reading = True
                assert self._nursery is not None
                self._nursery.start_soon(self._read_from_store, feed, listener)
                return
            self._deliver(feed, *read)
        failure = listener.failure(session_id)
        if feed.subscribers and failure is not None:
            self._fail(feed, f"session {session_id!r}: {failure}")

    async def _read_from_store(self, feed: _Feed, listener: DurableChanges) -> None:
        try:
            events, head = await self.read(feed.session_id, feed.next_seq, FEED_BATCH)
        except SessionError as exc:
            self._fail(feed, f"session {feed.session_id!r}: {exc}")
            return
        except Exception:
            log.exception("the feed of session %r failed", feed.session_id)
            self._fail(feed, f"session {feed.session_id!r}: the gateway's feed failed")
            return
        feed.reading = False
        if self._feeds.get(feed.session_id) is feed:
            self._in_round = True
            try:
                self._deliver(feed, events, head)
            except Exception:
                log.exception("the feed of session %r failed", feed.session_id)
                self._fail(feed, f"session {feed.session_id!r}: the gateway's feed failed")
                return
            finally:
                self._end_round()
            listener.note(feed.session_id)  # more may have become durable meanwhile

    def _deliver(self, feed: _Feed, events: Sequence[Event], head: int) -> None:
        feed.next_seq = events[-1].seq + 1
        self.rounds += 1
        self.events += len(events)
        stored_json = self.stored_json
        if stored_json is None:
            batch = EventBatch(events, head)
        else:
            session_id, first, last = feed.session_id, events[0].seq, events[-1].seq
            kept: Sequence[bytes | None] | None = None

            def encode(event: Event) -> bytes:
                nonlocal kept
                if kept is None:  # the whole batch's at once, on first use
                    kept = stored_json(session_id, first, last)
                text = kept[event.seq - first]
                return encode_event(event) if text is None else text

            batch = EventBatch(events, head, encode)
        feed.subscribers = [s for s in feed.subscribers if s.deliver(batch)]
        if not feed.subscribers:
            self._end(feed)

    def _fail(self, feed: _Feed, reason: str) -> None:
        subscribers = feed.subscribers
        self._end(feed)
        for subscriber in subscribers:
            subscriber.fail(reason)
