"""One session's log in a `MemoryStore`: its events' JSON, compressed in one buffer once flushed.

A session's events are kept as their compact JSON texts. Those appended
since the session's last flush are kept as they came (one `bytes` object
each: cheap to append and to read back while a turn runs and its
supervisors follow it); a flush (`settle`, at each step and turn's end and
before a session hibernates) moves them into a segment at the end of one
`bytearray`. So an idle session's log is one object whose buffer is
in the C allocator once it passes 512 bytes, rather than a small object per
event allocated during the turn that wrote it: a burst of turns would leave
those scattered over its arenas, keeping them from being given back long
after the burst. Compressed, a turn's events take about a fifth of their JSON.

A segment is its events' texts, each followed by a 4-byte trailer (its
length and two flags), stored as raw DEFLATE (zlib, a 4 KiB window, fixed
Huffman codes, primed with a dictionary of the fragments events share) once
it holds 2 KiB or its events end a turn, and as it is until then (so an
idle session's log is compressed whole, and a busy one's latest events are
compressed a few KB at a time, not at each of a step's flushes). Each
segment is followed by its stored size, its event count and whether it is
compressed. Reading runs backwards from the buffer's end along the
segments' counts and then the texts' trailers, so the latest events are
found at once; each segment read is inflated whole (at most about 1 MiB of
JSON, or one longer event).
"""

from __future__ import annotations

import struct
import zlib
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
_SEGMENT = struct.Struct("<II")  # the segment's stored size; its events << 1 | _RAW
_RAW = 1
"""The segment is stored as its texts, uncompressed."""
_SEGMENT_TEXT_BYTES = 1 << 20
"""A segment takes events while their texts stay within this (one longer event is a segment)."""
_COMPRESS_FROM_BYTES = 2048
"""A segment is compressed once it holds this much (or its events end a turn); a smaller one
stays raw, and the events of the next settle join it. Compressing costs about as much for a few
hundred bytes as for a few KB, and a few hundred bytes compress least, so a short two-step turn
is compressed once, at its end, not at each of its four flushes."""
_WINDOW_BITS = 12  # a 4 KiB window: cheap to set up for the few KB a step flushes
_MEMORY_LEVEL = 2
_DICTIONARY = "".join(
    # The fragments most events share, the commonest last (nearest, so cheapest to refer to).
    [
        '{"type":"compaction/request","seq":',
        '{"type":"compaction/end","seq":',
        '{"type":"request/retry","seq":',
        ',"attempt":1,"delay_ms":',
        ',"failure":{"code":"',
        '","message":"',
        '"retryable":true',
        '{"type":"request/header","seq":',
        ',"data":{"header":0,"reason":"initial"}}',
        '"source":{"kind":"plugin","plugin":"time","form":"snapshot"}}}',
        '{"type":"tool/call","seq":',
        '{"type":"tool/result","seq":',
        '","content":"',
        '","is_error":false}}',
        ',"call_id":"call_',
        '","name":"',
        '","arguments":"{\\"',
        '{"type":"assistant/message","seq":',
        '"message":{"role":"assistant","content":[{"type":"tool-call","id":"call_',
        '"message":{"role":"assistant","content":[{"type":"text","text":"',
        '"chunk":{"type":"tool-call-delta","index":0,"id":"call_',
        '"chunk":{"type":"finish","reason":"tool-calls"}}}',
        '"chunk":{"type":"finish","reason":"completed"}}}',
        '{"type":"turn/end","seq":',
        ',"reason":{"kind":"completed"}}}',
        '{"type":"user/message","seq":',
        ',"data":{"content":[{"type":"text","text":"',
        '"}],"source":{"kind":"user"}}}',
        '"usage":{"input_tokens":',
        ',"output_tokens":',
        ',"cache_read_tokens":',
        '{"type":"turn/start","seq":',
        '{"type":"step/start","seq":',
        '{"type":"step/end","seq":',
        '{"type":"assistant/chunk","seq":',
        ',"time":17',
        ',"data":{"turn":0,"step":0',
        ',"chunk":{"type":"text","text":"',
    ]
).encode()


class MemoryLog:
    """The JSON texts of one session's events, in seq order, each with its flags.

    Appending is amortized O(size of what is appended), and settling
    compresses what was appended since the last settle; reading events from
    `first` on is O(number of events from `first` on) plus the size of the
    segments holding them. Not thread-safe (a `MemoryStore` is used from one
    Trio thread).
    """

    __slots__ = ("_buffer", "_count", "_turn_ended", "_unsettled")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._count = 0  # events in `_buffer`
        self._unsettled: list[tuple[bytes, int]] | None = None  # appended since `settle`
        self._turn_ended = False  # the last event appended ends a turn

    def __len__(self) -> int:
        return self._count + len(self._unsettled or ())

    def extend(self, items: Sequence[tuple[bytes, int]], *, ends_turn: bool = False) -> None:
        """Append each `(text, flags)` of `items` as the next event; all of them or none.

        `ends_turn`: the last of `items` ends a turn, so the session is
        likely to go idle: the next settle compresses what it settles,
        whatever its size.

        Raises:
            SessionError: a text is longer than `MAX_EVENT_BYTES` (names its size).
            ValueError: a flag outside `JSON_TEXT | HEADER` (names it).
        """
        for text, flags in items:
            if len(text) > MAX_EVENT_BYTES:
                raise SessionError(
                    f"an event of {len(text):,} bytes of JSON is longer than a memory store "
                    f"keeps ({MAX_EVENT_BYTES:,})"
                )
            if flags & ~_FLAG_MASK:
                raise ValueError(f"event flags {flags} are not a combination of JSON_TEXT, HEADER")
        if not items:
            return
        if self._unsettled is None:
            self._unsettled = list(items)
        else:
            self._unsettled.extend(items)
        self._turn_ended = ends_turn

    def settle(self) -> None:
        """Move the events appended since the last call into the buffer; all or, if it
        raises (out of memory), none of them.

        They join the buffer's raw segment, if it ends with one; once that
        holds `_COMPRESS_FROM_BYTES` or more, or they end a turn, it is
        compressed.
        """
        unsettled = self._unsettled
        if not unsettled:
            return
        start, texts, count = self._raw_segment()
        segments = bytearray()
        for text, flags in unsettled:
            if count and len(texts) + len(text) > _SEGMENT_TEXT_BYTES:
                segments += _segment(texts, count, compress=True)
                texts, count = bytearray(), 0
            texts += text
            texts += _TRAILER.pack(len(text) << _FLAG_BITS | flags)
            count += 1
        whole = self._turn_ended or len(texts) >= _COMPRESS_FROM_BYTES
        segments += _segment(texts, count, compress=whole)
        self._buffer[start:] = segments  # the one change to the buffer: whole, or not at all
        self._count += len(unsettled)
        self._unsettled = None

    def _raw_segment(self) -> tuple[int, bytearray, int]:
        """Where the buffer's last segment starts, a copy of its texts and its event count,
        if it is raw; else the buffer's end, nothing and 0."""
        buffer = self._buffer
        end = len(buffer)
        if buffer:
            size, tag = _SEGMENT.unpack_from(buffer, end - _SEGMENT.size)
            if tag & _RAW:
                start = end - _SEGMENT.size - size
                return start, buffer[start : start + size], tag >> 1
        return end, bytearray(), 0

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

        Unsettled events are read as kept; settled ones are read in one walk
        back from the buffer's end, inflating each segment that holds any of
        them once, so reading a batch of the latest events costs what
        reading one does, per event.

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
            newest = settled - 1  # the newest event of the segment that ends at `end`
            with memoryview(self._buffer) as view:
                while newest >= first:
                    size, tag = _SEGMENT.unpack_from(view, end - _SEGMENT.size)
                    start = end - _SEGMENT.size - size
                    count = tag >> 1
                    if newest - count < last:
                        stored = view[start : end - _SEGMENT.size]
                        try:
                            texts = stored.tobytes() if tag & _RAW else _inflate(stored)
                        finally:
                            stored.release()  # even if a traceback keeps it: the buffer can grow
                        _read_back(texts, newest, first, last, out)
                    end = start
                    newest -= count
            out.reverse()
        if self._unsettled is not None and last >= settled:
            out += self._unsettled[max(first, settled) - settled : last - settled + 1]
        return out

    def items(self) -> list[tuple[bytes, int]]:
        """Every event's text and flags, in seq order."""
        return self.since(0)


_PRIMED = zlib.compressobj(
    1, zlib.DEFLATED, -_WINDOW_BITS, _MEMORY_LEVEL, zlib.Z_FIXED, _DICTIONARY
)
"""A compressor with the dictionary loaded, copied for each segment: a copy costs less than
setting one up, and a segment of a few KB compresses as well with fixed Huffman codes as
with codes built for it, for a third less time."""


def _segment(texts: bytearray, count: int, *, compress: bool) -> bytes:
    """`texts` (`count` events with their trailers) as a segment: compressed or raw, then
    its stored size and tag."""
    if not compress:
        return bytes(texts) + _SEGMENT.pack(len(texts), count << 1 | _RAW)
    packer = _PRIMED.copy()
    stored = packer.compress(texts) + packer.flush()
    return stored + _SEGMENT.pack(len(stored), count << 1)


def _inflate(packed: memoryview) -> bytes:
    """A segment's texts and trailers, from its compressed form."""
    unpacker = zlib.decompressobj(-_WINDOW_BITS, _DICTIONARY)
    return unpacker.decompress(packed) + unpacker.flush()


def _read_back(
    texts: bytes, newest: int, first: int, last: int, out: list[tuple[bytes, int]]
) -> None:
    """Append to `out`, newest first, the events `first` to `last` of a segment's `texts`,
    whose newest event is `newest` (the segment's older events are skipped at its start)."""
    end = len(texts)
    seq = newest
    with memoryview(texts) as view:
        while end > 0 and seq >= first:
            trailer = _TRAILER.unpack_from(view, end - _TRAILER.size)[0]
            start = end - _TRAILER.size - (trailer >> _FLAG_BITS)
            if seq <= last:
                out.append((bytes(view[start : end - _TRAILER.size]), trailer & _FLAG_MASK))
            end = start
            seq -= 1
