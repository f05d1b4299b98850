"""One session's log in a `MemoryStore`: its events' JSON texts in one buffer.

A session's events are kept as their compact JSON texts, one after the
other in one `bytearray`, with one array of their end offsets (and two
flags each). So an idle session's log is two small objects and two
buffers, the text's in the C allocator once it passes 512 bytes, rather
than a small object per event left wherever the turn that wrote it
allocated it (a burst of turns then leaves its arenas pinned, half-used,
by the events it logged).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence

JSON_TEXT = 1
"""The text is what `json` writes (ASCII); without this flag, what orjson writes (UTF-8)."""
HEADER = 2
"""A `request/header` event whose header is the number of the store's shared copy."""
_FLAGS = 2
"""Bits of each `_ends` entry taken by the flags."""


class MemoryLog:
    """The JSON texts of one session's events, in seq order, each with its flags.

    Appending is amortized O(size of what is appended); reading event `seq`
    is O(its size). Not thread-safe (a `MemoryStore` is used from one Trio
    thread).
    """

    __slots__ = ("_ends", "_text")

    def __init__(self) -> None:
        self._text = bytearray()
        self._ends = array("Q")

    def __len__(self) -> int:
        return len(self._ends)

    def extend(self, items: Sequence[tuple[bytes, int]]) -> None:
        """Append each `(text, flags)` of `items` as the next event."""
        for text, flags in items:
            self._text += text
            self._ends.append(len(self._text) << _FLAGS | flags)

    def item(self, seq: int) -> tuple[bytes, int]:
        """Event `seq`'s text (a copy) and flags.

        Raises:
            IndexError: no event `seq` is kept.
        """
        if not 0 <= seq < len(self._ends):
            raise IndexError(f"seq {seq} is not in this log of {len(self._ends)} events")
        entry = self._ends[seq]
        start = self._ends[seq - 1] >> _FLAGS if seq else 0
        return bytes(self._text[start : entry >> _FLAGS]), entry & (1 << _FLAGS) - 1

    def items(self) -> Iterator[tuple[bytearray, int]]:
        """Every event's text (a copy) and flags, in seq order."""
        text = self._text
        start = 0
        mask = (1 << _FLAGS) - 1
        for entry in self._ends:
            end = entry >> _FLAGS
            yield text[start:end], entry & mask
            start = end
