"""`agent.run()`, `max_steps`, closed agents and the domain errors leaving `open_agent`."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from actors.agent import (
    Agent,
    AgentClosedError,
    AgentOptions,
    InboxFullError,
    RetryPolicy,
    TurnFailedError,
    TurnResult,
    open_agent,
)
from actors.agent.agent import INBOX_CAPACITY
from actors.prompt import PromptError, PromptSection, SystemPrompt
from actors.providers import Reply, ScriptedProvider, ToolCall
from actors.providers.chunks import Usage
from actors.providers.openai_compat import OpenAICompatProvider
from actors.providers.simulator import SimulatorEngine, simulator_transport
from actors.session import SessionError, SQLiteStore
from tests.agent.helpers import (
    data_of,
    fail_first_step_once,
    held_until,
    refuse,
    turn_end_kinds,
)
from tests.agent.test_turns import ECHO

OPTIONS = AgentOptions(model="m")


def tool_loop(replies: int) -> list[Reply]:
    """`replies` scripted replies that each call the echo tool."""
    return [
        Reply.tool_calls([ToolCall(id=f"c{i}", name="echo", arguments='{"text": "x"}')])
        for i in range(replies)
    ]


# -- run() for each turn-end kind ------------------------------------------------------


async def test_run_returns_the_final_text_messages_and_summed_usage() -> None:
    provider = ScriptedProvider(
        [
            Reply.tool_calls(
                [ToolCall(id="c1", name="echo", arguments='{"text": "hi"}')],
                usage=Usage(input_tokens=100, output_tokens=5, cache_read_tokens=0),
            ),
            Reply.text(
                "All done.", usage=Usage(input_tokens=120, output_tokens=7, cache_read_tokens=64)
            ),
        ]
    )
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, tools=[ECHO], options=OPTIONS
    ) as agent:
        result = await agent.run("echo hi")
    assert isinstance(result, TurnResult)
    assert (result.turn, result.reason.kind, result.text) == (0, "completed", "All done.")
    assert [m.role for m in result.messages] == ["user", "assistant", "user", "assistant"]
    assert result.messages[0].text == "echo hi"
    assert result.usage == Usage(input_tokens=220, output_tokens=12, cache_read_tokens=64)


async def test_run_returns_a_max_tokens_turn() -> None:
    provider = ScriptedProvider([Reply.max_tokens("cut off here")])
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, options=OPTIONS
    ) as agent:
        result = await agent.run("write a lot")
    assert (result.reason.kind, result.text) == ("max-tokens", "cut off here")


async def test_run_raises_for_an_error_turn_naming_the_cause() -> None:
    provider = ScriptedProvider([Reply.failure("auth_failed", "invalid API key", status=401)])
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, options=OPTIONS
    ) as agent:
        with pytest.raises(
            TurnFailedError, match=r"turn 0 failed \(auth_failed\): invalid API key"
        ):
            await agent.run("hi")
        with pytest.raises(TurnFailedError) as raised:
            await agent.run("again")
    assert isinstance(raised.value, RuntimeError)
    assert raised.value.reason.kind == "error" and raised.value.turn == 1


async def test_run_raises_for_a_persona_with_an_unknown_variable() -> None:
    prompt = SystemPrompt(persona="You are {{unknown}}.")
    async with open_agent(
        system_prompt=prompt, provider=ScriptedProvider([Reply.text("x")]), options=OPTIONS
    ) as agent:
        with pytest.raises(TurnFailedError, match=r"\{\{unknown\}\}") as raised:
            await agent.run("hi")
    assert raised.value.reason.error is not None


async def test_run_raises_for_a_blocked_turn() -> None:
    async with open_agent(
        system_prompt=SystemPrompt(), provider=ScriptedProvider([]), options=OPTIONS
    ) as agent:
        agent.on_pre_step(refuse)
        with pytest.raises(TurnFailedError, match=r"was blocked") as raised:
            await agent.run("hi")
    assert raised.value.reason.kind == "blocked"


async def _run_cancelled(agent: Agent, text: str, *, match: str) -> TurnFailedError:
    """`agent.run(text)`, with `agent.cancel()` once every task is blocked; the run must
    raise `TurnFailedError` matching `match`, which is returned."""

    async def cancel_soon() -> None:
        await trio.testing.wait_all_tasks_blocked()
        agent.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_soon)
        with pytest.raises(TurnFailedError, match=match) as raised:
            await agent.run(text)
    return raised.value


async def test_run_raises_for_an_aborted_turn() -> None:
    async with open_agent(
        system_prompt=SystemPrompt(),
        provider=ScriptedProvider([Reply.hang("thinking")]),
        options=OPTIONS,
    ) as agent:
        failed = await _run_cancelled(agent, "hi", match=r"aborted \(by user\)")
    assert failed.reason.kind == "aborted"


async def test_run_waits_for_its_own_turn_not_an_earlier_one() -> None:
    provider = ScriptedProvider([Reply.text("first"), Reply.text("second")])
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, options=OPTIONS
    ) as agent:
        agent.followup("one")
        result = await agent.run("two")
    assert (result.turn, result.text) == (1, "second")


async def test_run_input_dropped_by_cancel_raises() -> None:
    async with open_agent(
        system_prompt=SystemPrompt(), provider=ScriptedProvider([Reply.text("a")]), options=OPTIONS
    ) as agent:
        agent.on_pre_step(held_until(trio.Event()))
        agent.followup("first")
        await trio.testing.wait_all_tasks_blocked()
        failed = await _run_cancelled(agent, "second", match=r"dropped before a turn took it")
    assert failed.turn is None


# -- submit() and its ticket ----------------------------------------------------------


async def test_a_ticket_settles_with_nobody_waiting_and_answers_every_waiter_alike() -> None:
    provider = ScriptedProvider([Reply.text("first"), Reply.text("second")])
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, options=OPTIONS
    ) as agent:
        agent.followup("one")
        ticket = agent.submit("two")
        assert not ticket.settled and ticket.turn is None
        with trio.move_on_after(0.001):  # a waiter that gives up loses nothing for others
            await ticket.outcome()
        await agent.when_idle()
        assert ticket.settled and ticket.turn == 1
        first, second = await ticket.outcome(), await ticket.outcome()
    assert first is second and (first.turn, first.text) == (1, "second")


async def test_a_ticket_of_a_refused_first_step_names_its_turn() -> None:
    async with open_agent(
        system_prompt=SystemPrompt(), provider=ScriptedProvider([]), options=OPTIONS
    ) as agent:
        agent.on_pre_step(refuse)
        ticket = agent.submit("hi")
        await agent.when_idle()
        assert ticket.settled and ticket.turn == 0
        with pytest.raises(TurnFailedError, match=r"was blocked"):
            await ticket.outcome()


async def test_a_ticket_of_a_first_step_that_failed_says_its_input_went_back_to_the_inbox() -> None:
    provider = ScriptedProvider([Reply.text("for hi"), Reply.text("for wake up")])
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, options=OPTIONS
    ) as agent:
        agent.on_pre_step(fail_first_step_once())
        ticket = agent.submit("hi")
        await agent.when_idle()
        assert ticket.settled and ticket.requeued and ticket.turn == 0
        with pytest.raises(TurnFailedError, match="not now"):
            await ticket.outcome()
        assert agent.inbox.parks_for_a_turn(ticket.message)  # parked, not lost
        result = await agent.run("wake up")  # the parked input runs first, in a turn of its own
    assert (result.turn, result.text) == (2, "for wake up")
    texts = [b.text for m in data_of(agent.session, "user/message") for b in m.content]
    assert texts == ["hi", "wake up"]


async def test_a_ticket_of_dropped_input_has_no_turn_and_one_of_a_closed_agent_raises() -> None:
    async with open_agent(
        system_prompt=SystemPrompt(), provider=ScriptedProvider([]), options=OPTIONS
    ) as agent:
        agent.on_pre_step(held_until(trio.Event()))
        agent.followup("first")
        await trio.testing.wait_all_tasks_blocked()
        dropped = agent.submit("second")
        agent.cancel()
        assert dropped.settled and dropped.turn is None
        with pytest.raises(TurnFailedError, match=r"dropped before a turn took it"):
            await dropped.outcome()
        agent.followup("again")  # input after the cancel wakes a turn, held like the first
        await trio.testing.wait_all_tasks_blocked()
        queued = agent.submit("third")
    assert queued.settled and queued.turn is None
    with pytest.raises(AgentClosedError, match=r"closed before its input got a turn"):
        await queued.outcome()


async def test_submit_raises_at_once_on_a_full_inbox_and_a_closed_agent() -> None:
    async with open_agent(
        system_prompt=SystemPrompt(), provider=ScriptedProvider([]), options=OPTIONS
    ) as agent:
        for index in range(INBOX_CAPACITY):
            agent.inject(f"input {index}")
        with pytest.raises(InboxFullError):
            agent.submit("one too many")
    with pytest.raises(AgentClosedError, match=r"is closed"):
        agent.submit("too late")


# -- max_steps -------------------------------------------------------------------------


async def test_max_steps_defaults_to_50() -> None:
    assert AgentOptions(model="m").max_steps == 50


async def test_max_steps_stops_a_tool_loop_at_exactly_that_many_steps() -> None:
    provider = ScriptedProvider(tool_loop(10))
    async with open_agent(
        system_prompt=SystemPrompt(),
        provider=provider,
        tools=[ECHO],
        options=AgentOptions(model="m", max_steps=3),
    ) as agent:
        with pytest.raises(TurnFailedError, match=r"max_steps") as raised:
            await agent.run("loop")
    assert len(provider.requests) == 3
    assert len(data_of(agent.session, "step/start")) == 3
    assert len(data_of(agent.session, "tool/result")) == 3  # the last step's tools still ran
    error = raised.value.reason.error
    assert error is not None and error.code == "max_steps"
    assert "max_steps is 3" in error.message


async def test_a_turn_that_needs_exactly_max_steps_completes() -> None:
    provider = ScriptedProvider([*tool_loop(2), Reply.text("done")])
    async with open_agent(
        system_prompt=SystemPrompt(),
        provider=provider,
        tools=[ECHO],
        options=AgentOptions(model="m", max_steps=3),
    ) as agent:
        result = await agent.run("loop")
    assert result.text == "done"


async def test_max_steps_none_means_no_limit() -> None:
    provider = ScriptedProvider([*tool_loop(60), Reply.text("done")])
    async with open_agent(
        system_prompt=SystemPrompt(),
        provider=provider,
        tools=[ECHO],
        options=AgentOptions(model="m", max_steps=None),
    ) as agent:
        result = await agent.run("loop")
    assert result.text == "done" and len(provider.requests) == 61


@pytest.mark.parametrize("bad", [0, -1, True, 2.5])
def test_max_steps_must_be_a_positive_int(bad: object) -> None:
    with pytest.raises(ValueError, match=r"max_steps must be a positive int or None"):
        AgentOptions(model="m", max_steps=bad)  # type: ignore[arg-type]


# -- closed agents ---------------------------------------------------------------------


async def closed_agent() -> object:
    async with open_agent(
        system_prompt=SystemPrompt(), provider=ScriptedProvider([]), options=OPTIONS
    ) as agent:
        pass
    return agent


@pytest.mark.parametrize("method", ["followup", "steer", "inject"])
async def test_input_after_close_raises_agent_closed_error(method: str) -> None:
    agent = await closed_agent()
    with pytest.raises(AgentClosedError, match=r"session '[0-9a-f]+' is closed"):
        getattr(agent, method)("too late")


async def test_run_after_close_raises_agent_closed_error() -> None:
    agent = await closed_agent()
    with pytest.raises(AgentClosedError, match=r"is closed"):
        await agent.run("too late")  # type: ignore[attr-defined]


async def test_run_waiting_when_the_agent_closes_raises() -> None:
    failures: list[BaseException] = []
    async with (
        trio.open_nursery() as nursery,
        open_agent(
            system_prompt=SystemPrompt(), provider=ScriptedProvider([]), options=OPTIONS
        ) as agent,
    ):
        agent.on_pre_step(held_until(trio.Event()))
        agent.followup("first")

        async def wait_run() -> None:
            try:
                await agent.run("queued")
            except (AgentClosedError, TurnFailedError) as exc:
                failures.append(exc)

        nursery.start_soon(wait_run)
        await trio.testing.wait_all_tasks_blocked()
    assert len(failures) == 1 and isinstance(failures[0], AgentClosedError)
    assert turn_end_kinds(agent.session) == ["aborted"]


# -- domain errors ---------------------------------------------------------------------


async def test_bad_store_path_raises_session_error_naming_the_path(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    path = blocker / "sessions.sqlite"
    with pytest.raises(SessionError, match=rf"SQLite store '{path}': cannot open the database"):
        async with open_agent(
            system_prompt=SystemPrompt(),
            provider=ScriptedProvider([]),
            store=SQLiteStore(path),
            options=OPTIONS,
        ):
            pytest.fail("the agent opened over an unusable store")


async def test_an_error_in_the_body_leaves_open_agent_unwrapped() -> None:
    prompt = SystemPrompt()
    with pytest.raises(PromptError, match=r"'dup'"):
        async with open_agent(system_prompt=prompt, provider=ScriptedProvider([]), options=OPTIONS):
            prompt.section(PromptSection(name="dup", order=1, text="a"))
            prompt.section(PromptSection(name="dup", order=1, text="b"))


async def test_run_raises_for_a_wrong_api_key_naming_the_status() -> None:
    engine = SimulatorEngine()
    async with httpx.AsyncClient(transport=simulator_transport(engine)) as client:
        provider = OpenAICompatProvider(client, base_url="http://sim", api_key="sk-wrong")
        async with open_agent(
            system_prompt=SystemPrompt(), provider=provider, options=OPTIONS
        ) as agent:
            with pytest.raises(TurnFailedError, match=r"turn 0 failed") as raised:
                await agent.run("hi")
    error = raised.value.reason.error
    assert error is not None and error.status == 401


async def test_run_raises_for_a_connect_error_naming_it() -> None:
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with httpx.AsyncClient(timeout=httpx.Timeout(5.0)) as client:
        provider = OpenAICompatProvider(client, base_url=f"http://127.0.0.1:{port}", api_key="sk-x")
        options = AgentOptions(model="m", retry=RetryPolicy(max_retries=0))
        async with open_agent(
            system_prompt=SystemPrompt(), provider=provider, options=options
        ) as agent:
            with pytest.raises(TurnFailedError, match=r"turn 0 failed \(connect_error\)") as raised:
                await agent.run("hi")
    assert raised.value.reason.kind == "error"
    assert f"http://127.0.0.1:{port}/chat/completions" in str(raised.value)  # names the provider
