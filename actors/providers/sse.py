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

from typing import Any

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
        events: list[SSEEvent] = []
        self._feed(data, events, True)
        return events

    def feed_data(self, data: bytes) -> list[str]:
        """Consume the next bytes of the stream and return the data of the events they complete.

        The same as `[event.data for event in self.feed(data)]`, without
        building the events (for consumers that ignore event types and ids).

        Raises:
            SSEError: the pending event grew past `max_event_bytes`.
        """
        values: list[str] = []
        self._feed(data, values, False)
        return values

    def _feed(self, data: bytes, out: list[Any], whole: bool) -> None:
        """Decode the complete lines of `data`, appending each event to `out`: an `SSEEvent`
        when `whole`, else its data."""
        if not data:
            return
        buffer = self._buffer
        pending = len(buffer)  # the unfinished line so far: it holds no line end
        buffer += data
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
            if self._first_line:
                self._first_line = False
                complete = complete.removeprefix(_BOM)
            limit = self.max_event_bytes
            # bytes.splitlines splits at exactly CRLF, LF and CR, the event-stream line ends.
            for line in complete.splitlines():
                if not line:
                    if self._data:
                        value = "\n".join(self._data)
                        out.append(
                            SSEEvent(
                                event=self._event_type or "message", data=value, id=self._last_id
                            )
                            if whole
                            else value
                        )
                        self._data = []
                        self._data_bytes = 0
                    self._event_type = ""
                elif line.startswith(b"data:"):
                    # The common line, split as bytes: ":" and " " never occur inside a
                    # UTF-8 sequence.
                    value = (line[6:] if line[5:6] == b" " else line[5:]).decode(
                        "utf-8", errors="replace"
                    )
                    self._data.append(value)
                    self._data_bytes += len(line)
                    if self._data_bytes > limit:
                        self._too_much_data()
                else:
                    self._field(line)
        elif start:
            del buffer[:start]
        if len(buffer) + self._data_bytes > self.max_event_bytes:
            raise SSEError(
                f"an event stream line or event exceeds {self.max_event_bytes} bytes "
                f"({len(buffer)} bytes of an unfinished line, {self._data_bytes} bytes of data)"
            )

    def _field(self, raw: bytes) -> None:
        """A line other than a blank one or a `data:` one: a comment or another field."""
        line = raw.decode("utf-8", errors="replace")
        if line.startswith(":"):
            return
        field, colon, text = line.partition(":")
        if colon and text.startswith(" "):
            text = text[1:]
        if field == "data":  # a bare "data" line: an empty data value
            self._data.append(text)
            self._data_bytes += len(raw)
            if self._data_bytes > self.max_event_bytes:
                self._too_much_data()
        elif field == "event":
            self._event_type = text
        elif field == "id" and "\0" not in text:
            self._last_id = text

    def _too_much_data(self) -> None:
        raise SSEError(
            f"an event's data exceeds {self.max_event_bytes} bytes "
            f"({len(self._data)} data lines so far)"
        )
