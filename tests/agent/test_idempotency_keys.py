"""Tool idempotency keys: `(session_id, seq)` of the logged `tool/call`, stable across resumes."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from pathlib import Path

import attrs
import pytest
import trio

from actors.agent import (
    AgentOptions,
    IdempotencyKey,
    Tool,
    ToolInvocation,
    ToolRegistry,
    function_tool,
    open_agent,
)
from actors.prompt import SystemPrompt
from actors.providers import Chunk, GenerateRequest, Reply, ScriptedProvider, ToolCall
from actors.session import Session, SQLiteStore
from actors.session.events import Event, ToolResult, TurnStart
from actors.session.lease import SessionFencedError, wall_clock_ms
from actors.session.session import INTERRUPTED_TOOL_RESULT
from tests.session.test_resume_repair import crash_image


def logged_calls(session: Session) -> list[Event]:
    return [event for event in session.events if event.type == "tool/call"]


def recording_tool(keys: list[IdempotencyKey], name: str = "t") -> Tool:
    async def execute(arguments: dict[str, object] | str, call: ToolInvocation) -> str:
        await trio.lowlevel.checkpoint()
        keys.append(call.idempotency_key)
        return "ok"

    return Tool(name=name, description="d", parameters={"type": "object"}, execute=execute)


async def test_every_call_gets_the_session_and_seq_of_its_logged_event() -> None:
    keys: list[IdempotencyKey] = []
    provider = ScriptedProvider(
        [
            Reply.tool_calls([ToolCall(id="1", name="t"), ToolCall(id="2", name="t")]),
            Reply.tool_calls([ToolCall(id="3", name="t")]),
            Reply.text("done"),
        ]
    )
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, tools=[recording_tool(keys)]
    ) as agent:
        agent.followup("go")
        await agent.when_idle()
    expected = [
        IdempotencyKey(session_id=agent.session.id, seq=event.seq)
        for event in logged_calls(agent.session)
    ]
    assert len(expected) == 3
    assert sorted(keys, key=lambda key: key.seq) == expected
    assert len(set(keys)) == 3  # different calls, different keys


async def test_calls_in_different_sessions_never_share_a_key() -> None:
    keys: list[IdempotencyKey] = []
    for _ in range(2):
        provider = ScriptedProvider(
            [Reply.tool_calls([ToolCall(id="1", name="t")]), Reply.text("")]
        )
        async with open_agent(
            system_prompt=SystemPrompt(), provider=provider, tools=[recording_tool(keys)]
        ) as agent:
            agent.followup("go")
            await agent.when_idle()
    assert keys[0].seq == keys[1].seq  # the same place in two logs...
    assert keys[0] != keys[1] and str(keys[0]) != str(keys[1])  # ...but two sessions


def test_the_key_text_is_session_colon_seq_and_splits_back() -> None:
    key = IdempotencyKey(session_id="team:a", seq=12)
    assert str(key) == "team:a:12"
    session_id, seq = str(key).rsplit(":", 1)
    assert IdempotencyKey(session_id=session_id, seq=int(seq)) == key


async def test_a_function_tool_reads_the_key_from_its_call_parameter() -> None:
    seen: list[str] = []

    @function_tool
    async def charge(amount: int, call: ToolInvocation) -> str:
        seen.append(f"{call.idempotency_key} {call.name} {amount}")
        return "charged"

    provider = ScriptedProvider(
        [
            Reply.tool_calls([ToolCall(id="1", name="charge", arguments='{"amount": 5}')]),
            Reply.text(""),
        ]
    )
    async with open_agent(system_prompt=SystemPrompt(), provider=provider, tools=[charge]) as agent:
        agent.followup("go")
        await agent.when_idle()
    (call,) = logged_calls(agent.session)
    assert seen == [f"{agent.session.id}:{call.seq} charge 5"]


async def test_a_tool_runs_only_once_its_call_is_durable(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "sessions.db")
    durable_at_run: list[tuple[int, int]] = []

    async def execute(arguments: dict[str, object] | str, call: ToolInvocation) -> str:
        key = call.idempotency_key
        durable_at_run.append((store.durable_seq(key.session_id), key.seq))
        await trio.lowlevel.checkpoint()
        return "ok"

    tool = Tool(name="t", description="d", parameters={"type": "object"}, execute=execute)
    provider = ScriptedProvider([Reply.tool_calls([ToolCall(id="1", name="t")]), Reply.text("")])
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, tools=[tool], store=store
    ) as agent:
        agent.followup("go")
        await agent.when_idle()
    ((durable, seq),) = durable_at_run
    assert durable >= seq


def test_an_invocation_is_made_only_from_a_tool_call_event() -> None:
    event = Event(type="turn/start", seq=4, time=0, data=TurnStart(turn=0))
    with pytest.raises(TypeError, match=r"session 's': event seq 4 is turn/start, not tool/call"):
        ToolInvocation.of("s", event)


async def test_a_resumed_session_names_the_interrupted_call_with_the_key_it_ran_under(
    tmp_path: Path,
) -> None:
    """Cut a turn off mid-tool (the file copied while the tool runs is what SIGKILL leaves),
    resume it in a new store: the repaired call rebuilt from the log, and a re-run of it, carry
    the key the first execution had; the resumed session's next call gets a new key."""
    path = tmp_path / "live" / "sessions.db"
    image = tmp_path / "image"
    first_keys: list[IdempotencyKey] = []
    copied = trio.Event()
    holder: dict[str, Session] = {}

    async def charge_then_hang(arguments: dict[str, object] | str, call: ToolInvocation) -> str:
        first_keys.append(call.idempotency_key)
        await holder["session"].flush()
        crash_image(path, image)
        copied.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    first_provider = ScriptedProvider([Reply.tool_calls([ToolCall(id="1", name="charge")])])
    options = AgentOptions(model="m")
    async with open_agent(
        system_prompt=SystemPrompt(),
        provider=first_provider,
        options=options,
        store=SQLiteStore(path),
        tools=[Tool("charge", "d", {"type": "object"}, charge_then_hang)],
    ) as first:
        holder["session"] = first.session
        first.followup("charge it")
        with trio.fail_after(10):
            await copied.wait()

    later_keys: list[IdempotencyKey] = []
    later = SQLiteStore(image / "sessions.db", wall_clock=lambda: wall_clock_ms() + 60_000)
    second_provider = ScriptedProvider(
        [Reply.tool_calls([ToolCall(id="2", name="charge")]), Reply.text("done")]
    )
    async with open_agent(
        system_prompt=SystemPrompt(),
        provider=second_provider,
        options=options,
        store=later,
        session_id=first.session.id,
        tools=[recording_tool(later_keys, "charge")],
    ) as resumed:
        (interrupted_call, *_) = logged_calls(resumed.session)
        repaired = ToolInvocation.of(resumed.session.id, interrupted_call)
        assert [repaired.idempotency_key] == first_keys
        results = [e.data for e in resumed.session.events if isinstance(e.data, ToolResult)]
        assert [(r.call_id, r.content) for r in results] == [("1", INTERRUPTED_TOOL_RESULT)]

        # Re-running the logged call (say, an operator's reconciliation) gives the same key.
        rerun_keys: list[IdempotencyKey] = []
        await ToolRegistry.of([recording_tool(rerun_keys, "charge")]).run(repaired)
        assert rerun_keys == first_keys

        resumed.followup("again")
        with trio.fail_after(10):
            await resumed.when_idle()
    (new_key,) = later_keys
    assert new_key.session_id == first_keys[0].session_id
    assert new_key.seq > first_keys[0].seq


GUIDE = Path(__file__).resolve().parents[2] / "docs" / "scale-out.md"


async def test_the_scale_out_guides_charge_tool_passes_the_key_on() -> None:
    guide = GUIDE.read_text()
    (code,) = [
        block.split("```", 1)[0]
        for block in guide.split("```python\n")[1:]
        if "call.idempotency_key" in block
    ]
    charged: list[tuple[int, str]] = []

    class Payments:
        async def charge(self, amount_cents: int, *, idempotency_key: str) -> str:
            await trio.lowlevel.checkpoint()
            charged.append((amount_cents, idempotency_key))
            return "charged"

    namespace: dict[str, object] = {"payments": Payments()}
    exec(compile(code, "docs/scale-out.md", "exec"), namespace)
    provider = ScriptedProvider(
        [
            Reply.tool_calls([ToolCall(id="1", name="charge", arguments='{"amount_cents": 250}')]),
            Reply.text("done"),
        ]
    )
    tool = namespace["charge"]
    assert isinstance(tool, Tool)
    async with open_agent(system_prompt=SystemPrompt(), provider=provider, tools=[tool]) as agent:
        agent.followup("go")
        await agent.when_idle()
    (call,) = logged_calls(agent.session)
    assert charged == [(250, f"{agent.session.id}:{call.seq}")]


@attrs.define
class TakeoverBeforeReplying:
    """A provider whose first reply comes after another writer took the session over."""

    inner: ScriptedProvider
    path: Path
    session_id: list[str]

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
        if len(self.inner.requests) == 0:  # the lease has expired for this store's clock
            thief = SQLiteStore(self.path, wall_clock=lambda: wall_clock_ms() + 60_000)
            await thief.acquire_lease(self.session_id[0], owner="thief")
        async with aclosing(self.inner.stream(request)) as chunks:
            async for chunk in chunks:
                yield chunk


async def test_a_writer_that_lost_the_session_runs_no_tool(tmp_path: Path) -> None:
    ran: list[IdempotencyKey] = []
    path = tmp_path / "sessions.db"
    session_id: list[str] = []
    provider = TakeoverBeforeReplying(
        ScriptedProvider([Reply.tool_calls([ToolCall(id="1", name="t")]), Reply.text("")]),
        path,
        session_id,
    )
    with pytest.raises(SessionFencedError):
        async with open_agent(
            system_prompt=SystemPrompt(),
            provider=provider,
            tools=[recording_tool(ran)],
            store=SQLiteStore(path),
        ) as agent:
            session_id.append(agent.session.id)
            agent.followup("go")
            with trio.fail_after(10):
                await agent.when_idle()
    assert ran == []
