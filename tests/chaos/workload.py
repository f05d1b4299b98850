"""Sessions driven through the gateway, and supervisors subscribed to their logs.

`Workload(url, token, sessions=N)`: `create()` opens N sessions
(`session/new`) over `driver_connections` websockets and subscribes each
one's log from seq 0 (`_harness/log/subscribe`) over
`subscriber_connections` other websockets; `run(stop, min_turns)` runs
every session's turns one after another (`session/prompt` with a line
`call chaos_step {...}`, so each turn is a tool call and an answer) until
`stop` is set and each session has done `min_turns`; `wait_caught_up(heads)`
waits until every subscriber has seen its session's log up to `heads`.
Everything the clients sent and saw is kept for the checks: the prompts
(with their outcome and timing) and each subscription's events.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from contextlib import AsyncExitStack
from typing import Any

import attrs
import trio

from tests.chaos.rpc import RpcClosed, RpcConnection, RpcError, open_rpc


def prompt_text(session_id: str, turn: int) -> str:
    """The user line of prompt `turn` of a session: one `chaos_step` tool call."""
    arguments = json.dumps({"session": session_id, "turn": turn})
    return f"call chaos_step {arguments}"


@attrs.define
class PromptRecord:
    """One `session/prompt` call and how it ended (`outcome`: the stopReason, or the error)."""

    session_id: str
    turn: int
    text: str
    sent: float
    done: float | None = None
    outcome: str | None = None


@attrs.define
class Subscription:
    """One `_harness/log/subscribe` (`subscription`: `CONNECTION/ID`): its events, in order."""

    session_id: str
    subscription: str
    from_seq: int
    connection: int
    events: list[Any] = attrs.field(factory=list)
    caught_up: list[int] = attrs.field(factory=list)


@attrs.define(eq=False)
class Workload:
    """See the module docstring."""

    url: str
    token: str
    sessions: int
    driver_connections: int = 10
    subscriber_connections: int = 4
    session_ids: list[str] = attrs.field(factory=list)
    prompts: list[PromptRecord] = attrs.field(factory=list)
    in_flight: dict[str, PromptRecord] = attrs.field(factory=dict)
    subscriptions: dict[str, Subscription] = attrs.field(factory=dict)
    other_notifications: list[tuple[int, str, Any]] = attrs.field(factory=list)
    _drivers: list[RpcConnection] = attrs.field(factory=list)
    _subscribers: list[RpcConnection] = attrs.field(factory=list)
    _progress: trio.Event = attrs.field(factory=trio.Event)

    async def connect(self, stack: AsyncExitStack) -> None:
        """Open the driver and subscriber websockets (closed when `stack` closes)."""
        for _ in range(self.driver_connections):
            self._drivers.append(await stack.enter_async_context(open_rpc(self.url, self.token)))
        for index in range(self.subscriber_connections):
            self._subscribers.append(
                await stack.enter_async_context(
                    open_rpc(self.url, self.token, self._notified(index))
                )
            )

    def _notified(self, connection: int) -> Any:
        def on_notification(method: str, params: Any) -> None:
            if method == "_harness/log/event":
                self._subscription(params, connection).events.append(params["event"])
                self._progress.set()
                self._progress = trio.Event()
            elif method == "_harness/log/caughtUp":
                self._subscription(params, connection).caught_up.append(params["seq"])
            else:
                self.other_notifications.append((connection, method, params))

        return on_notification

    def _subscription(self, params: Any, connection: int) -> Subscription:
        # Events may arrive before the subscribe call's answer: register on first sight.
        # Subscription ids are per connection: key them by both.
        key = f"{connection}/{params['subscription']}"
        if key not in self.subscriptions:
            self.subscriptions[key] = Subscription(params["sessionId"], key, 0, connection)
        return self.subscriptions[key]

    def driver(self, index: int) -> RpcConnection:
        """The driver connection of session number `index`."""
        return self._drivers[index % len(self._drivers)]

    async def create(self) -> None:
        """Open the sessions, then subscribe to each one's log from seq 0."""
        created: list[str | None] = [None] * self.sessions

        async def new(index: int) -> None:
            result = await self.driver(index).call("session/new", {"cwd": "/", "mcpServers": []})
            created[index] = result["sessionId"]

        async with trio.open_nursery() as nursery:
            for index in range(self.sessions):
                nursery.start_soon(new, index)
        self.session_ids = [sid for sid in created if sid is not None]

        async def subscribe(index: int, session_id: str) -> None:
            number = index % len(self._subscribers)
            connection = self._subscribers[number]
            result = await connection.call(
                "_harness/log/subscribe", {"sessionId": session_id, "fromSeq": 0}
            )
            params = {"subscription": result["subscription"], "sessionId": session_id}
            self._subscription(params, number).from_seq = result["fromSeq"]

        async with trio.open_nursery() as nursery:
            for index, session_id in enumerate(self.session_ids):
                nursery.start_soon(subscribe, index, session_id)

    async def run(self, stop: trio.Event, min_turns: int, max_turns: float = math.inf) -> None:
        """Run every session's turns until `stop` is set and each did `min_turns`.

        A prompt that fails is recorded with its error and that session stops;
        the checks report it.
        """

        async def session(index: int, session_id: str) -> None:
            turn = 0
            while turn < max_turns and (turn < min_turns or not stop.is_set()):
                record = PromptRecord(
                    session_id, turn, prompt_text(session_id, turn), sent=time.time()
                )
                self.prompts.append(record)
                self.in_flight[session_id] = record
                try:
                    result = await self.driver(index).call(
                        "session/prompt",
                        {
                            "sessionId": session_id,
                            "prompt": [{"type": "text", "text": record.text}],
                        },
                    )
                    record.outcome = str(result.get("stopReason"))
                except (RpcError, RpcClosed) as exc:
                    record.outcome = f"error: {exc}"
                finally:
                    record.done = time.time()
                    del self.in_flight[session_id]
                if record.outcome != "end_turn":
                    return
                turn += 1

        async with trio.open_nursery() as nursery:
            for index, session_id in enumerate(self.session_ids):
                nursery.start_soon(session, index, session_id)

    def seen_upto(self, session_id: str) -> int:
        """The newest seq any subscription of the session delivered (-1: none)."""
        return max(
            (
                s.events[-1].get("seq", -1) if s.events else -1
                for s in self.subscriptions.values()
                if s.session_id == session_id
            ),
            default=-1,
        )

    async def wait_caught_up(self, heads: Mapping[str, int], timeout: float) -> list[str]:
        """Wait until every subscription delivered its session's `heads`; the laggards, if any."""
        behind = {s.subscription: s for s in self.subscriptions.values()}
        with trio.move_on_after(timeout):
            while behind:
                for key, sub in list(behind.items()):
                    last = sub.events[-1].get("seq", -1) if sub.events else -1
                    if last >= heads.get(sub.session_id, -1):
                        del behind[key]
                if behind:
                    await self._progress.wait()
        return [
            f"subscription {s.subscription} on session {s.session_id} saw up to seq "
            f"{s.events[-1].get('seq') if s.events else None}; the log's head is "
            f"{heads.get(s.session_id)}{self._closed_note(s.connection)}"
            for s in behind.values()
        ]

    def _closed_note(self, connection: int) -> str:
        reason = self._subscribers[connection].close_reason
        return "" if reason is None else f" (its connection was closed: {reason})"

    def prompts_by_session(self) -> dict[str, list[str]]:
        """Every prompt text sent, by session."""
        by_session: dict[str, list[str]] = {sid: [] for sid in self.session_ids}
        for record in self.prompts:
            by_session[record.session_id].append(record.text)
        return by_session

    def failed_prompts(self) -> list[PromptRecord]:
        """The prompts whose reply was not `end_turn` (or that never got one)."""
        return [record for record in self.prompts if record.outcome != "end_turn"]
