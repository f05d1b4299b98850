"""Shared helpers for supervision tests: controllable children, stores and providers."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing, asynccontextmanager
from typing import Literal

import attrs
import trio

from actors.providers import Chunk, FinishChunk, GenerateRequest, Reply, ScriptedProvider, TextDelta
from actors.session import Event, Lease, MemoryStore, SessionError, UnknownSessionError
from actors.session.durability import DurableMarks
from supervision import ChildStart, Supervisor


class WorkerCrash(Exception):
    """What a test worker raises when told to crash."""


@attrs.define(eq=False)
class Control:
    """The started value of a `worker` incarnation: tell it to crash or to return."""

    name: str
    incarnation: int
    _order: Literal["crash", "finish"] | None = attrs.field(default=None, init=False)
    _ordered: trio.Event = attrs.field(factory=trio.Event, init=False)

    def crash(self) -> None:
        """Make this incarnation raise `WorkerCrash`."""
        self._order = "crash"
        self._ordered.set()

    def finish(self) -> None:
        """Make this incarnation return normally."""
        self._order = "finish"
        self._ordered.set()


def worker(name: str, log: list[str], *, crash_after: float | None = None) -> ChildStart[Control]:
    """A child start function logging "start NAME" and "stop NAME" for each incarnation.

    An incarnation runs until its `Control` orders it to crash or finish, or
    (with `crash_after`) crashes by itself that many seconds after starting.
    """
    incarnations = 0

    async def start(*, task_status: trio.TaskStatus[Control] = trio.TASK_STATUS_IGNORED) -> None:
        nonlocal incarnations
        control = Control(name=name, incarnation=incarnations)
        incarnations += 1
        log.append(f"start {name}")
        try:
            task_status.started(control)
            if crash_after is not None:
                await trio.sleep(crash_after)
                control.crash()
            await control._ordered.wait()
        finally:
            log.append(f"stop {name}")
        if control._order == "crash":
            raise WorkerCrash(f"{name} crashed")

    return start


@asynccontextmanager
async def serving(supervisor: Supervisor) -> AsyncIterator[Supervisor]:
    """Serve `supervisor` in a nursery for the body; leaving cancels it."""
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.serve)
        yield supervisor
        nursery.cancel_scope.cancel()


@attrs.define(eq=False)
class FlakyStore(MemoryStore):
    """A memory store whose next append of one event type raises `SessionError` (a bad disk)."""

    _fail_type: str | None = attrs.field(default=None, init=False)

    def fail_next(self, event_type: str) -> None:
        """Make the next append of an `event_type` event fail."""
        self._fail_type = event_type

    async def append(
        self, session_id: str, events: Sequence[Event], *, lease: Lease | None = None
    ) -> None:
        """Append, unless this is the armed failure."""
        if self._fail_type is not None and any(e.type == self._fail_type for e in events):
            self._fail_type = None
            await trio.lowlevel.checkpoint()
            raise SessionError(f"session {session_id!r}: the disk refused a write")
        await super().append(session_id, events, lease=lease)


@attrs.define(eq=False)
class WriterStore:
    """A store whose events become durable only through its writer task (like group commit).

    `durable` holds what the writer wrote; `log` records "store started" and
    "store stopped". The writer takes `write_delay` seconds per write (a slow
    disk). Anything still queued when the writer stops is lost.
    """

    log: list[str]
    durable: dict[str, list[Event]] = attrs.field(factory=dict)
    write_delay: float = 0.0
    _accepted: dict[str, list[Event]] = attrs.field(factory=dict, init=False)
    _marks: DurableMarks = attrs.field(factory=DurableMarks, init=False)
    _queue: trio.MemorySendChannel[tuple[str, list[Event]] | trio.Event] | None = attrs.field(
        default=None, init=False
    )

    @property
    def running(self) -> bool:
        """True while the writer runs."""
        return self._queue is not None

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The writer: moves queued events to `durable` until cancelled."""
        send, receive = trio.open_memory_channel[tuple[str, list[Event]] | trio.Event](64)
        self._queue = send
        self.log.append("store started")
        try:
            task_status.started()
            async for item in receive:
                if isinstance(item, trio.Event):
                    item.set()
                else:
                    await trio.sleep(self.write_delay)
                    self.durable.setdefault(item[0], []).extend(item[1])
                    if item[1]:
                        self._marks.advance(item[0], item[1][-1].seq)
        finally:
            self._queue = None
            self.log.append("store stopped")

    async def create(self, session_id: str) -> None:
        """Register an empty session."""
        await trio.lowlevel.checkpoint()
        self._accepted[session_id] = []

    async def exists(self, session_id: str) -> bool:
        """True once created."""
        await trio.lowlevel.checkpoint()
        return session_id in self._accepted

    async def load(self, session_id: str) -> list[Event]:
        """Every accepted event of the session."""
        await trio.lowlevel.checkpoint()
        if session_id not in self._accepted:
            raise UnknownSessionError(f"session {session_id!r} is not in this store")
        return list(self._accepted[session_id])

    async def acquire_lease(self, session_id: str, *, owner: str | None = None) -> Lease:
        """A lease nobody checks (this store has one writer by construction)."""
        await trio.lowlevel.checkpoint()
        return Lease(session_id=session_id, owner=owner or "test", epoch=1, expires_ms=0)

    async def release_lease(self, lease: Lease) -> None:
        """Nothing to release."""
        await trio.lowlevel.checkpoint()

    async def append(
        self, session_id: str, events: Sequence[Event], *, lease: Lease | None = None
    ) -> None:
        """Queue `events` for the writer."""
        self._accepted[session_id].extend(events)
        await self._writer().send((session_id, list(events)))

    async def flush(self, session_id: str | None = None) -> None:
        """Wait until the writer has written everything queued before."""
        written = trio.Event()
        await self._writer().send(written)
        await written.wait()

    async def list_sessions(self) -> list[str]:
        """Session ids in creation order."""
        await trio.lowlevel.checkpoint()
        return list(self._accepted)

    def durable_seq(self, session_id: str) -> int:
        """The newest seq the writer wrote; -1 when none."""
        return self._marks.seq(session_id)

    async def wait_durable(self, session_id: str, seq: int) -> None:
        """Return once the writer wrote `seq`."""
        await self._marks.wait(session_id, seq)

    def _writer(self) -> trio.MemorySendChannel[tuple[str, list[Event]] | trio.Event]:
        if self._queue is None:
            raise SessionError("the store's writer is not running")
        return self._queue


@attrs.define(eq=False)
class WatchedProvider:
    """A scripted provider that lets a test wait for its requests to arrive."""

    script: Sequence[Reply]
    _inner: ScriptedProvider = attrs.field(init=False)
    _arrived: trio.Event = attrs.field(factory=trio.Event, init=False)

    def __attrs_post_init__(self) -> None:
        self._inner = ScriptedProvider(self.script)

    @property
    def requests(self) -> list[GenerateRequest]:
        """Every request received, in order."""
        return self._inner.requests

    async def wait_requests(self, count: int) -> None:
        """Return once `count` requests have arrived."""
        while len(self.requests) < count:
            await self._arrived.wait()

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
        """Stream the next scripted reply, signalling the arrival first."""
        async with aclosing(self._inner.stream(request)) as chunks:
            self._arrived.set()
            self._arrived = trio.Event()
            async for chunk in chunks:
                yield chunk


@attrs.define(eq=False)
class ServedProvider(WatchedProvider):
    """A watched provider with a `serve` method, logging its life and closed streams."""

    log: list[str] = attrs.field(factory=list)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Log "provider started", wait until cancelled, log "provider stopped"."""
        self.log.append("provider started")
        try:
            task_status.started()
            await trio.sleep_forever()
        finally:
            self.log.append("provider stopped")

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
        """Stream the next scripted reply; log "stream closed" when it ends."""
        try:
            async with aclosing(super().stream(request)) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            self.log.append("stream closed")


@attrs.define(eq=False)
class GatedProvider:
    """Answers every request with `text`, but only once `gate` is set."""

    text: str
    gate: trio.Event = attrs.field(factory=trio.Event)
    requests: list[GenerateRequest] = attrs.field(factory=list)
    _arrived: trio.Event = attrs.field(factory=trio.Event, init=False)

    async def wait_requests(self, count: int) -> None:
        """Return once `count` requests have arrived."""
        while len(self.requests) < count:
            await self._arrived.wait()

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
        """Wait for the gate, then answer `text`."""
        self.requests.append(request)
        self._arrived.set()
        self._arrived = trio.Event()
        await self.gate.wait()
        yield TextDelta(text=self.text)
        yield FinishChunk(reason="completed")
