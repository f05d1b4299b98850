"""`Outbox.push_log`: relayed log frames go past the lane capacity, up to the relay limit."""

from __future__ import annotations

import pytest

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
