"""`MemoryLog`: one session's event texts in one buffer, each read back with its flags."""

from __future__ import annotations

import gc
import struct
import zlib
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from actors.session import memory_log
from actors.session.errors import SessionError
from actors.session.memory_log import HEADER, JSON_TEXT, MemoryLog

FLAGS = st.sampled_from([0, JSON_TEXT, HEADER | JSON_TEXT])
ITEMS = st.lists(st.tuples(st.binary(max_size=40), FLAGS), max_size=30)


@given(ITEMS, st.lists(st.integers(min_value=0, max_value=5), max_size=30))
def test_items_appended_in_any_chunks_read_back_in_order_with_their_flags(
    items: list[tuple[bytes, int]], chunk_sizes: list[int]
) -> None:
    log = MemoryLog()
    rest = list(items)
    for index, size in enumerate(chunk_sizes):
        log.extend(rest[:size])
        rest = rest[size:]
        if index % 2:
            log.settle()  # some settled into the buffer, some not
    log.extend(rest)
    assert len(log) == len(items)
    assert log.items() == items
    assert [log.item(seq) for seq in range(len(items))] == items
    assert all(log.since(first) == items[first:] for first in range(len(items) + 1))
    assert all(
        log.since(first, last) == items[first : last + 1]
        for first in range(len(items) + 1)
        for last in range(first - 1, len(items) + 2)
    )


@pytest.mark.parametrize("seq", [-1, 2])
def test_a_seq_outside_the_log_is_an_index_error_naming_it(seq: int) -> None:
    log = MemoryLog()
    log.extend([(b"{}", 0), (b"[]", JSON_TEXT)])
    with pytest.raises(IndexError, match=f"seq {seq} is not in this log of 2 events"):
        log.item(seq)
    if seq < 0:
        with pytest.raises(IndexError, match=f"seq {seq} is not in this log of 2 events"):
            log.since(seq)


def test_since_the_end_is_nothing_and_past_it_an_index_error() -> None:
    log = MemoryLog()
    log.extend([(b"{}", 0)])
    assert log.since(1) == []
    with pytest.raises(IndexError, match="seq 2 is not in this log of 1 events"):
        log.since(2)


def test_an_event_text_too_long_to_keep_is_refused_and_nothing_of_its_append_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(memory_log, "MAX_EVENT_BYTES", 8)
    log = MemoryLog()
    log.extend([(b"{}", 0)])
    with pytest.raises(SessionError, match="an event of 9 bytes of JSON is longer than a memory"):
        log.extend([(b"[]", 0), (b"[1,2,3,4]", 0)])
    assert log.items() == [(b"{}", 0)]
    assert len(log) == 1


def test_settled_events_leave_no_object_of_their_own() -> None:
    log = MemoryLog()
    log.extend([(b'{"seq":0}', 0), (b'{"seq":1}', JSON_TEXT)])
    assert any(isinstance(kept, list) for kept in gc.get_referents(log))  # the unsettled
    log.settle()
    log.settle()  # nothing more: no change
    assert not any(isinstance(kept, (list, bytes)) for kept in gc.get_referents(log))
    assert log.items() == [(b'{"seq":0}', 0), (b'{"seq":1}', JSON_TEXT)]


@given(
    ITEMS,
    st.lists(st.integers(min_value=0, max_value=5), max_size=30),
    st.sampled_from([0, 30, 100]),
)
def test_settles_split_into_raw_and_compressed_segments_read_back_in_order(
    items: list[tuple[bytes, int]], chunk_sizes: list[int], compress_from: int
) -> None:
    with (
        mock.patch.object(memory_log, "_SEGMENT_TEXT_BYTES", 50),  # several segments a settle
        mock.patch.object(memory_log, "_COMPRESS_FROM_BYTES", compress_from),
    ):
        log = MemoryLog()
        rest = list(items)
        for size in chunk_sizes:
            log.extend(rest[:size])
            rest = rest[size:]
            log.settle()
        log.extend(rest)
        log.settle()
        assert log.items() == items
        assert all(
            log.since(first, last) == items[first : last + 1]
            for first in range(len(items) + 1)
            for last in range(first - 1, len(items) + 1)
        )


_STEP = [
    b'{"type":"step/start","seq":%d,"time":1796558536931,"data":{"turn":0,"step":1}}',
    b'{"type":"user/message","seq":%d,"time":1796558536931,"data":{"content":[{"type":'
    b'"text","text":"Please look up the weather in Lisbon."}],"source":{"kind":"user"}}}',
    b'{"type":"assistant/chunk","seq":%d,"time":1796558537176,"data":{"turn":0,"step":0,'
    b'"chunk":{"type":"usage","usage":{"input_tokens":5694,"output_tokens":8,'
    b'"cache_read_tokens":5632}}}}',
    b'{"type":"assistant/chunk","seq":%d,"time":1796558537176,"data":{"turn":0,"step":0,'
    b'"chunk":{"type":"finish","reason":"completed"}}}',
    b'{"type":"step/end","seq":%d,"time":1796558537395,"data":{"turn":0,"step":1}}',
]


def _buffer(log: MemoryLog) -> bytearray:
    return next(kept for kept in gc.get_referents(log) if isinstance(kept, bytearray))


def test_settles_stay_raw_until_they_hold_2_kib_then_compress_to_under_a_third() -> None:
    log = MemoryLog()
    settled = 0
    seq = 0
    while settled < memory_log._COMPRESS_FROM_BYTES:
        step = [(text.replace(b"%d", str(seq + n).encode()), 0) for n, text in enumerate(_STEP)]
        seq += len(step)
        log.extend(step)
        log.settle()
        settled += sum(len(text) + 4 for text, _ in step)
        if settled < memory_log._COMPRESS_FROM_BYTES:
            assert len(_buffer(log)) == settled + 8  # kept as written, one raw segment
    assert len(log.items()) == seq
    assert len(_buffer(log)) < settled / 3


def test_a_settle_whose_events_end_a_turn_compresses_them_whatever_their_size() -> None:
    log = MemoryLog()
    step = [(text.replace(b"%d", str(seq).encode()), 0) for seq, text in enumerate(_STEP)]
    size = sum(len(text) + 4 for text, _ in step)
    log.extend(step[:2])
    log.settle()
    log.extend(step[2:], ends_turn=True)
    log.settle()
    assert size < memory_log._COMPRESS_FROM_BYTES
    assert len(_buffer(log)) < size / 2
    assert log.items() == step
    compressed = len(_buffer(log))
    log.extend(step[:1])  # a later append that does not end a turn: kept raw
    log.settle()
    assert log.items() == [*step, step[0]]
    assert len(_buffer(log)) == compressed + len(step[0][0]) + 4 + 8


def test_a_settle_that_fails_leaves_the_log_as_it_was() -> None:
    log = MemoryLog()
    log.extend([(b'{"seq":0}', 0)])
    log.settle()  # a raw segment, reopened by the next settle
    log.extend([(b'{"seq":1}', JSON_TEXT)], ends_turn=True)
    with (
        mock.patch.object(memory_log, "_segment", side_effect=MemoryError),
        pytest.raises(MemoryError),
    ):
        log.settle()
    assert log.items() == [(b'{"seq":0}', 0), (b'{"seq":1}', JSON_TEXT)]
    log.settle()
    assert log.items() == [(b'{"seq":0}', 0), (b'{"seq":1}', JSON_TEXT)]
    assert len(_buffer(log)) < 2 * (9 + 4) + 8  # compressed at last: the turn ended


def test_a_read_that_fails_leaves_the_buffer_free_to_grow() -> None:
    log = MemoryLog()
    log.extend([(b'{"seq":0}', 0)], ends_turn=True)
    log.settle()  # compressed
    with (
        mock.patch.object(memory_log, "_inflate", side_effect=zlib.error("damaged")),
        pytest.raises(zlib.error) as failed,
    ):
        log.items()
    kept = failed.value  # its traceback holds the reading frames
    log.extend([(b'{"seq":1}', 0)])
    log.settle()  # would be a BufferError if the failed read still held the buffer
    assert log.items() == [(b'{"seq":0}', 0), (b'{"seq":1}', 0)]
    assert kept.__traceback__ is not None


def test_flags_outside_json_text_and_header_are_refused() -> None:
    log = MemoryLog()
    with pytest.raises(ValueError, match="event flags 4 are not a combination"):
        log.extend([(b"{}", 4)])
    assert len(log) == 0


def test_an_empty_append_keeps_the_turn_end_of_the_one_before() -> None:
    log = MemoryLog()
    step = [(b'{"type":"turn/end","seq":0,"time":1,"data":{"turn":0}}', 0)]
    log.extend(step, ends_turn=True)
    log.extend([])
    log.settle()
    assert len(_buffer(log)) != len(step[0][0]) + 4 + 8  # compressed, not raw
    assert log.items() == step


class MemoryLogAgainstAList(RuleBasedStateMachine):
    """Appends, settles and reads in any order, with small segment sizes, against a list."""

    def __init__(self) -> None:
        super().__init__()
        self.log = MemoryLog()
        self.kept: list[tuple[bytes, int]] = []
        self.patches: list[Any] = []

    @initialize(compress_from=st.integers(1, 200), segment_bytes=st.integers(1, 200))
    def sizes(self, compress_from: int, segment_bytes: int) -> None:
        for name, value in (
            ("_COMPRESS_FROM_BYTES", compress_from),
            ("_SEGMENT_TEXT_BYTES", segment_bytes),
        ):
            patch = mock.patch.object(memory_log, name, value)
            patch.start()
            self.patches.append(patch)

    @rule(items=ITEMS, ends_turn=st.booleans())
    def extend(self, items: list[tuple[bytes, int]], ends_turn: bool) -> None:
        self.log.extend(items, ends_turn=ends_turn)
        self.kept += items

    @rule()
    def settle(self) -> None:
        self.log.settle()
        # Segments, walked back from the end, add up to every event; only the last is raw.
        buffer = bytes(_buffer(self.log))
        end, events, newest = len(buffer), 0, True
        while end:
            size, tag = struct.unpack_from("<II", buffer, end - 8)
            assert newest or not tag & 1
            newest = False
            events += tag >> 1
            end -= 8 + size
        assert events == len(self.kept)

    @rule(first=st.integers(-2, 40), last=st.none() | st.integers(-3, 45))
    def since(self, first: int, last: int | None) -> None:
        if not 0 <= first <= len(self.kept):
            with pytest.raises(IndexError):
                self.log.since(first, last)
            return
        upto = len(self.kept) if last is None else max(first, last + 1)
        assert self.log.since(first, last) == self.kept[first:upto]
        if first < len(self.kept):
            assert self.log.item(first) == self.kept[first]

    @invariant()
    def same_length(self) -> None:
        assert len(self.log) == len(self.kept)

    def teardown(self) -> None:
        assert self.log.items() == self.kept
        buffer = _buffer(self.log)
        buffer += b"x"  # a BufferError if a read left a view that keeps the buffer from growing
        del buffer[-1:]
        for patch in self.patches:
            patch.stop()


test_memory_log_against_a_list = MemoryLogAgainstAList.TestCase
test_memory_log_against_a_list.settings = settings(max_examples=150, stateful_step_count=30)
