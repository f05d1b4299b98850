"""The simulator's memo of tools lists renders and validates each list as the uncached path."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.providers.simulator.rejection import Rejection
from actors.providers.simulator.tokens import tools_text
from actors.providers.simulator.tool_lists import ToolLists
from actors.providers.simulator.validation import _check_tools


def _unchecked(tools: list[Any]) -> None:
    """A check every list passes."""


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=8,
)


@given(lists=st.lists(st.lists(JSON, min_size=1, max_size=3), max_size=6))
def test_every_list_gets_the_header_the_uncached_render_gives(
    lists: list[list[object]],
) -> None:
    memo = ToolLists(max_lists=3)
    for tools in [*lists, *lists]:
        assert memo.checked_header(tools, _unchecked) == tools_text(tools)


def test_values_equal_in_python_but_not_in_json_get_their_own_header() -> None:
    lists = ToolLists(max_lists=3)
    variants: list[list[object]] = [[{"a": 1}], [{"a": 1.0}], [{"a": True}], [{"b": 0, "a": 1}]]
    variants.append([{"a": 1, "b": 0}])
    for tools in [*variants, *variants]:
        assert lists.checked_header(tools, _unchecked) == tools_text(tools)


def test_a_list_that_passed_is_not_checked_again_and_one_that_failed_always_is() -> None:
    lists = ToolLists(max_lists=2)
    checked: list[object] = []

    def check(tools: list[Any]) -> None:
        checked.append(tools)
        _check_tools(tools)

    good: list[Any] = [{"type": "function", "function": {"name": "f"}}]
    bad: list[Any] = [{"type": "function", "function": {"name": 1}}]
    for _ in range(3):
        lists.checked_header([dict(tool) for tool in good], check)
        with pytest.raises(Rejection, match=r"tools\[0\]"):
            lists.checked_header(bad, check)
    assert checked == [good, bad, bad, bad]
    # 1 and 1.0 are equal in Python, not in JSON: separate lists, checked each.
    lists.checked_header([{"type": "function", "function": {"name": "f", "x": 1}}], check)
    lists.checked_header([{"type": "function", "function": {"name": "f", "x": 1.0}}], check)
    assert len(checked) == 6 and len(lists) == 2


def test_a_list_that_fails_its_check_gets_no_header_and_is_checked_again() -> None:
    lists = ToolLists()
    tools: list[Any] = [{"type": "function", "function": {"name": "f"}}]
    failures = iter([Rejection(422, "no")])

    def check(_: list[Any]) -> None:
        failure = next(failures, None)
        if failure is not None:
            raise failure

    with pytest.raises(Rejection):
        lists.checked_header(tools, check)
    assert lists.checked_header(tools, check) == tools_text(tools)


def test_a_list_marshal_refuses_is_handled_without_the_memo() -> None:
    lists = ToolLists()
    deep: list[Any] = []
    for _ in range(3000):
        deep = [deep]
    with pytest.raises(Rejection):
        lists.checked_header(deep, _check_tools)
    assert len(lists) == 0
