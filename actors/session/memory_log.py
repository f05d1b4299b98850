"""One session's log in a `MemoryStore`: its events' JSON texts in one buffer.

A session's events are kept as their compact JSON texts, one after the
other in one `bytearray`, each followed by a 4-byte trailer (its length
and two flags). So an idle session's log is one object, whose buffer is in
the C allocator once it passes 512 bytes, rather than a small object per
event (or an offsets array) allocated during the turn that wrote it: a
burst of turns would leave those scattered over its arenas, keeping them
from being given back long after the burst ended.

Reading runs backwards from the end along the trailers, so the last events
(what a log's readers ask for as it grows) are found at once.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from actors.session.errors import SessionError

JSON_TEXT = 1
"""The text is what `json` writes (ASCII); without this flag, what orjson writes (UTF-8)."""
HEADER = 2
"""A `request/header` event whose header is the number of the store's shared copy."""
_FLAG_BITS = 2
_FLAG_MASK = (1 << _FLAG_BITS) - 1
_TRAILER = struct.Struct("<I")
MAX_EVENT_BYTES = (1 << (32 - _FLAG_BITS)) - 1
"""The longest event text a `MemoryLog` keeps (1 GiB less a byte)."""


class MemoryLog:
    """The JSON texts of one session's events, in seq order, each with its flags.

    Appending is amortized O(size of what is appended); reading event `seq`
    is O(number of events after it) plus its size. Not thread-safe (a
    `MemoryStore` is used from one Trio thread).
    """

    __slots__ = ("_buffer", "_count")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def extend(self, items: Sequence[tuple[bytes, int]]) -> None:
        """Append each `(text, flags)` of `items` as the next event; all of them or none.

        Raises:
            SessionError: a text is longer than `MAX_EVENT_BYTES` (names its size).
        """
        for text, _ in items:
            if len(text) > MAX_EVENT_BYTES:
                raise SessionError(
                    f"an event of {len(text):,} bytes of JSON is longer than a memory store "
                    f"keeps ({MAX_EVENT_BYTES:,})"
                )
        for text, flags in items:
            self._buffer += text
            self._buffer += _TRAILER.pack(len(text) << _FLAG_BITS | flags)
        self._count += len(items)

    def item(self, seq: int) -> tuple[bytes, int]:
        """Event `seq`'s text (a copy) and flags.

        Raises:
            IndexError: no event `seq` is kept.
        """
        if not 0 <= seq < self._count:
            raise IndexError(f"seq {seq} is not in this log of {self._count} events")
        end = len(self._buffer)
        for _ in range(self._count - seq - 1):
            end -= _TRAILER.size + (_TRAILER.unpack_from(self._buffer, end - 4)[0] >> _FLAG_BITS)
        trailer = _TRAILER.unpack_from(self._buffer, end - 4)[0]
        start = end - _TRAILER.size - (trailer >> _FLAG_BITS)
        return bytes(self._buffer[start : end - _TRAILER.size]), trailer & _FLAG_MASK

    def since(self, first: int, last: int | None = None) -> list[tuple[bytes, int]]:
        """The texts (copies) and flags of events `first` to `last` (None: the log's last), in
        seq order (fewer when `last` is past the end).

        One walk back from the end: O(number of events from `first` on) plus
        the size of those read, so reading a batch of the latest events costs
        what reading one does, per event.

        Raises:
            IndexError: `first` is below 0 or past the log's end.
        """
        if not 0 <= first <= self._count:
            raise IndexError(f"seq {first} is not in this log of {self._count} events")
        last = self._count - 1 if last is None else min(last, self._count - 1)
        out: list[tuple[bytes, int]] = []
        end = len(self._buffer)
        with memoryview(self._buffer) as view:
            for seq in range(self._count - 1, first - 1, -1):
                trailer = _TRAILER.unpack_from(view, end - _TRAILER.size)[0]
                start = end - _TRAILER.size - (trailer >> _FLAG_BITS)
                if seq <= last:
                    out.append((bytes(view[start : end - _TRAILER.size]), trailer & _FLAG_MASK))
                end = start
        out.reverse()
        return out

    def items(self) -> list[tuple[bytes, int]]:
        """Every event's text (a copy) and flags, in seq order."""
        return self.since(0)
