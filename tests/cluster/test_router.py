"""The cluster gateway in process over in-process nodes: routing, aggregation, takeover."""

from __future__ import annotations

import pytest
import trio

from supervision.cluster import owner
from tests.cluster.helpers import CLUSTER_SECRET, cluster_config, running_cluster
from tests.gateway.helpers import connect


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
        nursery.cancel_scope.cancel()
