"""Every tool's arguments are validated against its schema before `execute` runs."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from actors.agent import AgentOptions, Tool, ToolSchemaError, open_agent
from actors.prompt import SystemPrompt
from actors.providers import Reply, ScriptedProvider, ToolCall
from tests.agent.helpers import data_of, turn_end_kinds

SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "limit": {"type": "integer"},
        "mode": {"enum": ["fast", "slow"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "window": {
            "type": "object",
            "properties": {"start": {"type": "integer"}},
            "required": ["start"],
            "additionalProperties": False,
        },
    },
    "required": ["path"],
    "additionalProperties": False,
}


async def call_with(arguments: str) -> tuple[Any, list[Any]]:
    """One call of a tool with `SCHEMA`; its result and what `execute` received."""
    executed: list[Any] = []

    async def execute(args: dict[str, Any] | str, call: object) -> str:
        executed.append(args)
        return "ran"

    tool = Tool("read", "Read a file.", SCHEMA, execute)
    provider = ScriptedProvider(
        [Reply.tool_calls([ToolCall(id="1", name="read", arguments=arguments)]), Reply.text("ok")]
    )
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, tools=[tool], options=AgentOptions("m")
    ) as agent:
        agent.followup("go")
        with trio.fail_after(5):
            await agent.when_idle()
    assert turn_end_kinds(agent.session) == ["completed"]
    (result,) = data_of(agent.session, "tool/result")
    return result, executed


async def test_valid_arguments_reach_execute_as_a_dict() -> None:
    result, executed = await call_with('{"path": "a.txt", "limit": 3, "window": {"start": 1}}')
    assert (result.content, result.is_error) == ("ran", False)
    assert executed == [{"path": "a.txt", "limit": 3, "window": {"start": 1}}]


async def test_arguments_that_are_not_json_are_refused() -> None:
    result, executed = await call_with("{not json")
    assert executed == []
    assert result.is_error
    assert (result.error.name, result.error.code) == ("InvalidArguments", "invalid_arguments")
    assert "not valid JSON" in result.content and "'read'" in result.content


async def test_arguments_that_are_not_an_object_are_refused() -> None:
    result, executed = await call_with('["a.txt"]')
    assert executed == []
    assert result.error.code == "invalid_arguments"
    assert "expected a JSON object" in result.content and 'array ["a.txt"]' in result.content


async def test_missing_required_parameter_is_named() -> None:
    result, executed = await call_with('{"limit": 3}')
    assert executed == []
    assert result.content == "invalid arguments for tool 'read': missing required parameter 'path'"


async def test_wrong_type_names_the_parameter_and_the_expected_type() -> None:
    result, executed = await call_with('{"path": "a", "limit": "3"}')
    assert executed == []
    assert result.content == (
        "invalid arguments for tool 'read': parameter 'limit' must be an integer, got string \"3\""
    )


async def test_enum_miss_lists_the_accepted_values() -> None:
    result, _ = await call_with('{"path": "a", "mode": "medium"}')
    assert result.content.endswith(
        'parameter \'mode\' must be one of "fast", "slow", got string "medium"'
    )


async def test_nested_errors_name_the_path_inside_the_arguments() -> None:
    result, _ = await call_with('{"path": "a", "window": {"start": true}}')
    assert "parameter 'window.start' must be an integer, got boolean true" in result.content


async def test_wrong_array_item_names_its_index() -> None:
    result, _ = await call_with('{"path": "a", "tags": ["x", 2]}')
    assert "parameter 'tags.1' must be a string, got integer 2" in result.content


async def test_missing_nested_property_names_its_object() -> None:
    result, _ = await call_with('{"path": "a", "window": {}}')
    assert "missing required parameter 'start' of parameter 'window'" in result.content


async def test_unexpected_parameter_is_named_with_the_accepted_ones() -> None:
    result, _ = await call_with('{"path": "a", "force": true}')
    assert "unexpected parameter 'force'; accepted: 'path', 'limit', 'mode'" in result.content


async def test_empty_arguments_count_as_an_empty_object() -> None:
    result, executed = await call_with("")
    assert executed == []
    assert "missing required parameter 'path'" in result.content


def test_malformed_schema_fails_when_the_tool_is_made() -> None:
    async def execute(args: dict[str, Any] | str, call: object) -> str:
        return ""

    with pytest.raises(ToolSchemaError, match=r"tool 'bad': parameters are not a valid JSON"):
        Tool("bad", "d", {"type": "bogus"}, execute)


async def test_schema_defaults_are_not_inserted_into_the_arguments() -> None:
    executed: list[Any] = []

    async def execute(args: dict[str, Any] | str, call: object) -> str:
        executed.append(args)
        return "ran"

    schema = {"type": "object", "properties": {"limit": {"type": "integer", "default": 10}}}
    tool = Tool("count", "Count.", schema, execute)
    provider = ScriptedProvider(
        [Reply.tool_calls([ToolCall(id="1", name="count")]), Reply.text("")]
    )
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, tools=[tool], options=AgentOptions("m")
    ) as agent:
        agent.followup("go")
        await agent.when_idle()
    assert executed == [{}]
