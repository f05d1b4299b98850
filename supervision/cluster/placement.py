"""Rendezvous (highest-random-weight) placement of sessions on nodes.

Every node gets a score per session, `blake2b-64(node, session)`; the
session belongs to the node with the highest score, and the descending
order of scores is the order in which to try the others when the owner is
gone. Pure functions: any two processes with the same view of the nodes
place every session alike, with no shared state. Changing the view moves
only what must move: a node that leaves takes only its own sessions away
(each to its next-ranked node), and a node that joins takes over about a
1/N share, every session of it from its previous owner.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


class PlacementError(ValueError):
    """A session cannot be placed: there are no nodes."""


def score(node_id: str, session_id: str) -> int:
    """The node's weight for the session: the first 64 bits of BLAKE2b over both ids."""
    digest = hashlib.blake2b(
        node_id.encode("utf-8", "surrogatepass")
        + b"\x00"
        + session_id.encode("utf-8", "surrogatepass"),
        digest_size=8,
    )
    return int.from_bytes(digest.digest(), "big")


def ranked(session_id: str, nodes: Iterable[str]) -> list[str]:
    """Every node, best first, for `session_id` (ties, which need equal ids, break by id).

    The input's order and duplicates do not matter.
    """
    return sorted(set(nodes), key=lambda node: (-score(node, session_id), node))


def owner(session_id: str, nodes: Iterable[str]) -> str:
    """The node that owns `session_id` among `nodes`.

    Raises:
        PlacementError: `nodes` is empty.
    """
    candidates = ranked(session_id, nodes)
    if not candidates:
        raise PlacementError(f"session {session_id!r} cannot be placed: no live nodes")
    return candidates[0]
