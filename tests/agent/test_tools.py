"""Tool execution: concurrent within a step, failures become error results."""

from __future__ import annotations

import pytest
import trio

from actors.agent import Tool, ToolRegistry, open_agent
from actors.agent.tools import ToolRegistryError
from actors.prompt import PromptError, SystemPrompt
from actors.providers import Reply, ScriptedProvider, ToolCall
from actors.session.events import ToolCallRequested
from tests.agent.helpers import data_of, turn_end_kinds, types


async def test_tool_calls_of_one_step_run_concurrently() -> None:
    a_started, b_started = trio.Event(), trio.Event()

    async def a(arguments: dict[str, object] | str, call: object) -> str:
        a_started.set()
        await b_started.wait()
        return "a"

    async def b(arguments: dict[str, object] | str, call: object) -> str:
        b_started.set()
        await a_started.wait()
        return "b"

    tools = [
        Tool(name="a", description="d", parameters={"type": "object"}, execute=a),
        Tool(name="b", description="d", parameters={"type": "object"}, execute=b),
    ]
    provider = ScriptedProvider(
        [
            Reply.tool_calls([ToolCall(id="1", name="a"), ToolCall(id="2", name="b")]),
            Reply.text("done"),
        ]
    )
    async with open_agent(system_prompt=SystemPrompt(), provider=provider, tools=tools) as agent:
        agent.followup("go")
        with trio.fail_after(5):
            await agent.when_idle()
    results = data_of(agent.session, "tool/result")
    assert [(r.call_id, r.content) for r in results] == [("1", "a"), ("2", "b")]


async def test_raising_tool_yields_an_error_result_and_the_turn_goes_on() -> None:
    async def explode(arguments: dict[str, object] | str, call: object) -> str:
        raise LookupError("no such file: a.txt")

    tool = Tool(name="read", description="d", parameters={"type": "object"}, execute=explode)
    provider = ScriptedProvider(
        [Reply.tool_calls([ToolCall(id="1", name="read")]), Reply.text("sorry")]
    )
    async with open_agent(system_prompt=SystemPrompt(), provider=provider, tools=[tool]) as agent:
        agent.followup("go")
        await agent.when_idle()
    result = data_of(agent.session, "tool/result")[0]
    assert result.is_error is True
    assert result.content == "no such file: a.txt"
    assert result.error.name == "LookupError"
    assert turn_end_kinds(agent.session) == ["completed"]
    assert provider.requests[1].messages[-1].is_error is True


async def test_unknown_tool_yields_an_error_result_naming_the_tool() -> None:
    provider = ScriptedProvider(
        [Reply.tool_calls([ToolCall(id="1", name="nope")]), Reply.text("ok")]
    )
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("go")
        await agent.when_idle()
    result = data_of(agent.session, "tool/result")[0]
    assert result.is_error and "'nope'" in result.content


async def test_tool_receives_parsed_arguments_and_never_the_raw_string() -> None:
    seen: dict[str, object] = {}

    async def record(arguments: dict[str, object] | str, call: ToolCallRequested) -> str:
        seen[call.call_id] = arguments
        return "ok"

    tool = Tool(name="t", description="d", parameters={"type": "object"}, execute=record)
    provider = ScriptedProvider(
        [
            Reply.tool_calls(
                [
                    ToolCall(id="1", name="t", arguments='{"x": 1}'),
                    ToolCall(id="2", name="t", arguments="not json"),
                ]
            ),
            Reply.text("ok"),
        ]
    )
    async with open_agent(system_prompt=SystemPrompt(), provider=provider, tools=[tool]) as agent:
        agent.followup("go")
        await agent.when_idle()
    assert seen == {"1": {"x": 1}}  # "not json" got an InvalidArguments result instead
    assert [c.arguments for c in data_of(agent.session, "tool/call")] == ['{"x": 1}', "not json"]


async def test_tool_schemas_reach_the_request_in_code_point_order() -> None:
    async def noop(arguments: dict[str, object] | str, call: object) -> str:
        return ""

    tools = [
        Tool(name=name, description=name, parameters={"type": "object"}, execute=noop)
        for name in ("zeta", "Alpha", "beta")
    ]
    provider = ScriptedProvider([Reply.text("ok")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider, tools=tools) as agent:
        agent.followup("go")
        await agent.when_idle()
    assert [t.name for t in provider.requests[0].tools] == ["Alpha", "beta", "zeta"]


async def test_cancelled_tool_calls_still_get_error_results() -> None:
    async def forever(arguments: dict[str, object] | str, call: object) -> str:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    tool = Tool(name="wait", description="d", parameters={"type": "object"}, execute=forever)
    provider = ScriptedProvider([Reply.tool_calls([ToolCall(id="1", name="wait")])])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider, tools=[tool]) as agent:
        agent.followup("go")
        await trio.testing.wait_all_tasks_blocked()
        agent.cancel()
        await agent.when_idle()
    result = data_of(agent.session, "tool/result")[0]
    assert (result.call_id, result.is_error, result.error.code) == ("1", True, "cancelled")
    assert turn_end_kinds(agent.session) == ["aborted"]


def test_duplicate_tool_names_are_refused() -> None:
    async def noop(arguments: dict[str, object] | str, call: object) -> str:
        return ""

    tool = Tool(name="t", description="d", parameters={}, execute=noop)
    with pytest.raises(ToolRegistryError, match="'t'"):
        ToolRegistry.of([tool, tool])


async def test_tool_results_are_logged_in_call_order_when_calls_finish_out_of_order() -> None:
    first_may_finish = trio.Event()

    async def slow(arguments: dict[str, object] | str, call: object) -> str:
        await first_may_finish.wait()
        return "slow"

    async def fast(arguments: dict[str, object] | str, call: object) -> str:
        first_may_finish.set()
        return "fast"

    tools = [
        Tool(name="slow", description="d", parameters={}, execute=slow),
        Tool(name="fast", description="d", parameters={}, execute=fast),
    ]
    provider = ScriptedProvider(
        [
            Reply.tool_calls([ToolCall(id="1", name="slow"), ToolCall(id="2", name="fast")]),
            Reply.text("done"),
        ]
    )
    async with open_agent(system_prompt=SystemPrompt(), provider=provider, tools=tools) as agent:
        agent.followup("go")
        with trio.fail_after(5):
            await agent.when_idle()
    results = data_of(agent.session, "tool/result")
    assert [(r.call_id, r.content) for r in results] == [("1", "slow"), ("2", "fast")]
    assert [m.text for m in provider.requests[1].messages][-2:] == ["slow", "fast"]


async def test_every_tool_call_is_logged_before_any_tool_result() -> None:
    async def noop(arguments: dict[str, object] | str, call: object) -> str:
        return "ok"

    tool = Tool(name="t", description="d", parameters={}, execute=noop)
    provider = ScriptedProvider(
        [
            Reply.tool_calls([ToolCall(id="1", name="t"), ToolCall(id="2", name="t")]),
            Reply.text("done"),
        ]
    )
    async with open_agent(system_prompt=SystemPrompt(), provider=provider, tools=[tool]) as agent:
        agent.followup("go")
        await agent.when_idle()
    first_step = types(agent.session)[: types(agent.session).index("step/end") + 1]
    assert first_step[-6:] == [
        "assistant/message",
        "tool/call",
        "tool/call",
        "tool/result",
        "tool/result",
        "step/end",
    ]


async def test_one_failing_tool_does_not_affect_its_siblings() -> None:
    async def explode(arguments: dict[str, object] | str, call: object) -> str:
        raise ValueError("bad input")

    async def fine(arguments: dict[str, object] | str, call: object) -> str:
        await trio.lowlevel.checkpoint()
        return "fine"

    tools = [
        Tool(name="explode", description="d", parameters={}, execute=explode),
        Tool(name="fine", description="d", parameters={}, execute=fine),
    ]
    provider = ScriptedProvider(
        [
            Reply.tool_calls([ToolCall(id="1", name="explode"), ToolCall(id="2", name="fine")]),
            Reply.text("done"),
        ]
    )
    async with open_agent(system_prompt=SystemPrompt(), provider=provider, tools=tools) as agent:
        agent.followup("go")
        await agent.when_idle()
    results = data_of(agent.session, "tool/result")
    assert [(r.content, r.is_error) for r in results] == [("bad input", True), ("fine", False)]
    assert turn_end_kinds(agent.session) == ["completed"]


def test_tool_parameters_are_a_detached_snapshot_shared_with_its_schema() -> None:
    async def noop(arguments: dict[str, object] | str, call: object) -> str:
        return ""

    parameters: dict[str, object] = {"type": "object", "required": ["path"]}
    tool = Tool(name="read", description="d", parameters=parameters, execute=noop)
    parameters["required"] = ["changed"]
    assert tool.parameters == {"type": "object", "required": ("path",)}
    assert tool.parameters is tool.schema.parameters
    with pytest.raises(TypeError):
        tool.parameters["type"] = "array"  # type: ignore[index]


def test_tool_with_non_json_parameters_raises_naming_the_tool() -> None:
    async def noop(arguments: dict[str, object] | str, call: object) -> str:
        return ""

    with pytest.raises(PromptError, match="tool 'read'"):
        Tool(name="read", description="d", parameters={"default": object()}, execute=noop)


def test_registries_of_the_same_tools_share_one_result_until_one_changes() -> None:
    async def noop(arguments: dict[str, object] | str, call: object) -> str:
        return "ok"

    tools = [
        Tool(name=name, description=name, parameters={"type": "object"}, execute=noop)
        for name in ("a", "b")
    ]
    first, second = ToolRegistry.of(tools), ToolRegistry.of(tools)
    ctx = None  # the provider does not look at the context
    shared = first.provider(ctx)  # type: ignore[arg-type]
    assert second.provider(ctx) is shared  # type: ignore[arg-type]
    assert first.provider(ctx) is shared  # the same object every assembly: validated once  # type: ignore[arg-type]
    extra = Tool(name="c", description="c", parameters={"type": "object"}, execute=noop)
    first.add(extra)
    second.remove("a")
    assert [s.name for s in first.provider(ctx).schemas] == ["a", "b", "c"]  # type: ignore[arg-type]
    assert [s.name for s in second.provider(ctx).schemas] == ["b"]  # type: ignore[arg-type]
    assert ToolRegistry.of(tools).names() == ["a", "b"]  # the shared table is unchanged
    assert first.names() == ["a", "b", "c"] and second.names() == ["b"]
