"""A connection's outgoing frames in two priority lanes, drained by its one writer task.

Frames are UTF-8 payloads (`bytes`); the transport adds the framing.

- The **control** lane holds replies, errors and snapshot notifications. It
  is bounded (`CONTROL_CAPACITY` frames); overflowing it means the socket is
  not keeping up, so the named overflow behaviour is *disconnect the slow
  consumer* (`OutboxOverflow`, which the connection turns into close 4008).
- The **log** lane holds the frames of subscription cursors, bounded by
  size (`LOG_CAPACITY_BYTES`). The session fan-out *offers* frames
  (`offer_log`, never blocking): when the lane is full the offer is refused
  and that cursor leaves the fan-out to catch up on its own. A catching-up
  cursor *blocks* on a full lane (`put_log`): it simply reads the log later,
  from where it stopped, so nothing is lost and no agent ever waits.
  Frames *relayed* from elsewhere (the cluster gateway passing on a node's
  `session/update`s, which it cannot read again later) are *pushed*
  (`push_log`, never blocking, never refused for a full lane) up to
  `RELAY_LIMIT_BYTES` queued in all; past that the named overflow
  behaviour is *disconnect the slow consumer* (`OutboxOverflow`, close 4008).

A connection's *merged* log subscriptions (`merge: true`) share frames:
the fan-out adds each one's new events to the connection's **open merged
frame** (`offer_merged`: a cursor check and a few list appends, no frame
of its own), one `_harness/log/merged` notification carrying every merged
subscription's batch of the round. The open frame is the tail of the log
lane: it is sealed (made into one frame) before any other log frame is
queued behind it, when it would pass `MERGED_MAX_BYTES` of batches, and
when the writer takes the lane, so log frames keep their arrival order.
Frames that must follow a batch of the open frame (a subscription's first
`caughtUp`) wait beside it (`after_merged`) and are queued right behind it
when it is sealed.

The writer takes everything queued at once, control frames first, then log
frames in arrival order, and writes it with one system call. The session
fan-out may queue without waking the writer (`wake=False`): at the end of
its round the connection writes what is queued itself when the socket is
free (`Connection.flush_round`), so a round costs no writer wakeup, and
wakes the writer (`wake`, `kick`) only for what that could not write.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import trio

from supervision.gateway.transport import Framing

CONTROL_CAPACITY = 512
"""Control frames (replies, errors, snapshots) that may wait before the peer is a slow consumer."""

LOG_CAPACITY_BYTES = 16 * 1024 * 1024
"""Bytes of log frames waiting for the writer before offers are refused and cursors block."""


RELAY_LIMIT_BYTES = 2 * LOG_CAPACITY_BYTES
"""Bytes of log frames waiting for the writer past which a relayed frame disconnects the peer."""


MERGED_MAX_BYTES = 256 * 1024
"""Most bytes of batches in one `_harness/log/merged` frame (a larger batch goes alone)."""

MERGED_HEAD = b'{"jsonrpc":"2.0","method":"_harness/log/merged","params":{"batches":['
"""The start of a `_harness/log/merged` notification, before its first batch."""

MERGED_SEPARATOR = b"]},"
"""Ends one batch of a merged frame (its `events` array and object) before the next."""

MERGED_END = b"]}]}}"
"""Ends the last batch of a merged frame, its `batches` array, `params` and the message."""


class OutboxOverflow(Exception):
    """A lane is over its bound: the peer does not read fast enough."""


class OutboxClosed(Exception):
    """The connection is closing; nothing more is accepted."""


@attrs.define(eq=False)
class Outbox:
    """Two bounded lanes and the wakeups of the writer and of blocked cursors."""

    control_capacity: int = CONTROL_CAPACITY
    log_capacity: int = LOG_CAPACITY_BYTES
    relay_limit: int = RELAY_LIMIT_BYTES
    merged_max_bytes: int = MERGED_MAX_BYTES
    _control: list[bytes] = attrs.field(factory=list, init=False)
    _log: list[bytes] = attrs.field(factory=list, init=False)
    _log_bytes: int = attrs.field(default=0, init=False)
    _ready: trio.Event = attrs.field(factory=trio.Event, init=False)
    _space: trio.Event = attrs.field(factory=trio.Event, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    _kicked: bool = attrs.field(default=False, init=False)
    _merged: list[bytes] = attrs.field(factory=list, init=False)
    """The open merged frame's batches: prefix, events JSON, separator, prefix, ..."""
    _merged_size: int = attrs.field(default=0, init=False)
    _merged_framing: Framing | None = attrs.field(default=None, init=False)
    _after_merged: list[bytes] = attrs.field(factory=list, init=False)
    """Frames queued right behind the open merged frame when it is sealed."""

    @property
    def queued_frames(self) -> int:
        """Frames waiting for the writer (an open merged frame counts as one)."""
        return len(self._control) + len(self._log) + (1 if self._merged else 0)

    @property
    def has_frames(self) -> bool:
        """True while anything is queued."""
        return bool(self._control or self._log or self._merged)

    @property
    def log_has_room(self) -> bool:
        """True while the log lane is under its capacity (an offer would be taken)."""
        return self._log_bytes < self.log_capacity and not self._closed

    def put_control(self, frame: bytes) -> None:
        """Queue a control frame. Raises `OutboxOverflow` when the lane is full."""
        if self._closed:
            raise OutboxClosed("the connection is closing")
        if len(self._control) >= self.control_capacity:
            raise OutboxOverflow(
                f"{len(self._control)} replies are waiting to be written; the peer is too slow"
            )
        self._control.append(frame)
        self._ready.set()

    def offer_log(self, frames: Sequence[bytes], size: int, *, wake: bool = True) -> bool:
        """Queue log frames of `size` bytes unless the lane is full or closed; True if queued.

        `wake=False` leaves the writer asleep: the caller then writes or wakes (`wake`).
        """
        if not self.log_has_room:
            return False
        self._queue_log(frames, size, wake=wake)
        return True

    def offer_merged(
        self, prefix: bytes, events: bytes, framing: Framing, *, wake: bool = True
    ) -> bool:
        """Add one subscription's batch to the open merged frame unless the lane is full or
        closed; True if queued. `wake` as for `offer_log`.

        `prefix` is the batch's object up to its `events` array
        (`{"subscription":...,"sessionId":...,"events":[`), `events` the
        array's body (the events' JSON joined by commas). A frame holding
        batches already is sealed first when this batch would take it past
        `merged_max_bytes`.
        """
        if not self.log_has_room:
            return False
        size = len(prefix) + len(events) + len(MERGED_SEPARATOR)
        if self._merged and self._merged_size + size > self.merged_max_bytes:
            self._seal()
        merged = self._merged
        merged.append(prefix)
        merged.append(events)
        merged.append(MERGED_SEPARATOR)
        self._merged_size += size
        self._log_bytes += size
        self._merged_framing = framing
        if wake:
            self._ready.set()
        return True

    def after_merged(self, frame: bytes) -> None:
        """Queue `frame` right behind the open merged frame (which must hold a batch): it
        follows that frame's batches, before any later log frame."""
        assert self._merged
        self._after_merged.append(frame)
        self._log_bytes += len(frame)

    def _queue_log(self, frames: Sequence[bytes], size: int, *, wake: bool = True) -> None:
        """Append log frames of `size` bytes behind everything queued (the open merged frame
        sealed first, so log frames keep their arrival order) and wake the writer (`wake`)."""
        if self._merged:
            self._seal()
        self._log.extend(frames)
        self._log_bytes += size
        if wake:
            self._ready.set()

    def wake(self) -> None:
        """Wake the writer if anything is queued (after offers made with `wake=False`)."""
        if self.has_frames:
            self._ready.set()

    def kick(self) -> None:
        """Wake the writer even with nothing queued (it has a transport's tail to write);
        its next `wait_ready` returns at once, and `take` clears the kick."""
        self._kicked = True
        self._ready.set()

    def _seal(self) -> None:
        """Make the open merged frame one frame at the tail of the log lane."""
        merged, framing = self._merged, self._merged_framing
        assert merged and framing is not None
        merged[-1] = MERGED_END
        payload = len(MERGED_HEAD) + self._merged_size + len(MERGED_END) - len(MERGED_SEPARATOR)
        self._log.append(b"".join((framing.header(payload), MERGED_HEAD, *merged, framing.trailer)))
        self._log_bytes += len(MERGED_HEAD) + len(MERGED_END) - len(MERGED_SEPARATOR)
        self._merged = []
        self._merged_size = 0
        if self._after_merged:
            self._log.extend(self._after_merged)
            self._after_merged = []

    def push_log(self, frames: Sequence[bytes], size: int) -> None:
        """Queue relayed log frames of `size` bytes now, even over the lane's capacity.

        Raises:
            OutboxOverflow: more than `relay_limit` bytes of log frames would wait.
            OutboxClosed: the connection is closing.
        """
        if self._closed:
            raise OutboxClosed("the connection is closing")
        if self._log_bytes + size > self.relay_limit:
            raise OutboxOverflow(
                f"{self._log_bytes} bytes of log frames are waiting to be written and "
                f"{size} more arrived (limit {self.relay_limit}); the peer is too slow"
            )
        self._queue_log(frames, size)

    async def put_log(self, frames: Sequence[bytes]) -> None:
        """Queue log frames, waiting while the log lane is full.

        Cancellation: cancellable; a cancelled put queued nothing.

        Raises:
            OutboxClosed: the connection is closing.
        """
        await trio.lowlevel.checkpoint()
        while True:
            # Checked again after every wait, with no checkpoint before the frames are
            # queued: every put woken by the same space would otherwise queue its frames.
            if self._closed:
                raise OutboxClosed("the connection is closing")
            if self._log_bytes < self.log_capacity:
                break
            if self._space.is_set():
                self._space = trio.Event()
            await self._space.wait()
        self._queue_log(frames, sum(len(frame) for frame in frames))

    async def wait_ready(self) -> None:
        """Return once something is queued or the writer was kicked (without taking it).
        Cancellable."""
        while not self._control and not self._log and not self._merged and not self._kicked:
            if self._ready.is_set():
                self._ready = trio.Event()
            await self._ready.wait()

    def take(self) -> list[bytes]:
        """Every queued frame, removed: control frames first, then log frames (the open merged
        frame sealed, last); clears a kick."""
        self._kicked = False
        frames = self._control
        self._control = []
        if self._merged:
            self._seal()
        if self._log:
            frames.extend(self._log)
            self._log = []
            self._log_bytes = 0
            self._space.set()
        return frames

    def take_control_nowait(self) -> list[bytes]:
        """Every queued control frame, removed (to flush replies before a close)."""
        frames, self._control = self._control, []
        return frames

    def close(self) -> None:
        """Refuse further frames and wake blocked cursors (they see `OutboxClosed`)."""
        self._closed = True
        self._space.set()
