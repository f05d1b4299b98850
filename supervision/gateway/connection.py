"""One supervisor connection: an actor with a reader task, one writer task and its cursors.

The connection only frames, orders and bounds; handlers (plain async
functions of params and a `Call`) never touch the transport.

- The **reader** takes one message at a time. A binary frame closes with
  1003, an oversized one with 1009 (trio-websocket enforces the size on
  websockets); malformed JSON-RPC gets an error answer and the connection
  stays open. Requests run in worker tasks, at most `max_inflight` at once
  (-33003 `overloaded` beyond); a duplicate in-flight id is -32600. So the
  reader never blocks on a handler.
- The **writer** drains the `Outbox` (replies first, then cursor batches),
  everything queued in one write (the fan-out queues a whole round of
  sessions' events before the writer runs, so one write carries them all);
  each write runs under the write deadline, and a write that stalls past it
  closes the connection with **4008** (aborting it where even the close
  frame cannot be written).
- Each **cursor** (prompt, load replay, a log subscription catching up) has
  a follow task that waits until its next seq is durable, reads the durable
  events from there and queues their frames; a full outbox blocks only that
  task. A log subscription at the durable head instead joins the session's
  fan-out (`supervision.gateway.fanout`), which queues its frames without
  blocking; when the log lane is full it drops out and catches up on its
  own. Agents never wait on a connection.
- Websockets are **kept alive**: every `ping_interval` (20 s) a ping; a pong
  that does not come within `ping_timeout` (20 s) closes the connection with
  1011 (a dead or frozen peer; aborted when even the close cannot be sent).

A handler that fails with anything but `RpcError` is a bug: its request is
answered -32603 and the connection closes with 1011. Nothing a connection
does can take the server down.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from actors.session import SessionError
from supervision.gateway.auth import Principal
from supervision.gateway.cursors import Cursor, EventBatch, LogCursor, PromptCursor
from supervision.gateway.outbox import Outbox, OutboxClosed, OutboxOverflow
from supervision.gateway.protocol import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    OVERLOADED,
    Frame,
    JsonId,
    Notification,
    Request,
    RpcError,
    dumps,
    error_response,
    parse_frame,
    response,
)
from supervision.gateway.transport import DirectSend, Framing, Transport, TransportClosed

if TYPE_CHECKING:
    from supervision.gateway.server import Gateway

log = logging.getLogger(__name__)

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_UNSUPPORTED = 1003
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_INTERNAL = 1011
CLOSE_SLOW_CONSUMER = 4008

CURSOR_BATCH = 256
"""Most events one cursor reads and queues per round."""

DEFAULT_PING_INTERVAL_SECONDS = 20.0
"""How long a websocket connection waits between keep-alive pings."""

DEFAULT_PING_TIMEOUT_SECONDS = 20.0
"""How long a ping's pong may take before the peer counts as dead (close 1011)."""

MAX_SUBSCRIPTIONS = 10_000
"""Log subscriptions one connection may hold at once (each holds a cursor and, while it
catches up, a task)."""

MAX_WATCHES = 16
"""`_harness/sessions/watch`es one connection may open (each is told of every session
change of the gateway, and lasts as long as its connection)."""

CLOSE_GRACE_SECONDS = 1.0
"""How long a close handshake may take before the connection is aborted."""

DEFERRED: Any = object()
"""Returned by a handler whose reply a cursor sends later (`session/prompt`, `session/load`)."""


@attrs.define(eq=False)
class Call:
    """What a handler gets besides its params: the connection, its principal, the request id."""

    connection: Connection
    id: JsonId

    @property
    def gateway(self) -> Gateway:
        """The gateway serving this connection."""
        return self.connection.gateway

    @property
    def principal(self) -> Principal:
        """Who is calling."""
        return self.connection.principal


Handler = Callable[[Any, Call], Awaitable[Any]]


@attrs.frozen(kw_only=True)
class ConnectionStatistics:
    """A snapshot of one connection."""

    inflight: int
    subscriptions: int
    queued_frames: int
    frames_written: int
    catch_ups: int
    """Times a live log subscription fell out of the fan-out (full log lane) to catch up."""


@attrs.define(eq=False)
class _LiveLog:
    """A log subscription as a fan-out subscriber: frames into the connection's log lane.

    When the lane is full it leaves the fan-out and catches up on its own
    (from its cursor's `next_seq`, which only a delivered batch advances).
    """

    connection: Connection
    cursor: LogCursor
    stopped: bool = False
    catch_up: Callable[[], None] | None = None
    outbox: Outbox = attrs.field(init=False)
    framing: Framing = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.outbox = self.connection.outbox
        self.framing = self.connection.transport.framing

    def deliver(self, batch: EventBatch) -> bool:
        """Queue the batch's frames (a merged subscription's whole batch into the open merged
        frame), or leave (False) when the log lane is full or closed.

        A connection that writes directly is flushed once at the end of the
        fan-out's round (`Connection.flush_round`) instead of its writer
        being woken here."""
        if self.stopped:
            return False
        connection, outbox, cursor = self.connection, self.outbox, self.cursor
        if not outbox.log_has_room:
            connection.fall_behind(self)
            return False
        wake = connection.direct is None
        if cursor.merge:
            joined = cursor.whole(batch)
            if joined is not None:
                # Into the connection's open merged frame: no frame of its own (a first batch's
                # `caughtUp` right after that frame).
                outbox.offer_merged(cursor.batch_prefix, joined, self.framing, wake=wake)
                caught_up = cursor.caught_up_frame(batch.head, self.framing)
                if caught_up is not None:
                    outbox.after_merged(caught_up)
                if not wake:
                    connection.flush_after_round()
                return True
        frames = cursor.frames(batch, self.framing)
        if frames:
            outbox.offer_log(frames, sum(map(len, frames)), wake=wake)
            if not wake:
                connection.flush_after_round()
        return True

    def fail(self, reason: str) -> None:
        """Close the connection (1011): the session's log cannot be followed."""
        self.connection.close(CLOSE_INTERNAL, reason)


_subscription_ids = itertools.count()


@attrs.define(eq=False)
class Connection:
    """The actor of one connection (see the module docstring). Run with `run()`."""

    gateway: Gateway
    transport: Transport
    principal: Principal
    write_deadline: float
    max_inflight: int
    max_frame: int
    ping: Callable[[], Awaitable[None]] | None = None
    """Sends a ping and returns at its pong (websockets); None: no keep-alive (stdio)."""
    direct: DirectSend | None = None
    """The transport written to synchronously at the end of a fan-out round (websockets);
    None: the writer task writes everything."""
    ping_interval: float = DEFAULT_PING_INTERVAL_SECONDS
    ping_timeout: float = DEFAULT_PING_TIMEOUT_SECONDS
    initialized: bool = False
    outbox: Outbox = attrs.field(factory=Outbox)
    subscriptions: dict[str, LogCursor] = attrs.field(factory=dict)
    subscription_stops: dict[str, Callable[[], None]] = attrs.field(factory=dict)
    prompts: dict[str, PromptCursor] = attrs.field(factory=dict)
    frames_written: int = 0
    catch_ups: int = 0
    _inflight: dict[JsonId, trio.CancelScope] = attrs.field(factory=dict)
    _cursor_scopes: dict[int, trio.CancelScope] = attrs.field(factory=dict)
    _nursery: trio.Nursery | None = None
    _close_code: int = CLOSE_NORMAL
    _close_reason: str = ""
    _stalled: bool = False
    _unsent: list[bytes] = attrs.field(factory=list)
    watches: int = 0
    """`_harness/sessions/watch`es opened (they last as long as the connection)."""
    answer_after_eof: bool = False
    """Answer requests already running when the input ends (stdio, whose output stays open)."""
    _running_handlers: int = 0
    _queuing: int = 0
    """Log-lane puts under way (`put_log`)."""
    _handlers_done: trio.Event = attrs.field(factory=trio.Event)
    _close_requested: bool = False
    _drain_on_close: bool = False
    """Write the log lane too before the close frame (not only replies): the end of input
    after every request was answered, some of them behind their updates."""
    _on_close: list[Callable[[], None]] = attrs.field(factory=list)
    _flush_due: bool = False

    async def run(self) -> int:
        """Serve the connection until the peer leaves or it is closed; return the close code.

        Cancellation: closes with the code set by `close()` (the gateway's
        shutdown sets 1001 first) within the close grace, else aborts.
        """
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._read)
                nursery.start_soon(self._write)
                if self.ping is not None:
                    nursery.start_soon(self._keep_alive, self.ping)
        finally:
            if not self._close_requested:
                # Cancelled from outside: the server is shutting down.
                self._close_code, self._close_reason = CLOSE_GOING_AWAY, "server shutting down"
            self.outbox.close()
            with trio.CancelScope(shield=True):
                await self._say_goodbye()
        return self._close_code

    def close(self, code: int, reason: str) -> None:
        """Close the connection with `code` (the first close wins)."""
        if self._nursery is not None and not self._close_requested:
            self._close_requested = True
            self._close_code = code
            self._close_reason = reason
            self._nursery.cancel_scope.cancel()

    def start_soon(self, task: Callable[[Connection], Awaitable[None]]) -> None:
        """Run `task(self)` in the connection's nursery: it ends with the connection (cancelled).

        For per-subscription writers (`_harness/sessions/watch`); `task` handles its own errors.
        """
        if self._nursery is None:
            raise RuntimeError("the connection is not running")
        self._nursery.start_soon(task, self)

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call `callback()` when the connection ends (to drop registrations it made)."""
        self._on_close.append(callback)

    def statistics(self) -> ConnectionStatistics:
        """Requests in flight, subscriptions, queued frames, frames written, catch-ups."""
        return ConnectionStatistics(
            inflight=len(self._inflight),
            subscriptions=len(self.subscriptions),
            queued_frames=self.outbox.queued_frames,
            frames_written=self.frames_written,
            catch_ups=self.catch_ups,
        )

    # -- cursors ------------------------------------------------------------

    def new_subscription_id(self) -> str:
        """A fresh subscription id, unique in this gateway."""
        return f"sub-{next(_subscription_ids)}"

    def follow(self, cursor: Cursor) -> Callable[[], None]:
        """Start the follow task of `cursor`; returns a function that stops it."""
        return self._start_follow(cursor, None)

    def end_prompt(self, session_id: str, error: RpcError) -> bool:
        """Answer the session's deferred `session/prompt` with `error` now, and stop
        following its turn (the session left this process); False when there is none."""
        cursor = self.prompts.get(session_id)
        if cursor is None or cursor.finished:
            return False
        cursor.finished = True
        scope = self._cursor_scopes.pop(id(cursor), None)
        if scope is not None:
            scope.cancel()
        cursor.on_done()
        self._send_control(error_response(cursor.request_id, error))
        return True

    def subscribe_log(self, cursor: LogCursor, *, live: bool) -> Callable[[], None]:
        """Deliver `cursor`'s events: from the session's fan-out while it keeps up, else on its own.

        `live`: the cursor starts at the durable head (no replay), so it joins
        the fan-out at once; otherwise it catches up first. Returns a
        function that stops the subscription (idempotent).
        """
        subscriber = _LiveLog(connection=self, cursor=cursor)
        stop_follow: Callable[[], None] | None = None
        if not (
            live and self.gateway.fanout.attach(cursor.session_id, cursor.next_seq, subscriber)
        ):
            stop_follow = self._start_follow(cursor, subscriber)

        def stop() -> None:
            subscriber.stopped = True
            self.gateway.fanout.detach(cursor.session_id, subscriber)
            if stop_follow is not None:
                stop_follow()
            if subscriber.catch_up is not None:
                subscriber.catch_up()

        return stop

    def _start_follow(self, cursor: Cursor, joins: _LiveLog | None) -> Callable[[], None]:
        nursery = self._nursery
        if nursery is None:
            raise RuntimeError("the connection is not running")
        scope = trio.CancelScope()
        key = id(cursor)
        self._cursor_scopes[key] = scope
        nursery.start_soon(self._follow, cursor, scope, joins)

        def stop() -> None:
            scope.cancel()
            self._cursor_scopes.pop(key, None)

        return stop

    async def _follow(
        self, cursor: Cursor, scope: trio.CancelScope, joins: _LiveLog | None
    ) -> None:
        gateway = self.gateway
        with scope:
            try:
                while not cursor.finished:
                    events, head = await gateway.read_durable(
                        cursor.session_id, cursor.next_seq, CURSOR_BATCH
                    )
                    frames = cursor.take(events, head, self.transport.framing)
                    if frames:
                        await self.put_log(frames)
                    if (
                        joins is not None
                        and cursor.next_seq > head
                        and gateway.fanout.attach(cursor.session_id, cursor.next_seq, joins)
                    ):
                        break  # caught up: the session's fan-out delivers from here
            except OutboxClosed:
                return
            except SessionError as exc:
                self.close(CLOSE_INTERNAL, f"session {cursor.session_id!r}: {exc}")
        self._cursor_scopes.pop(id(cursor), None)

    def fall_behind(self, subscriber: _LiveLog) -> None:
        """A live subscription the fan-out dropped (the log lane was full): catch up on its own."""
        if not subscriber.stopped and not self.outbox_closed:
            self.catch_ups += 1
            subscriber.catch_up = self._start_follow(subscriber.cursor, subscriber)

    # -- reader ---------------------------------------------------------------

    async def _read(self) -> None:
        while True:
            try:
                message = await self.transport.receive()
            except TransportClosed as exc:
                if self.answer_after_eof:
                    # The peer only stopped sending: finish what it asked first, the
                    # deferred replies (a prompt's, at its turn's end) included.
                    while self._running_handlers or self._inflight or self._queuing:
                        await self._handlers_done.wait()
                    self._drain_on_close = True  # those replies may still wait in the log lane
                self.close(exc.code or CLOSE_NORMAL, "peer closed")
                return
            if isinstance(message, bytes):
                self.close(CLOSE_UNSUPPORTED, "binary frames are not accepted; send text")
                return
            if len(message) > self.max_frame:
                self.close(CLOSE_TOO_BIG, f"frame over {self.max_frame} bytes")
                return
            self._dispatch(parse_frame(message))

    def _dispatch(self, frame: Frame) -> None:
        if frame.batch:
            self._start_batch(frame)
            return
        (message,) = frame.messages
        if isinstance(message, RpcError):
            self._send_control(error_response(message.id, message))
        elif isinstance(message, Notification):
            self._notify(message)
        else:
            error = self._admit(message, in_batch=False)
            if error is not None:
                self._send_control(error_response(message.id, error))
                return
            scope = trio.CancelScope()
            self._inflight[message.id] = scope
            assert self._nursery is not None
            self._running_handlers += 1  # counted from here, so EOF waits for it too
            self._nursery.start_soon(self._answer, message, scope)

    def _admit(self, request: Request, *, in_batch: bool) -> RpcError | None:
        if request.id in self._inflight:
            return RpcError(
                INVALID_REQUEST,
                f"request id {request.id!r} is already in flight on this connection",
            )
        if len(self._inflight) >= self.max_inflight:
            return RpcError(
                OVERLOADED,
                f"{self.max_inflight} requests are in flight on this connection; "
                f"{request.method!r} was not started",
                {"reason": "overloaded", "retryAfterMs": 100},
            )
        return self.gateway.methods.admit(self, request.method, in_batch=in_batch)

    def _notify(self, message: Notification) -> None:
        method = self.gateway.methods.notification(message.method)
        if method is None or not self.initialized:
            return  # unknown notifications are ignored (ACP); they are never answered
        assert self._nursery is not None
        self._nursery.start_soon(self._run_notification, method, message)

    async def _run_notification(self, method: Handler, message: Notification) -> None:
        try:
            await method(message.params, Call(connection=self, id=None))
        except RpcError:
            pass  # a notification has no answer to carry the error
        except Exception:
            log.exception("notification %r failed", message.method)
            self.close(CLOSE_INTERNAL, f"notification {message.method!r} failed")

    async def _answer(self, request: Request, scope: trio.CancelScope) -> None:
        deferred = False
        try:
            with scope:
                try:
                    result = await self.gateway.methods.call(
                        request.method, request.params, Call(connection=self, id=request.id)
                    )
                except RpcError as error:
                    self._send_control(error_response(request.id, error))
                    return
                except Exception as exc:
                    log.exception("handler of %r failed", request.method)
                    failure = RpcError(INTERNAL_ERROR, f"{request.method!r} failed: {exc}")
                    self._send_control(error_response(request.id, failure))
                    self.close(CLOSE_INTERNAL, f"handler of {request.method!r} failed")
                    return
                if result is DEFERRED:
                    deferred = True
                    return
                self._send_control(response(request.id, result))
        finally:
            if not deferred:
                self._inflight.pop(request.id, None)
            self._running_handlers -= 1
            self._note_settled()

    def release(self, request_id: JsonId) -> None:
        """A deferred request got its reply (from its cursor): free its in-flight slot."""
        self._inflight.pop(request_id, None)
        self._note_settled()

    def _note_settled(self) -> None:
        """Wake the reader waiting at end of input once no handler runs and no reply is due."""
        if not self._running_handlers and not self._inflight and not self._queuing:
            self._handlers_done.set()
            self._handlers_done = trio.Event()

    def _start_batch(self, frame: Frame) -> None:
        answers: list[dict[str, Any] | None] = [None] * len(frame.messages)
        admitted: list[tuple[int, Request]] = []
        for index, message in enumerate(frame.messages):
            if isinstance(message, RpcError):
                answers[index] = error_response(message.id, message)
            elif isinstance(message, Notification):
                self._notify(message)
            else:
                error = self._admit(message, in_batch=True)
                if error is not None:
                    answers[index] = error_response(message.id, error)
                else:
                    self._inflight[message.id] = trio.CancelScope()
                    admitted.append((index, message))
        if not admitted:
            replies = [answer for answer in answers if answer is not None]
            if replies:
                self._put_control(dumps(replies))
            return
        assert self._nursery is not None
        self._running_handlers += 1  # counted from here, so EOF waits for the batch too
        self._nursery.start_soon(self._answer_batch, answers, admitted)

    async def _answer_batch(
        self, answers: list[dict[str, Any] | None], admitted: list[tuple[int, Request]]
    ) -> None:
        try:
            for index, request in admitted:
                try:
                    result = await self.gateway.methods.call(
                        request.method, request.params, Call(connection=self, id=request.id)
                    )
                    answers[index] = response(request.id, result)
                except RpcError as error:
                    answers[index] = error_response(request.id, error)
                except Exception as exc:
                    log.exception("handler of %r failed", request.method)
                    failure = RpcError(INTERNAL_ERROR, f"{request.method!r} failed: {exc}")
                    answers[index] = error_response(request.id, failure)
                    self.close(CLOSE_INTERNAL, f"handler of {request.method!r} failed")
                finally:
                    self._inflight.pop(request.id, None)
        finally:
            replies = [answer for answer in answers if answer is not None]
            if replies and not self.outbox_closed:
                self._put_control(dumps(replies))
            self._running_handlers -= 1
            self._note_settled()

    # -- writer -----------------------------------------------------------------

    @property
    def outbox_closed(self) -> bool:
        """True once the connection stopped accepting frames."""
        return self._nursery is None or self._nursery.cancel_scope.cancel_called

    def send_notification(self, message: Mapping[str, Any]) -> None:
        """Queue a notification on the control lane (snapshots, changes)."""
        self._send_control(message)

    def relay_log(self, message: Mapping[str, Any]) -> None:
        """Queue a relayed `session/update` (or other log-lane message) on the log lane now.

        Paced like a cursor's frames (after queued replies, written under the
        write deadline); more than the outbox's relay limit waiting closes
        the connection with 4008 (a slow consumer).
        """
        frame = self.transport.framing.frame(dumps(message).encode())
        try:
            self.outbox.push_log([frame], len(frame))
        except OutboxOverflow as exc:
            self._close_slow(str(exc))
        except OutboxClosed:
            pass

    async def put_log(self, frames: Sequence[bytes]) -> None:
        """`outbox.put_log(frames)`, counted: at the end of input (`answer_after_eof`) the
        connection waits for the frames being queued (a deferred reply among them: its
        request left `_inflight` when the frame was made) before it closes.

        Cancellation: cancellable; a cancelled put queued nothing.

        Raises:
            OutboxClosed: the connection is closing.
        """
        self._queuing += 1
        try:
            await self.outbox.put_log(frames)
        finally:
            self._queuing -= 1
            self._note_settled()

    async def answer_after_log(self, request_id: JsonId, message: Mapping[str, Any]) -> None:
        """Queue a deferred request's reply behind the log-lane frames already queued (the
        updates it ends), then free its in-flight slot (see `release`).

        Cancellation: cancellable; a cancelled answer queued nothing.
        """
        try:
            await self.outbox.put_log([self.transport.framing.frame(dumps(message).encode())])
        except OutboxClosed:
            pass
        finally:
            self.release(request_id)

    def _send_control(self, message: Mapping[str, Any]) -> None:
        self._put_control(dumps(message))

    def _put_control(self, text: str) -> None:
        try:
            self.outbox.put_control(self.transport.framing.frame(text.encode()))
        except OutboxOverflow as exc:
            self._close_slow(str(exc))
        except OutboxClosed:
            pass

    def _close_slow(self, reason: str) -> None:
        """Close with 4008 (a slow consumer), counted once: only when the connection was not
        closing already (later overflows of a closing connection change nothing)."""
        if self._nursery is not None and not self._close_requested:
            self.gateway.count_slow_consumer()
            self.close(CLOSE_SLOW_CONSUMER, reason)

    def flush_after_round(self) -> None:
        """Have `flush_round` run once when the fan-out's current round ends."""
        if not self._flush_due:
            self._flush_due = True
            self.gateway.fanout.after_round(self.flush_round)

    def flush_round(self) -> None:
        """Write what is queued now, with one system call and no task switch, when the
        transport is free (`direct`); wake the writer for whatever is left.

        What the socket does not take at once is written first by the
        writer (under the write deadline, like any write); when another
        write is in progress, or the connection is closing, the writer
        writes everything as usual.
        """
        self._flush_due = False
        outbox, direct = self.outbox, self.direct
        if direct is not None and not self.outbox_closed and direct.can_send_now():
            frames = outbox.take()
            if frames:
                self.frames_written += len(frames)
                if not direct.send_now(b"".join(frames)):
                    outbox.kick()
            return
        outbox.wake()

    async def _write(self) -> None:
        # One scope for every write (cheaper than a scope per write): while a batch is being
        # written it is shielded, so a close never cuts a batch (only the write deadline
        # does) and never loses a reply that was already taken from the outbox, and it
        # carries the write deadline; between writes it is neither.
        with trio.CancelScope() as write:
            while True:
                await self.outbox.wait_ready()
                self._unsent = self.outbox.take()
                write.shield = True
                write.deadline = trio.current_time() + self.write_deadline
                try:
                    await self.transport.send_batch(self._unsent)
                except TransportClosed:
                    self.close(CLOSE_NORMAL, "peer gone")
                    return
                write.deadline = math.inf
                write.shield = False
                self.frames_written += len(self._unsent)
                self._unsent = []
                await trio.lowlevel.checkpoint_if_cancelled()
        if write.cancelled_caught:
            self._stalled = True
            self._close_slow(f"slow consumer: a write stalled for {self.write_deadline} s")

    async def _keep_alive(self, ping: Callable[[], Awaitable[None]]) -> None:
        while True:
            await trio.sleep(self.ping_interval)
            with trio.move_on_after(self.ping_timeout) as timeout:
                try:
                    await ping()
                except TransportClosed:
                    return  # the reader sees the close too
            if timeout.cancelled_caught:
                self.close(CLOSE_INTERNAL, f"keepalive: no pong within {self.ping_timeout:g} s")
                return

    async def _say_goodbye(self) -> None:
        for callback in self._on_close:
            callback()
        for stop in list(self.subscription_stops.values()):
            stop()
        for key in list(self._cursor_scopes):
            self._cursor_scopes.pop(key).cancel()
        for cursor in list(self.prompts.values()):
            # Unanswered prompts give their turns' claims up, so the same prompt sent
            # again on another connection (a gateway's retry) can follow its turn.
            if not cursor.finished:
                cursor.finished = True
                cursor.on_done()
        with trio.move_on_after(0 if self._stalled else CLOSE_GRACE_SECONDS) as grace:
            try:
                # Replies already queued go out before the close frame (and, after the end of
                # input, the log lane: the deferred replies the reader waited for are there).
                queued = (
                    self.outbox.take()
                    if self._drain_on_close
                    else self.outbox.take_control_nowait()
                )
                unsent = [*self._unsent, *queued]
                if unsent:
                    await self.transport.send_batch(unsent)
                self._unsent = []
                await self.transport.close(self._close_code, self._close_reason)
            except Exception:
                grace.cancel()
        if grace.cancelled_caught:
            await self.transport.abort()
