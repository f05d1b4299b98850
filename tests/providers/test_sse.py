"""The incremental SSE decoder: split invariance and the WHATWG line rules."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.providers.sse import SSEDecoder, SSEError, SSEEvent

# Field values never contain line ends; anything else goes, NUL and non-ASCII included.
_VALUE = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=12)
_TERMINATOR = st.sampled_from(["\n", "\r\n", "\r"])


@st.composite
def _streams(draw: st.DrawFn) -> tuple[bytes, list[SSEEvent]]:
    """An event stream (with comments, odd fields, mixed line ends) and its events."""
    lines: list[str] = []
    expected: list[SSEEvent] = []
    last_id: str | None = None
    for _ in range(draw(st.integers(0, 6))):
        data: list[str] = []
        event_type = ""
        for _ in range(draw(st.integers(0, 4))):
            kind = draw(
                st.sampled_from(["data", "data", "event", "id", "comment", "retry", "other"])
            )
            value = draw(_VALUE)
            if kind == "comment":
                lines.append(":" + value)
                continue
            spaced = draw(st.booleans()) or value.startswith(" ")
            lines.append(f"{kind}:{' ' if spaced else ''}{value}")
            if kind == "data":
                data.append(value)
            elif kind == "event":
                event_type = value
            elif kind == "id" and "\0" not in value:
                last_id = value
        lines.append("")
        if data:
            expected.append(
                SSEEvent(event=event_type or "message", data="\n".join(data), id=last_id)
            )
    text = ""
    previous = ""
    for line in lines:
        terminator = draw(_TERMINATOR)
        if previous == "\r" and not line and terminator == "\n":
            terminator = "\r\n"  # "\r" + "\n" would read as one line end
        text += line + terminator
        previous = terminator
    bom = "\ufeff" if draw(st.booleans()) else ""
    return (bom + text).encode(), expected


def _feed_all(pieces: list[bytes]) -> list[SSEEvent]:
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    for piece in pieces:
        events.extend(decoder.feed(piece))
    return events


@given(_streams())
def test_a_whole_stream_decodes_to_its_events(stream: tuple[bytes, list[SSEEvent]]) -> None:
    data, expected = stream
    assert _feed_all([data]) == expected


@given(_streams(), st.data())
def test_any_split_into_reads_yields_the_same_events(
    stream: tuple[bytes, list[SSEEvent]], draw: st.DataObject
) -> None:
    data, expected = stream
    cuts = sorted(draw.draw(st.sets(st.integers(0, len(data)), max_size=len(data) + 1)))
    bounds = [0, *cuts, len(data)]
    pieces = [data[start:end] for start, end in itertools.pairwise(bounds)]
    assert _feed_all(pieces) == expected


@given(_streams(), st.data())
def test_the_data_only_feed_gives_each_events_data_for_any_split(
    stream: tuple[bytes, list[SSEEvent]], draw: st.DataObject
) -> None:
    data, expected = stream
    cuts = sorted(draw.draw(st.sets(st.integers(0, len(data)), max_size=len(data) + 1)))
    decoder = SSEDecoder()
    values: list[str] = []
    for start, end in itertools.pairwise([0, *cuts, len(data)]):
        values += decoder.feed_data(data[start:end])
    assert values == [event.data for event in expected]


def test_crlf_split_between_reads_is_one_line_end() -> None:
    # A CR ending one read and an LF opening the next must not make a blank line.
    assert _feed_all([b"data: a\r", b"\ndata: b\r\n\r\n"]) == [SSEEvent(data="a\nb")]


def test_comments_and_blank_lines_dispatch_nothing() -> None:
    assert _feed_all([b": keep-alive\n\n: ping\r\n\r\n\n\n"]) == []


def test_data_only_keep_alive_is_an_event_with_comment_like_data() -> None:
    assert _feed_all([b"data: : keep-alive\n\n"]) == [SSEEvent(data=": keep-alive")]


def test_several_events_in_one_read() -> None:
    events = _feed_all([b"data: 1\n\ndata: 2\n\nevent: x\ndata: 3\n\n"])
    assert events == [SSEEvent(data="1"), SSEEvent(data="2"), SSEEvent(event="x", data="3")]


def test_an_event_split_across_many_reads() -> None:
    payload = 'data: {"choices":[{"delta":{"content":"h\u00e9llo"}}]}\n\n'.encode()
    events = _feed_all([payload[i : i + 1] for i in range(len(payload))])
    assert events == [SSEEvent(data='{"choices":[{"delta":{"content":"h\u00e9llo"}}]}')]


def test_an_unfinished_event_at_the_end_is_not_dispatched() -> None:
    assert _feed_all([b"data: [DONE]\n"]) == []


def test_only_one_leading_space_is_stripped_from_a_value() -> None:
    assert _feed_all([b"data:  two\ndata:none\n\n"]) == [SSEEvent(data=" two\nnone")]


def test_the_last_event_id_persists_across_events() -> None:
    events = _feed_all([b"id: 7\ndata: a\n\ndata: b\n\n"])
    assert [event.id for event in events] == ["7", "7"]


def test_an_overlong_line_fails_loudly() -> None:
    decoder = SSEDecoder(max_event_bytes=32)
    with pytest.raises(SSEError, match="exceeds 32 bytes"):
        decoder.feed(b"data: " + b"x" * 40)


def test_overlong_event_data_fails_loudly() -> None:
    decoder = SSEDecoder(max_event_bytes=32)
    with pytest.raises(SSEError, match="data exceeds 32 bytes"):
        decoder.feed(b"data: 0123456789\n" * 3)


def test_a_bare_data_line_adds_an_empty_value() -> None:
    assert _feed_all([b"data\ndata:x\n\n", b"data\n\n"]) == [
        SSEEvent(data="\nx"),
        SSEEvent(data=""),
    ]


def test_a_long_line_fed_byte_by_byte_decodes_once_complete() -> None:
    line = b"data: " + b"y" * 5000 + b"\r\n\r\n"
    assert _feed_all([line[i : i + 1] for i in range(len(line))]) == [SSEEvent(data="y" * 5000)]
