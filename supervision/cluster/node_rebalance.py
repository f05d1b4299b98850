"""Rebalancing on a node: give up sessions whose rendezvous owner is now another node.

When the membership view changes (a node joined), every session this node
hosts whose owner over the new view is another node is released at its
next turn boundary, never mid-turn: once its agent is idle, its log
subscribers here are told `_harness/log/moved` (the gateway resumes them on
the new owner), and its agent is closed, which flushes the log and releases
the lease. The new owner takes it over on first touch. Sessions whose owner
did not change stay where they are.

A session this node starts while its view places it on another node (a
gateway sent it here because the owner looked down from there, or its
view is older) is released the same way, at its first idle moment after
`takeover_grace`; without that, such a session would stay here, and every
call its owner gets would be answered `MOVED` until the next view change.

An idle agent has no input waiting (queuing a prompt wakes it at once), so
a prompt still being answered here then only replays a turn already in the
log: it is not waited for, and finishes from the store after the release.
While a session's agent is being closed, calls for it here are answered
`MOVED` (`closing_here`), so no new input reaches an agent on its way out.
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


TAKEOVER_GRACE_SECONDS = 1.0
"""How long a session started here while owned elsewhere stays before it may be released: the
call that started it queues its input in that time (queued input keeps the agent busy)."""


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
    takeover_grace: float = TAKEOVER_GRACE_SECONDS
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
        """Check the hosted sessions at every view change, and each session as it starts
        here, until cancelled.

        Cancellation: stops; sessions being released finish their release or stay.
        """
        version = self.view.version
        async with trio.open_nursery() as nursery:

            def check(session_id: str, grace: float) -> None:
                if session_id not in self._releasing and self.owned_elsewhere(session_id):
                    self._releasing.add(session_id)
                    nursery.start_soon(self._release_when_idle, session_id, grace)

            stop = self.gateway.directory.on_start(lambda sid: check(sid, self.takeover_grace))
            try:
                while True:
                    version = await self.view.wait_changed(version)
                    for session_id in hosted_sessions(self.gateway):
                        check(session_id, 0.0)
            finally:
                stop()

    async def _release_when_idle(self, session_id: str, grace: float) -> None:
        try:
            await trio.sleep(grace)
            agent = self.gateway.directory.live_agent(session_id)
            if agent is None:
                return
            async with agent.session.watch() as events:
                while agent.status != "idle":
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
