"""`function_tool`: schemas from type hints and docstrings, calls with converted arguments."""

from __future__ import annotations

import threading
from typing import Any, Literal, NotRequired, TypedDict

import attrs
import pytest
import trio

from actors.agent import AgentOptions, Tool, function_tool, open_agent
from actors.jsonvalue import thaw_json
from actors.prompt import SystemPrompt
from actors.providers import Reply, ScriptedProvider, ToolCall
from actors.session.events import ToolCallRequested
from tests.agent.helpers import data_of


def _noop() -> None:
    return None


def schema_of(fn: Any) -> dict[str, Any]:
    """The `properties` entry of the only parameter of `fn`."""
    tool = function_tool(fn)
    (prop,) = tool.parameters["properties"].values()
    return dict(thaw_json(prop))


async def run_calls(tool: Tool, *arguments: str) -> list[Any]:
    """Run `tool` once per raw arguments string through an agent; the tool results."""
    calls = [ToolCall(id=str(i), name=tool.name, arguments=a) for i, a in enumerate(arguments)]
    provider = ScriptedProvider([Reply.tool_calls(calls), Reply.text("done")])
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, tools=[tool], options=AgentOptions("m")
    ) as agent:
        agent.followup("go")
        with trio.fail_after(5):
            await agent.when_idle()
    return data_of(agent.session, "tool/result")


# -- schema per annotation ---------------------------------------------------


def test_str_becomes_a_string_schema() -> None:
    def f(x: str) -> str:
        return x

    assert schema_of(f) == {"type": "string"}


def test_int_becomes_an_integer_schema() -> None:
    def f(x: int) -> str:
        return ""

    assert schema_of(f) == {"type": "integer"}


def test_float_becomes_a_number_schema() -> None:
    def f(x: float) -> str:
        return ""

    assert schema_of(f) == {"type": "number"}


def test_bool_becomes_a_boolean_schema() -> None:
    def f(x: bool) -> str:
        return ""

    assert schema_of(f) == {"type": "boolean"}


def test_none_becomes_a_null_schema() -> None:
    def f(x: None) -> str:
        return ""

    assert schema_of(f) == {"type": "null"}


def test_list_becomes_an_array_of_its_item_schema() -> None:
    def f(x: list[int]) -> str:
        return ""

    assert schema_of(f) == {"type": "array", "items": {"type": "integer"}}


def test_dict_of_str_becomes_an_object_with_typed_values() -> None:
    def f(x: dict[str, float]) -> str:
        return ""

    assert schema_of(f) == {"type": "object", "additionalProperties": {"type": "number"}}


def test_literal_becomes_an_enum() -> None:
    def f(x: Literal["fast", "slow"]) -> str:
        return ""

    assert schema_of(f) == {"type": "string", "enum": ["fast", "slow"]}


def test_mixed_number_literal_refuses_booleans() -> None:
    def f(x: Literal[1, 2.5]) -> str:
        return ""

    assert schema_of(f) == {"type": "number", "enum": [1, 2.5]}


def test_optional_becomes_any_of_the_type_and_null() -> None:
    def f(x: int | None) -> str:
        return ""

    assert schema_of(f) == {"anyOf": [{"type": "integer"}, {"type": "null"}]}


def test_parameter_with_a_default_is_not_required_and_shows_the_default() -> None:
    def f(path: str, limit: int = 10) -> str:
        return ""

    tool = function_tool(f)
    assert tool.parameters["required"] == ("path",)
    assert tool.parameters["properties"]["limit"] == {"type": "integer", "default": 10}
    assert tool.parameters["additionalProperties"] is False


def test_function_without_parameters_has_an_empty_object_schema() -> None:
    tool = function_tool(_noop)
    assert tool.parameters == {"type": "object", "properties": {}, "additionalProperties": False}


@attrs.frozen
class Point:
    """A point on the page.

    Attributes:
        x: Distance from the left edge.
        y: Distance from the top edge.
    """

    x: float
    y: float = 0.0


def test_attrs_class_becomes_a_nested_object_with_field_descriptions() -> None:
    def f(at: Point) -> str:
        return ""

    assert schema_of(f) == {
        "type": "object",
        "description": "A point on the page.",
        "properties": {
            "x": {"type": "number", "description": "Distance from the left edge."},
            "y": {"type": "number", "description": "Distance from the top edge.", "default": 0.0},
        },
        "required": ["x"],
        "additionalProperties": False,
    }


class Filter(TypedDict):
    field: str
    values: list[str]
    negate: NotRequired[bool]


def test_typeddict_becomes_a_nested_object_with_its_required_keys() -> None:
    def f(where: Filter) -> str:
        return ""

    assert schema_of(f) == {
        "type": "object",
        "properties": {
            "field": {"type": "string"},
            "values": {"type": "array", "items": {"type": "string"}},
            "negate": {"type": "boolean"},
        },
        "required": ["field", "values"],
        "additionalProperties": False,
    }


def test_call_parameter_is_not_in_the_schema() -> None:
    def f(path: str, call: ToolCallRequested) -> str:
        return ""

    assert list(function_tool(f).parameters["properties"]) == ["path"]


# -- docstrings ----------------------------------------------------------------


def test_first_paragraph_of_the_docstring_is_the_description() -> None:
    def search(query: str) -> str:
        """Search the notes for a phrase
        and return matching lines.

        Matching ignores case.

        Args:
            query: The phrase to look for.
        """
        return ""

    tool = function_tool(search)
    assert tool.description == "Search the notes for a phrase and return matching lines."


def test_args_section_describes_each_parameter() -> None:
    def search(query: str, limit: int = 5) -> str:
        """Search.

        Args:
            query: The phrase to look for,
                across several lines.
            limit: At most this many lines.
        """
        return ""

    props = function_tool(search).parameters["properties"]
    assert props["query"]["description"] == "The phrase to look for, across several lines."
    assert props["limit"]["description"] == "At most this many lines."


def test_name_and_description_arguments_override_the_function() -> None:
    def f(x: int) -> str:
        """Ignored."""
        return ""

    tool = function_tool(f, name="lookup", description="Look a number up.")
    assert (tool.name, tool.description) == ("lookup", "Look a number up.")


def test_decorator_with_arguments_makes_a_tool() -> None:
    @function_tool(name="shout")
    async def f(text: str) -> str:
        """Upper-case the text."""
        return text.upper()

    assert isinstance(f, Tool)
    assert (f.name, f.description) == ("shout", "Upper-case the text.")


def test_docstring_naming_an_unknown_parameter_fails_at_creation() -> None:
    def f(query: str) -> str:
        """Search.

        Args:
            qeury: Misspelt.
        """
        return ""

    with pytest.raises(TypeError, match=r"'f'.*Args name 'qeury', which is not a parameter"):
        function_tool(f)


# -- unsupported annotations fail at creation ---------------------------------------


@pytest.mark.parametrize(
    ("annotation", "shown"),
    [
        (bytes, "bytes"),
        (list, "list"),
        (dict[int, str], "dict"),
        (tuple[int, int], "tuple"),
        (int | str, "int | str"),
        (set[str], "set"),
        (Any, "Any"),
    ],
)
def test_unsupported_annotation_fails_naming_function_and_parameter(
    annotation: Any, shown: str
) -> None:
    def lookup(key: str, bad: int) -> str:
        return ""

    lookup.__annotations__["bad"] = annotation
    with pytest.raises(TypeError, match=rf"'lookup'.*parameter 'bad'.*unsupported.*{shown}"):
        function_tool(lookup)


@attrs.frozen
class Job:
    payload: bytes


@attrs.frozen
class Node:
    children: list[Node]


def test_unsupported_annotation_inside_a_nested_class_names_the_parameter() -> None:
    def submit(job: Job) -> str:
        return ""

    with pytest.raises(TypeError, match=r"'submit'.*parameter 'job'.*bytes.*inside"):
        function_tool(submit)


def test_missing_annotation_fails_naming_the_parameter() -> None:
    def f(x):  # type: ignore[no-untyped-def]
        return ""

    with pytest.raises(TypeError, match=r"'f'.*parameter 'x' has no type annotation"):
        function_tool(f)


def test_variadic_parameters_fail_at_creation() -> None:
    def f(*names: str) -> str:
        return ""

    with pytest.raises(TypeError, match=r"'f'.*parameter 'names' is variadic positional"):
        function_tool(f)


def test_recursive_class_fails_at_creation() -> None:
    def walk(tree: Node) -> str:
        return ""

    with pytest.raises(TypeError, match=r"'walk'.*parameter 'tree'.*recursive"):
        function_tool(walk)


# -- calls ------------------------------------------------------------------------


async def test_function_receives_keyword_arguments_with_nested_objects_converted() -> None:
    seen: list[Any] = []

    @function_tool
    async def place(at: Point, where: Filter, tags: list[str] | None = None) -> str:
        seen.extend([at, where, tags])
        return "placed"

    (result,) = await run_calls(
        place, '{"at": {"x": 1, "y": 2.5}, "where": {"field": "f", "values": ["a"]}}'
    )
    assert result.content == "placed" and not result.is_error
    assert seen == [Point(x=1.0, y=2.5), {"field": "f", "values": ["a"]}, None]
    assert isinstance(seen[0], Point)


async def test_call_parameter_receives_the_tool_call_event() -> None:
    seen: list[ToolCallRequested] = []

    @function_tool
    async def where_am_i(call: ToolCallRequested) -> str:
        seen.append(call)
        return call.call_id

    (result,) = await run_calls(where_am_i, "{}")
    assert result.content == "0"
    assert seen[0].name == "where_am_i" and seen[0].turn == 0


async def test_sync_function_runs_in_a_worker_thread() -> None:
    threads: list[int] = []

    @function_tool
    def add(a: int, b: int) -> int:
        threads.append(threading.get_ident())
        return a + b

    (result,) = await run_calls(add, '{"a": 2, "b": 3}')
    assert result.content == "5"
    assert threads and threads[0] != threading.get_ident()


async def test_non_string_results_are_sent_as_json() -> None:
    @function_tool
    async def locate() -> Point:
        return Point(x=1.0, y=2.0)

    (result,) = await run_calls(locate, "")
    assert result.content == '{"x": 1.0, "y": 2.0}'


async def test_raising_function_gives_an_error_result_with_its_message() -> None:
    @function_tool
    async def fail(path: str) -> str:
        raise FileNotFoundError(f"no such file: {path}")

    (result,) = await run_calls(fail, '{"path": "a.txt"}')
    assert result.is_error and result.content == "no such file: a.txt"
    assert result.error.name == "FileNotFoundError"
