"""One session's log in a `MemoryStore`: its events' JSON texts, in one buffer once flushed.

A session's events are kept as their compact JSON texts. Those appended
since the session's last flush are kept as they came (one `bytes` object
each: cheap to append and to read back while a turn runs and its
supervisors follow it); a flush (`settle`, at the end of each turn and
before a session hibernates) moves them into one `bytearray`, each text
followed by a 4-byte trailer (its length and two flags). So an idle
session's log is one object whose buffer is in the C allocator once it
passes 512 bytes, rather than a small object per event allocated during
the turn that wrote it: a burst of turns would leave those scattered over
its arenas, keeping them from being given back long after the burst.

Reading the buffer runs backwards from its end along the trailers, so the
latest events are found at once.
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

    Appending is amortized O(size of what is appended); reading events from
    `first` on is O(number of events from `first` on) plus their size. Not
    thread-safe (a `MemoryStore` is used from one Trio thread).
    """

    __slots__ = ("_buffer", "_count", "_unsettled")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._count = 0  # events in `_buffer`
        self._unsettled: list[tuple[bytes, int]] | None = None  # appended since `settle`

    def __len__(self) -> int:
        return self._count + len(self._unsettled or ())

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
        if self._unsettled is None:
            self._unsettled = list(items)
        else:
            self._unsettled.extend(items)

    def settle(self) -> None:
        """Move the events appended since the last call into the buffer."""
        unsettled, self._unsettled = self._unsettled, None
        if not unsettled:
            return
        for text, flags in unsettled:
            self._buffer += text
            self._buffer += _TRAILER.pack(len(text) << _FLAG_BITS | flags)
        self._count += len(unsettled)

    def item(self, seq: int) -> tuple[bytes, int]:
        """Event `seq`'s text and flags.

        Raises:
            IndexError: no event `seq` is kept.
        """
        if not 0 <= seq < len(self):
            raise IndexError(f"seq {seq} is not in this log of {len(self)} events")
        return self.since(seq, seq)[0]

    def since(self, first: int, last: int | None = None) -> list[tuple[bytes, int]]:
        """The texts and flags of events `first` to `last` (None: the log's last), in seq
        order (fewer when `last` is past the end).

        Unsettled events are read as kept; settled ones are copied out of the
        buffer in one walk back from its end, so reading a batch of the
        latest events costs what reading one does, per event.

        Raises:
            IndexError: `first` is below 0 or past the log's end.
        """
        length = len(self)
        if not 0 <= first <= length:
            raise IndexError(f"seq {first} is not in this log of {length} events")
        last = length - 1 if last is None else min(last, length - 1)
        settled = self._count
        out: list[tuple[bytes, int]] = []
        if first < settled:
            end = len(self._buffer)
            with memoryview(self._buffer) as view:
                for seq in range(settled - 1, first - 1, -1):
                    trailer = _TRAILER.unpack_from(view, end - _TRAILER.size)[0]
                    start = end - _TRAILER.size - (trailer >> _FLAG_BITS)
                    if seq <= last:
                        text = bytes(view[start : end - _TRAILER.size])
                        out.append((text, trailer & _FLAG_MASK))
                    end = start
            out.reverse()
        if self._unsettled is not None and last >= settled:
            out += self._unsettled[max(first, settled) - settled : last - settled + 1]
        return out

    def items(self) -> list[tuple[bytes, int]]:
        """Every event's text and flags, in seq order."""
        return self.since(0)
