"""Routed log subscriptions are resumed when their node ends them, even as they are set up.

The nodes here are fakes behind in-memory streams (`tests.cluster.fake_nodes`).
"""

from __future__ import annotations

import itertools
from typing import Any, cast

import pytest
import trio
import trio.testing

from supervision.cluster.router import RoutedSubscription, Router, RouterClient
from supervision.gateway.connection import Connection
from tests.cluster.fake_nodes import FakeCall, nodes_at


async def subscribe(router: Router, client: RouterClient, session_id: str) -> RoutedSubscription:
    """A subscription set up as the cluster gateway's `_harness/log/subscribe` does it."""
    client.subscribing += 1
    try:
        node_id, reply = await router.forward(
            client, session_id, "_harness/log/subscribe", {"sessionId": session_id, "fromSeq": 0}
        )
    finally:
        client.subscribing -= 1
    subscription = RoutedSubscription(
        id=client.new_subscription_id(),
        client=client,
        session_id=session_id,
        types=None,
        last_seq=-1,
    )
    client.serve(subscription, node_id, reply["result"]["subscription"])
    return subscription


async def test_a_subscription_moved_right_behind_its_reply_is_resumed(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The node ends the subscription (`_harness/log/moved`: it releases the session) in
    # the envelope of its reply, so the gateway gets the notification before it has
    # handled the reply. Once dropped as unknown, it left the subscription served by a
    # node that had ended it: silent for ever.
    numbers = itertools.count()

    async def moving_its_first_subscription(call: FakeCall) -> dict[str, Any]:
        if call.message["method"] == "_harness/log/unsubscribe":
            return {"result": {}}
        node_sub = f"node-sub-{next(numbers)}"
        if node_sub == "node-sub-0":
            call.notify_behind_reply(
                "_harness/log/moved", {"subscription": node_sub, "sessionId": "s"}
            )
        return {"result": {"subscription": node_sub, "fromSeq": 0, "headSeq": -1}}

    async with trio.open_nursery() as nursery:
        view = nodes_at(monkeypatch, nursery, {"a": moving_its_first_subscription})
        router = Router(view=view, secret="s", nursery=nursery)
        client = RouterClient(router=router, connection=cast(Connection, None), key="k")
        subscription = await subscribe(router, client, "s")
        await trio.testing.wait_all_tasks_blocked()
        assert (subscription.node_id, subscription.node_subscription) == ("a", "node-sub-1")
        assert not subscription.resuming
        nursery.cancel_scope.cancel()


async def test_a_subscription_whose_node_dropped_before_it_was_served_is_resumed(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The node's stream dropped after its reply came and before the gateway recorded
    # the subscription as served there: the drop's notice went to the subscriptions it
    # served then, so this one is resumed as it is recorded.
    numbers = itertools.count()

    async def subscribed(call: FakeCall) -> dict[str, Any]:
        return {"result": {"subscription": f"node-sub-{next(numbers)}", "fromSeq": 0}}

    async with trio.open_nursery() as nursery:
        view = nodes_at(monkeypatch, nursery, {"a": subscribed})
        router = Router(view=view, secret="s", nursery=nursery)
        client = RouterClient(router=router, connection=cast(Connection, None), key="k")
        client.subscribing += 1
        node_id, reply = await router.forward(
            client, "s", "_harness/log/subscribe", {"sessionId": "s", "fromSeq": 0}
        )
        client.subscribing -= 1
        router.links[node_id].close("dropped before the reply was handled")
        subscription = RoutedSubscription(
            id=client.new_subscription_id(), client=client, session_id="s", types=None, last_seq=-1
        )
        client.serve(subscription, node_id, reply["result"]["subscription"])
        await trio.testing.wait_all_tasks_blocked()
        assert (subscription.node_id, subscription.node_subscription) == ("a", "node-sub-1")
        assert router.links["a"].down is None
        nursery.cancel_scope.cancel()
