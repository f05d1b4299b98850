"""One failing tool or child is contained: `SystemExit` and friends never take down siblings."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio
import trio.testing

from actors.agent import AgentOptions, Tool, ToolRegistry
from actors.prompt import SystemPrompt
from actors.providers.openai_compat import OpenAICompatProvider
from actors.providers.simulator import SimulatorEngine, simulator_transport
from actors.session.events import ToolCallRequested, ToolResult, TurnEnd
from supervision import ChildSpec, ChildStartError, Supervisor, open_runtime
from tests.supervision.helpers import serving, worker


def _call(name: str) -> ToolCallRequested:
    return ToolCallRequested(turn=0, step=0, call_id="c1", name=name, arguments="{}")


def _tool(name: str, execute: Any) -> Tool:
    return Tool(name=name, description="d", parameters={"type": "object"}, execute=execute)


async def test_system_exit_from_a_tool_becomes_an_error_result_naming_it() -> None:
    async def leave(arguments: object, call: object) -> str:
        raise SystemExit(2)

    result = await ToolRegistry.of([_tool("cli", leave)]).run(_call("cli"))
    assert result.is_error is True
    assert result.error is not None and result.error.name == "SystemExit"
    assert result.content == "SystemExit: 2"


async def test_a_base_exception_from_a_tool_becomes_an_error_result() -> None:
    class Odd(BaseException):
        pass

    async def odd(arguments: object, call: object) -> str:
        raise Odd

    result = await ToolRegistry.of([_tool("odd", odd)]).run(_call("odd"))
    assert result.is_error is True and result.content == "Odd"


async def test_keyboard_interrupt_from_a_tool_propagates() -> None:
    async def interrupt(arguments: object, call: object) -> str:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        await ToolRegistry.of([_tool("ki", interrupt)]).run(_call("ki"))


async def test_cancelling_a_tool_propagates_cancelled() -> None:
    async def sleepy(arguments: object, call: object) -> str:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    registry = ToolRegistry.of([_tool("sleepy", sleepy)])
    with trio.move_on_after(0.01) as scope:
        await registry.run(_call("sleepy"))
    assert scope.cancelled_caught


async def test_a_group_of_cancelled_and_system_exit_propagates_as_cancellation() -> None:
    """A tool whose own nursery is cancelled while one of its children raises SystemExit."""

    async def exits() -> None:
        try:
            await trio.sleep_forever()
        finally:
            raise SystemExit(3)

    async def fan_out(arguments: object, call: object) -> str:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(exits)
            nursery.start_soon(trio.sleep_forever)
        return "unreachable"

    registry = ToolRegistry.of([_tool("fan", fan_out)])
    with trio.move_on_after(0.01) as scope:
        await registry.run(_call("fan"))
    assert scope.cancelled_caught  # the SystemExit did not escape the cancel scope


async def test_supervisor_records_a_child_system_exit_as_a_crash_and_keeps_its_sibling(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[str] = []

    async def leaves(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep(1)
        raise SystemExit(2)

    async with serving(Supervisor(name="s")) as supervisor:
        sibling = await supervisor.start_child(ChildSpec(id="b", start=worker("b", log)))
        child = await supervisor.start_child(ChildSpec(id="a", start=leaves, restart="temporary"))
        exit = await child.wait_stopped()
        assert exit.reason == "crashed"
        assert isinstance(exit.error, SystemExit) and exit.error.code == 2
        assert sibling.state == "running" and sibling.restarts == 0
        assert supervisor.statistics().crashes == 1


async def test_supervisor_records_a_start_raising_system_exit_as_a_start_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def refuses(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        raise SystemExit(2)

    async with serving(Supervisor(name="s")) as supervisor:
        with pytest.raises(ChildStartError, match="SystemExit") as caught:
            await supervisor.start_child(ChildSpec(id="a", start=refuses))
        assert isinstance(caught.value.__cause__, SystemExit)
        assert supervisor.running


async def test_system_exit_in_one_tool_leaves_five_busy_siblings_and_the_agent_serving(
    autojump_clock: trio.testing.MockClock,
) -> None:
    busy_started = trio.Semaphore(0)

    async def leave(arguments: dict[str, Any] | str, call: object) -> str:
        for _ in range(5):  # every sibling is inside its own tool call
            await busy_started.acquire()
        raise SystemExit(2)

    async def busy(arguments: dict[str, Any] | str, call: object) -> str:
        busy_started.release()
        await trio.sleep(5)
        return "busy work done"

    tools = [_tool("leave", leave), _tool("busy", busy)]
    engine = SimulatorEngine()
    client = httpx.AsyncClient(transport=simulator_transport(engine))
    provider = OpenAICompatProvider(
        client, base_url="http://simulator.test", api_key=engine.config.api_key
    )
    async with (
        client,
        open_runtime(
            system_prompt=SystemPrompt(), providers={"default": provider}, strategy="one_for_one"
        ) as runtime,
    ):
        options = AgentOptions(model="deepseek-chat")
        leaver = await runtime.start_agent(options=options, tools=tools)
        siblings = [await runtime.start_agent(options=options, tools=tools) for _ in range(5)]
        for child in siblings:
            child.value.followup("work\ncall busy {}")
        leaver.value.followup("exit now\ncall leave {}")
        with trio.fail_after(60):
            for child in [leaver, *siblings]:
                await child.value.when_idle()
            leaver.value.followup("are you still there?")
            await leaver.value.when_idle()
        assert leaver.restarts == 0 and all(child.restarts == 0 for child in siblings)
        assert runtime.supervisor.statistics().crashes == 0
        for child in siblings:
            events = [event.data for event in child.value.session.events]
            results = [data for data in events if isinstance(data, ToolResult)]
            assert [(r.is_error, r.content) for r in results] == [(False, "busy work done")]
            assert [d.reason.kind for d in events if isinstance(d, TurnEnd)] == ["completed"]
        events = [event.data for event in leaver.value.session.events]
        results = [data for data in events if isinstance(data, ToolResult)]
        assert len(results) == 1 and results[0].is_error
        assert results[0].error is not None and results[0].error.name == "SystemExit"
        ends = [data.reason.kind for data in events if isinstance(data, TurnEnd)]
        assert ends == ["completed", "completed"]
