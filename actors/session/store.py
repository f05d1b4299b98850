"""Session stores: where the log becomes durable.

`SessionStore` is the protocol the `Session` writes through. `MemoryStore`
keeps each session's events as their JSON form (so loading always goes
through the durable representation); `SQLiteStore` (in
`actors/session/sqlite_store.py`) is the embedded default on disk. Both
implement the one-writer-per-session lease of `actors/session/lease.py`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import attrs
import orjson
import trio

from actors.session.codec import event_from_json, event_to_json, event_to_shared_json
from actors.session.durability import DurableChanges, DurableMarks
from actors.session.errors import SessionError
from actors.session.events import Event, RequestHeaderLogged, UnknownData
from actors.session.lease import (
    Lease,
    SessionBusyError,
    SessionFencedError,
    default_owner,
)
from actors.session.memory_log import HEADER, JSON_TEXT, MemoryLog


class SessionExistsError(SessionError):
    """`create()` was asked for a session id the store already holds."""


class UnknownSessionError(SessionError):
    """An operation named a session id the store does not hold."""


@runtime_checkable
class SessionStore(Protocol):
    """Durable, append-only storage of session logs.

    `append` queues events in order and may return before they are durable;
    `flush` returns once everything appended before the call is durable.
    `running` tells whether the store can accept writes now (a store with a
    writer task must have it started first: see `serve`). `durable_seq`
    and `wait_durable` tell readers (`Session.watch()`, the gateway) which
    events are durable, so nothing a crash could take back is ever shown.

    One writer per session: `acquire_lease` grants a `Lease` (or raises
    `SessionBusyError`); appends under it carry its epoch, and the store
    refuses them (`SessionFencedError`) once another writer took the session
    over. A refused or failed append breaks that session only (its later
    appends and flushes raise), never the store's other sessions. Every
    failure is a `SessionError` naming the store, the session and, where it
    applies, the seq.
    """

    @property
    def running(self) -> bool:
        """True when `append` and `flush` can be used."""
        ...

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the store's writer until cancelled; `task_status.started()` once usable."""
        ...

    async def create(self, session_id: str) -> None:
        """Register a new, empty session. Raises `SessionExistsError` if it exists."""
        ...

    async def exists(self, session_id: str) -> bool:
        """True when the store holds `session_id`."""
        ...

    async def load(self, session_id: str) -> list[Event]:
        """All durable events of `session_id`, in seq order. Raises `UnknownSessionError`."""
        ...

    async def acquire_lease(self, session_id: str, *, owner: str | None = None) -> Lease:
        """Take the write lease of `session_id` (which need not exist yet).

        Raises `SessionBusyError` naming the holder when another live lease
        holds it; an expired one is taken over with the next epoch.
        """
        ...

    async def release_lease(self, lease: Lease) -> None:
        """Give `lease` up (a no-op when it was already taken over); the epoch stays used."""
        ...

    async def append(
        self, session_id: str, events: Sequence[Event], *, lease: Lease | None = None
    ) -> None:
        """Queue `events` (contiguous seqs) for `session_id`, in order, under `lease`."""
        ...

    async def flush(self, session_id: str | None = None) -> None:
        """Return once what was appended before this call (to `session_id`, or all) is durable."""
        ...

    async def list_sessions(self) -> list[str]:
        """Ids of every stored session, in creation order."""
        ...

    def durable_seq(self, session_id: str) -> int:
        """The newest seq of `session_id` this store knows is durable; -1 when none.

        Covers what this store committed and what it loaded; never blocks.
        """
        ...

    async def wait_durable(self, session_id: str, seq: int) -> None:
        """Return once `durable_seq(session_id) >= seq`.

        Cancellation: cancellable; nothing is affected.

        Raises:
            SessionError: an accepted append of the session failed, so `seq`
                will never become durable.
        """
        ...

    def durable_changes(self) -> DurableChanges:
        """A listener of every session's durability: one wakeup for all that advanced.

        Each commit (or failed commit) reports its sessions to every open
        listener; `close()` the listener when done. Never blocks the store.
        """
        ...


@attrs.define(eq=False)
class MemoryStore:
    """An in-process store: durable for the life of the object, no writer task needed.

    Events are kept in their durable JSON form: a session's log is one
    buffer of its events' compact JSON texts (`MemoryLog`: UTF-8 written by
    orjson, or ASCII where only `json` writes it exactly, see
    `_stored_form`), compressed as flushes settle them, so an idle
    session's log costs a fraction of its own events' bytes in one
    allocation, not a small object per event. A
    request header (its config, system text and tool schemas) is not
    repeated in every log that sends it: a `request/header` event's
    `header` is written as the number of the store's one decoded copy of
    that header, whose tool list is itself shared between headers
    (`event_to_shared_json`).

    Leases never expire here: every holder lives in this process, and
    `open_agent` releases its lease however it exits.
    """

    _logs: dict[str, MemoryLog] = attrs.field(factory=dict, init=False)
    _headers: list[dict[str, Any]] = attrs.field(factory=list, init=False)
    """The decoded request headers logs refer to by number (read-only, shared by their loads)."""
    _header_numbers: dict[str, int] = attrs.field(factory=dict, init=False)
    """`_headers` numbers by content: a header's JSON text without its tools, and the identity
    of its shared tool list (kept alive in `_headers`, so never reused while numbered)."""
    _holders: dict[str, Lease] = attrs.field(factory=dict, init=False)
    _epochs: dict[str, int] = attrs.field(factory=dict, init=False)
    _marks: DurableMarks = attrs.field(factory=DurableMarks, init=False)

    @property
    def running(self) -> bool:
        """Always True: a memory store needs no writer."""
        return True

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Nothing to run: reports started and waits until cancelled."""
        task_status.started()
        await trio.sleep_forever()

    async def create(self, session_id: str) -> None:
        """Register a new, empty session."""
        await trio.lowlevel.checkpoint()
        if session_id in self._logs:
            raise SessionExistsError(f"session {session_id!r} already exists")
        self._logs[session_id] = MemoryLog()

    async def exists(self, session_id: str) -> bool:
        """True when `session_id` was created."""
        await trio.lowlevel.checkpoint()
        return session_id in self._logs

    async def load(self, session_id: str) -> list[Event]:
        """The session's events, decoded from their stored JSON."""
        await trio.lowlevel.checkpoint()
        return [
            event_from_json(self._decoded(text, flags))
            for text, flags in self._log(session_id).items()
        ]

    async def acquire_lease(self, session_id: str, *, owner: str | None = None) -> Lease:
        """Take the lease of `session_id`; `SessionBusyError` while another holds it."""
        await trio.lowlevel.checkpoint()
        holder = self._holders.get(session_id)
        if holder is not None:
            raise SessionBusyError(
                f"session {session_id!r} is busy: its write lease is held by {holder.owner} "
                f"(epoch {holder.epoch}) in this memory store",
                session_id=session_id,
                holder=holder.owner,
            )
        epoch = self._epochs.get(session_id, 0) + 1
        self._epochs[session_id] = epoch
        lease = Lease(
            session_id=session_id, owner=owner or default_owner(), epoch=epoch, expires_ms=0
        )
        self._holders[session_id] = lease
        return lease

    async def release_lease(self, lease: Lease) -> None:
        """Give `lease` up."""
        await trio.lowlevel.checkpoint()
        if self._holders.get(lease.session_id) == lease:
            del self._holders[lease.session_id]

    async def append(
        self, session_id: str, events: Sequence[Event], *, lease: Lease | None = None
    ) -> None:
        """Store `events` immediately (a memory store is "durable" at once).

        A cancellation point but not a scheduling point: a caller cancelled
        before it stores nothing (`trio.Cancelled`), and storing never
        blocks, so it does not yield to other tasks (an agent's turn
        appends seven times; each yield was a pass through the scheduler
        and a resumption of the agent's whole call stack).

        Raises:
            SessionFencedError: `lease` is no longer the session's lease.
            SessionBusyError: no `lease` was given while another writer holds one.
            SessionError: a seq does not continue the log, or an event cannot
                be written as JSON (then none of `events` is stored).
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        holder = self._holders.get(session_id)
        if lease is not None and holder is not lease and holder != lease:
            raise SessionFencedError(
                f"session {session_id!r}: the write lease of epoch {lease.epoch} was released "
                f"or taken over; seq {events[0].seq if events else '-'} and later are refused",
                session_id=session_id,
                epoch=lease.epoch,
            )
        if lease is None and holder is not None:
            raise SessionBusyError(
                f"session {session_id!r} is busy: its write lease is held by {holder.owner} "
                f"(epoch {holder.epoch}); a write without the lease is refused",
                session_id=session_id,
                holder=holder.owner,
            )
        log = self._log(session_id)
        for expected, event in enumerate(events, len(log)):
            if event.seq != expected:
                raise SessionError(
                    f"session {session_id!r}: event {event.type} has seq {event.seq}, "
                    f"expected {expected}"
                )
        # Encoded first, so a refused append stores none of its events.
        log.extend(
            [self._stored_form(session_id, event) for event in events],
            ends_turn=bool(events) and events[-1].type == "turn/end",
        )
        self._marks.advance(session_id, len(log) - 1)

    async def flush(self, session_id: str | None = None) -> None:
        """Return at once: nothing is pending in a memory store. The events appended since
        the session's (or every session's) last flush move into its log's one buffer,
        compressed once 2 KiB or a turn's end is there (`MemoryLog.settle`: an agent flushes
        at each step, at the end of each turn and before its session hibernates, so an idle
        session keeps no object per event).

        Not a checkpoint: every append was durable (and a checkpoint) when
        it returned, so there is nothing to wait for and nothing to yield to.
        """
        if session_id is None:
            for log in self._logs.values():
                log.settle()
        elif (one := self._logs.get(session_id)) is not None:
            one.settle()

    async def list_sessions(self) -> list[str]:
        """Session ids in creation order."""
        await trio.lowlevel.checkpoint()
        return list(self._logs)

    def durable_seq(self, session_id: str) -> int:
        """The session's last stored seq (a memory store is durable at once); -1 when none."""
        return self._marks.seq(session_id)

    async def wait_durable(self, session_id: str, seq: int) -> None:
        """Return once `seq` of `session_id` is stored. Cancellable."""
        await self._marks.wait(session_id, seq)

    def durable_changes(self) -> DurableChanges:
        """A listener of every session's appends (each one is durable at once here)."""
        return self._marks.changes()

    def durable_json(self, session_id: str, seq: int) -> bytes | None:
        """The compact, ASCII JSON of event `seq` of `session_id` as kept since its append,
        byte for byte what `json` writes (`ensure_ascii`, no spaces) for that event of
        `session.to_json()`; None when the kept form is not exactly that (a request header,
        kept by number; orjson's text of an event with characters `json` escapes) or the
        event was not appended.

        orjson and `json` write the same bytes for what events hold outside headers
        (strings, integers, booleans, null: no floats) except the characters `json`
        escapes and orjson does not: everything past `~`.
        """
        return self.durable_json_range(session_id, seq, seq)[0]

    def durable_json_range(self, session_id: str, first: int, last: int) -> list[bytes | None]:
        """`durable_json` of events `first` to `last` of `session_id`, read in one walk of the
        log (for a batch of recent events, what one event costs each); None for every seq
        that was not appended."""
        wanted = max(0, last - first + 1)
        log = self._logs.get(session_id)
        if log is None or not 0 <= first < len(log):
            return [None] * wanted
        kept = [_exact_json(text, flags) for text, flags in log.since(first, last)]
        return kept + [None] * (wanted - len(kept))

    def _log(self, session_id: str) -> MemoryLog:
        try:
            return self._logs[session_id]
        except KeyError:
            raise UnknownSessionError(f"session {session_id!r} is not in this store") from None

    def _stored_form(self, session_id: str, event: Event) -> tuple[bytes, int]:
        """How this store keeps `event`: its compact JSON text and `MemoryLog` flags.

        orjson writes it (UTF-8) where that gives exactly what `json`
        accepts, which is nearly always; `json` writes it (ASCII) where
        orjson refuses a value (integers beyond 64 bits, lone surrogates,
        non-string keys, subclasses of built-in types), where orjson could
        have written a NaN or an infinity as `null` (any `null` in its
        output: `json` refuses those), and for the raw data of an event type
        this version does not know. So an event is refused exactly when
        `json` refuses it. A request header's `header` is written as the
        number of the store's shared copy of it (`_header_number`).

        Raises:
            SessionError: the event cannot be written as JSON; names the session and seq.
        """
        data = event.data
        try:
            if isinstance(data, RequestHeaderLogged):
                item = event_to_shared_json(event)
                item["data"]["header"] = self._header_number(item["data"]["header"])
                return _encode(item).encode(), HEADER | JSON_TEXT
            obj = event_to_json(event)
            if not isinstance(data, UnknownData):
                try:
                    text = orjson.dumps(obj, option=_ORJSON_OPTIONS)
                except orjson.JSONEncodeError:
                    pass
                else:
                    if b"null" not in text:
                        # A copy of its size: orjson's own bytes keep a 4 KB buffer each.
                        return bytes(memoryview(text)), 0
            return _encode(obj).encode(), JSON_TEXT
        except (TypeError, ValueError) as exc:
            raise SessionError(
                f"session {session_id!r}: event seq {event.seq} ({event.type}) "
                f"cannot be stored as JSON: {exc}"
            ) from exc

    def _header_number(self, header: dict[str, Any]) -> int:
        """The number of the stored copy of `header` (its shared JSON form), stored if new.

        Raises:
            TypeError, ValueError: the header cannot be written as JSON.
        """
        tools = header.get("tools")
        key = _encode({name: value for name, value in header.items() if name != "tools"})
        if tools is not None:
            key += f"+tools@{id(tools)}"
        number = self._header_numbers.get(key)
        if number is None:
            number = self._header_numbers[key] = len(self._headers)
            self._headers.append(header)
        return number

    def _decoded(self, text: bytes | bytearray, flags: int) -> Any:
        """The JSON value of a kept event (`_stored_form`): each encoder's own text, decoded."""
        if not flags & JSON_TEXT:
            return orjson.loads(text)
        item = json.loads(text)
        if flags & HEADER:
            item["data"]["header"] = self._headers[item["data"]["header"]]
        return item


_encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
"""Compact JSON text (ASCII, so one byte a character), without a new encoder per call."""

_ORJSON_OPTIONS = (
    orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
)
"""Values `json` refuses are refused by orjson too (no `default`), so `json` decides them."""


def _exact_json(text: bytes, flags: int) -> bytes | None:
    """A kept event's text when it is exactly what `json` writes for it (`durable_json`)."""
    if flags & HEADER:
        return None
    if flags & JSON_TEXT or (text.isascii() and b"\x7f" not in text):
        return text
    return None
