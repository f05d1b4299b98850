"""The cluster gateway's router: places sessions on nodes and forwards calls over node links.

`Router` keeps one `NodeLink` per live node (the membership view decides
which are live; a node that leaves the view has its link closed at once,
so its callers retry) and places each session by rendezvous over the live
nodes. `forward` sends one call to the session's owner and retries it on
the next-ranked node when the owner's link drops, until `retry_deadline`.
A node that answers `MOVED` names the lease holder. A live holder (in the
view) releases the session to its owner at its next turn boundary when
rebalancing says so, so the owner is asked again after at most
`MOVED_RETRY_MS` (the call is not sent to the holder, so that it goes
idle); a live holder that still has it after `holder_grace` (nothing told
it to let go: it took the session over while its view differed) gets the
call itself. A holder that is dead or frozen is waited out for
`retryAfterMs`, the time its lease has left. A node whose stream dropped
with the call is skipped for the rest of it while the view stays the
same, except when a `MOVED` names it as the holder: it is waited out like
a dead holder, then asked again (still in the view, it renews its lease,
so it is alive: a stream can drop under a live node). A retried
`session/prompt` carries the same request id, so the node that takes the
session over answers a prompt that was already logged from the log.

`RouterClient` is one supervisor connection's side of it: its key on every
node link, and the routing of notifications back to that connection. Its
log subscriptions survive the death of the node serving them: each is
resumed on the session's next owner from the seq after the last event
delivered, and only events past that seq are passed on, so the stream the
supervisor sees has no gap and no duplicate.

Log events are paced by the supervisor's socket as in the single-process
gateway: they go into the connection's byte-bounded log lane, never its
control lane. A subscription whose event finds the lane full *falls
behind*: the event is not passed on, the node's subscription is ended,
and once the lane has room again the subscription is resumed from the
seq after the last event passed on (the node replays the rest from the
store). So a slow supervisor is never closed for its log subscriptions,
and it loses and repeats nothing.

A prompt's (or a load's) `session/update`s, and a watch's
`_harness/sessions/changed`, are relayed into the same log lane
(`Connection.relay_log`), and the prompt's reply is queued behind them
there, so it never overtakes them: a slow supervisor is closed 4008 only
when a write stalls past the write deadline, as in the single-process
gateway, or when more than the outbox's relay limit (bytes) waits (the node
does not wait for the supervisor, so the gateway cannot leave them in the
log as a cursor does).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import secrets
from collections.abc import Collection, Mapping
from typing import Any

import attrs
import trio

from supervision.cluster.membership import MembershipView, NodeInfo
from supervision.cluster.placement import ranked
from supervision.cluster.router_link import (
    ACK_DEADLINE_SECONDS,
    PING_INTERVAL_SECONDS,
    PING_TIMEOUT_SECONDS,
    ClientEnded,
    NodeDown,
    NodeLink,
)
from supervision.cluster.wire import MOVED, MOVED_RETRY_MS
from supervision.gateway.auth import Principal
from supervision.gateway.connection import CLOSE_INTERNAL, Connection
from supervision.gateway.outbox import OutboxClosed
from supervision.gateway.protocol import INTERNAL_ERROR, OVERLOADED, RpcError, dumps

log = logging.getLogger(__name__)

RETRY_DEADLINE_SECONDS = 60.0
"""How long a call may go unanswered (retried on `MOVED`, or held by a node) before it fails
-33003; the window starts again when a node is lost with the call (once per node and view)."""

HOLDER_GRACE_SECONDS = 10.0
"""How long a call waits for a live holder to release a session (at its turn boundary)
before the call is sent to the holder itself."""

EACH_NODE_DEADLINE_SECONDS = 10.0
"""How long a call sent to every node (the stats, the tree, watches) waits for each."""

CLIENT_ENDED_RETRY_SECONDS = 0.1
"""The pause before asking a node again that closed the caller's virtual connection."""

MAX_RETRY_AFTER_MS = 5000
"""The longest pause a node's `retryAfterMs` can ask for before a call is sent again."""

UNROUTED_LIMIT = 10_000
"""Log notifications held for a subscription whose reply has not been handled yet."""

_client_ids = itertools.count()


@attrs.define(eq=False)
class Router:
    """Placement and node links of one cluster gateway (see the module docstring)."""

    view: MembershipView
    secret: str = attrs.field(repr=False)
    nursery: trio.Nursery
    retry_deadline: float = RETRY_DEADLINE_SECONDS
    holder_grace: float = HOLDER_GRACE_SECONDS
    """How long a live holder named by `MOVED` may keep a session before it gets the call."""
    each_node_deadline: float = EACH_NODE_DEADLINE_SECONDS
    ack_deadline: float = ACK_DEADLINE_SECONDS
    """Passed to each new `NodeLink` (see there)."""
    ping_interval: float = PING_INTERVAL_SECONDS
    ping_timeout: float = PING_TIMEOUT_SECONDS
    """The node-stream keep-alive of each new `NodeLink` (see there)."""
    links: dict[str, NodeLink] = attrs.field(factory=dict)
    clients: dict[Connection, RouterClient] = attrs.field(factory=dict)
    """The router side of each live client connection."""
    subscribed: dict[str, set[RoutedSubscription]] = attrs.field(factory=dict)
    """Session id → the log subscriptions on it, of every client."""
    gateway_id: str = attrs.field(factory=lambda: secrets.token_hex(4))
    retries: int = 0
    """Calls sent again after a node died or answered `MOVED`."""
    prompting: dict[str, str] = attrs.field(factory=dict)
    """Session id → the node its `session/prompt` in flight went to (where a cancel goes)."""

    def link(self, node: NodeInfo) -> NodeLink:
        """The link to `node`, opened (in the router's nursery) when there is none up."""
        link = self.links.get(node.node_id)
        if link is not None and link.down is None and link.node == node:
            return link
        if link is not None:
            link.close(f"node {node.node_id!r} restarted or its stream dropped")
        link = NodeLink(
            node=node,
            secret=self.secret,
            ack_deadline=self.ack_deadline,
            ping_interval=self.ping_interval,
            ping_timeout=self.ping_timeout,
        )
        self.links[node.node_id] = link
        self.nursery.start_soon(link.run)
        return link

    async def watch_view(self) -> None:
        """Close the link of every node that leaves the view, until cancelled."""
        version = self.view.version
        while True:
            version = await self.view.wait_changed(version)
            live = set(self.view.nodes)
            for node_id, link in list(self.links.items()):
                if link.node not in live:
                    link.close(f"node {node_id!r} left the membership view")
                    del self.links[node_id]

    def owner_of(self, session_id: str, excluded: Collection[str] = ()) -> NodeInfo | None:
        """The live node that should host `session_id` (skipping `excluded`), or None."""
        nodes = {n.node_id: n for n in self.view.nodes if n.node_id not in excluded}
        order = ranked(session_id, nodes)
        return nodes[order[0]] if order else None

    async def forward(
        self, client: RouterClient, session_id: str, method: str, params: Mapping[str, Any]
    ) -> tuple[str, Mapping[str, Any]]:
        """Send the call to the session's owner, retrying as the module docstring says.

        Returns the node that answered and its reply message.

        Cancellation: the call is abandoned where it is.

        Raises:
            RpcError: -33003 when no node answered within `retry_deadline` (of the
                call, or since the last node lost with it).
        """
        excluded: set[str] = set()
        lost: set[str] = set()
        version = self.view.version
        last = "no live node"
        asking: str | None = None
        holder: NodeInfo | None = None
        held_since: float | None = None
        # `asking`: the node a call is out to (None between attempts); `holder`: a
        # live node that kept the session's lease past `holder_grace`, asked next.
        with trio.move_on_after(self.retry_deadline) as deadline:
            while True:
                if self.view.version != version:
                    excluded.clear()
                    lost.clear()
                    version = self.view.version
                redirected = holder is not None
                node = holder if holder is not None else self.owner_of(session_id, excluded)
                holder = None
                if node is None:
                    with trio.move_on_after(1):
                        await self.view.wait_changed(version)
                    excluded.clear()
                    continue
                asking = node.node_id
                if method == "session/prompt":
                    self.prompting[session_id] = node.node_id
                try:
                    reply = await self.link(node).call(client.key, client.notify, method, params)
                except ClientEnded as exc:
                    asking = None
                    # The node is up; it ended this client (e.g. a session broke there).
                    last = str(exc)
                    self.retries += 1
                    await trio.sleep(CLIENT_ENDED_RETRY_SECONDS)
                    continue
                except NodeDown as exc:
                    asking = None
                    last = str(exc)
                    excluded.add(node.node_id)
                    self.retries += 1
                    if node.node_id not in lost:
                        # A node lost with the call: the call starts over elsewhere, with a
                        # whole retry window (a turn may rightly take long on its new node).
                        # Once per node and view: a node whose stream keeps dropping while
                        # the view keeps it (cut off from this gateway only) cannot hold
                        # the call for ever.
                        lost.add(node.node_id)
                        deadline.deadline = trio.current_time() + self.retry_deadline
                    continue
                asking = None
                error = reply.get("error")
                if isinstance(error, Mapping) and error.get("code") == MOVED:
                    last = str(error.get("message"))
                    data = error.get("data")
                    data = data if isinstance(data, Mapping) else {}
                    self.retries += 1
                    pause = retry_after_ms(data.get("retryAfterMs"))
                    live = None if redirected else self.live_holder(data.get("holderNode"), node)
                    if live is not None and live.node_id in excluded:
                        # Its stream dropped with this call, yet the view still has it:
                        # wait out its lease as a dead holder's, then ask it again. A dead
                        # holder has left the view by then; one still in it renews its
                        # lease (a stream can drop under a live node), and skipping it for
                        # the rest of the call would leave its session unanswered.
                        excluded.discard(live.node_id)
                        live = None
                    if live is None:
                        # The holder is dead or frozen: its lease runs out after the pause.
                        held_since = None
                        await trio.sleep(pause / 1000)
                        continue
                    # A live holder releases the session at its next turn boundary when
                    # rebalancing says so: ask the owner again soon. One that keeps it
                    # (nothing told it to let go) serves the call itself.
                    now = trio.current_time()
                    held_since = now if held_since is None else held_since
                    if now - held_since >= self.holder_grace:
                        holder = live
                        continue
                    await trio.sleep(min(pause, MOVED_RETRY_MS) / 1000)
                    continue
                if session_id:
                    self._answered(session_id, node.node_id)
                return node.node_id, reply
        if asking is not None:  # the deadline came while a node had the call
            before = "" if last == "no live node" else f"; before: {last}"
            last = f"node {asking!r} did not answer in time{before}"
        raise RpcError(
            OVERLOADED,
            f"{method!r} for session {session_id!r}: no node answered within "
            f"{self.retry_deadline} s (last: {last})",
            {"reason": "overloaded", "retryAfterMs": 1000},
        )

    def live_holder(self, holder_node: object, answered_by: NodeInfo) -> NodeInfo | None:
        """The holder a `MOVED` from `answered_by` names, when it is another node in the
        view (the answering node's own name is an earlier incarnation of it: gone). A node
        whose stream just dropped may still be named: the caller then waits out its lease
        and asks it again."""
        if not isinstance(holder_node, str) or holder_node == answered_by.node_id:
            return None
        return next((n for n in self.view.nodes if n.node_id == holder_node), None)

    def _answered(self, session_id: str, node_id: str) -> None:
        """`node_id` answered a call for `session_id`: it hosts it now, so its log
        subscriptions served elsewhere move there (a release the gateway missed)."""
        for subscription in list(self.subscribed.get(session_id, ())):
            if subscription.node_id != node_id and not subscription.resuming:
                subscription.client.resume(subscription)

    async def each_node(
        self, client: RouterClient, method: str, params: Mapping[str, Any]
    ) -> list[tuple[NodeInfo, Mapping[str, Any] | str]]:
        """Send the call to every live node at once: each node's reply, or why it failed
        (`"timeout"` for a node that did not answer within `each_node_deadline`)."""
        answers: list[tuple[NodeInfo, Mapping[str, Any] | str]] = []

        async def one(node: NodeInfo) -> None:
            with trio.move_on_after(self.each_node_deadline):
                try:
                    answers.append(
                        (
                            node,
                            await self.link(node).call(client.key, client.notify, method, params),
                        )
                    )
                except NodeDown as exc:
                    answers.append((node, str(exc)))
                return
            answers.append((node, "timeout"))

        async with trio.open_nursery() as nursery:
            for node in self.view.nodes:
                nursery.start_soon(one, node)
        return sorted(answers, key=lambda pair: pair[0].node_id)

    def client(self, connection: Connection) -> RouterClient:
        """The router side of `connection` (made on first use; ended with the connection)."""
        existing = self.clients.get(connection)
        if existing is not None:
            return existing
        client = RouterClient(
            router=self, connection=connection, key=f"{self.gateway_id}-{next(_client_ids)}"
        )
        self.clients[connection] = client
        connection.on_close(client.ended)
        return client


def retry_after_ms(value: object) -> int:
    """A node's `retryAfterMs` hint as a pause: an int clamped to 0-`MAX_RETRY_AFTER_MS`
    (`MOVED_RETRY_MS` when it is not an int; a bool is not one)."""
    if not isinstance(value, int) or isinstance(value, bool):
        return MOVED_RETRY_MS
    return min(max(value, 0), MAX_RETRY_AFTER_MS)


def rpc_result(reply: Mapping[str, Any]) -> Any:
    """The result of a node's reply message; its error raised as the same `RpcError`."""
    error = reply.get("error")
    if isinstance(error, Mapping):
        code = error.get("code")
        raise RpcError(
            code if isinstance(code, int) else INTERNAL_ERROR,
            str(error.get("message")),
            error.get("data"),
        )
    return reply.get("result")


@attrs.define(eq=False)
class RoutedSubscription:
    """One log subscription as the supervisor sees it, and where it is served now."""

    id: str
    client: RouterClient
    session_id: str
    types: list[str] | None
    last_seq: int
    """The last seq passed on (or before the first wanted one)."""
    node_id: str = ""
    node_subscription: str = ""
    caught_up: bool = False
    resuming: bool = False
    behind: bool = False
    """The log lane was full for one of its events: resumed once the lane has room."""


def visible(principal: Principal, session_id: str) -> bool:
    """True when the caller's session filter covers `session_id` (`own`: created through here)."""
    sessions = principal.token.sessions
    if sessions == "*":
        return True
    if sessions == "own":
        return session_id in principal.created
    return session_id in sessions


@attrs.define(eq=False)
class RouterClient:
    """One supervisor connection's side of the router (see the module docstring)."""

    router: Router
    connection: Connection
    key: str
    subscriptions: dict[str, RoutedSubscription] = attrs.field(factory=dict)
    watches: dict[tuple[str, str], str] = attrs.field(factory=dict)
    _served: dict[tuple[str, str], RoutedSubscription] = attrs.field(factory=dict)
    _unrouted: dict[tuple[str, str], list[Mapping[str, Any]]] = attrs.field(factory=dict)
    _unrouted_count: int = 0
    subscribing: int = 0
    """Subscribe calls of this client in flight (their first events may beat their reply)."""
    _resumers: set[trio.CancelScope] = attrs.field(factory=set)
    _ended: bool = False
    _ids: itertools.count[int] = attrs.field(factory=itertools.count)

    def new_subscription_id(self) -> str:
        """A subscription id unique on this connection."""
        return f"sub-{self.key}-{next(self._ids)}"

    # -- subscriptions -----------------------------------------------------------

    def serve(self, subscription: RoutedSubscription, node_id: str, node_sub: str) -> None:
        """Record `node_id` serving `subscription` as `node_sub`; pass on what it sent already.

        What the node sent may end it already (`_harness/log/moved` right behind its
        reply), and the node's stream may have dropped since it replied: either way,
        the subscription is resumed at once, as it would have been once served.
        """
        subscription.node_id, subscription.node_subscription = node_id, node_sub
        self._served[(node_id, node_sub)] = subscription
        self.subscriptions[subscription.id] = subscription
        self.router.subscribed.setdefault(subscription.session_id, set()).add(subscription)
        ended = False
        for message in self._unrouted.pop((node_id, node_sub), []):
            self._count_unrouted(-1)
            if message.get("method") == "_harness/log/moved":
                ended = True
            else:
                self._log_notification(subscription, message)
        if not self.subscribing:
            # What is left belongs to subscriptions that ended (or moved) meanwhile.
            self._unrouted.clear()
            self._unrouted_count = 0
        link = self.router.links.get(node_id)
        if ended or link is None or link.down is not None:
            self.resume(subscription)

    def drop(self, subscription: RoutedSubscription) -> None:
        """Forget `subscription` (unsubscribed, or its connection ended)."""
        self.subscriptions.pop(subscription.id, None)
        self._served.pop((subscription.node_id, subscription.node_subscription), None)
        on_session = self.router.subscribed.get(subscription.session_id)
        if on_session is not None:
            on_session.discard(subscription)
            if not on_session:
                del self.router.subscribed[subscription.session_id]

    def _count_unrouted(self, delta: int) -> None:
        self._unrouted_count += delta
        if self._unrouted_count > UNROUTED_LIMIT:
            self.connection.close(
                CLOSE_INTERNAL,
                f"over {UNROUTED_LIMIT} log events arrived for unknown subscriptions",
            )

    def _log_notification(
        self, subscription: RoutedSubscription, message: Mapping[str, Any]
    ) -> None:
        params = dict(message.get("params") or {})
        method = message.get("method")
        seq: Any = None
        if method == "_harness/log/event":
            event = params.get("event")
            seq = event.get("seq") if isinstance(event, Mapping) else None
            if not isinstance(seq, int) or seq <= subscription.last_seq:
                return  # replayed again after a resume: already passed on
        elif subscription.caught_up:  # `_harness/log/caughtUp`, sent once
            return
        connection = self.connection
        if connection.outbox_closed:
            return
        if not connection.outbox.log_has_room:
            # The supervisor reads slower than the node sends: stop the node's
            # subscription here and resume it from `last_seq + 1` once there is room.
            subscription.behind = True
            connection.catch_ups += 1
            self.resume(subscription)
            return
        params["subscription"] = subscription.id
        frame = connection.transport.framing.frame(
            dumps({"jsonrpc": "2.0", "method": method, "params": params}).encode()
        )
        connection.outbox.offer_log([frame], len(frame))
        if seq is not None:
            subscription.last_seq = seq
        else:
            subscription.caught_up = True

    def resume(self, subscription: RoutedSubscription) -> None:
        """Resubscribe on the session's current owner from the seq after the last one passed on."""
        if self._ended or subscription.resuming or subscription.id not in self.subscriptions:
            return
        subscription.resuming = True
        self._served.pop((subscription.node_id, subscription.node_subscription), None)
        self.router.nursery.start_soon(self._resume, subscription)

    async def _resume(self, subscription: RoutedSubscription) -> None:
        scope = trio.CancelScope()
        self._resumers.add(scope)
        try:
            with scope:
                await self._resubscribe(subscription)
        finally:
            self._resumers.discard(scope)

    async def _resubscribe(self, subscription: RoutedSubscription) -> None:
        old = self.router.links.get(subscription.node_id)
        if old is not None and old.down is None and subscription.node_subscription:
            # The old node may still run it (it answered for the session before losing it).
            with contextlib.suppress(NodeDown):
                await old.call(
                    self.key,
                    self.notify,
                    "_harness/log/unsubscribe",
                    {"subscription": subscription.node_subscription},
                )
        if subscription.behind:
            try:
                await self.connection.outbox.put_log(())  # returns once the log lane has room
            except OutboxClosed:
                return
            subscription.behind = False
        params: dict[str, Any] = {
            "sessionId": subscription.session_id,
            "fromSeq": subscription.last_seq + 1,
        }
        if subscription.types is not None:
            params["types"] = subscription.types
        self.subscribing += 1
        try:
            node_id, reply = await self.router.forward(
                self, subscription.session_id, "_harness/log/subscribe", params
            )
            result = rpc_result(reply)
            node_sub = result["subscription"]
        except RpcError as exc:
            self.connection.close(
                CLOSE_INTERNAL,
                f"subscription {subscription.id} could not be resumed: {exc.message}",
            )
            return
        except (KeyError, TypeError) as exc:
            self.connection.close(
                CLOSE_INTERNAL,
                f"subscription {subscription.id} could not be resumed: the node's "
                f"log/subscribe reply has no subscription ({exc!r})",
            )
            return
        finally:
            self.subscribing -= 1
        subscription.resuming = False
        self.serve(subscription, node_id, str(node_sub))

    # -- notifications -------------------------------------------------------------

    def notify(self, node_id: str, message: Mapping[str, Any]) -> None:
        """A message from `node_id` for this client (see `NodeLink`)."""
        if "_linkDown" in message or "_clientEnded" in message:
            for subscription in list(self.subscriptions.values()):
                if subscription.node_id == node_id:
                    self.resume(subscription)
            return
        method = message.get("method")
        params = message.get("params")
        if not isinstance(params, Mapping):
            params = {}
        if method in ("_harness/log/event", "_harness/log/caughtUp"):
            key = (node_id, str(params.get("subscription")))
            served = self._served.get(key)
            if served is None:
                if self.subscribing:  # else: a subscription that ended; its late events go
                    self._unrouted.setdefault(key, []).append(message)
                    self._count_unrouted(1)
            else:
                self._log_notification(served, message)
        elif method == "_harness/log/moved":
            key = (node_id, str(params.get("subscription")))
            moved = self._served.get(key)
            if moved is not None:
                self.resume(moved)
            elif self.subscribing:  # it may end a subscription whose reply is not handled yet
                self._unrouted.setdefault(key, []).append(message)
                self._count_unrouted(1)
        elif method == "session/update":
            # Paced as the single-process gateway paces a prompt's updates: the log lane.
            self.connection.relay_log(message)
        elif method == "_harness/sessions/changed":
            watch = self.watches.get((node_id, str(params.get("subscription"))))
            if watch is not None:
                # Paced like the log (the node paces its watches the same way).
                self.connection.relay_log(
                    {
                        "jsonrpc": "2.0",
                        "method": method,
                        "params": {**params, "subscription": watch},
                    }
                )
        elif method == "_harness/supervision/event":
            # Only to a client that may observe the session (its path ends in agent:SESSION).
            principal = self.connection.principal
            session_id = str(params.get("path", "")).rpartition("agent:")[2]
            if principal.has("observe") and visible(principal, session_id):
                self.connection.send_notification(message)
        else:
            self.connection.send_notification(message)

    def ended(self) -> None:
        """The connection closed: stop resuming, end its virtual connections on every node."""
        self._ended = True
        for scope in list(self._resumers):
            scope.cancel()
        for subscription in list(self.subscriptions.values()):
            self.drop(subscription)
        self.router.clients.pop(self.connection, None)
        for link in list(self.router.links.values()):
            if self.key in link.clients:
                self.router.nursery.start_soon(link.end, self.key)
