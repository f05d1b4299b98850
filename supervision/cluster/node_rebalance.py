"""Rebalancing on a node: give up sessions whose rendezvous owner is now another node.

When the membership view changes (a node joined), every session this node
hosts whose owner over the new view is another node is released at its
next turn boundary, never mid-turn (and so is a session started here,
after its first turn, when the view already places it elsewhere): once its agent is idle, its log
subscribers here are told `_harness/log/moved` (the gateway resumes them on
the new owner), and its agent is closed, which flushes the log and releases
the lease. The new owner takes it over on first touch. Sessions whose owner
did not change stay where they are.

An idle agent has no input waiting (queuing a prompt wakes it at once), so
a prompt still being answered here then only replays a turn already in the
log: it is not waited for, and finishes from the store after the release.
"""

from __future__ import annotations

import logging
import weakref

import attrs
import trio

from actors.session.events import TurnEnd
from supervision.cluster.membership import MembershipView
from supervision.cluster.placement import owner
from supervision.gateway import Gateway
from supervision.gateway.protocol import notification
from supervision.gateway.sessions import AGENT_CHILD_PREFIX

log = logging.getLogger(__name__)

_CLOSING: weakref.WeakKeyDictionary[Gateway, set[str]] = weakref.WeakKeyDictionary()


def closing_here(gateway: Gateway, session_id: str) -> bool:
    """True while this node is releasing `session_id` (its agent is being closed): a call
    for it here is answered `MOVED`, never served by the agent on its way out."""
    return session_id in _CLOSING.get(gateway, ())


def hosted_sessions(gateway: Gateway) -> list[str]:
    """The sessions whose agents this node's supervisor runs."""
    return [
        child.id.removeprefix(AGENT_CHILD_PREFIX)
        for child in gateway.runtime.supervisor.children()
        if child.id.startswith(AGENT_CHILD_PREFIX)
    ]


def tell_subscribers_moved(gateway: Gateway, session_id: str) -> None:
    """End every log subscription on `session_id` here with `_harness/log/moved`."""
    for connection in list(gateway.connections):
        for subscription, cursor in list(connection.subscriptions.items()):
            if cursor.session_id != session_id:
                continue
            del connection.subscriptions[subscription]
            stop = connection.subscription_stops.pop(subscription, None)
            if stop is not None:
                stop()
            connection.send_notification(
                notification(
                    "_harness/log/moved", {"subscription": subscription, "sessionId": session_id}
                )
            )


@attrs.define(eq=False)
class Rebalancer:
    """Releases sessions owned elsewhere (see the module docstring). Run with `run()`."""

    gateway: Gateway
    view: MembershipView
    node_id: str
    releases: int = 0
    """Sessions released to another node so far."""
    _releasing: set[str] = attrs.field(factory=set)
    _closing: set[str] = attrs.field(factory=set)

    def __attrs_post_init__(self) -> None:
        _CLOSING[self.gateway] = self._closing

    def owned_elsewhere(self, session_id: str) -> bool:
        """True when the view places `session_id` on another node (and knows this one)."""
        nodes = self.view.node_ids()
        return self.node_id in nodes and owner(session_id, nodes) != self.node_id

    async def run(self) -> None:
        """Check the hosted sessions at every view change, until cancelled.

        Cancellation: stops; sessions being released finish their release or stay.
        """
        version = self.view.version
        async with trio.open_nursery() as nursery:

            def check(session_id: str, after_a_turn: bool = False) -> None:
                if session_id not in self._releasing and self.owned_elsewhere(session_id):
                    self._releasing.add(session_id)
                    nursery.start_soon(self._release_when_idle, session_id, after_a_turn)

            # A session started here after the last view change (a failover to this
            # node while views differed) is released after its next turn.
            stop = self.gateway.directory.on_start(lambda sid: check(sid, after_a_turn=True))
            try:
                while True:
                    version = await self.view.wait_changed(version)
                    for session_id in hosted_sessions(self.gateway):
                        check(session_id)
            finally:
                stop()

    async def _release_when_idle(self, session_id: str, after_a_turn: bool = False) -> None:
        try:
            agent = self.gateway.directory.live_agent(session_id)
            if agent is None:
                return
            async with agent.session.watch() as events:
                while after_a_turn or agent.status != "idle":
                    after_a_turn = False
                    async for event in events:
                        if isinstance(event.data, TurnEnd):
                            break
                    else:
                        return  # the agent ended by itself
                if not self.owned_elsewhere(session_id):
                    return
                self._closing.add(session_id)
                tell_subscribers_moved(self.gateway, session_id)
                await self.gateway.directory.close(session_id)
                self.releases += 1
                log.info("node %s released session %s to its new owner", self.node_id, session_id)
        finally:
            self._releasing.discard(session_id)
            self._closing.discard(session_id)
