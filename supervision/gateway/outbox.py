"""A connection's outgoing frames in two priority lanes, drained by its one writer task.

- The **control** lane holds replies, errors and snapshot notifications. It
  is bounded (`CONTROL_CAPACITY` frames); overflowing it means the socket is
  not keeping up, so the named overflow behaviour is *disconnect the slow
  consumer* (`OutboxOverflow`, which the connection turns into close 4008).
- The **log** lane holds batches formatted by the subscription cursors. It
  is bounded (`LOG_CAPACITY` batches); a cursor putting a batch into a full
  lane *blocks* (only that cursor: it simply reads the log later, from where
  it stopped, so nothing is lost and no agent ever waits).

The writer takes control frames first, then log batches in arrival order,
everything queued at once, and writes it with one system call.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import attrs
import trio

CONTROL_CAPACITY = 512
"""Control frames (replies, errors, snapshots) that may wait before the peer is a slow consumer."""

LOG_CAPACITY = 8
"""Cursor batches waiting for the writer before cursors block."""


class OutboxOverflow(Exception):
    """The control lane is full: the peer does not read fast enough."""


class OutboxClosed(Exception):
    """The connection is closing; nothing more is accepted."""


@attrs.define(eq=False)
class Outbox:
    """Two bounded lanes and the wakeups of the writer and of blocked cursors."""

    control_capacity: int = CONTROL_CAPACITY
    log_capacity: int = LOG_CAPACITY
    _control: deque[str] = attrs.field(factory=deque, init=False)
    _log: deque[Sequence[str]] = attrs.field(factory=deque, init=False)
    _ready: trio.Event = attrs.field(factory=trio.Event, init=False)
    _space: trio.Event = attrs.field(factory=trio.Event, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    queued_frames: int = attrs.field(default=0, init=False)

    def put_control(self, frame: str) -> None:
        """Queue a control frame. Raises `OutboxOverflow` when the lane is full."""
        if self._closed:
            raise OutboxClosed("the connection is closing")
        if len(self._control) >= self.control_capacity:
            raise OutboxOverflow(
                f"{len(self._control)} replies are waiting to be written; the peer is too slow"
            )
        self._control.append(frame)
        self.queued_frames += 1
        self._ready.set()

    async def put_log(self, frames: Sequence[str]) -> None:
        """Queue one cursor batch, waiting while the log lane is full.

        Cancellation: cancellable; a cancelled put queued nothing.

        Raises:
            OutboxClosed: the connection is closing.
        """
        while True:
            if self._closed:
                raise OutboxClosed("the connection is closing")
            if len(self._log) < self.log_capacity:
                break
            if self._space.is_set():
                self._space = trio.Event()
            await self._space.wait()
        await trio.lowlevel.checkpoint()
        if self._closed:
            raise OutboxClosed("the connection is closing")
        self._log.append(frames)
        self.queued_frames += len(frames)
        self._ready.set()

    async def wait_ready(self) -> None:
        """Return once something is queued (without taking it). Cancellable."""
        while not self._control and not self._log:
            if self._ready.is_set():
                self._ready = trio.Event()
            await self._ready.wait()

    async def take(self) -> list[str]:
        """The next frames to write: every queued control frame, then every log batch.

        Waits until there is something to write.
        """
        while not self._control and not self._log:
            if self._ready.is_set():
                self._ready = trio.Event()
            await self._ready.wait()
        frames = list(self._control)
        self._control.clear()
        if self._log:
            while self._log:
                frames.extend(self._log.popleft())
            self._space.set()
        self.queued_frames -= len(frames)
        return frames

    def take_control_nowait(self) -> list[str]:
        """Every queued control frame, removed (to flush replies before a close)."""
        frames = list(self._control)
        self._control.clear()
        self.queued_frames -= len(frames)
        return frames

    def close(self) -> None:
        """Refuse further frames and wake blocked cursors (they see `OutboxClosed`)."""
        self._closed = True
        self._space.set()
