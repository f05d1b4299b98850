"""The cluster gateway's method table: every method forwarded to nodes, or answered from them all.

Admission, framing and scopes are the single-process gateway's (the same
`Connection` actor runs each supervisor connection); only the handlers
differ. A method naming a session goes to that session's owner through
`Router.forward` (retried on node death and `MOVED`); `session/new` picks
the new session's id here, so it is placed before it exists;
`session/prompt` and `_harness/session/send` get a request id
(`_meta.harness.requestId`, kept when the client sent one); the lists, `_harness/stats`,
`_harness/sessions/watch` and `_harness/supervision/tree` cover all live
nodes. A session outside the caller's filter is answered as not found,
before anything is forwarded.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Mapping
from typing import Any

import attrs
import trio

from actors.session.session import new_session_id
from supervision.cluster.router import (
    RoutedSubscription,
    Router,
    RouterClient,
    rpc_result,
    visible,
)
from supervision.cluster.router_link import NodeDown
from supervision.gateway import acp_methods as acp
from supervision.gateway.connection import DEFERRED, Call
from supervision.gateway.methods import METHODS, Method, MethodTable
from supervision.gateway.protocol import (
    RpcError,
    error_response,
    invalid_params,
    not_found,
    response,
    structure_params,
)

LOG_LANE_REPLIES = frozenset({"session/prompt", "session/load"})
"""Methods whose `session/update`s are relayed on the log lane: their replies follow them there."""

REQUEST_ID_METHODS = frozenset({"session/prompt", "_harness/session/send"})
"""Methods whose retries must not log their message twice: each call gets a request id
(`_meta.harness.requestId`, kept when the client sent one) that the node looks up."""

PLACEMENT_OF_LISTS = ""
"""The placement key of calls any node can answer (the lists: the log is shared)."""


@attrs.frozen(kw_only=True)
class Forwarded:
    """A call as the cluster handlers get it: the raw params (to forward) and the typed ones."""

    raw: Mapping[str, Any]
    typed: Any
    router: Router


def _client(f: Forwarded, call: Call) -> RouterClient:
    return f.router.client(call.connection)


def _session(f: Forwarded, call: Call) -> str:
    session_id = f.raw.get("sessionId")
    assert isinstance(session_id, str)  # the params class requires it
    if not visible(call.principal, session_id):
        raise not_found(f"session {session_id!r}")
    return session_id


def _with_harness_meta(raw: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
    params = dict(raw)
    meta = dict(params.get("_meta") or {})
    harness = dict(meta.get("harness") or {})
    for name, value in fields.items():
        harness.setdefault(name, value)
    meta["harness"] = harness
    params["_meta"] = meta
    return params


async def initialize(f: Forwarded, call: Call) -> Any:
    """Answered by the gateway itself (its runtime id and epoch, the full method list)."""
    return await acp.initialize(f.typed, call)


async def new_session(f: Forwarded, call: Call) -> Any:
    """Place a new session id by rendezvous and start it on its owner."""
    session_id = new_session_id()
    params = _with_harness_meta(f.raw, sessionId=session_id)
    _, reply = await f.router.forward(_client(f, call), session_id, "session/new", params)
    result = rpc_result(reply)
    call.principal.created.add(session_id)
    return result


async def by_session(f: Forwarded, call: Call, method: str) -> Any:
    """Forward a call naming one session to its owner (the reply of a prompt or load goes
    behind its `session/update`s on the log lane)."""
    if method not in LOG_LANE_REPLIES:
        return await _by_session(f, call, method)
    try:
        message = response(call.id, await _by_session(f, call, method))
    except RpcError as error:
        message = error_response(call.id, error)
    await call.connection.answer_after_log(call.id, message)
    return DEFERRED


async def _by_session(f: Forwarded, call: Call, method: str) -> Any:
    session_id = _session(f, call)
    params: Mapping[str, Any] = f.raw
    if method in REQUEST_ID_METHODS:
        params = _with_harness_meta(
            f.raw, requestId=f"{f.router.gateway_id}-{secrets.token_hex(8)}"
        )
    try:
        _, reply = await f.router.forward(_client(f, call), session_id, method, params)
    finally:
        if method == "session/prompt":
            f.router.prompting.pop(session_id, None)
    return rpc_result(reply)


async def cancel(f: Forwarded, call: Call) -> None:
    """Notification: pass `session/cancel` to the node its last prompt went to, else to the
    session's owner (nothing when that node is down)."""
    session_id = f.raw.get("sessionId")
    if not isinstance(session_id, str) or not visible(call.principal, session_id):
        return
    prompted = f.router.prompting.get(session_id)
    link = f.router.links.get(prompted) if prompted is not None else None
    node = link.node if link is not None and link.down is None else f.router.owner_of(session_id)
    if node is None:
        return
    client = _client(f, call)
    try:
        await f.router.link(node).notify(client.key, client.notify, "session/cancel", f.raw)
    except NodeDown:
        return


async def any_node(f: Forwarded, call: Call, method: str) -> Any:
    """Lists: any node answers for the whole shared log; rows outside the filter are dropped."""
    _, reply = await f.router.forward(_client(f, call), PLACEMENT_OF_LISTS, method, f.raw)
    result = rpc_result(reply)
    if isinstance(result, dict) and isinstance(result.get("sessions"), list):
        result["sessions"] = [
            row
            for row in result["sessions"]
            if isinstance(row, Mapping) and visible(call.principal, str(row.get("sessionId")))
        ]
    return result


async def log_subscribe(f: Forwarded, call: Call) -> Any:
    """Subscribe on the session's owner; the subscription then survives that node's death."""
    if f.typed.batch:
        raise invalid_params(
            "/batch",
            "unsupported",
            "the cluster gateway sends one _harness/log/event per event; subscribe without batch",
        )
    if f.typed.merge:
        raise invalid_params(
            "/merge",
            "unsupported",
            "the cluster gateway sends one _harness/log/event per event; subscribe without merge",
        )
    session_id = _session(f, call)
    client = _client(f, call)
    client.subscribing += 1
    try:
        node_id, reply = await f.router.forward(client, session_id, "_harness/log/subscribe", f.raw)
        result = dict(rpc_result(reply))
    except BaseException:
        client.subscribing -= 1
        raise
    client.subscribing -= 1
    from_seq = f.typed.from_seq
    subscription = RoutedSubscription(
        id=client.new_subscription_id(),
        client=client,
        session_id=session_id,
        types=f.typed.types,
        last_seq=(from_seq - 1) if from_seq is not None else int(result["headSeq"]),
    )
    client.serve(subscription, node_id, str(result["subscription"]))
    result["subscription"] = subscription.id
    result["epoch"] = call.gateway.epoch  # the node's epoch means nothing to the client
    return result


async def log_unsubscribe(f: Forwarded, call: Call) -> Any:
    """Unsubscribe on the node serving it now."""
    client = _client(f, call)
    subscription = client.subscriptions.get(f.typed.subscription)
    if subscription is None:
        # As the single-process gateway answers it: an id that names nothing is not found.
        raise not_found(f"subscription {f.typed.subscription!r}")
    client.drop(subscription)
    link = f.router.links.get(subscription.node_id)
    if link is not None:
        with contextlib.suppress(NodeDown):  # its node is gone, and the subscription with it
            await link.call(
                client.key,
                client.notify,
                "_harness/log/unsubscribe",
                {"subscription": subscription.node_subscription},
            )
    return {}


async def sessions_watch(f: Forwarded, call: Call) -> Any:
    """Watch on every live node under one subscription id."""
    client = _client(f, call)
    watch = client.new_subscription_id()
    for node, reply in await f.router.each_node(client, "_harness/sessions/watch", f.raw):
        if isinstance(reply, Mapping) and "result" in reply:
            client.watches[(node.node_id, str(reply["result"]["subscription"]))] = watch
    return {"subscription": watch}


def _merge_providers(entries: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    merged: dict[str, dict[str, Any]] = {}
    for entry in entries:
        name = str(entry.get("name"))
        into = merged.setdefault(
            name,
            {
                "name": name,
                "inflight": 0,
                "requests": 0,
                "retries": 0,
                "failuresByCode": {},
                "latencyMs": {"p50": None, "p99": None},
            },
        )
        for key in ("inflight", "requests", "retries"):
            into[key] += int(entry.get(key) or 0)
        for code, count in dict(entry.get("failuresByCode") or {}).items():
            into["failuresByCode"][code] = into["failuresByCode"].get(code, 0) + int(count)
        latency = entry.get("latencyMs") or {}
        for key in ("p50", "p99"):
            value = latency.get(key)
            if value is not None and (
                into["latencyMs"][key] is None or value > into["latencyMs"][key]
            ):
                into["latencyMs"][key] = value
    return list(merged.values())


async def stats(f: Forwarded, call: Call) -> Any:
    """Every live node's stats, summed, with per-node entries and the `fencedCommits` total."""
    client = _client(f, call)
    nodes: list[dict[str, Any]] = []
    live = running = restarts = commits = input_tokens = cache_read = fenced = 0
    commit_p99: float | None = None
    providers: list[Mapping[str, Any]] = []
    for node, reply in await f.router.each_node(client, "_harness/stats", {}):
        entry: dict[str, Any] = {"nodeId": node.node_id, "endpoint": node.endpoint}
        result = reply.get("result") if isinstance(reply, Mapping) else None
        if not isinstance(result, Mapping):
            entry["error"] = reply if isinstance(reply, str) else reply.get("error")
            nodes.append(entry)
            continue
        entry["stats"] = result
        nodes.append(entry)
        sessions = result.get("sessions") or {}
        live += int(sessions.get("live") or 0)
        running += int(sessions.get("running") or 0)
        providers.extend(result.get("providers") or [])
        cache = result.get("cache") or {}
        input_tokens += int(cache.get("inputTokens") or 0)
        cache_read += int(cache.get("cacheReadTokens") or 0)
        store = result.get("store") or {}
        commits += int(store.get("commits") or 0)
        p99 = store.get("commitP99Ms")
        if p99 is not None and (commit_p99 is None or p99 > commit_p99):
            commit_p99 = p99
        restarts += int((result.get("supervision") or {}).get("restarts") or 0)
        fenced += int((result.get("node") or {}).get("fencedCommits") or 0)
    gateway = call.gateway
    own = gateway.statistics()
    return {
        "uptimeS": trio.current_time() - gateway._started,
        "epoch": gateway.epoch,
        "sessions": {"live": live, "running": running, "idle": live - running},
        "providers": _merge_providers(providers),
        "cache": {
            "inputTokens": input_tokens,
            "cacheReadTokens": cache_read,
            "hitRatio": cache_read / input_tokens if input_tokens else 0.0,
        },
        "store": {"commits": commits, "commitP99Ms": commit_p99},
        "gateway": {
            "connections": own.connections,
            "subscriptions": sum(len(c.subscriptions) for c in f.router.clients.values()),
            "slowConsumerCloses": own.slow_consumer_closes,
        },
        "supervision": {"restarts": restarts},
        "nodes": nodes,
        "fencedCommits": fenced,
        "retries": f.router.retries,
    }


async def supervision_tree(f: Forwarded, call: Call) -> Any:
    """One root over every node's tree."""
    client = _client(f, call)
    children = []
    for node, reply in await f.router.each_node(client, "_harness/supervision/tree", {}):
        result = reply.get("result") if isinstance(reply, Mapping) else None
        if isinstance(result, Mapping):
            tree = dict(result["tree"]) if "tree" in result else dict(result)
            tree["path"] = f"{node.node_id}/{tree.get('path')}"
            tree["children"] = [
                {**child, "path": f"{node.node_id}/{child.get('path')}"}
                for child in tree.get("children") or []
                if visible(call.principal, str(child.get("path", "")).rpartition("agent:")[2])
            ]
            children.append(tree)
    return {
        "tree": {
            "path": "cluster",
            "strategy": None,
            "children": children,
            "restarts": sum(int(c.get("restarts") or 0) for c in children),
            "incarnation": 0,
            "status": "running",
        }
    }


async def supervision_restart(f: Forwarded, call: Call) -> Any:
    """Restart a session's agent on its owner (`path` ends in `agent:SESSION`)."""
    path = str(f.raw.get("path"))
    _, sep, session_id = path.rpartition("agent:")
    if not sep or not session_id or not visible(call.principal, session_id):
        raise not_found(f"supervision path {path!r}")
    node_path = path.partition("/")[2] if path.count("/") > 1 else path
    _, reply = await f.router.forward(
        _client(f, call), session_id, "_harness/supervision/restart", {"path": node_path}
    )
    return rpc_result(reply)


def _handler(name: str) -> Any:
    special = {
        "initialize": initialize,
        "session/new": new_session,
        "session/cancel": cancel,
        "session/list": lambda f, call: any_node(f, call, "session/list"),
        "_harness/sessions/list": lambda f, call: any_node(f, call, "_harness/sessions/list"),
        "_harness/sessions/watch": sessions_watch,
        "_harness/log/subscribe": log_subscribe,
        "_harness/log/unsubscribe": log_unsubscribe,
        "_harness/stats": stats,
        "_harness/supervision/tree": supervision_tree,
        "_harness/supervision/restart": supervision_restart,
    }
    if name in special:
        return special[name]
    return lambda f, call: by_session(f, call, name)


CLUSTER_METHODS: Mapping[str, Method] = {
    name: attrs.evolve(method, handler=_handler(name)) for name, method in METHODS.items()
}
"""The gateway's method table with the cluster handlers (see the module docstring)."""


@attrs.frozen(kw_only=True)
class ClusterMethodTable(MethodTable):
    """`MethodTable` whose handlers get a `Forwarded` (raw and typed params, and the router)."""

    router: Router
    methods: Mapping[str, Method] = CLUSTER_METHODS

    async def call(self, name: str, params: Mapping[str, Any], call: Call) -> Any:
        """Structure `params` (refusing bad ones as the single-process gateway does), then route."""
        method = self.methods[name]
        typed = structure_params(name, params, method.params)
        return await method.handler(Forwarded(raw=params, typed=typed, router=self.router), call)

    def notification(self, name: str) -> Any:
        """The routing handler of notification `name`, or None if unknown."""
        method = self.methods.get(name)
        if method is None or not method.notification:
            return None

        async def run(params: Mapping[str, Any], call: Call) -> Any:
            if method.scope is not None and not call.principal.has(method.scope):
                return None
            typed = structure_params(name, params, method.params)
            return await method.handler(
                Forwarded(raw=params, typed=typed, router=self.router), call
            )

        return run
