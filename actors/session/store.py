"""Session stores: where the log becomes durable.

`SessionStore` is the protocol the `Session` writes through. `MemoryStore`
keeps each session's events as their JSON form (so loading always goes
through the durable representation); `SQLiteStore` (in
`actors/session/sqlite_store.py`) is the embedded default on disk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import attrs
import trio

from actors.session.codec import event_from_json, event_to_shared_json
from actors.session.errors import SessionError
from actors.session.events import Event


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
    writer task must have it started first: see `serve`).
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

    async def append(self, session_id: str, events: Sequence[Event]) -> None:
        """Queue `events` (contiguous seqs) for `session_id`, in order."""
        ...

    async def flush(self) -> None:
        """Return once every event appended before this call is durable."""
        ...

    async def list_sessions(self) -> list[str]:
        """Ids of every stored session, in creation order."""
        ...


@attrs.define(eq=False)
class MemoryStore:
    """An in-process store: durable for the life of the object, no writer task needed.

    Events are kept in their JSON form, with the decoded tool schemas of
    request headers shared between sessions (`event_to_shared_json`), so an
    idle session's log costs what its own events hold.
    """

    _logs: dict[str, list[dict[str, Any]]] = attrs.field(factory=dict, init=False)

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
        self._logs[session_id] = []

    async def exists(self, session_id: str) -> bool:
        """True when `session_id` was created."""
        await trio.lowlevel.checkpoint()
        return session_id in self._logs

    async def load(self, session_id: str) -> list[Event]:
        """The session's events, decoded from their stored JSON."""
        await trio.lowlevel.checkpoint()
        return [event_from_json(obj) for obj in self._log(session_id)]

    async def append(self, session_id: str, events: Sequence[Event]) -> None:
        """Store `events` immediately (a memory store is "durable" at once)."""
        await trio.lowlevel.checkpoint()
        log = self._log(session_id)
        for event in events:
            if event.seq != len(log):
                raise SessionError(
                    f"session {session_id!r}: event {event.type} has seq {event.seq}, "
                    f"expected {len(log)}"
                )
            log.append(event_to_shared_json(event))

    async def flush(self) -> None:
        """Nothing is pending in a memory store."""
        await trio.lowlevel.checkpoint()

    async def list_sessions(self) -> list[str]:
        """Session ids in creation order."""
        await trio.lowlevel.checkpoint()
        return list(self._logs)

    def _log(self, session_id: str) -> list[dict[str, Any]]:
        try:
            return self._logs[session_id]
        except KeyError:
            raise UnknownSessionError(f"session {session_id!r} is not in this store") from None
