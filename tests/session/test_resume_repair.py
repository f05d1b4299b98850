"""Resume repairs a cut-off turn so every later request passes the tool-pairing rule.

The unit tests build crashed logs by hand; the last test cuts a real turn
off mid-tool (a copy of the SQLite file taken while the tool runs is exactly
what a SIGKILL leaves behind) and resumes it over the real HTTP path to the
simulator, whose tool-pairing check is DeepSeek's.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import trio

from actors.agent import AgentOptions, Tool, open_agent
from actors.messages import Message, TextBlock, ToolCallBlock, UserSource
from actors.prompt import SystemPrompt
from actors.providers.actor import ProviderActor
from actors.providers.openai_compat import OpenAICompatProvider
from actors.providers.simulator import SimulatorEngine, serve_simulator
from actors.session import MemoryStore, Session, SQLiteStore
from actors.session.events import (
    AssistantMessage,
    EventData,
    StepEnd,
    StepStart,
    ToolCallRequested,
    ToolError,
    ToolResult,
    TurnEnd,
    TurnEndReason,
    TurnStart,
    UserMessage,
)
from actors.session.lease import wall_clock_ms
from actors.session.session import INTERRUPTED_TOOL_RESULT


def interrupted(call_id: str, step: int = 0) -> ToolResult:
    return ToolResult(
        turn=0,
        step=step,
        call_id=call_id,
        content=INTERRUPTED_TOOL_RESULT,
        is_error=True,
        error=ToolError(name="Interrupted", code="interrupted"),
    )


def asking(*call_ids: str) -> AssistantMessage:
    blocks = [ToolCallBlock(id=c, name="work", arguments="{}") for c in call_ids]
    return AssistantMessage(
        turn=0, step=0, message=Message(role="assistant", content=(TextBlock(text="ok"), *blocks))
    )


def called(call_id: str) -> ToolCallRequested:
    return ToolCallRequested(turn=0, step=0, call_id=call_id, name="work", arguments="{}")


async def crashed_with(*items: EventData) -> MemoryStore:
    store = MemoryStore()
    session = await Session.create(store, "s")
    await session.extend(
        [
            TurnStart(turn=0),
            StepStart(turn=0, step=0),
            UserMessage(content="go", source=UserSource()),
            *items,
        ]
    )
    return store


async def repaired(store: MemoryStore) -> list[EventData]:
    before = len(await store.load("s"))
    session = await Session.load(store, "s")
    assert [e.seq for e in await store.load("s")] == list(range(len(session)))
    return [event.data for event in session.events[before:]]


async def test_a_logged_call_without_a_result_is_answered_interrupted() -> None:
    store = await crashed_with(asking("c1"), called("c1"))
    assert await repaired(store) == [
        interrupted("c1"),
        StepEnd(turn=0, step=0),
        TurnEnd(turn=0, reason=TurnEndReason(kind="interrupted")),
    ]


async def test_calls_the_model_made_but_the_log_never_reached_are_logged_then_answered() -> None:
    store = await crashed_with(asking("c1", "c2"))
    assert await repaired(store) == [
        called("c1"),
        called("c2"),
        interrupted("c1"),
        interrupted("c2"),
        StepEnd(turn=0, step=0),
        TurnEnd(turn=0, reason=TurnEndReason(kind="interrupted")),
    ]


async def test_only_the_unanswered_calls_get_an_interrupted_result() -> None:
    done = ToolResult(turn=0, step=0, call_id="c1", content="fine", is_error=False)
    store = await crashed_with(asking("c1", "c2"), called("c1"), called("c2"), done)
    repairs = await repaired(store)
    assert repairs[0] == interrupted("c2")
    assert len(repairs) == 3


async def test_a_repaired_surface_pairs_every_call_with_a_result() -> None:
    store = await crashed_with(asking("c1", "c2"), called("c1"))
    session = await Session.load(store, "s")
    messages = session.derive_messages()
    assert [m.role for m in messages] == ["user", "assistant", "user", "user"]
    assert [m.source.call_id for m in messages[2:]] == ["c1", "c2"]  # type: ignore[union-attr]
    assert all(m.is_error for m in messages[2:])


def actor_for(engine: SimulatorEngine, url: str) -> ProviderActor:
    def factory(client: httpx.AsyncClient) -> OpenAICompatProvider:
        return OpenAICompatProvider(client, base_url=url, api_key=engine.config.api_key)

    return ProviderActor(name="sim", factory=factory, max_in_flight=4)


def crash_image(path: Path, image: Path) -> None:
    """Copy the database and its WAL as they are now: what a SIGKILL would leave on disk."""
    image.mkdir()
    for suffix in ("", "-wal"):
        source = path.with_name(path.name + suffix)
        if source.exists():
            shutil.copyfile(source, image / source.name)


async def test_a_session_cut_off_mid_tool_resumes_and_its_next_turns_pass_tool_pairing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "live" / "sessions.db"
    image = tmp_path / "image"
    copied = trio.Event()
    holder: dict[str, Session] = {}

    async def work_then_hang(arguments: dict[str, Any] | str, call: ToolCallRequested) -> str:
        await holder["session"].flush()
        crash_image(path, image)
        copied.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def work(arguments: dict[str, Any] | str, call: ToolCallRequested) -> str:
        await trio.lowlevel.checkpoint()
        return "done"

    engine = SimulatorEngine()
    options = AgentOptions(model="deepseek-chat")
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_simulator, engine)
        actor = actor_for(engine, url)
        await nursery.start(actor.serve)
        async with open_agent(
            system_prompt=SystemPrompt(),
            provider=actor,
            options=options,
            store=SQLiteStore(path),
            tools=[Tool("work", "Do work.", {"type": "object"}, work_then_hang)],
        ) as first:
            holder["session"] = first.session
            first.followup('call work {"n": 1}')
            with trio.fail_after(10):
                await copied.wait()
        # The crashed holder's lease is still in the image: resume once it expired.
        later = SQLiteStore(image / "sessions.db", wall_clock=lambda: wall_clock_ms() + 60_000)
        async with open_agent(
            system_prompt=SystemPrompt(),
            provider=actor,
            options=options,
            store=later,
            session_id=first.session.id,
            tools=[Tool("work", "Do work.", {"type": "object"}, work)],
        ) as resumed:
            # The simulator first answers the interrupted result, then makes the new call.
            for text in ("and now?", 'call work {"n": 2}'):
                resumed.followup(text)
                with trio.fail_after(10):
                    await resumed.when_idle()
        nursery.cancel_scope.cancel()
    ends = [e.data.reason.kind for e in resumed.session.events if isinstance(e.data, TurnEnd)]
    assert ends == ["interrupted", "completed", "completed"]
    results = [e.data for e in resumed.session.events if isinstance(e.data, ToolResult)]
    assert [(r.is_error, r.content) for r in results] == [
        (True, INTERRUPTED_TOOL_RESULT),
        (False, "done"),
    ]
    assert all(request.status == 200 for request in engine.requests)
