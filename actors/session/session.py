"""The session log: the single source of truth for everything a model saw."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal

import attrs
import trio

from actors.messages import Message
from actors.session.codec import event_to_json
from actors.session.errors import SessionError, SessionHibernatingError
from actors.session.events import (
    SURFACE_TYPES,
    AssistantMessage,
    Event,
    EventData,
    StepEnd,
    StepStart,
    ToolCallRequested,
    ToolError,
    ToolResult,
    TurnEnd,
    TurnEndReason,
    TurnStart,
    type_of,
)
from actors.session.header import RequestHeader
from actors.session.lease import Lease
from actors.session.reducers import (
    derive_messages,
    fold_request_header,
    message_of,
    surface_events,
)
from actors.session.store import SessionStore

WallClock = Callable[[], int]
"""Returns the wall-clock time in epoch milliseconds."""

INTERRUPTED_TOOL_RESULT = (
    "The tool call was interrupted by a restart before it returned a result; "
    "it may or may not have taken effect."
)
"""The content of the error `tool/result` that resume gives an unanswered call."""


def system_clock_ms() -> int:
    """The machine's wall clock in epoch milliseconds."""
    return time.time_ns() // 1_000_000


def new_session_id() -> str:
    """A fresh random session id."""
    return uuid.uuid4().hex


@attrs.define(eq=False)
class Session:
    """An append-only, numbered event log backed by a `SessionStore`.

    Events get contiguous `seq` numbers from 0 and a wall-clock `time`.
    `append` queues an event to the store (with backpressure) and returns it;
    `flush` waits until everything appended so far is durable;
    `durable_seq`, `wait_durable` and `watch` show only durable events. The
    model-visible message list is maintained incrementally, so deriving it
    costs the same at turn 1 and turn 500.

    With a `lease` (see `SessionStore.acquire_lease`) every write carries its
    epoch, so the store refuses them once another writer took the session
    over (`SessionFencedError`).

    An idle session can `hibernate()`: it releases its in-memory events and
    message list and keeps only its length; `wake()` reloads them from the
    store. Appending and watching wake it by themselves; the synchronous
    readers raise `SessionHibernatingError` until it is woken.
    """

    id: str
    store: SessionStore
    clock: WallClock = system_clock_ms
    lease: Lease | None = attrs.field(default=None, kw_only=True)
    _events: list[Event] = attrs.field(factory=list, alias="events")
    _surface: list[Message] = attrs.field(factory=list, init=False)
    _hibernated_length: int | None = attrs.field(default=None, init=False)
    _watches: int = attrs.field(default=0, init=False)
    _extended: trio.Event | None = attrs.field(default=None, init=False)  # while waited for
    _extension_waited: bool = attrs.field(default=False, init=False)
    # Made by the first append after a wake, dropped by `hibernate` (nothing holds or awaits it
    # then): an idle session keeps no lock and its parking lot.
    _append_lock: trio.StrictFIFOLock | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self._surface = derive_messages(self._events)

    @classmethod
    async def create(
        cls,
        store: SessionStore,
        session_id: str | None = None,
        *,
        clock: WallClock = system_clock_ms,
        lease: Lease | None = None,
    ) -> Session:
        """A new, empty session registered in `store`, written under `lease` if given.

        Raises:
            SessionExistsError: `session_id` is already stored.
        """
        sid = session_id or new_session_id()
        await store.create(sid)
        return cls(id=sid, store=store, clock=clock, lease=lease)

    @classmethod
    async def load(
        cls,
        store: SessionStore,
        session_id: str,
        *,
        clock: WallClock = system_clock_ms,
        lease: Lease | None = None,
    ) -> Session:
        """The stored session `session_id`, its events restored exactly, written under `lease`.

        A turn left open by a crash is closed so that the conversation stays
        valid for any OpenAI-compatible server: every tool call of the turn
        without a result gets an error `tool/result` (`Interrupted`,
        code `interrupted`; a call the model asked for but whose `tool/call`
        was never logged gets that first), an open step gets `step/end`, and
        the turn `turn/end` with reason `interrupted`, durably. Earlier
        events are never altered. Resume under the session's lease, or the
        repair could close another live writer's turn (it is refused then).

        Raises:
            UnknownSessionError: the store has no such session.
            SessionError: a stored event cannot be decoded, or the repair
                cannot be written.
        """
        events = await store.load(session_id)
        for expected, event in enumerate(events):
            if event.seq != expected:
                raise SessionError(
                    f"session {session_id!r}: stored event {event.type} has seq {event.seq}, "
                    f"expected {expected}"
                )
        session = cls(id=session_id, store=store, clock=clock, events=events, lease=lease)
        await session._close_interrupted_turn()
        return session

    @classmethod
    async def open(
        cls,
        store: SessionStore,
        session_id: str | None = None,
        *,
        clock: WallClock = system_clock_ms,
        lease: Lease | None = None,
    ) -> Session:
        """Load `session_id` when the store has it, else create it (or a fresh id)."""
        if session_id is not None and await store.exists(session_id):
            return await cls.load(store, session_id, clock=clock, lease=lease)
        return await cls.create(store, session_id, clock=clock, lease=lease)

    @property
    def events(self) -> Sequence[Event]:
        """Every event, in seq order (a read-only view)."""
        return tuple(self._awake())

    def events_since(self, seq: int) -> Sequence[Event]:
        """The events with `seq` >= the given one, in order."""
        return tuple(self._awake()[seq:])

    def __len__(self) -> int:
        if self._hibernated_length is not None:
            return self._hibernated_length
        return len(self._events)

    @property
    def hibernating(self) -> bool:
        """True while the in-memory log is released (see `hibernate`)."""
        return self._hibernated_length is not None

    def hibernate(self) -> bool:
        """Release the in-memory events and message list, keeping only the log's length.

        Like Erlang's `hibernate`: an idle session then costs almost nothing
        until it is used again. Only a session whose every event is durable,
        with no append in progress and no watch open, hibernates (its store
        must give every event back on `wake`); otherwise nothing changes.

        Returns:
            True when the session hibernates (or already did).
        """
        if self._hibernated_length is not None:
            return True
        appending = self._append_lock is not None and self._append_lock.locked()
        if self._watches or appending or self.durable_seq < len(self) - 1:
            return False
        self._append_lock = None
        self._hibernated_length = len(self._events)
        # Emptied in place (freeing their item arrays), not replaced: new list objects would be
        # allocated now, at the end of a burst of turns, and kept for the whole idle period.
        self._events.clear()
        self._surface.clear()
        return True

    async def wake(self) -> None:
        """Reload a hibernating session's events from its store; a no-op when awake.

        Always a checkpoint: a hibernating session's is the store's load (no
        second scheduling pass before it), an awake one's a plain checkpoint.
        Cancellation: cancelling leaves the session hibernating, unchanged.

        Raises:
            SessionError: the store no longer holds exactly the events the
                session had (another writer, or a damaged store).
        """
        length = self._hibernated_length
        if length is None:
            await trio.lowlevel.checkpoint()
            return
        events = await self.store.load(self.id)
        if self._hibernated_length is None:  # a concurrent wake finished first
            return
        if len(events) != length or any(e.seq != n for n, e in enumerate(events)):
            raise SessionError(
                f"session {self.id!r}: waking from hibernation found {len(events)} stored "
                f"events, expected {length}"
            )
        self._events.extend(events)  # into the same (emptied) lists, see `hibernate`
        self._surface.extend(derive_messages(events))
        self._hibernated_length = None

    def _awake(self) -> list[Event]:
        if self._hibernated_length is not None:
            raise SessionHibernatingError(
                f"session {self.id!r} is hibernating; await session.wake() before reading it"
            )
        return self._events

    async def append(
        self,
        data: EventData,
        *,
        surface_op: Literal["replace"] | None = None,
        source_event_seqs: Sequence[int] | None = None,
        type: str | None = None,
        ignorable: bool = False,
    ) -> Event:
        """Append one event and queue it to the store.

        Returns once the store accepted it; call `flush()` to wait for
        durability. Concurrent appends from several tasks are serialised in
        call order, so seqs stay contiguous. Cancellation before the store
        accepted the event leaves the log unchanged.

        Raises:
            ReplacementError: a replacement cites events it cannot replace.
        """
        type_ = type or type_of(data)

        def build(first: int, now: int) -> list[Event]:
            return [
                Event(
                    type=type_,
                    seq=first,
                    time=now,
                    data=data,
                    surface_op=surface_op,
                    source_event_seqs=source_event_seqs,
                    ignorable=ignorable,
                )
            ]

        (appended,) = await self._commit(build, replaces=surface_op is not None)
        return appended

    async def extend(self, items: Sequence[EventData]) -> list[Event]:
        """Append several plain events as one store write, in order.

        Same guarantees as `append` (the events get consecutive seqs, and
        cancellation before the store accepted them leaves the log
        unchanged); cheaper when a step logs several events at once.
        """
        types = [type_of(data) for data in items]

        def build(first: int, now: int) -> list[Event]:
            return [
                Event(type=type_, seq=seq, time=now, data=data)
                for seq, (type_, data) in enumerate(zip(types, items, strict=True), first)
            ]

        return await self._commit(build, replaces=False)

    async def _commit(
        self, build: Callable[[int, int], list[Event]], *, replaces: bool
    ) -> list[Event]:
        """Number the events `build(first seq, now)` makes, hand them to the store, keep them."""
        # Uncontended appends take the lock without an extra scheduling point;
        # the store's append is the cancellation point (and, where storing
        # can block, the scheduling point).
        lock = self._append_lock
        if lock is None:
            lock = self._append_lock = trio.StrictFIFOLock()
        try:
            lock.acquire_nowait()
        except trio.WouldBlock:
            await lock.acquire()
        try:
            if self._hibernated_length is not None:
                await self.wake()
            events = build(len(self._events), self.clock())
            if replaces:
                surface = derive_messages([*self._events, *events])
            await self.store.append(self.id, events, lease=self.lease)
            self._events.extend(events)
            if replaces:
                self._surface = surface
            else:
                for event in events:
                    if event.type in SURFACE_TYPES:
                        self._surface.append(message_of(event))
            if self._extension_waited and self._extended is not None:
                self._extension_waited = False
                self._extended.set()
                self._extended = None
            return events
        finally:
            lock.release()

    @property
    def durable_seq(self) -> int:
        """The newest seq durable in the store (and in this log); -1 when none is.

        Events up to it can never be taken back by a crash; events after it
        may still be (and their seqs reused), so nothing after it is shown
        to watchers.
        """
        return min(self.store.durable_seq(self.id), len(self) - 1)

    async def wait_durable(self, seq: int) -> None:
        """Return once `durable_seq >= seq`.

        Woken by the store's commit; the appending agent never waits for
        this. Cancellation: cancellable; nothing is affected.

        Raises:
            SessionError: the store failed to commit an append of this
                session, so `seq` will never become durable.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        while self.durable_seq < seq:
            if self.store.durable_seq(self.id) < seq:
                await self.store.wait_durable(self.id, seq)
            else:
                # The store committed it before the appender recorded it here.
                if self._extended is None:
                    self._extended = trio.Event()
                self._extension_waited = True
                await self._extended.wait()

    def durable_events(self, from_seq: int, limit: int | None = None) -> Sequence[Event]:
        """Durable events from `from_seq` on, in order, at most `limit` of them."""
        end = self.durable_seq + 1
        if limit is not None:
            end = min(end, from_seq + limit)
        return tuple(self._awake()[from_seq:end]) if from_seq < end else ()

    @asynccontextmanager
    async def watch(
        self, *, from_seq: int | None = None, buffer: int = 256
    ) -> AsyncIterator[trio.MemoryReceiveChannel[Event]]:
        """Receive the durable events from `from_seq` on, in seq order, while the context is open.

        `from_seq=None` means the events appended from now on. An event is
        delivered only once it is durable in the store, so a watcher never
        sees an event a crash could take back. The watch is a cursor into
        the log: a task owned by the context reads durable events at the
        consumer's pace into a channel of `buffer` events and blocks when it
        is full, so a slow watcher lags but loses nothing, and the agent
        appending never waits for it.

        Leaving the context stops the cursor and closes the channel; a
        consumer iterating it drains what was delivered and then sees its
        end. A store failure ends the channel early after the last durable
        event (never a gap).
        """
        start = len(self) if from_seq is None else from_seq
        if start < 0:
            raise SessionError(f"session {self.id!r}: cannot watch from seq {start}")
        send, receive = trio.open_memory_channel[Event](buffer)
        # An open watch keeps the session awake: its cursor reads the events.
        self._watches += 1
        try:
            await self.wake()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pump, start, send)
                try:
                    yield receive
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            self._watches -= 1

    async def _pump(self, next_seq: int, send: trio.MemorySendChannel[Event]) -> None:
        async with send:
            while True:
                try:
                    await self.wait_durable(next_seq)
                except SessionError:
                    return
                for event in self.durable_events(next_seq):
                    await send.send(event)
                    next_seq = event.seq + 1

    async def flush(self) -> None:
        """Return once every event appended so far is durable.

        Raises:
            SessionFencedError: another writer took the session's lease over.
            SessionError: an appended event of this session is not durable.
        """
        await self.store.flush(self.id)

    def derive_messages(self) -> list[Message]:
        """The model-visible messages, rebuilt from the surface events (a fresh list)."""
        self._awake()
        return list(self._surface)

    def surface_events(self) -> list[Event]:
        """The surface events currently model-visible, in order."""
        return surface_events(self._awake())

    def header(self) -> RequestHeader | None:
        """The latest canonical request header in the log."""
        return fold_request_header(self._awake())

    def to_json(self) -> list[dict[str, Any]]:
        """The durable JSON form of every event, in order."""
        return [event_to_json(event) for event in self._awake()]

    def open_turn(self) -> int | None:
        """The number of a turn that started and has not ended, if any."""
        for event in reversed(self._awake()):
            if isinstance(event.data, TurnEnd):
                return None
            if isinstance(event.data, TurnStart):
                return event.data.turn
        return None

    def next_turn(self) -> int:
        """The number the next turn gets (0 for an empty log)."""
        for event in reversed(self._awake()):
            if isinstance(event.data, TurnStart):
                return event.data.turn + 1
        return 0

    def completed_turns(self) -> list[int]:
        """Numbers of turns that have a `turn/end`, in order."""
        return [e.data.turn for e in self._awake() if isinstance(e.data, TurnEnd)]

    async def fork(
        self, up_to_turn: int | None = None, *, session_id: str | None = None
    ) -> Session:
        """A new session in the same store holding this one's events up to `up_to_turn`.

        The copy ends at the `turn/end` of `up_to_turn` (default: the last
        completed turn); an in-flight turn is never copied. Events keep their
        seq, time and data.

        Raises:
            SessionError: `up_to_turn` has not completed.
        """
        await self.wake()
        completed = self.completed_turns()
        if up_to_turn is None:
            end = self._end_of_last_completed_turn()
        else:
            if up_to_turn not in completed:
                raise SessionError(
                    f"session {self.id!r}: cannot fork up to turn {up_to_turn}; "
                    f"completed turns are {completed}"
                )
            end = next(
                e.seq
                for e in self._events
                if isinstance(e.data, TurnEnd) and e.data.turn == up_to_turn
            )
        child = await Session.create(self.store, session_id, clock=self.clock)
        copied = self._events[: end + 1]
        if copied:
            await self.store.append(child.id, copied)
        child._events = list(copied)
        child._surface = derive_messages(copied)
        return child

    def _end_of_last_completed_turn(self) -> int:
        for event in reversed(self._events):
            if isinstance(event.data, TurnEnd):
                return event.seq
        return -1

    async def _close_interrupted_turn(self) -> None:
        turn = self.open_turn()
        if turn is None:
            return
        start = max(
            e.seq for e in self._events if isinstance(e.data, TurnStart) and e.data.turn == turn
        )
        repairs: list[EventData] = [*_unanswered_calls(self._events[start:])]
        open_step: StepStart | None = None
        for event in reversed(self._events):
            if isinstance(event.data, StepEnd):
                break
            if isinstance(event.data, StepStart):
                open_step = event.data
                break
            if isinstance(event.data, TurnStart):
                break
        if open_step is not None:
            repairs.append(StepEnd(turn=open_step.turn, step=open_step.step))
        repairs.append(TurnEnd(turn=turn, reason=TurnEndReason(kind="interrupted")))
        await self.extend(repairs)
        await self.flush()


def _unanswered_calls(turn_events: Sequence[Event]) -> list[EventData]:
    """For each tool call of a cut-off turn without a result: its `tool/call` if missing, then an
    `Interrupted` error `tool/result` (so every call the model made is answered, in its order)."""
    logged = {e.data.call_id: e.data for e in turn_events if isinstance(e.data, ToolCallRequested)}
    answered = {e.data.call_id for e in turn_events if isinstance(e.data, ToolResult)}
    missing: list[EventData] = []
    calls: dict[str, ToolCallRequested] = {}
    for event in turn_events:
        data = event.data
        if not isinstance(data, AssistantMessage) or event.surface_op is not None:
            continue
        for block in data.message.tool_calls:
            call = logged.get(block.id)
            if call is None:
                call = ToolCallRequested(
                    turn=data.turn,
                    step=data.step,
                    call_id=block.id,
                    name=block.name,
                    arguments=block.arguments,
                )
                missing.append(call)
            calls.setdefault(block.id, call)
    for call_id, call in logged.items():
        calls.setdefault(call_id, call)
    results: list[EventData] = [
        ToolResult(
            turn=call.turn,
            step=call.step,
            call_id=call.call_id,
            content=INTERRUPTED_TOOL_RESULT,
            is_error=True,
            error=ToolError(name="Interrupted", code="interrupted"),
        )
        for call in calls.values()
        if call.call_id not in answered
    ]
    return [*missing, *results]
