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
from supervision.gateway.cursors import EventBatch, EventTexts, LogCursor
from supervision.gateway.encoding import encode_event
from supervision.gateway.outbox import MERGED_END, MERGED_HEAD, MERGED_SEPARATOR, Outbox
from supervision.gateway.protocol import encode, notification
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


MERGED_LIMIT = 2000
"""`Outbox.merged_max_bytes` in the merged-frame test (a few batches per frame)."""


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


def _stream(
    cursor: LogCursor,
    batches: Sequence[tuple[int, int]],
    head: int,
    takes: Sequence[bool] = (),
) -> list[Any]:
    """What `cursor` sends for the fan-out's batches `events[start:end]`, decoded, in order.

    The frames go through an `Outbox` as the fan-out queues them (a merged
    cursor's whole batches into the open merged frame); the writer takes
    the lane after batch i when `takes[i]`, and at the end. Each item is
    ("event", seq, the event's bytes as sent) or ("caughtUp", seq).
    """
    outbox = Outbox(merged_max_bytes=MERGED_LIMIT)
    written: list[bytes] = []
    for index, (start, end) in enumerate(batches):
        batch = EventBatch(_events()[start:end], head)
        joined = cursor.whole(batch) if cursor.merge else None
        if joined is not None:
            assert outbox.offer_merged(cursor.batch_prefix, joined, WEBSOCKET_FRAMING)
            caught_up = cursor.caught_up_frame(batch.head, WEBSOCKET_FRAMING)
            if caught_up is not None:  # as `_LiveLog.deliver`: right behind the merged frame
                outbox.after_merged(caught_up)
        else:
            frames = cursor.frames(batch, WEBSOCKET_FRAMING)
            assert outbox.offer_log(frames, sum(map(len, frames)))
        if index < len(takes) and takes[index]:
            written.extend(outbox.take())
    written.extend(outbox.take())
    return _decode(written, {cursor.subscription: cursor})[cursor.subscription]


def _decode(frames: Sequence[bytes], cursors: dict[str, LogCursor]) -> dict[str, list[Any]]:
    """Each subscription's items (see `_stream`) in the frames, checking their form and limits."""
    events = _events()
    items: dict[str, list[Any]] = {name: [] for name in cursors}
    for frame in frames:
        payload = _payload(frame)
        message = json.loads(payload)
        method, params = message["method"], message["params"]
        if method == "_harness/log/merged":
            batches = params["batches"]
            assert batches and all(cursors[b["subscription"]].merge for b in batches)
            if len(batches) > 1:  # only a single batch may exceed the frame's limit
                size = len(payload) - len(MERGED_HEAD) - len(MERGED_END) + len(MERGED_SEPARATOR)
                assert size <= MERGED_LIMIT
            runs = [("_harness/log/events", b) for b in batches]
        else:
            runs = [(method, params)]
        for method, params in runs:
            cursor = cursors[params["subscription"]]
            if method == "_harness/log/caughtUp":
                items[cursor.subscription].append(("caughtUp", params["seq"]))
                continue
            assert params["sessionId"] == cursor.session_id
            if method == "_harness/log/event":
                assert not cursor.batch
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
                items[cursor.subscription].append(("event", event["seq"], text))
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
    takes=st.lists(st.booleans(), max_size=40),
)
def test_batched_merged_and_unbatched_cursors_send_the_same_events_in_the_same_order(
    deliveries: tuple[list[tuple[int, int]], int],
    types: frozenset[str] | None,
    limit: int,
    head_extra: int,
    live: bool,
    takes: list[bool],
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
                merge=merge,
                batch_max_bytes=limit,
                caught_up=live,
            ),
            batches,
            head,
            takes,
        )
        for batch, merge in ((False, False), (True, False), (False, True))
    ]
    assert streams[0] == streams[1] == streams[2]
    expected = [e for e in _events()[first:] if types is None or e.type in types]
    assert [item[1] for item in streams[0] if item[0] == "event"] == [e.seq for e in expected]
    caught_up = [item for item in streams[0] if item[0] == "caughtUp"]
    assert caught_up == ([] if head_extra or live else [("caughtUp", len(_events()) - 1)])


@settings(max_examples=200, deadline=None)
@given(
    deliveries=_deliveries(),
    subscriptions=st.integers(1, 4),
    kinds=st.lists(st.sampled_from(["plain", "batch", "merge"]), min_size=4, max_size=4),
    caught_up=st.lists(st.booleans(), min_size=4, max_size=4),
    takes=st.lists(st.booleans(), max_size=40),
)
def test_merged_frames_carry_every_subscriptions_batches_in_order(
    deliveries: tuple[list[tuple[int, int]], int],
    subscriptions: int,
    kinds: list[str],
    caught_up: list[bool],
    takes: list[bool],
) -> None:
    """Several subscriptions of one connection (any mix of kinds, live ones that still owe
    their `caughtUp` among them) fed the same rounds, as the fan-out does: each one's events
    arrive exactly once, in order, whatever the frames, and the `caughtUp` after them."""
    batches, first = deliveries
    head = len(_events()) - 1
    cursors = {
        f"sub-{index}": LogCursor(
            subscription=f"sub-{index}",
            session_id="x",
            next_seq=first,
            texts=EventTexts(),
            batch=kinds[index] == "batch",
            merge=kinds[index] == "merge",
            caught_up=caught_up[index],
        )
        for index in range(subscriptions)
    }
    outbox = Outbox(merged_max_bytes=MERGED_LIMIT)
    written: list[bytes] = []
    for index, (start, end) in enumerate(batches):
        batch = EventBatch(_events()[start:end], head)
        for cursor in cursors.values():
            joined = cursor.whole(batch) if cursor.merge else None
            if joined is not None:
                assert outbox.offer_merged(cursor.batch_prefix, joined, WEBSOCKET_FRAMING)
                late = cursor.caught_up_frame(batch.head, WEBSOCKET_FRAMING)
                if late is not None:  # as `_LiveLog.deliver`: right behind the merged frame
                    outbox.after_merged(late)
            else:
                frames = cursor.frames(batch, WEBSOCKET_FRAMING)
                assert outbox.offer_log(frames, sum(map(len, frames)))
        if index < len(takes) and takes[index]:
            written.extend(outbox.take())
    written.extend(outbox.take())
    expected = [("event", e.seq, encode_event(e)) for e in _events()[first:]]
    assert _decode(written, cursors) == {
        name: expected + ([] if caught_up[index] else [("caughtUp", head)])
        for index, name in enumerate(cursors)
    }


def test_live_merged_subscriptions_first_batches_share_the_rounds_frame_then_catch_up() -> None:
    # A live subscription's first batch (it still owes its `caughtUp`) goes into the open
    # merged frame like any other, and its `caughtUp` follows that frame: one merged frame
    # per round, not one per new subscription.
    events = _events()
    cursors = [
        LogCursor(subscription=name, session_id=name, next_seq=0, texts=EventTexts(), merge=True)
        for name in ("a", "b", "c")
    ]
    outbox = Outbox()
    batch = EventBatch(events[:3], 2)
    for cursor in cursors:
        joined = cursor.whole(batch)
        assert joined is not None
        assert outbox.offer_merged(cursor.batch_prefix, joined, WEBSOCKET_FRAMING)
        late = cursor.caught_up_frame(batch.head, WEBSOCKET_FRAMING)
        assert late is not None
        outbox.after_merged(late)
    messages = [json.loads(_payload(frame)) for frame in outbox.take()]
    assert [m["method"] for m in messages] == ["_harness/log/merged"] + [
        "_harness/log/caughtUp"
    ] * 3
    assert [b["subscription"] for b in messages[0]["params"]["batches"]] == ["a", "b", "c"]
    assert [m["params"] for m in messages[1:]] == [
        {"subscription": name, "seq": 2} for name in ("a", "b", "c")
    ]
    assert all(cursor.caught_up_frame(2, WEBSOCKET_FRAMING) is None for cursor in cursors)


def test_a_round_of_merged_subscriptions_is_one_frame_until_another_frame_comes_between() -> None:
    events = _events()
    cursors = {
        name: LogCursor(
            subscription=name,
            session_id=session,
            next_seq=0,
            texts=EventTexts(),
            merge=True,
            caught_up=True,
        )
        for name, session in (("a", "s-1"), ("b", "s-2"), ("c", "s-1"))
    }
    outbox = Outbox()
    batch = EventBatch(events[:3], len(events) - 1)
    for cursor in cursors.values():
        joined = cursor.whole(batch)
        assert joined is not None
        assert outbox.offer_merged(cursor.batch_prefix, joined, WEBSOCKET_FRAMING)
    assert outbox.queued_frames == 1
    (frame,) = outbox.take()
    message = json.loads(_payload(frame))
    assert message["method"] == "_harness/log/merged"
    assert [(b["subscription"], b["sessionId"]) for b in message["params"]["batches"]] == [
        ("a", "s-1"),
        ("b", "s-2"),
        ("c", "s-1"),
    ]
    # A frame queued between two batches seals the open merged frame: the order holds.
    batch = EventBatch(events[3:5], len(events) - 1)
    a, b, c = (cursors[name].whole(batch) for name in "abc")
    assert a is not None and b is not None and c is not None
    outbox.offer_merged(cursors["a"].batch_prefix, a, WEBSOCKET_FRAMING)
    outbox.offer_log([WEBSOCKET_FRAMING.frame(b'{"jsonrpc":"2.0","method":"x"}')], 1)
    outbox.offer_merged(cursors["b"].batch_prefix, b, WEBSOCKET_FRAMING)
    outbox.offer_merged(cursors["c"].batch_prefix, c, WEBSOCKET_FRAMING)
    methods = [json.loads(_payload(f))["method"] for f in outbox.take()]
    assert methods == ["_harness/log/merged", "x", "_harness/log/merged"]


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


async def test_merged_subscriptions_get_their_sessions_logs_in_shared_frames() -> None:
    async with running_gateway() as gateway, connect(gateway) as client:
        with trio.fail_after(30):
            agents = [
                await gateway.directory.create(profile="default", owner=None) for _ in range(2)
            ]
            for agent in agents:
                await client.call(
                    "_harness/log/subscribe", {"sessionId": agent.session.id, "merge": True}
                )
            for turn in range(3):
                for agent in agents:
                    agent.followup(f"turn {turn}")
            for agent in agents:
                await agent.when_idle()
                await agent.session.flush()
            expected = {a.session.id: [json.dumps(e) for e in a.session.to_json()] for a in agents}
            await client.wait_for_log_events(sum(map(len, expected.values())))
            assert {
                sid: [json.dumps(e) for e in events] for sid, events in client.log_events.items()
            } == expected
            kinds = {n["method"] for n in client.notifications}
            assert "_harness/log/event" not in kinds and "_harness/log/events" not in kinds
            merged = [n for n in client.notifications if n["method"] == "_harness/log/merged"]
            assert len(merged) < sum(map(len, expected.values()))


@given(subscription=st.text(), seq=st.integers(0, 2**53))
def test_the_caught_up_frame_is_the_generic_encoding_of_its_notification(
    subscription: str, seq: int
) -> None:
    cursor = LogCursor(subscription=subscription, session_id="s", next_seq=seq, texts=EventTexts())
    cursor.next_seq = seq + 1
    frame = cursor.caught_up_frame(seq, WEBSOCKET_FRAMING)
    assert frame is not None
    expected = notification("_harness/log/caughtUp", {"subscription": subscription, "seq": seq})
    assert frame == WEBSOCKET_FRAMING.frame(encode(expected))
    assert cursor.caught_up_frame(seq, WEBSOCKET_FRAMING) is None  # once
