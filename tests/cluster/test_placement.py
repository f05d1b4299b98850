"""Rendezvous placement: deterministic, total, and it moves only what a view change must move."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervision.cluster.placement import PlacementError, owner, ranked

node_ids = st.text(min_size=1, max_size=12)
node_sets = st.sets(node_ids, min_size=1, max_size=8)
session_ids = st.text(max_size=24)


@given(session_ids, node_sets, st.randoms())
def test_every_view_order_places_a_session_alike(
    session_id: str, nodes: set[str], shuffler: object
) -> None:
    listed = sorted(nodes)
    shuffled = list(nodes)
    shuffler.shuffle(shuffled)  # type: ignore[attr-defined]
    assert owner(session_id, listed) == owner(session_id, shuffled + shuffled[:1])
    assert ranked(session_id, listed) == ranked(session_id, shuffled)


@given(session_ids, node_sets)
def test_the_ranking_holds_every_node_once_owner_first(session_id: str, nodes: set[str]) -> None:
    order = ranked(session_id, nodes)
    assert sorted(order) == sorted(nodes)
    assert order[0] == owner(session_id, nodes)


@given(session_ids, node_sets, node_ids)
def test_a_node_leaving_moves_only_its_own_sessions_to_their_next_node(
    session_id: str, nodes: set[str], leaving: str
) -> None:
    nodes = nodes | {leaving}
    before = ranked(session_id, nodes)
    remaining = nodes - {leaving}
    if not remaining:
        return
    after = owner(session_id, remaining)
    if before[0] == leaving:
        assert after == before[1]
    else:
        assert after == before[0]


@given(session_ids, node_sets, node_ids)
def test_a_node_joining_takes_sessions_only_for_itself(
    session_id: str, nodes: set[str], joining: str
) -> None:
    after = owner(session_id, nodes | {joining})
    assert after in (owner(session_id, nodes), joining)


def test_sessions_spread_evenly_and_a_join_moves_about_its_share() -> None:
    nodes = ["node-a", "node-b", "node-c"]
    sessions = [f"session-{index}" for index in range(3000)]
    counts = Counter(owner(session_id, nodes) for session_id in sessions)
    assert all(800 <= count <= 1200 for count in counts.values()), counts
    moved = [s for s in sessions if owner(s, [*nodes, "node-d"]) != owner(s, nodes)]
    assert 600 <= len(moved) <= 900  # about a quarter, all of it to the new node
    assert {owner(s, [*nodes, "node-d"]) for s in moved} == {"node-d"}


def test_no_nodes_is_refused_naming_the_session() -> None:
    with pytest.raises(PlacementError, match="session 's' cannot be placed: no live nodes"):
        owner("s", [])
