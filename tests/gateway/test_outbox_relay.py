"""`Outbox.push_log`: relayed log frames go past the lane capacity, up to the relay limit."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from supervision.gateway.outbox import Outbox, OutboxClosed, OutboxOverflow


def test_relayed_frames_are_queued_past_the_lane_capacity_in_order() -> None:
    outbox = Outbox(log_capacity=4, relay_limit=100)
    outbox.put_control(b"reply")
    for n in range(10):
        outbox.push_log([f"u{n}".encode()], 2)
    assert not outbox.log_has_room  # cursors and the fan-out wait; relayed frames did not
    assert outbox.take() == [b"reply", *(f"u{n}".encode() for n in range(10))]
    assert outbox.log_has_room


def test_relayed_frames_past_the_relay_limit_overflow_and_are_not_queued() -> None:
    outbox = Outbox(log_capacity=4, relay_limit=10)
    outbox.push_log([b"x" * 8], 8)
    with pytest.raises(OutboxOverflow, match="limit 10"):
        outbox.push_log([b"yyy"], 3)
    assert outbox.take() == [b"x" * 8]


def test_a_closed_outbox_refuses_relayed_frames() -> None:
    outbox = Outbox()
    outbox.close()
    with pytest.raises(OutboxClosed):
        outbox.push_log([b"u"], 1)


async def test_puts_woken_by_the_same_space_queue_no_more_than_the_lane_allows() -> None:
    """Every `put_log` waiting on a full lane wakes when it drains; each must check the room
    again, or all of them queue at once (the catching-up cursors of one connection)."""
    outbox = Outbox(log_capacity=1000)
    await outbox.put_log([b"x" * 900])
    async with trio.open_nursery() as nursery:
        for _ in range(50):
            nursery.start_soon(outbox.put_log, [b"y" * 900])
        await trio.testing.wait_all_tasks_blocked()
        for _ in range(49):
            assert len(b"".join(outbox.take())) <= 1000 + 900  # under the cap, plus one put
            await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
