"""Model-facing tool order: validating a configured `tool_order` and ordering tools by it.

Without a configured order, tools sort by name in code-point order. With one,
listed tools take their listed position and every unlisted tool lands at the
`TOOL_ORDER_REST` marker, sorted by name. Both sorts are stable: tools with
equal names (never deduplicated here) keep the order they were collected in.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from operator import attrgetter

import attrs

from actors.prompt.errors import PromptError
from actors.prompt.types import TOOL_ORDER_REST, ToolSchema

_BY_NAME = attrgetter("name")


@attrs.frozen(kw_only=True)
class ToolOrder:
    """A validated `tool_order`: exactly one rest marker, no duplicate entries.

    Attributes:
        listed: The configured tool names, in order, without the marker.
        rank: Each configured entry's index, the marker's included.
        rest_rank: The marker's index: where unlisted tools go.
    """

    listed: tuple[str, ...]
    rank: Mapping[str, int]
    rest_rank: int


def parse_tool_order(tool_order: Sequence[str]) -> ToolOrder:
    """Validate a configured tool order.

    Raises:
        PromptError: `tool_order` is a bare string, holds a non-string entry,
            does not hold `TOOL_ORDER_REST` exactly once, or repeats a name.
    """
    if isinstance(tool_order, str):
        raise PromptError("tool_order must be a sequence of tool names, not a string")
    entries = tuple(tool_order)
    for entry in entries:
        if not isinstance(entry, str):
            raise PromptError(f"tool_order entry {entry!r} is not a tool name (str)")
    markers = entries.count(TOOL_ORDER_REST)
    if markers != 1:
        raise PromptError(
            f"tool_order must contain the rest marker {TOOL_ORDER_REST!r} exactly once, "
            f"found it {markers} times"
        )
    rank: dict[str, int] = {}
    for index, entry in enumerate(entries):
        if entry in rank:
            raise PromptError(f"tool_order lists tool {entry!r} more than once")
        rank[entry] = index
    return ToolOrder(
        listed=tuple(entry for entry in entries if entry != TOOL_ORDER_REST),
        rank=rank,
        rest_rank=rank[TOOL_ORDER_REST],
    )


def order_tools(
    schemas: Iterable[ToolSchema],
    *,
    order: ToolOrder | None,
    known_names: Collection[str] = (),
) -> list[ToolSchema]:
    """Return a new list of `schemas` in canonical model-facing order.

    Args:
        schemas: The visible tools, in collection order.
        order: The configured order, or None for plain name order.
        known_names: Every name any provider knows (before scope restriction);
            only consulted when `order` is given. A listed name that is known
            but not among `schemas` is simply absent from the result.

    Raises:
        PromptError: `order` lists a name outside `known_names`.
    """
    if order is None:
        return sorted(schemas, key=_BY_NAME)
    for name in order.listed:
        if name not in known_names:
            known = ", ".join(sorted(known_names)) or "(none)"
            raise PromptError(
                f"tool_order lists tool {name!r}, which no tool provider knows; known: {known}"
            )
    ordered = sorted(schemas, key=_BY_NAME)
    rank = order.rank
    # Listed tools are few: sort by name first (stable, in C), then lift the
    # listed ones out and put them around the rest by their configured rank.
    listed = sorted((s for s in ordered if s.name in rank), key=lambda s: rank[s.name])
    if not listed:
        return ordered
    rest = [s for s in ordered if s.name not in rank]
    before = [s for s in listed if rank[s.name] < order.rest_rank]
    return before + rest + listed[len(before) :]
