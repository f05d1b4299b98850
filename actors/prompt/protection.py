"""Protection restoration: put protected sections and tools back as they were before the waterfall.

Internal to `actors.prompt`; the assembly pipeline calls `restore_protected`
after the `on_assemble` listeners ran (DESIGN §4, step 7).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from actors.prompt.types import AssembledSection, ToolSchema

_Named = TypeVar("_Named", AssembledSection, ToolSchema)


def restore_protected(
    canonical: list[_Named], current: Iterable[_Named], protected: frozenset[str]
) -> list[_Named]:
    """Put protected entries back exactly as they were before the waterfall.

    Protected names are removed from `current` (canonical absence wins too)
    and the canonical protected entries re-inserted, each before its first
    later unprotected canonical neighbour that survived in `current` (or at
    the end); when anchors would invert them, a restored entry goes right
    after the previous one, so restored entries keep canonical order.

    Args:
        canonical: The entries before the waterfall, in canonical order.
        current: The entries the waterfall left.
        protected: The names whose canonical state is authoritative.

    Returns:
        A fresh list: `current` without protected names, plus the canonical
        protected entries in their places.
    """
    kept = [item for item in current if item.name not in protected]
    position: dict[str, int] = {}
    for index, item in enumerate(kept):
        position.setdefault(item.name, index)
    anchors: list[tuple[int, _Named]] = []
    anchor = len(kept)
    for item in reversed(canonical):
        if item.name in protected:
            anchors.append((anchor, item))
        elif item.name in position:
            anchor = position[item.name]
    slots: dict[int, list[_Named]] = {}
    floor = 0
    for slot, item in reversed(anchors):
        floor = max(slot, floor)
        slots.setdefault(floor, []).append(item)
    restored: list[_Named] = []
    for index, item in enumerate(kept):
        restored.extend(slots.get(index, ()))
        restored.append(item)
    restored.extend(slots.get(len(kept), ()))
    return restored
