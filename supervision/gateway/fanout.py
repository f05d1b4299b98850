"""The session fan-out: one feed task per watched session hands its durable events out.

A feed waits until the session's next seq is durable (the store's commit
wakes it; the agent never waits for it), lets the session commit for
another `linger` (2 ms, so a streamed step goes out in a few batches, not
one per chunk; only while few sessions commit at once), reads every
durable event from there once, encodes each event's JSON once, and hands
the batch to each subscriber synchronously: a live log subscription turns
it into frames that share the encoded bytes, a status watcher looks for
turn starts and ends. So committed
events cost one wakeup per session, whatever the number of subscribers,
and one encoding each.

A feed delivers every durable event from its `next_seq` on, in order, with
no gap and no duplicate, so a subscriber attaches only at or after it
(`attach` refuses one that is behind; it catches up on its own first).
A subscriber whose `deliver` returns False leaves the feed; a feed without
subscribers ends. The feeds run in the gateway's nursery (`run`); a feed's
failure ends that feed only: its subscribers get `fail(reason)`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import attrs
import trio

from actors.session import Event, SessionError
from supervision.gateway.cursors import encode_event

log = logging.getLogger(__name__)

FEED_BATCH = 1024
"""Most events a feed reads and hands out per wakeup."""

FEED_LINGER_SECONDS = 0.002
"""How long a woken feed waits for the session's next commits before it reads and hands out."""

MAX_LINGERING = 8
"""Feeds that may linger at once. When more sessions commit at the same time the runtime is
busy: the feeds read at once, and the connections' writers batch across sessions anyway."""

WaitDurable = Callable[[str, int], Awaitable[None]]
"""`wait(session_id, seq)`: returns once `seq` is durable (the store's `wait_durable`)."""

ReadDurable = Callable[[str, int, int], Awaitable[tuple[Sequence[Event], int]]]
"""`read(session_id, from_seq, limit)`: waits until `from_seq` is durable; events and head."""


class Subscriber(Protocol):
    """One consumer of a session's durable events."""

    @property
    def wants_text(self) -> bool:
        """True when `deliver` needs the events' encoded JSON."""
        ...

    def deliver(self, events: Sequence[Event], encoded: Sequence[bytes], head: int) -> bool:
        """Take a contiguous batch (`encoded` is empty unless `wants_text`); False to leave.

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
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)


@attrs.define(eq=False)
class Fanout:
    """The gateway's session feeds (see the module docstring). Serve them with `run`."""

    wait: WaitDurable
    read: ReadDurable
    linger: float = FEED_LINGER_SECONDS
    _lingering: int = attrs.field(default=0, init=False)
    _feeds: dict[str, _Feed] = attrs.field(factory=dict, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)

    @property
    def feeds(self) -> int:
        """Sessions with a running feed."""
        return len(self._feeds)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host the feeds until cancelled (`task_status.started()` once they can be attached).

        Cancellation: every feed stops; subscribers are not told (their
        connections are closing with the gateway).
        """
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            self._feeds.clear()

    def attach(self, session_id: str, next_seq: int, subscriber: Subscriber) -> bool:
        """Add `subscriber` from `next_seq` on; False when the feed is already past it.

        Raises:
            RuntimeError: the fan-out is not running.
        """
        if self._nursery is None:
            raise RuntimeError("the gateway's fan-out is not running")
        feed = self._feeds.get(session_id)
        if feed is None:
            feed = self._feeds[session_id] = _Feed(session_id=session_id, next_seq=next_seq)
            self._nursery.start_soon(self._run_feed, feed)
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
        """Remove `subscriber` (a no-op when it is not attached); a feed left empty stops."""
        feed = self._feeds.get(session_id)
        if feed is None or subscriber not in feed.subscribers:
            return
        feed.subscribers.remove(subscriber)
        if not feed.subscribers:
            self._end(feed)

    def _end(self, feed: _Feed) -> None:
        feed.scope.cancel()
        if self._feeds.get(feed.session_id) is feed:
            del self._feeds[feed.session_id]

    async def _run_feed(self, feed: _Feed) -> None:
        with feed.scope:
            try:
                while feed.subscribers:
                    if self.linger:
                        # The first durable event wakes the feed; what the session commits
                        # in the next moment (the rest of a streamed step) goes out with it.
                        await self.wait(feed.session_id, feed.next_seq)
                        if self._lingering < MAX_LINGERING:
                            self._lingering += 1
                            try:
                                await trio.sleep(self.linger)
                            finally:
                                self._lingering -= 1
                    events, head = await self.read(feed.session_id, feed.next_seq, FEED_BATCH)
                    feed.next_seq = events[-1].seq + 1
                    subscribers = feed.subscribers
                    encoded: Sequence[bytes] = ()
                    if any(subscriber.wants_text for subscriber in subscribers):
                        encoded = [encode_event(event) for event in events]
                    feed.subscribers = [s for s in subscribers if s.deliver(events, encoded, head)]
            except SessionError as exc:
                self._fail(feed, f"session {feed.session_id!r}: {exc}")
            except Exception:
                # A bug in one feed ends that feed (its subscribers' connections), never the server.
                log.exception("the feed of session %r failed", feed.session_id)
                self._fail(feed, f"session {feed.session_id!r}: the gateway's feed failed")
        self._end(feed)

    def _fail(self, feed: _Feed, reason: str) -> None:
        subscribers, feed.subscribers = feed.subscribers, []
        for subscriber in subscribers:
            subscriber.fail(reason)
