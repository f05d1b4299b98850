"""What the simulator remembers per distinct tools list: its rendered header and its validity.

Every request of a benchmark carries the same tools (40 schemas, ~15 KB of
JSON): rendering their header (`tokens.tools_text`) and checking their
shapes (`validation`) once per distinct list, not once per request, is the
point. A list is keyed by its `marshal` form, which is exact for parsed
JSON: it keeps every type (`1`, `1.0` and `true` differ), every key in
order and every string, so two lists with the same key render to the same
text and pass or fail the same checks. A list `marshal` refuses is handled
without the memo.
"""

from __future__ import annotations

import marshal
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import attrs

from actors.providers.simulator.tokens import tools_text


@attrs.define(kw_only=True, eq=False)
class _Known:
    header: str | None = None
    valid: bool = False


class ToolLists:
    """A bounded LRU of tools lists: their rendered header and whether they passed validation.

    Args:
        max_lists: The most distinct lists remembered (least recently used
            forgotten first).
    """

    def __init__(self, *, max_lists: int = 64) -> None:
        if max_lists < 1:
            raise ValueError(f"max_lists must be positive, got {max_lists}")
        self._max = max_lists
        self._lists: OrderedDict[bytes, _Known] = OrderedDict()

    def __len__(self) -> int:
        """The lists remembered now."""
        return len(self._lists)

    def checked_header(self, tools: list[Any], check: Callable[[list[Any]], None]) -> str:
        """Run `check(tools)` unless an equal list passed it before; return the list's header.

        The header is `tokens.tools_text(tools)`, rendered once per distinct
        list (the same str each time); the list is keyed once for both.

        Raises:
            Exception: whatever `check` raises (a failing list is not remembered).
        """
        known = self._known(tools)
        if known is None:
            check(tools)
            return tools_text(tools)
        if not known.valid:
            check(tools)
            known.valid = True
        if known.header is None:
            known.header = tools_text(tools)
        return known.header

    def _known(self, tools: list[Any]) -> _Known | None:
        try:
            key = marshal.dumps(tools)
        except ValueError:
            return None
        known = self._lists.get(key)
        if known is not None:
            self._lists.move_to_end(key)
            return known
        known = self._lists[key] = _Known()
        if len(self._lists) > self._max:
            self._lists.popitem(last=False)
        return known
