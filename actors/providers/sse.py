"""Incremental Server-Sent Events parsing: bytes in, events out.

`SSEDecoder` follows the WHATWG event-stream rules: lines end with CRLF, LF or
CR (a CR at the end of one read and an LF at the start of the next are one
line end); lines starting with `:` are comments; `data` lines accumulate and
a blank line dispatches the event; a leading byte-order mark is dropped; an
event that has no `data` line is not dispatched; an event still incomplete
when the stream ends is never dispatched. `retry` fields are ignored (nothing
here reconnects).

The decoder is pure and split-invariant: feeding a byte stream in any split
yields the same events as feeding it whole. It holds at most
`max_event_bytes` of pending input and raises `SSEError` beyond that, so a
server that never ends a line cannot grow memory without bound.
"""

from __future__ import annotations

import attrs

_BOM = b"\xef\xbb\xbf"
_LF = 0x0A

DEFAULT_MAX_EVENT_BYTES = 16 * 1024 * 1024
"""Default bound on one event's pending bytes (its data lines and the line being read)."""


class SSEError(ValueError):
    """The event stream broke a limit of the decoder (an event too large to buffer)."""


@attrs.frozen(kw_only=True)
class SSEEvent:
    """One dispatched event.

    Attributes:
        event: The event type (`"message"` when the stream named none).
        data: The data lines joined with `"\\n"`.
        id: The last event id seen on the stream so far, if any.
    """

    event: str = "message"
    data: str = ""
    id: str | None = None


@attrs.define(eq=False)
class SSEDecoder:
    """Turns chunks of an event stream into `SSEEvent`s, one `feed` at a time.

    Args:
        max_event_bytes: The most bytes one event may occupy while pending
            (its accumulated data plus the line being read).
    """

    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES
    _buffer: bytearray = attrs.field(factory=bytearray, init=False)
    _after_cr: bool = attrs.field(default=False, init=False)
    _first_line: bool = attrs.field(default=True, init=False)
    _data: list[str] = attrs.field(factory=list, init=False)
    _data_bytes: int = attrs.field(default=0, init=False)
    _event_type: str = attrs.field(default="", init=False)
    _last_id: str | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        if self.max_event_bytes < 1:
            raise ValueError(f"max_event_bytes must be positive, got {self.max_event_bytes}")

    def feed(self, data: bytes) -> list[SSEEvent]:
        """Consume the next bytes of the stream and return the events they complete.

        Raises:
            SSEError: the pending event grew past `max_event_bytes`.
        """
        if not data:
            return []
        buffer = self._buffer
        pending = len(buffer)  # the unfinished line so far: it holds no line end
        buffer += data
        events: list[SSEEvent] = []
        start = 0
        if self._after_cr:
            # The previous read ended with CR: an LF opening this one belongs to it.
            self._after_cr = False
            if buffer[0] == _LF:
                start = 1
        # Every complete line ends at or before the last line end of the new bytes.
        last = max(data.rfind(b"\n"), data.rfind(b"\r"))
        if last >= 0 and pending + last >= start:
            end = pending + last + 1
            complete = bytes(buffer[start:end])
            del buffer[:end]
            self._after_cr = complete.endswith(b"\r")
            # bytes.splitlines splits at exactly CRLF, LF and CR, the event-stream line ends.
            for line in complete.splitlines():
                self._line(line, events)
        elif start:
            del buffer[:start]
        if len(buffer) + self._data_bytes > self.max_event_bytes:
            raise SSEError(
                f"an event stream line or event exceeds {self.max_event_bytes} bytes "
                f"({len(buffer)} bytes of an unfinished line, {self._data_bytes} bytes of data)"
            )
        return events

    def _line(self, raw: bytes, events: list[SSEEvent]) -> None:
        if self._first_line:
            self._first_line = False
            raw = raw.removeprefix(_BOM)
        if not raw:
            self._dispatch(events)
            return
        if raw.startswith(b"data:"):
            # The common line, split as bytes: ":" and " " never occur inside a UTF-8 sequence.
            value = raw[6:] if raw.startswith(b"data: ") else raw[5:]
            self._add_data(value.decode("utf-8", errors="replace"), len(raw))
            return
        line = raw.decode("utf-8", errors="replace")
        if line.startswith(":"):
            return
        field, colon, text = line.partition(":")
        if colon and text.startswith(" "):
            text = text[1:]
        if field == "data":  # a bare "data" line: an empty data value
            self._add_data(text, len(raw))
        elif field == "event":
            self._event_type = text
        elif field == "id" and "\0" not in text:
            self._last_id = text

    def _add_data(self, value: str, size: int) -> None:
        self._data.append(value)
        self._data_bytes += size
        if self._data_bytes > self.max_event_bytes:
            raise SSEError(
                f"an event's data exceeds {self.max_event_bytes} bytes "
                f"({len(self._data)} data lines so far)"
            )

    def _dispatch(self, events: list[SSEEvent]) -> None:
        if self._data:
            events.append(
                SSEEvent(
                    event=self._event_type or "message",
                    data="\n".join(self._data),
                    id=self._last_id,
                )
            )
        self._data = []
        self._data_bytes = 0
        self._event_type = ""
