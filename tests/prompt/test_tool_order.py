"""Tool order: validation at construction, canonical ordering at every assembly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.prompt import (
    TOOL_ORDER_REST,
    AssembleContext,
    PromptError,
    SystemPrompt,
    ToolProviderResult,
    ToolSchema,
)
from actors.prompt.tool_order import order_tools, parse_tool_order
from actors.scope import Scope

tool_names = st.text(min_size=1, max_size=6).filter(lambda name: name != TOOL_ORDER_REST)


def tool(name: str, description: str = "") -> ToolSchema:
    return ToolSchema(name=name, description=description, parameters={})


def providing(*names: str, known: list[str] | None = None) -> SystemPrompt:
    return providing_into(SystemPrompt(), *names, known=known)


def providing_into(
    prompt: SystemPrompt, *names: str, known: list[str] | None = None
) -> SystemPrompt:
    schemas = [tool(name) for name in names]
    prompt.tools(lambda ctx: ToolProviderResult(schemas=schemas, known_names=known))
    return prompt


async def tool_names_of(prompt: SystemPrompt, scope: Scope | None = None) -> list[str]:
    return [t.name for t in (await prompt.assemble(AssembleContext(scope=scope))).tools]


@pytest.mark.parametrize(
    "tool_order",
    [["read"], [TOOL_ORDER_REST, "read", TOOL_ORDER_REST], []],
    ids=["no-marker", "two-markers", "empty"],
)
def test_tool_order_without_exactly_one_rest_marker_fails_at_construction(
    tool_order: list[str],
) -> None:
    with pytest.raises(PromptError, match="exactly once"):
        SystemPrompt(tool_order=tool_order)


def test_tool_order_with_a_duplicate_fails_at_construction() -> None:
    with pytest.raises(PromptError, match="'read' more than once"):
        SystemPrompt(tool_order=["read", TOOL_ORDER_REST, "read"])


def test_tool_order_given_as_a_string_fails_at_construction() -> None:
    with pytest.raises(PromptError, match="not a string"):
        SystemPrompt(tool_order=TOOL_ORDER_REST)


async def test_without_tool_order_tools_sort_by_code_point() -> None:
    prompt = providing("b", "a", "B", "é", "_")

    assert await tool_names_of(prompt) == ["B", "_", "a", "b", "é"]


async def test_listed_tools_take_their_place_and_the_rest_sort_at_the_marker() -> None:
    prompt = providing_into(
        SystemPrompt(tool_order=["write", TOOL_ORDER_REST, "bash"]), "bash", "grep", "write", "a"
    )

    assert await tool_names_of(prompt) == ["write", "a", "grep", "bash"]


async def test_listed_name_unknown_to_every_provider_fails_each_assembly() -> None:
    prompt = providing_into(SystemPrompt(tool_order=["spawn", TOOL_ORDER_REST]), "read")

    for _ in range(2):
        with pytest.raises(PromptError, match="'spawn', which no tool provider knows; known: read"):
            await prompt.assemble()


async def test_listed_name_known_but_hidden_in_this_scope_is_absent() -> None:
    prompt = providing_into(
        SystemPrompt(tool_order=["write", TOOL_ORDER_REST]), "read", known=["read", "write"]
    )

    assert await tool_names_of(prompt) == ["read"]


async def test_provider_returning_the_rest_marker_fails_without_tool_order() -> None:
    prompt = providing(TOOL_ORDER_REST)

    for _ in range(2):
        with pytest.raises(PromptError, match="reserved tool name"):
            await prompt.assemble()


async def test_provider_returning_the_rest_marker_fails_with_tool_order() -> None:
    prompt = providing_into(SystemPrompt(tool_order=[TOOL_ORDER_REST]), TOOL_ORDER_REST)

    for _ in range(2):
        with pytest.raises(PromptError, match="reserved tool name"):
            await prompt.assemble()


async def test_provider_knowing_the_rest_marker_as_a_hidden_name_fails() -> None:
    prompt = providing("read", known=["read", TOOL_ORDER_REST])

    with pytest.raises(PromptError, match="reserved tool name"):
        await prompt.assemble()


async def test_equal_names_are_kept_in_collection_order() -> None:
    prompt = SystemPrompt()
    prompt.tools(lambda ctx: ToolProviderResult(schemas=[tool("x", "first")]))
    prompt.tools(lambda ctx: ToolProviderResult(schemas=[tool("x", "second")]))

    assembly = await prompt.assemble()

    assert [t.description for t in assembly.tools] == ["first", "second"]


@given(names=st.lists(tool_names, max_size=12))
def test_default_order_is_the_sorted_permutation(names: list[str]) -> None:
    ordered = order_tools([tool(name) for name in names], order=None)

    assert [t.name for t in ordered] == sorted(names)


@given(
    data=st.data(),
    visible=st.lists(tool_names, max_size=12, unique=True),
    hidden=st.lists(tool_names, max_size=4, unique=True),
)
def test_configured_order_places_listed_then_rest_sorted_at_the_marker(
    data: st.DataObject, visible: list[str], hidden: list[str]
) -> None:
    known = set(visible) | set(hidden)
    listed = data.draw(
        st.lists(st.sampled_from(sorted(known)), unique=True) if known else st.just([])
    )
    marker_at = data.draw(st.integers(min_value=0, max_value=len(listed)))
    configured = [*listed[:marker_at], TOOL_ORDER_REST, *listed[marker_at:]]
    shuffled = data.draw(st.permutations(visible))

    ordered = [
        t.name
        for t in order_tools(
            [tool(name) for name in shuffled], order=parse_tool_order(configured), known_names=known
        )
    ]

    rest = sorted(name for name in visible if name not in listed)
    expected = (
        [name for name in listed[:marker_at] if name in visible]
        + rest
        + [name for name in listed[marker_at:] if name in visible]
    )
    assert ordered == expected


@given(
    listed=st.lists(tool_names, min_size=1, max_size=4, unique=True),
    known=st.sets(tool_names, max_size=6),
)
def test_configured_order_fails_iff_a_listed_name_is_unknown(
    listed: list[str], known: set[str]
) -> None:
    order = parse_tool_order([*listed, TOOL_ORDER_REST])
    if set(listed) <= known:
        assert order_tools([], order=order, known_names=known) == []
    else:
        with pytest.raises(PromptError, match="no tool provider knows"):
            order_tools([], order=order, known_names=known)


@given(entries=st.lists(tool_names, max_size=6))
def test_parse_rejects_exactly_the_invalid_configurations(entries: list[str]) -> None:
    configured = [*entries, TOOL_ORDER_REST]
    if len(set(entries)) == len(entries):
        assert parse_tool_order(configured).listed == tuple(entries)
    else:
        with pytest.raises(PromptError, match="more than once"):
            parse_tool_order(configured)


async def test_provider_returning_a_new_result_is_checked_again() -> None:
    prompt = SystemPrompt(tool_order=["read", TOOL_ORDER_REST])
    results = iter(
        [
            ToolProviderResult(schemas=[tool("read")]),
            ToolProviderResult(schemas=[tool("write")]),
        ]
    )
    prompt.tools(lambda ctx: next(results))
    await prompt.assemble()

    with pytest.raises(PromptError, match="'read', which no tool provider knows"):
        await prompt.assemble()
