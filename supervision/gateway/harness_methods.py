"""The `_harness/*` supervisor methods: plain async handlers of (params, call).

Everything is read through public runtime APIs. Log methods deliver the
log events themselves (`session.to_json()` form), only once durable.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from actors.agent import Agent, StepInspection
from actors.messages import Message
from actors.prompt import PromptError
from actors.session import EVENT_TYPES, Event, SessionError, event_to_json, rebuild_request
from actors.session.events import RequestHeaderLogged
from actors.session.session import system_clock_ms
from supervision.gateway.acp_methods import (
    attach,
    cursor_position,
    input_refusals,
    require_session,
    user_message,
)
from supervision.gateway.connection import MAX_SUBSCRIPTIONS, MAX_WATCHES, Call
from supervision.gateway.cursors import LogCursor
from supervision.gateway.messages import (
    Empty,
    HarnessCancelParams,
    InspectParams,
    LogReadParams,
    LogSubscribeParams,
    RebuildParams,
    RestartParams,
    SendParams,
    SessionsListParams,
    SessionStateParams,
    SessionsWatchParams,
    SubscriptionRef,
)
from supervision.gateway.protocol import (
    ASSEMBLY_FAILED,
    OVERLOADED,
    REBUILD_FAILED,
    RpcError,
    invalid_params,
    not_found,
    notification,
)
from supervision.gateway.sessions import AGENT_CHILD_PREFIX, open_position
from supervision.gateway.status import WatchCursor

MAX_LIST_LIMIT = 500
MAX_READ_LIMIT = 1000
DEFAULT_READ_LIMIT = 100


def _limit(value: int | None, default: int, maximum: int) -> int:
    if value is None:
        return default
    if not 1 <= value <= maximum:
        raise invalid_params(
            "/limit", "out_of_range", f"limit {value} is outside 1..{maximum}", maximum=maximum
        )
    return value


def _check_from_seq(session_id: str, from_seq: int, head: int) -> None:
    if from_seq < 0 or from_seq > head + 1:
        raise invalid_params(
            "/fromSeq",
            "seq_out_of_range",
            f"session {session_id!r}: fromSeq {from_seq} is outside 0..{head + 1} (headSeq {head})",
            headSeq=head,
        )


async def sessions_list(params: SessionsListParams, call: Call) -> dict[str, Any]:
    """Visible sessions' summaries, filtered, in pages of at most 500."""
    limit = _limit(params.limit, MAX_LIST_LIMIT, MAX_LIST_LIMIT)
    directory = call.gateway.directory
    wanted = params.filter
    ids = [sid for sid in await directory.session_ids() if directory.visible(call.principal, sid)]
    if wanted is not None and wanted.agent is not None:
        ids = [sid for sid in ids if directory.agent_of(sid) == wanted.agent]
    if wanted is not None and wanted.parent_session_id is not None:
        ids = [sid for sid in ids if directory.parent_of(sid) == wanted.parent_session_id]
    start = cursor_position(params.cursor, "/cursor")
    summaries: list[dict[str, Any]] = []
    position = start
    while position < len(ids) and len(summaries) < limit:
        summary = await directory.summary(ids[position])
        position += 1
        if wanted is None or wanted.status is None or summary["status"] == wanted.status:
            summaries.append(summary)
    result: dict[str, Any] = {"sessions": summaries}
    if position < len(ids):
        result["nextCursor"] = str(position)
    return result


async def sessions_watch(params: SessionsWatchParams, call: Call) -> dict[str, Any]:
    """Notify `_harness/sessions/changed` when sessions are added, change status or are removed.

    The changes of the sessions the token and `filter` cover are paced and
    coalesced per watch (`supervision.gateway.status.WatchCursor`): a live
    session's change carries its `SessionSummary`, a removed one
    `{sessionId, agent}`. Status changes (a durable `turn/start`: "running",
    `turn/end`: "idle") come from the gateway's own fan-out, for every
    gateway however it was started.
    """
    connection = call.connection
    if connection.watches >= MAX_WATCHES:
        raise RpcError(
            OVERLOADED,
            f"{MAX_WATCHES} session watches are open on this connection (the most one may "
            "hold); one watch covers every session its token and filter allow",
            {"reason": "too_many_watches", "limit": MAX_WATCHES},
        )
    connection.watches += 1
    gateway = call.gateway
    cursor = WatchCursor(
        subscription=connection.new_subscription_id(),
        directory=gateway.directory,
        principal=call.principal,
        filter=params.filter,
    )
    connection.on_close(gateway.directory.on_change(cursor.record))
    connection.on_close(gateway.status_watch.open())
    connection.start_soon(cursor.serve)
    return {"subscription": cursor.subscription}


def _check_types(types: list[str] | None) -> frozenset[str] | None:
    """The event types a subscription keeps; -32602 naming the unknown ones and the known."""
    if types is None:
        return None
    unknown = [(index, name) for index, name in enumerate(types) if name not in EVENT_TYPES]
    if unknown:
        names = ", ".join(repr(name) for _, name in unknown)
        raise invalid_params(
            f"/types/{unknown[0][0]}",
            "unknown_type",
            f"unknown event type{'s' if len(unknown) > 1 else ''} {names}; "
            f"known: {', '.join(EVENT_TYPES)}",
            known=list(EVENT_TYPES),
        )
    return frozenset(types)


async def log_subscribe(params: LogSubscribeParams, call: Call) -> dict[str, Any]:
    """A cursor from `fromSeq` (inclusive; omitted = live only) over the durable log."""
    types = _check_types(params.types)
    await require_session(call, params.session_id)
    head = await call.gateway.head_seq(params.session_id)
    start = head + 1 if params.from_seq is None else params.from_seq
    _check_from_seq(params.session_id, start, head)
    connection = call.connection
    if len(connection.subscriptions) >= MAX_SUBSCRIPTIONS:
        raise RpcError(
            OVERLOADED,
            f"{MAX_SUBSCRIPTIONS} log subscriptions are open on this connection (the most one "
            "may hold); unsubscribe from one first",
            {"reason": "too_many_subscriptions", "limit": MAX_SUBSCRIPTIONS},
        )
    subscription = connection.new_subscription_id()
    cursor = LogCursor(
        subscription=subscription,
        session_id=params.session_id,
        next_seq=start,
        texts=call.gateway.event_texts,
        types=types,
        batch=params.batch,
        merge=params.merge,
    )
    connection.subscriptions[subscription] = cursor
    connection.subscription_stops[subscription] = connection.subscribe_log(
        cursor, live=start > head
    )
    return {
        "subscription": subscription,
        "fromSeq": start,
        "headSeq": head,
        "epoch": call.gateway.epoch,
    }


async def log_unsubscribe(params: SubscriptionRef, call: Call) -> dict[str, Any]:
    """Stop a subscription of this connection."""
    connection = call.connection
    if connection.subscriptions.pop(params.subscription, None) is None:
        raise not_found(f"subscription {params.subscription!r}")
    connection.subscription_stops.pop(params.subscription)()
    return {}


async def log_read(params: LogReadParams, call: Call) -> dict[str, Any]:
    """A page of durable events from `fromSeq`."""
    await require_session(call, params.session_id)
    limit = _limit(params.limit, DEFAULT_READ_LIMIT, MAX_READ_LIMIT)
    events = await call.gateway.directory.events(params.session_id)
    head = len(events) - 1
    _check_from_seq(params.session_id, params.from_seq, head)
    page = events[params.from_seq : params.from_seq + limit]
    return {
        "events": [event_to_json(event) for event in page],
        "nextSeq": params.from_seq + len(page),
        "headSeq": head,
    }


async def session_state(params: SessionStateParams, call: Call) -> dict[str, Any]:
    """Status, open turn/step, inbox depths, and the supervisor path and incarnation."""
    await require_session(call, params.session_id)
    directory = call.gateway.directory
    child = directory.child(params.session_id)
    agent = directory.live_agent(params.session_id)
    events = await directory.events(params.session_id)
    turn, step = open_position(events)
    state: dict[str, Any] = {
        "status": "stopped" if agent is None else agent.status,
        "inbox": {"nextTurn": 0, "nextStep": 0},
        "supervisor": {
            "path": f"{call.gateway.runtime.name}/{AGENT_CHILD_PREFIX}{params.session_id}",
            "incarnation": -1 if child is None else directory.incarnation(params.session_id),
        },
    }
    if agent is not None:
        inbox = agent.inbox.statistics()
        state["inbox"] = {"nextTurn": inbox.next_turn, "nextStep": inbox.next_step}
    if turn is not None:
        state["turn"] = turn
    if step is not None:
        state["step"] = step
    return state


async def session_send(params: SendParams, call: Call) -> dict[str, Any]:
    """`followup` / `steer` / `inject` without waiting for the turn."""
    await require_session(call, params.session_id)
    message = user_message(params.content, "content")
    agent = await attach(call, params.session_id)
    place_message(agent, message, params.placement)
    return {"accepted": True, "placement": params.placement}


def place_message(
    agent: Agent, message: Message, placement: Literal["next_turn", "next_step", "inject"]
) -> None:
    """Queue `message` on `agent` where `placement` says (`_harness/session/send`).

    `next_turn` is a follow-up, `next_step` steers the running turn, `inject`
    joins the next request without a turn of its own.

    Raises:
        RpcError: the agent refused it (`input_refusals`: a full inbox, a closed agent).
    """
    with input_refusals(agent.session.id):
        if placement == "next_turn":
            agent.followup(message)
        elif placement == "next_step":
            agent.steer(message)
        else:
            agent.inject(message)


async def session_cancel(params: HarnessCancelParams, call: Call) -> dict[str, Any]:
    """Cancel the live turn (keeping queued input unless `keepInbox` is false)."""
    await require_session(call, params.session_id)
    agent = call.gateway.directory.live_agent(params.session_id)
    if agent is None:
        return {"cancelled": False}
    running = agent.status == "running"
    agent.cancel(keep_inbox=params.keep_inbox)
    return {"cancelled": running}


async def prompt_inspect(params: InspectParams, call: Call) -> dict[str, Any]:
    """A dry run of the next step's assembly (nothing logged, no provider, no pre-step).

    Like every observe method it never starts an agent (a token with only
    `observe` must not start stored sessions): a stopped session is refused
    (-33005, `not_running`); `session/resume` starts it.
    """
    await require_session(call, params.session_id)
    agent = call.gateway.directory.live_agent(params.session_id)
    if agent is None:
        raise RpcError(
            ASSEMBLY_FAILED,
            f"session {params.session_id!r} is not running, and an observe method starts no "
            "agent: session/resume it (control scope) to inspect its next step",
            {"reason": "not_running"},
        )
    try:
        inspection = await agent.inspect_next_step()
    except PromptError as exc:
        raise RpcError(
            ASSEMBLY_FAILED,
            f"session {params.session_id!r}: assembly failed: {exc}",
            {"reason": "assembly_failed"},
        ) from exc
    return inspection_json(inspection)


def inspection_json(inspection: StepInspection) -> dict[str, Any]:
    """`inspection` as `_harness/prompt/inspect`'s result (sections and contexts with `shadows`).

    The header is written exactly as the log would write it.
    """
    header_event = Event(
        type="request/header",
        seq=0,
        time=0,
        data=RequestHeaderLogged(header=inspection.header, reason="change"),
    )
    return {
        "header": event_to_json(header_event)["data"]["header"],
        "headerChanged": inspection.header_changed,
        "sections": [
            {
                "name": s.name,
                "order": s.order,
                "scope": s.scope,
                "shadows": list(s.shadows),
                "complete": s.complete,
                "bytes": s.bytes,
                "sha256": s.sha256,
            }
            for s in inspection.sections
        ],
        "tools": [{"name": t.name, "scope": t.scope} for t in inspection.tools],
        "contexts": [
            {"name": c.name, "order": c.order, "scope": c.scope, "text": c.text}
            for c in inspection.contexts
        ],
        "variables": dict(inspection.variables),
    }


async def request_rebuild(params: RebuildParams, call: Call) -> dict[str, Any]:
    """The exact request of one attempt, rebuilt from the durable log, and its SHA-256."""
    await require_session(call, params.session_id)
    events = await call.gateway.directory.events(params.session_id)
    try:
        request = rebuild_request(list(events), params.turn, params.step, params.attempt).to_json()
    except SessionError as exc:
        raise RpcError(
            REBUILD_FAILED,
            f"session {params.session_id!r} turn {params.turn} step {params.step} "
            f"attempt {params.attempt}: {exc}",
            {"reason": "rebuild_failed"},
        ) from exc
    text = json.dumps(request, separators=(",", ":"), ensure_ascii=False)
    return {"request": request, "sha256": hashlib.sha256(text.encode()).hexdigest()}


async def stats(params: Empty, call: Call) -> dict[str, Any]:
    """Runtime, provider, cache, store, gateway and supervision figures."""
    return await call.gateway.stats(call.principal)


async def supervision_tree(params: Empty, call: Call) -> dict[str, Any]:
    """The runtime's supervisor and its children."""
    return {"tree": call.gateway.supervision_tree(call.principal)}


async def supervision_restart(params: RestartParams, call: Call) -> dict[str, Any]:
    """Restart the agent at `path` (`<runtime>/agent:<sessionId>`); every connection that may
    observe the session gets a `_harness/supervision/event`."""
    gateway = call.gateway
    prefix = f"{gateway.runtime.name}/{AGENT_CHILD_PREFIX}"
    session_id = params.path[len(prefix) :] if params.path.startswith(prefix) else None
    directory = gateway.directory
    if (
        session_id is None
        or not directory.visible(call.principal, session_id)
        or directory.child(session_id) is None
    ):
        raise not_found(f"supervision path {params.path!r}")
    await directory.restart(session_id)
    incarnation = directory.incarnation(session_id)
    gateway.notify_observers(
        session_id,
        notification(
            "_harness/supervision/event",
            {
                "path": params.path,
                "kind": "restarted",
                "reason": "admin",
                "incarnation": incarnation,
                "time": system_clock_ms(),
            },
        ),
    )
    return {"path": params.path, "incarnation": incarnation}
