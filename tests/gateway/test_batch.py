"""Batched subscriptions (`batch: true`) carry the same events in the same order as unbatched."""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Sequence
from typing import Any

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.session import Event
from supervision.gateway.cursors import EventBatch, EventTexts, LogCursor, encode_event
from supervision.gateway.transport import WEBSOCKET_FRAMING
from tests.gateway.helpers import connect, running_gateway


async def _a_log() -> list[Event]:
    async with running_gateway() as gateway:
        agent = await gateway.directory.create(profile="default", owner=None)
        agent.followup('call list_files {"path": "."}')
        agent.followup("and say something")
        await agent.when_idle()
        await agent.session.flush()
        return list(agent.session.durable_events(0))


@functools.cache
def _events() -> list[Event]:
    return trio.run(_a_log)


def _payload(frame: bytes) -> bytes:
    """The payload of one unmasked websocket text frame."""
    assert frame[0] == 0x81
    length, start = frame[1], 2
    if length == 126:
        (length,), start = struct.unpack("!H", frame[2:4]), 4
    elif length == 127:
        (length,), start = struct.unpack("!Q", frame[2:10]), 10
    assert len(frame) == start + length
    return frame[start:]


def _stream(cursor: LogCursor, batches: Sequence[tuple[int, int]], head: int) -> list[Any]:
    """What `cursor` sends for the fan-out's batches `events[start:end]`, decoded, in order.

    Each item is ("event", seq, the event's bytes as sent) or ("caughtUp", seq).
    """
    events = _events()
    items: list[Any] = []
    for start, end in batches:
        batch = EventBatch(events[start:end], head)
        for frame in cursor.frames(batch, WEBSOCKET_FRAMING):
            payload = _payload(frame)
            message = json.loads(payload)
            method, params = message["method"], message["params"]
            assert params["subscription"] == cursor.subscription
            if method == "_harness/log/caughtUp":
                items.append(("caughtUp", params["seq"]))
                continue
            assert params["sessionId"] == cursor.session_id
            if method == "_harness/log/event":
                sent = [params["event"]]
            else:
                assert method == "_harness/log/events" and cursor.batch
                sent = params["events"]
                if len(sent) > 1:  # only a single event may exceed the limit
                    body = sum(len(encode_event(events[e["seq"]])) for e in sent)
                    assert body + len(sent) - 1 <= cursor.batch_max_bytes
            for event in sent:
                text = encode_event(events[event["seq"]])
                assert text in payload  # the stored event's bytes, exactly
                items.append(("event", event["seq"], text))
    return items


@st.composite
def _deliveries(draw: st.DrawFn) -> tuple[list[tuple[int, int]], int]:
    """Contiguous batches over the log, each starting at or before the previous one's end."""
    count = len(_events())
    batches: list[tuple[int, int]] = []
    position = draw(st.integers(0, count - 1))
    first = position
    while position < count:
        start = draw(st.integers(max(first, position - 3), position))  # some already delivered
        end = draw(st.integers(position + 1, min(count, position + 40)))
        batches.append((start, end))
        position = end
    return batches, first


@settings(max_examples=200, deadline=None)
@given(
    deliveries=_deliveries(),
    types=st.none()
    | st.deferred(lambda: st.frozensets(st.sampled_from(sorted({e.type for e in _events()})))),
    limit=st.sampled_from([1, 200, 1000, 256 * 1024]),
    head_extra=st.integers(0, 1),
    live=st.booleans(),
)
def test_batched_and_unbatched_cursors_send_the_same_events_in_the_same_order(
    deliveries: tuple[list[tuple[int, int]], int],
    types: frozenset[str] | None,
    limit: int,
    head_extra: int,
    live: bool,
) -> None:
    """`live`: the cursor joined the fan-out at the head (caught up already)."""
    batches, first = deliveries
    head = len(_events()) - 1 + head_extra  # head_extra: never caught up within these batches
    streams = [
        _stream(
            LogCursor(
                subscription="s",
                session_id="x",
                next_seq=first,
                texts=EventTexts(),
                types=types,
                batch=batch,
                batch_max_bytes=limit,
                caught_up=live,
            ),
            batches,
            head,
        )
        for batch in (False, True)
    ]
    assert streams[0] == streams[1]
    expected = [e for e in _events()[first:] if types is None or e.type in types]
    assert [item[1] for item in streams[0] if item[0] == "event"] == [e.seq for e in expected]
    caught_up = [item for item in streams[0] if item[0] == "caughtUp"]
    assert caught_up == ([] if head_extra or live else [("caughtUp", len(_events()) - 1)])


async def test_a_batched_subscription_gets_the_log_in_fewer_frames() -> None:
    async with (
        running_gateway() as gateway,
        connect(gateway) as plain,
        connect(gateway) as batched,
    ):
        with trio.fail_after(30):
            agent = await gateway.directory.create(profile="default", owner=None)
            sid = agent.session.id
            for client, batch in ((plain, False), (batched, True)):
                reply = await client.call(
                    "_harness/log/subscribe", {"sessionId": sid, "fromSeq": 0, "batch": batch}
                )
                assert reply["fromSeq"] == 0
            for turn in range(3):
                agent.followup(f"turn {turn}")
            await agent.when_idle()
            await agent.session.flush()
            expected = [json.dumps(e) for e in agent.session.to_json()]
            for client in (plain, batched):
                await client.wait_for_log_events(len(expected))
                assert [json.dumps(e) for e in client.log_events[sid]] == expected
            kinds = {n["method"] for n in batched.notifications}
            assert "_harness/log/event" not in kinds and "_harness/log/events" in kinds
            frames = [n for n in batched.notifications if n["method"] == "_harness/log/events"]
            assert len(frames) < len(expected)
            # A resubscription from the middle gets the rest, batched, exactly once.
            async with connect(gateway) as late:
                middle = len(expected) // 2
                await late.call(
                    "_harness/log/subscribe", {"sessionId": sid, "fromSeq": middle, "batch": True}
                )
                await late.wait_for(lambda n: n["method"] == "_harness/log/caughtUp")
                assert [json.dumps(e) for e in late.log_events[sid]] == expected[middle:]


async def test_batch_must_be_a_boolean() -> None:
    async with running_gateway() as gateway, connect(gateway) as client:
        agent = await gateway.directory.create(profile="default", owner=None)
        answer = await client.request(
            "_harness/log/subscribe", {"sessionId": agent.session.id, "batch": "yes"}
        )
        assert answer["error"]["code"] == -32602
        assert answer["error"]["data"]["path"] == "/batch"
