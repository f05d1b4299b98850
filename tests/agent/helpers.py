"""Shared helpers for agent tests."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

import trio

from actors.agent.decisions import (
    FailTurn,
    PreStepListener,
    PreStepNext,
    Reject,
    StepDecision,
    StepProposal,
)
from actors.messages import PluginSource
from actors.providers import GenerateRequest, Reply, ScriptedProvider
from actors.providers.chunks import Chunk
from actors.session import MemoryStore, Session
from actors.session.events import UserMessage


async def refuse(proposal: StepProposal, next: PreStepNext) -> StepDecision:
    """A pre-step listener that refuses every step (its turn ends `blocked`)."""
    return Reject(reason="policy")


def fail_first_step_once() -> PreStepListener:
    """A pre-step listener that fails the first step it sees ("not now", before the step
    opens: its input goes back to the inbox) and lets every later one through."""
    failures = [FailTurn("not now", code="later")]

    async def fail_once(proposal: StepProposal, next: PreStepNext) -> StepDecision:
        if failures:
            raise failures.pop()
        return await next()

    return fail_once


def held_until(gate: trio.Event) -> PreStepListener:
    """A pre-step listener that holds every step until `gate` is set."""

    async def hold(proposal: StepProposal, next: PreStepNext) -> StepDecision:
        await gate.wait()
        return await next()

    return hold


def types(session: Session) -> list[str]:
    """The event types of a session, in order."""
    return [event.type for event in session.events]


def data_of(session: Session, type_: str) -> list[Any]:
    """The data of every event of one type, in order."""
    return [event.data for event in session.events if event.type == type_]


def turn_end_kinds(session: Session) -> list[str]:
    """The kind of every turn/end reason, in order."""
    return [data.reason.kind for data in data_of(session, "turn/end")]


def request_texts(request: GenerateRequest) -> list[str]:
    """The text of every message of a request, in order."""
    return [message.text for message in request.messages]


def dump(request: GenerateRequest) -> str:
    """The compact JSON text of a request: what "byte for byte" compares."""
    return json.dumps(request.to_json(), separators=(",", ":"))


class GatedProvider(ScriptedProvider):
    """A scripted provider that holds its first request until `gate` is set."""

    def __init__(self, script: list[Reply], gate: trio.Event) -> None:
        super().__init__(script)
        self.gate = gate

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
        if not self.requests:
            await self.gate.wait()
        async with aclosing(super().stream(request)) as chunks:
            async for chunk in chunks:
                yield chunk


class FlushHookStore(MemoryStore):
    """A memory store that runs `before_flush` (once) inside its next `flush()`."""

    def __init__(self) -> None:
        super().__init__()
        self.before_flush: Callable[[], Awaitable[None]] | None = None

    async def flush(self, session_id: str | None = None) -> None:
        hook, self.before_flush = self.before_flush, None
        if hook is not None:
            await hook()
        await super().flush(session_id)


async def compact_surface(session: Session, summary: str = "Summary of earlier work.") -> None:
    """Replace every surface event of `session` by one summary message (a compaction)."""
    cited = [event.seq for event in session.surface_events()]
    await session.append(
        UserMessage(content=summary, source=PluginSource(plugin="compaction")),
        surface_op="replace",
        source_event_seqs=cited,
    )
