"""The node's method table: the gateway's methods, plus takeover, `MOVED` and request ids.

A node answers the same ACP and `_harness/*` methods as a single-process
gateway, with three changes for the cluster:

- **Takeover on first touch.** Before any call naming a stored session that
  this node does not host, the node starts the session's agent, which takes
  the session's lease. A lease another live writer holds is answered
  `MOVED` (with `retryAfterMs`): the caller retries on the owner, or here
  once the old lease expired. So is a call for a session this node is
  releasing (`supervision.cluster.node_rebalance`), also when the release
  began while the call waited for the session's start, and a log
  subscription whose session stopped being hosted here while it was set up
  (it would follow a log this node no longer writes).
- **`session/new` with a given id** (`_meta.harness.sessionId`), so the
  gateway can place a session before it exists.
- **Exactly-once prompts and sends.** `session/prompt` and
  `_harness/session/send` carry `_meta.harness.requestId`; the user message
  is logged with it (`source.request_id`). A prompt whose request id is
  already in the log (or queued here) is not queued again: its turn is
  followed (still running) or replayed (ended) and answered from the log.
  Only an attempt the previous owner's death cut off (its turn ended
  `interrupted`), or one whose message can no longer reach the log (dropped
  by a cancel, or refused by a pre-step listener before its first step
  opened: answered `cancelled` or `refusal`, as on a single-process
  gateway), is run again, as a new turn with the same request id. A
  send whose request id is logged or queued is answered accepted and not
  queued again. The lookup is `supervision.cluster.request_index`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from actors.agent import TurnTicket
from actors.messages import Message, TextBlock, UserSource
from actors.session import SessionBusyError, UnknownSessionError
from actors.session.lease import Lease, default_owner
from actors.session.postgres_store import PostgresStore
from supervision.cluster.node_rebalance import closing_here
from supervision.cluster.request_index import request_index
from supervision.cluster.wire import MOVED, MOVED_RETRY_MS
from supervision.gateway.acp_methods import (
    answer_at_outcome,
    refuse_second_prompt,
    require_session,
    submit_prompt,
    user_message,
)
from supervision.gateway.connection import DEFERRED, Call
from supervision.gateway.cursors import PromptCursor
from supervision.gateway.harness_methods import place_message
from supervision.gateway.messages import (
    LogSubscribeParams,
    NewSessionParams,
    PromptParams,
    SendParams,
)
from supervision.gateway.methods import METHODS, Method
from supervision.gateway.protocol import (
    INTERNAL_ERROR,
    RpcError,
    invalid_params,
)
from supervision.supervisor import ChildStoppedError, SupervisionError

NODE_LEASE_OWNER = "harness node {node_id}: {process}"
"""The lease owner a node's store writes, so a refused caller learns the holding node's id."""


MOVED_RETRY_MARGIN_MS = 50
"""Added to the time left on the holder's lease, so the retry finds it expired."""


def lease_owner(node_id: str) -> str:
    """The lease owner string of node `node_id` (this process)."""
    return NODE_LEASE_OWNER.format(node_id=node_id, process=default_owner())


def holder_node(holder: str) -> str | None:
    """The node id in a lease owner string written by a node, or None (another process)."""
    prefix, sep, _ = holder.partition(": ")
    if not sep or not prefix.startswith("harness node "):
        return None
    return prefix.removeprefix("harness node ") or None


def moved(session_id: str, cause: SessionBusyError) -> RpcError:
    """The `MOVED` answer for `session_id`: who holds it (`holderNode` when a node does),
    and `retryAfterMs` until the holder's lease runs out (when the store says)."""
    retry_ms = MOVED_RETRY_MS
    if cause.retry_after is not None:
        retry_ms = round(cause.retry_after * 1000) + MOVED_RETRY_MARGIN_MS
    data: dict[str, Any] = {
        "reason": "moved",
        "sessionId": session_id,
        "retryAfterMs": retry_ms,
    }
    node = holder_node(cause.holder) if cause.holder else None
    if node is not None:
        data["holderNode"] = node
    return RpcError(MOVED, f"session {session_id!r} is held by another node: {cause}", data)


def _busy_cause(exc: BaseException) -> SessionBusyError | None:
    """The `SessionBusyError` behind `exc` (through causes, contexts and groups), if any."""
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, SessionBusyError):
            return current
        if isinstance(current, BaseExceptionGroup):
            stack.extend(current.exceptions)
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                stack.append(linked)
    return None


def _released(session_id: str) -> RpcError:
    """The `MOVED` answer for a session this node is releasing: its owner takes it over
    once the agent here is gone."""
    return RpcError(
        MOVED,
        f"session {session_id!r} is being released by this node to its owner",
        {"reason": "moved", "sessionId": session_id, "retryAfterMs": MOVED_RETRY_MS},
    )


def _lost_here(call: Call, lease: Lease | None) -> bool:
    """True when this node's store knows `lease` (a live agent's) was taken over."""
    store = call.gateway.runtime.store
    return isinstance(store, PostgresStore) and lease is not None and not store.holds_lease(lease)


async def host(call: Call, session_id: str) -> None:
    """Make sure this node hosts `session_id` if it is stored (taking its lease).

    A session that is not stored is left for the handler to answer as not
    found.

    Returns only with the session's agent running here and not being released.

    Raises:
        RpcError: `MOVED` when another live writer holds the lease, or when this
            node is releasing the session (or released it while this call
            waited for its start); -32603 when the agent fails to start for
            another reason.
    """
    directory = call.gateway.directory
    if closing_here(call.gateway, session_id):
        raise _released(session_id)
    for attempt in range(3):
        agent = directory.live_agent(session_id)
        if agent is not None:
            if not _lost_here(call, agent.session.lease):
                return
            # Its lease was taken over (found when this node woke, or at a refused
            # commit): the agent is a stale writer. Drop it, then try to take the lease.
            await directory.close(session_id)
            continue
        try:
            await directory.attach(session_id)
        except UnknownSessionError:
            return
        except SessionBusyError as exc:
            raise moved(session_id, exc) from exc
        except ChildStoppedError as exc:
            # A concurrent start of the same session failed; start it again to learn why.
            if attempt == 2:
                raise RpcError(
                    INTERNAL_ERROR, f"session {session_id!r} keeps stopping as it starts: {exc}"
                ) from exc
        except SupervisionError as exc:
            busy = _busy_cause(exc)
            if busy is not None:
                raise moved(session_id, busy) from exc
            raise RpcError(
                INTERNAL_ERROR, f"session {session_id!r} could not start on this node: {exc}"
            ) from exc
        else:
            if closing_here(call.gateway, session_id) or directory.live_agent(session_id) is None:
                # Its release began (or ended) while this call waited for the start (its
                # own, or another call's): no input may reach the agent on its way out.
                raise _released(session_id)
            return


def _hosting(method: Method) -> Method:
    """`method` with takeover on first touch for its `sessionId` param."""
    inner = method.handler

    async def handler(params: Any, call: Call) -> Any:
        session_id = getattr(params, "session_id", None)
        if isinstance(session_id, str) and call.gateway.directory.visible(
            call.principal, session_id
        ):
            try:
                await host(call, session_id)
            except RpcError:
                if method.notification:
                    return None
                raise
        return await inner(params, call)

    return attrs.evolve(method, handler=handler)


def _harness_meta(meta: Mapping[str, Any] | None) -> Mapping[str, Any]:
    harness = (meta or {}).get("harness")
    return harness if isinstance(harness, Mapping) else {}


def _request_id(meta: Mapping[str, Any] | None) -> str | None:
    """`_meta.harness.requestId`, or None when absent.

    Raises:
        RpcError: -32602 when it is present but not a non-empty string.
    """
    request_id = _harness_meta(meta).get("requestId")
    if request_id is None:
        return None
    if not isinstance(request_id, str) or not request_id:
        raise invalid_params(
            "/_meta/harness/requestId", "invalid", "requestId must be a non-empty string"
        )
    return request_id


async def new_session(params: NewSessionParams, call: Call) -> dict[str, Any]:
    """`session/new`, starting the session under `_meta.harness.sessionId` when given."""
    harness = _harness_meta(params.meta)
    session_id = harness.get("sessionId")
    if session_id is None:
        result: dict[str, Any] = await METHODS["session/new"].handler(params, call)
        return result
    if not isinstance(session_id, str) or not session_id:
        raise invalid_params(
            "/_meta/harness/sessionId", "invalid", "sessionId must be a non-empty string"
        )
    profile = harness.get("agent", "default")
    directory = call.gateway.directory
    if not isinstance(profile, str) or profile not in directory.profiles:
        raise invalid_params(
            "/_meta/harness/agent",
            "unknown_agent",
            f"unknown agent profile {profile!r}; configured: {sorted(directory.profiles)}",
        )
    if params.mcp_servers:
        raise invalid_params(
            "/mcpServers", "unsupported", "mcpServers are not supported; pass an empty list"
        )
    if await directory.exists(session_id):
        # A retried session/new whose first attempt did start it: the same answer.
        await host(call, session_id)
        return {"sessionId": session_id}
    try:
        agent = await directory.create(
            profile=profile, owner=call.principal.token, session_id=session_id
        )
    except SupervisionError as exc:
        busy = _busy_cause(exc)
        if busy is not None:
            raise moved(session_id, busy) from exc
        raise RpcError(INTERNAL_ERROR, f"session/new: the agent did not start: {exc}") from exc
    return {"sessionId": agent.session.id}


async def prompt(params: PromptParams, call: Call) -> Any:
    """`session/prompt` with exactly-once delivery per `_meta.harness.requestId`."""
    request_id = _request_id(params.meta)
    if request_id is None:
        return await METHODS["session/prompt"].handler(params, call)
    session_id = params.session_id
    await require_session(call, session_id)
    typed = user_message(params.prompt, "prompt")
    message = Message(role="user", content=typed.content, source=UserSource(request_id=request_id))
    connection = call.connection
    refuse_second_prompt(connection, session_id)
    await host(call, session_id)
    agent = call.gateway.directory.live_agent(session_id)
    if agent is None:
        raise RpcError(INTERNAL_ERROR, f"session {session_id!r} stopped before the prompt")
    # Again: another prompt of this connection may have registered while the session started.
    refuse_second_prompt(connection, session_id)
    index = request_index(agent.session)
    logged = index.find(request_id)
    attempt = index.queued(request_id)
    ticket: TurnTicket | None
    if attempt is not None:  # queued here and not logged yet: follow that attempt
        follow_from, ticket = attempt.at, attempt.ticket
    elif logged is not None and (logged.end is None or logged.end.reason.kind != "interrupted"):
        follow_from, ticket = logged.start_seq, None  # in the log: follow or replay its turn
    else:
        # Never logged (or its message can no longer be), or cut off by the previous
        # owner's death (its turn ended `interrupted`): run it (again).
        follow_from = len(agent.session)
        ticket = submit_prompt(agent, message)
        index.queue(request_id, ticket)
    gateway = call.gateway
    rpc_id = call.id

    def done() -> None:
        cursor = connection.prompts.pop(session_id, None)
        if cursor is not None and cursor.turn is not None:
            gateway.release_turn(session_id, cursor.turn)
        connection.release(rpc_id)

    cursor = PromptCursor(
        request_id=rpc_id,
        session_id=session_id,
        next_seq=follow_from,
        texts=tuple(b.text for b in message.content if isinstance(b, TextBlock)),
        claim=lambda turn: gateway.claim_turn(session_id, turn),
        on_done=done,
        message_request_id=request_id,
    )
    connection.prompts[session_id] = cursor
    connection.follow(cursor)
    if ticket is not None:
        connection.start_soon(functools.partial(answer_at_outcome, ticket, cursor))
    return DEFERRED


@attrs.frozen(kw_only=True)
class NodeSendParams:
    """`_harness/session/send` as a node takes it: `_meta.harness.requestId` may name it."""

    session_id: str
    content: list[dict[str, Any]]
    placement: Literal["next_turn", "next_step", "inject"]
    meta: dict[str, Any] | None = None


async def send(params: NodeSendParams, call: Call) -> dict[str, Any]:
    """`_harness/session/send`, queued once per `_meta.harness.requestId`.

    A request id already in the log, or queued here and not logged yet, is
    answered as accepted without queuing the message again.
    """
    request_id = _request_id(params.meta)
    if request_id is None:
        result: dict[str, Any] = await METHODS["_harness/session/send"].handler(
            SendParams(
                session_id=params.session_id, content=params.content, placement=params.placement
            ),
            call,
        )
        return result
    await require_session(call, params.session_id)
    typed = user_message(params.content, "content")
    message = Message(role="user", content=typed.content, source=UserSource(request_id=request_id))
    await host(call, params.session_id)
    agent = call.gateway.directory.live_agent(params.session_id)
    if agent is None:
        raise RpcError(INTERNAL_ERROR, f"session {params.session_id!r} stopped before the send")
    index = request_index(agent.session)
    accepted = {"accepted": True, "placement": params.placement}
    if index.find(request_id) is not None or index.queued(request_id) is not None:
        return accepted
    place_message(agent, message, params.placement)
    index.queue(request_id, None)
    return accepted


async def log_subscribe(params: LogSubscribeParams, call: Call) -> dict[str, Any]:
    """`_harness/log/subscribe`, answered `MOVED` when the session stopped being hosted
    here (its release began, or its lease was found lost) while the subscription was
    being set up.

    A subscription follows this node's commits of the session, and its subscribers
    are told `_harness/log/moved` when the release (or the loss) begins; one set up
    after that would see no event again. The check runs as the subscription is
    registered, with no checkpoint between them.
    """
    result: dict[str, Any] = await METHODS["_harness/log/subscribe"].handler(params, call)
    session_id = params.session_id
    agent = call.gateway.directory.live_agent(session_id)
    if (
        closing_here(call.gateway, session_id)
        or agent is None
        or _lost_here(call, agent.session.lease)
    ):
        subscription = result["subscription"]
        connection = call.connection
        del connection.subscriptions[subscription]
        connection.subscription_stops.pop(subscription)()
        raise RpcError(
            MOVED,
            f"session {session_id!r} stopped being hosted by this node while the "
            "subscription was set up",
            {"reason": "moved", "sessionId": session_id, "retryAfterMs": MOVED_RETRY_MS},
        )
    return result


async def stats(params: Any, call: Call) -> dict[str, Any]:
    """`_harness/stats` with `node: {nodeId, fencedCommits}` (appends refused by fencing)."""
    result: dict[str, Any] = await METHODS["_harness/stats"].handler(params, call)
    store_statistics = getattr(call.gateway.runtime.store, "statistics", None)
    snapshot = store_statistics() if callable(store_statistics) else None
    result["node"] = {
        "nodeId": call.gateway.runtime_id,
        "fencedCommits": int(getattr(snapshot, "fenced_appends", 0)),
    }
    return result


def _node_method(name: str, method: Method) -> Method:
    if name == "session/new":
        return attrs.evolve(method, handler=new_session)
    if name == "session/prompt":
        return _hosting(attrs.evolve(method, handler=prompt))
    if name == "_harness/session/send":
        return _hosting(attrs.evolve(method, params=NodeSendParams, handler=send))
    if name == "_harness/stats":
        return attrs.evolve(method, handler=stats)
    if name == "_harness/log/subscribe":
        return _hosting(attrs.evolve(method, handler=log_subscribe))
    return _hosting(method)


NODE_METHODS: Mapping[str, Method] = {
    name: _node_method(name, method) for name, method in METHODS.items()
}
"""The gateway's method table as a node serves it (see the module docstring)."""
