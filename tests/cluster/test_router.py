"""The cluster gateway in process over in-process nodes: routing, aggregation, takeover."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import trio

from actors.session import Event
from actors.session.events import TurnEnd, TurnStart
from actors.session.postgres_store import PostgresStore
from supervision.cluster import MembershipView, owner
from supervision.cluster.wire import MOVED
from supervision.gateway import Token
from supervision.gateway.protocol import OVERLOADED
from tests.cluster.helpers import (
    CLUSTER_SECRET,
    cluster_config,
    raw_node_client,
    running_cluster,
    start_gateway,
    start_node,
    wait_nodes,
)
from tests.gateway.helpers import connect


async def stored_events(dsn: str, session_id: str) -> list[Event]:
    store = PostgresStore(dsn)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.serve)
        events = await store.load(session_id)
        nursery.cancel_scope.cancel()
    return list(events)


@pytest.fixture(autouse=True)
def _secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_CLUSTER_TOKEN", CLUSTER_SECRET)


def text(value: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": value}]


async def test_sessions_are_placed_by_rendezvous_and_views_cover_every_node(
    postgres_dsn: str,
) -> None:
    config = cluster_config(postgres_dsn)
    async with trio.open_nursery() as nursery:
        async with (
            running_cluster(config, ("a", "b"), nursery) as (_, gateway),
            connect(gateway) as client,
        ):
            watch = (await client.call("_harness/sessions/watch", {}))["subscription"]
            ids = []
            for _ in range(6):
                new = await client.call("session/new", {"cwd": "/", "mcpServers": []})
                ids.append(new["sessionId"])
            for sid in ids:
                reply = await client.call(
                    "session/prompt", {"sessionId": sid, "prompt": text("hi")}
                )
                assert reply["stopReason"] == "end_turn"
            updates = [n for n in client.notifications if n["method"] == "session/update"]
            assert {n["params"]["sessionId"] for n in updates} == set(ids)
            stats = await client.call("_harness/stats", {})
            per_node = {e["nodeId"]: e["stats"]["sessions"]["live"] for e in stats["nodes"]}
            expected = {"a": 0, "b": 0}
            for sid in ids:
                expected[owner(sid, ["a", "b"])] += 1
            assert per_node == expected
            assert stats["sessions"]["live"] == 6
            assert stats["fencedCommits"] == 0
            listed = await client.call("session/list", {})
            assert {row["sessionId"] for row in listed["sessions"]} == set(ids)
            harness_listed = await client.call("_harness/sessions/list", {})
            assert {row["sessionId"] for row in harness_listed["sessions"]} == set(ids)
            state = await client.call("_harness/session/state", {"sessionId": ids[0]})
            assert state["status"] == "idle"
            added = {
                n["params"]["session"]["sessionId"]
                for n in client.notifications
                if n["method"] == "_harness/sessions/changed"
                and n["params"]["change"] == "added"
                and n["params"]["subscription"] == watch
            }
            assert added == set(ids)
            tree = (await client.call("_harness/supervision/tree", {}))["tree"]
            assert sorted(child["path"].partition("/")[0] for child in tree["children"]) == [
                "a",
                "b",
            ]
            agents = [c for node in tree["children"] for c in node["children"]]
            assert len(agents) == 6
            subscribed = await client.call(
                "_harness/log/subscribe", {"sessionId": ids[0], "fromSeq": 0}
            )
            assert (
                await client.call(
                    "_harness/log/unsubscribe", {"subscription": subscribed["subscription"]}
                )
                == {}
            )
            missing = await client.request(
                "_harness/log/unsubscribe", {"subscription": subscribed["subscription"]}
            )
            # As the single-process gateway answers it (tests/gateway/test_methods.py).
            assert missing["error"]["code"] == -32002
            assert missing["error"]["data"] == {"reason": "not_found"}
            assert subscribed["subscription"] in missing["error"]["message"]
        nursery.cancel_scope.cancel()


async def test_a_node_answers_moved_for_a_session_another_node_holds(postgres_dsn: str) -> None:
    config = cluster_config(postgres_dsn)
    async with (
        trio.open_nursery() as nursery,
        running_cluster(config, ("a", "b"), nursery) as (_, gateway),
        connect(gateway) as client,
    ):
        sid = (await client.call("session/new", {"cwd": "/", "mcpServers": []}))["sessionId"]
        holder = owner(sid, ["a", "b"])
        other = next(n for n in gateway.methods.router.view.nodes if n.node_id != holder)
        async with raw_node_client(other.endpoint) as direct:
            reply = await direct.request("_harness/session/state", {"sessionId": sid})
        assert reply["error"]["code"] == MOVED
        assert reply["error"]["data"]["reason"] == "moved"
        assert reply["error"]["data"]["retryAfterMs"] > 0
        assert reply["error"]["data"]["holderNode"] == holder
        assert "held by another node" in reply["error"]["message"]
        nursery.cancel_scope.cancel()


async def test_a_live_holder_that_keeps_a_session_gets_the_call_after_a_grace(
    postgres_dsn: str,
) -> None:
    # Nodes a, b, c all live; a gateway that sees only a and b places sessions there.
    # Over all three some belong to c, though no view changes after they start, so
    # nothing tells their node to release them: a full-view gateway's call reaches c,
    # is refused MOVED naming the live holder, and after the grace goes to the holder
    # (before, c answered MOVED until the call gave up).
    config = cluster_config(postgres_dsn)
    async with trio.open_nursery() as nursery:
        async with running_cluster(config, ("a", "b", "c"), nursery) as (_, full):
            two = MembershipView()
            two._update(tuple(n for n in full.methods.router.view.nodes if n.node_id != "c"))
            narrow = await start_gateway(config, nursery, view=two)
            async with connect(narrow) as placing:
                sid = ""
                while owner(sid, ["a", "b", "c"]) != "c":
                    new = await placing.call("session/new", {"cwd": "/", "mcpServers": []})
                    sid = new["sessionId"]
            router = full.methods.router
            router.retry_deadline = 8
            router.holder_grace = 1.0
            async with connect(full) as client:
                started = trio.current_time()
                with trio.fail_after(20):
                    reply = await client.call(
                        "session/prompt", {"sessionId": sid, "prompt": text("one")}
                    )
                assert reply["stopReason"] == "end_turn"
                assert trio.current_time() - started >= router.holder_grace
        nursery.cancel_scope.cancel()


async def test_a_session_is_taken_over_on_first_touch_when_its_node_leaves(
    postgres_dsn: str,
) -> None:
    config = cluster_config(postgres_dsn)
    async with (
        trio.open_nursery() as nursery,
        running_cluster(config, ("a", "b"), nursery) as (scopes, gateway),
        connect(gateway) as client,
    ):
        sid = (await client.call("session/new", {"cwd": "/", "mcpServers": []}))["sessionId"]
        first = owner(sid, ["a", "b"])
        await client.call("session/prompt", {"sessionId": sid, "prompt": text("one")})
        scopes[first].cancel()  # a clean stop: it leaves the view and releases its leases
        await wait_nodes(gateway, 1)
        reply = await client.call("session/prompt", {"sessionId": sid, "prompt": text("two")})
        assert reply["stopReason"] == "end_turn"
        stats = await client.call("_harness/stats", {})
        assert [(e["nodeId"], e["stats"]["sessions"]["live"]) for e in stats["nodes"]] == [
            (next(n for n in ("a", "b") if n != first), 1)
        ]
        read = await client.call("_harness/log/read", {"sessionId": sid, "fromSeq": 0})
        turns = [e["data"]["turn"] for e in read["events"] if e["type"] == "turn/start"]
        assert turns == [1, 2] or turns == [0, 1]
        nursery.cancel_scope.cancel()


async def test_a_joining_node_takes_over_only_its_sessions_at_turn_boundaries(
    postgres_dsn: str,
) -> None:
    config = cluster_config(postgres_dsn)
    async with (
        trio.open_nursery() as nursery,
        running_cluster(config, ("a",), nursery) as (_, gateway),
        connect(gateway) as client,
    ):
        ids = [
            (await client.call("session/new", {"cwd": "/", "mcpServers": []}))["sessionId"]
            for _ in range(8)
        ]
        for sid in ids:
            await client.call("session/prompt", {"sessionId": sid, "prompt": text("one")})
        moving = [sid for sid in ids if owner(sid, ["a", "b"]) == "b"]
        staying = [sid for sid in ids if sid not in moving]
        assert moving and staying
        watched = moving[0]
        await client.call("_harness/log/subscribe", {"sessionId": watched, "fromSeq": 0})
        await start_node(config, "b", nursery)
        await wait_nodes(gateway, 2)
        for sid in ids:
            reply = await client.call("session/prompt", {"sessionId": sid, "prompt": text("two")})
            assert reply["stopReason"] == "end_turn"
        stats = await client.call("_harness/stats", {})
        live = {e["nodeId"]: e["stats"]["sessions"]["live"] for e in stats["nodes"]}
        assert live == {"a": len(staying), "b": len(moving)}
        read = await client.call("_harness/log/read", {"sessionId": watched, "fromSeq": 0})
        with trio.fail_after(10):
            while len(client.log_events.get(watched, [])) < len(read["events"]):
                await client.wait_for_log_events(client.log_event_count + 1)
        assert client.log_events[watched] == read["events"]
        nursery.cancel_scope.cancel()


async def test_two_gateways_with_different_views_never_make_two_writers(
    postgres_dsn: str,
) -> None:
    config = cluster_config(postgres_dsn)
    async with trio.open_nursery() as nursery:
        async with running_cluster(config, ("a", "b"), nursery) as (_, first):
            a_only = MembershipView()
            a_only._update(tuple(n for n in first.methods.router.view.nodes if n.node_id == "a"))
            second = await start_gateway(config, nursery, view=a_only, retry_deadline=3)
            outcomes: list[dict[str, Any]] = []
            async with connect(first) as one, connect(second) as two:
                ids = [
                    (await one.call("session/new", {"cwd": "/", "mcpServers": []}))["sessionId"]
                    for _ in range(4)
                ]

                async def prompts(client: Any, label: str) -> None:
                    for round in range(2):
                        for sid in ids:
                            outcomes.append(
                                await client.request(
                                    "session/prompt",
                                    {"sessionId": sid, "prompt": text(f"{label} {round}")},
                                )
                            )

                async with trio.open_nursery() as both:
                    both.start_soon(prompts, one, "one")
                    both.start_soon(prompts, two, "two")
        nursery.cancel_scope.cancel()
    completed = 0
    for outcome in outcomes:
        if "error" in outcome:
            assert outcome["error"]["code"] == OVERLOADED, outcome  # gave up after MOVED
        else:
            assert outcome["result"]["stopReason"] == "end_turn"
            completed += 1
    assert completed >= len(ids) * 2  # the first gateway's prompts all went through
    for sid in ids:
        events = await stored_events(postgres_dsn, sid)
        assert [e.seq for e in events] == list(range(len(events)))
        open_turn = None
        turns = []
        for event in events:
            if isinstance(event.data, TurnStart):
                assert open_turn is None, f"{sid}: turn {event.data.turn} opened inside another"
                open_turn = event.data.turn
                turns.append(open_turn)
            elif isinstance(event.data, TurnEnd):
                assert event.data.turn == open_turn, f"{sid}: turn/end of a turn not open"
                assert event.data.reason.kind == "completed", event
                open_turn = None
        assert turns == list(range(turns[0], turns[0] + len(turns)))
        completed -= len(turns)
    assert completed == 0  # every completed prompt is one turn in the log, and no more


async def test_a_node_whose_lease_was_taken_is_fenced_and_keeps_serving(
    postgres_dsn: str,
) -> None:
    config = cluster_config(postgres_dsn)
    async with trio.open_nursery() as nursery:
        async with running_cluster(config, ("a",), nursery) as (_, gateway):
            gateway.methods.router.retry_deadline = 3
            async with connect(gateway) as client:
                sid = (await client.call("session/new", {"cwd": "/", "mcpServers": []}))[
                    "sessionId"
                ]
                await client.call("session/prompt", {"sessionId": sid, "prompt": text("one")})
                before = len(await stored_events(postgres_dsn, sid))
                # Another writer takes the lease over (as after a stall past its expiry).
                with psycopg.connect(postgres_dsn, autocommit=True) as connection:
                    connection.execute(
                        "UPDATE harness_leases SET epoch = epoch + 1, owner = 'thief', "
                        "expires_at = clock_timestamp() + interval '60 s' WHERE session_id = %s",
                        (sid,),
                    )
                reply = await client.request(
                    "session/prompt", {"sessionId": sid, "prompt": text("two")}
                )
                assert reply["error"]["code"] == OVERLOADED, reply
                assert "held by another node" in reply["error"]["message"]
                stats = await client.call("_harness/stats", {})
                assert stats["fencedCommits"] >= 1
                assert stats["nodes"][0]["stats"]["node"]["fencedCommits"] >= 1
                other = (await client.call("session/new", {"cwd": "/", "mcpServers": []}))[
                    "sessionId"
                ]
                done = await client.call(
                    "session/prompt", {"sessionId": other, "prompt": text("still here")}
                )
                assert done["stopReason"] == "end_turn"
        nursery.cancel_scope.cancel()
    assert len(await stored_events(postgres_dsn, sid)) == before


def logged_request_ids(read: dict[str, Any]) -> list[str | None]:
    return [
        e["data"].get("source", {}).get("request_id")
        for e in read["events"]
        if e["type"] == "user/message"
    ]


async def test_a_send_retried_after_its_first_attempt_was_logged_is_logged_once(
    postgres_dsn: str,
) -> None:
    config = cluster_config(postgres_dsn)
    async with (
        trio.open_nursery() as nursery,
        running_cluster(config, ("a", "b"), nursery) as (scopes, gateway),
        connect(gateway) as client,
    ):
        sid = (await client.call("session/new", {"cwd": "/", "mcpServers": []}))["sessionId"]
        first = owner(sid, ["a", "b"])
        await client.call("_harness/log/subscribe", {"sessionId": sid})
        sent = {"sessionId": sid, "content": text("hello"), "placement": "next_turn"}
        assert await client.call("_harness/session/send", sent) == {
            "accepted": True,
            "placement": "next_turn",
        }
        with trio.fail_after(10):
            await client.wait_for(
                lambda m: (
                    m["method"] == "_harness/log/event"
                    and m["params"]["event"]["type"] == "turn/end"
                )
            )
        read = await client.call("_harness/log/read", {"sessionId": sid, "fromSeq": 0})
        (request_id,) = logged_request_ids(read)
        assert request_id is not None
        assert request_id.startswith(gateway.methods.router.gateway_id)
        # The node that logged it dies before its answer got back: the gateway sends the
        # call again, with the same request id, to the session's next owner.
        scopes[first].cancel()
        await wait_nodes(gateway, 1)
        (survivor,) = gateway.methods.router.view.nodes
        retry = {**sent, "_meta": {"harness": {"requestId": request_id}}}
        async with raw_node_client(survivor.endpoint) as direct:
            with trio.fail_after(15):
                while True:  # MOVED until the stopping node has released the lease
                    answer = await direct.request("_harness/session/send", retry)
                    if answer.get("error", {}).get("code") != MOVED:
                        break
                    await trio.sleep(0.2)
            assert answer["result"] == {"accepted": True, "placement": "next_turn"}
            # Twice at once on one node: the second finds the first queued, not logged yet.
            twice = {**sent, "_meta": {"harness": {"requestId": "twice"}}}
            await direct.call("_harness/session/send", twice)
            await direct.call("_harness/session/send", twice)
        reply = await client.call("session/prompt", {"sessionId": sid, "prompt": text("two")})
        assert reply["stopReason"] == "end_turn"
        read = await client.call("_harness/log/read", {"sessionId": sid, "fromSeq": 0})
        ids = logged_request_ids(read)
        assert ids.count(request_id) == 1
        assert ids.count("twice") == 1
        assert len(ids) == 3
        # session/close needs no request id: it logs nothing, so a retry changes no log.
        assert await client.call("session/close", {"sessionId": sid}) == {}
        async with raw_node_client(survivor.endpoint) as direct:
            assert await direct.call("session/close", {"sessionId": sid}) == {}
        after = await client.call("_harness/log/read", {"sessionId": sid, "fromSeq": 0})
        assert after["events"] == read["events"]
        nursery.cancel_scope.cancel()


async def test_a_supervision_event_reaches_only_clients_that_may_observe_its_session(
    postgres_dsn: str,
) -> None:
    config = cluster_config(postgres_dsn)
    elsewhere = Token(secret="elsewhere", scopes=["observe"], sessions=("nope",), name="else")
    observer = Token(secret="observer", scopes=["observe"], name="observer")
    async with trio.open_nursery() as nursery:
        async with (
            running_cluster(config, ("a", "b"), nursery, tokens=(elsewhere, observer)) as (
                _,
                gateway,
            ),
            connect(gateway) as admin,
            connect(gateway, headers=[("Authorization", "Bearer elsewhere")]) as other,
            connect(gateway, headers=[("Authorization", "Bearer observer")]) as watcher,
        ):
            sid = (await admin.call("session/new", {"cwd": "/", "mcpServers": []}))["sessionId"]
            for client in (other, watcher):
                await client.call("_harness/supervision/tree", {})  # a connection on every node
            tree = (await admin.call("_harness/supervision/tree", {}))["tree"]
            (path,) = [
                agent["path"]
                for node in tree["children"]
                for agent in node["children"]
                if agent["path"].endswith(sid)
            ]
            await admin.call("_harness/supervision/restart", {"path": path})
            with trio.fail_after(10):
                await watcher.wait_for(lambda n: n["method"] == "_harness/supervision/event")
            # A round trip through the same node: an event for `other` would have come first.
            await other.call("_harness/supervision/tree", {})
            assert not [
                n for n in other.notifications if n["method"] == "_harness/supervision/event"
            ]
        nursery.cancel_scope.cancel()
