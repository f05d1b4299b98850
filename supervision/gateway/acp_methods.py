"""The ACP v1 methods: plain async handlers of (params, call), mapped onto the runtime.

`session/prompt` and `session/load` answer through cursors (their
`session/update`s are projections of the durable log and all go out before
the reply), so they return `DEFERRED`. Errors are `RpcError`s naming the
offending field, session or method.
"""

from __future__ import annotations

import datetime
import functools
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import PurePath
from typing import Any

from actors.agent import Agent, AgentClosedError, InboxFullError, TurnFailedError, TurnTicket
from actors.messages import Message, TextBlock, UserSource
from actors.session import SessionError, UnknownSessionError
from supervision.gateway.connection import DEFERRED, Call, Connection
from supervision.gateway.cursors import PromptCursor, ReplayCursor
from supervision.gateway.messages import (
    InitializeParams,
    ListSessionsParams,
    LoadSessionParams,
    NewSessionParams,
    PromptParams,
    SessionRef,
)
from supervision.gateway.outbox import OutboxClosed
from supervision.gateway.protocol import (
    INTERNAL_ERROR,
    OVERLOADED,
    SESSION_BUSY,
    RpcError,
    clip,
    invalid_params,
    not_found,
)
from supervision.supervisor import SupervisionError

PROTOCOL_VERSION = 1
SESSION_LIST_PAGE = 100


async def require_session(call: Call, session_id: str) -> None:
    """Raise -32002 unless `session_id` exists and the caller's filter covers it.

    A session outside the filter is answered exactly like a missing one.
    """
    directory = call.gateway.directory
    if not directory.visible(call.principal, session_id) or not await directory.exists(session_id):
        raise not_found(f"session {session_id!r}")


def user_message(blocks: list[dict[str, Any]], field: str) -> Message:
    """A user message from ACP content blocks (text, and resource links as their URI)."""
    content = []
    for index, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            content.append(TextBlock(text=block["text"]))
        elif kind == "resource_link" and isinstance(block.get("uri"), str):
            content.append(TextBlock(text=block["uri"]))
        else:
            raise invalid_params(
                f"/{field}/{index}",
                "unsupported_content",
                f"{field}[{index}]: content type {kind!r} is not supported; send text",
            )
    if not content:
        raise invalid_params(f"/{field}", "empty", f"{field} holds no content")
    return Message(role="user", content=tuple(content), source=UserSource())


async def initialize(params: InitializeParams, call: Call) -> dict[str, Any]:
    """Capabilities, with the harness extension under `agentCapabilities._meta.harness`."""
    gateway = call.gateway
    return {
        "protocolVersion": PROTOCOL_VERSION,
        "agentCapabilities": {
            "loadSession": True,
            "promptCapabilities": {"image": False, "audio": False, "embeddedContext": False},
            "sessionCapabilities": {"list": {}, "resume": {}, "close": {}},
            "_meta": {
                "harness": {
                    "protocol": "harness-supervisor/1",
                    "runtimeId": gateway.runtime_id,
                    "epoch": gateway.epoch,
                    "methods": gateway.methods.names(),
                    "limits": gateway.limits(),
                    "scopes": sorted(call.principal.token.scopes),
                }
            },
        },
        "agentInfo": {"name": "harness", "title": "harness", "version": gateway.version},
        "authMethods": [],
    }


async def new_session(params: NewSessionParams, call: Call) -> dict[str, Any]:
    """Start an agent of profile `_meta.harness.agent` (default `default`)."""
    if params.mcp_servers:
        raise invalid_params(
            "/mcpServers", "unsupported", "mcpServers are not supported; pass an empty list"
        )
    harness = (params.meta or {}).get("harness") or {}
    profile = harness.get("agent", "default") if isinstance(harness, dict) else "default"
    if not isinstance(profile, str) or profile not in call.gateway.directory.profiles:
        raise invalid_params(
            "/_meta/harness/agent",
            "unknown_agent",
            f"unknown agent profile {profile!r}; configured: "
            f"{sorted(call.gateway.directory.profiles)}",
        )
    try:
        agent = await call.gateway.directory.create(profile=profile, owner=call.principal.token)
    except SupervisionError as exc:
        raise RpcError(-32603, f"session/new: the agent did not start: {exc}") from exc
    return {"sessionId": agent.session.id}


async def prompt(params: PromptParams, call: Call) -> Any:
    """Queue the prompt as a followup; the reply comes at *that* turn's end (via its cursor)."""
    await require_session(call, params.session_id)
    message = user_message(params.prompt, "prompt")
    connection = call.connection
    refuse_second_prompt(connection, params.session_id)
    agent = await attach(call, params.session_id)
    # Again: another prompt of this connection may have registered while the agent started.
    refuse_second_prompt(connection, params.session_id)
    ticket = submit_prompt(agent, message)
    gateway = call.gateway
    request_id = call.id
    cursor = PromptCursor(
        request_id=request_id,
        session_id=params.session_id,
        next_seq=len(agent.session),
        texts=tuple(b.text for b in message.content if isinstance(b, TextBlock)),
        claim=lambda turn: gateway.claim_turn(params.session_id, turn),
        on_done=lambda: _prompt_done(call, params.session_id, request_id),
    )
    connection.prompts[params.session_id] = cursor
    connection.follow(cursor)
    connection.start_soon(functools.partial(answer_at_outcome, ticket, cursor))
    return DEFERRED


def refuse_second_prompt(connection: Connection, session_id: str) -> None:
    """Refuse a prompt while another of this connection waits on the same session.

    Raises:
        RpcError: -33002 `session_busy`.
    """
    if session_id in connection.prompts:
        raise RpcError(
            SESSION_BUSY,
            f"session {session_id!r}: a prompt from this connection is already in flight",
            {"reason": "session_busy"},
        )


@contextmanager
def input_refusals(session_id: str) -> Iterator[None]:
    """Answer input the agent of `session_id` refused: a full inbox is -33003
    (`overloaded`, `retryAfterMs`), a closed agent -32603 (`closed`)."""
    try:
        yield
    except InboxFullError as exc:
        raise RpcError(
            OVERLOADED, str(exc), {"reason": "overloaded", "retryAfterMs": 1000}
        ) from exc
    except AgentClosedError as exc:
        raise closed_error(session_id, exc) from exc


def submit_prompt(agent: Agent, message: Message) -> TurnTicket:
    """Queue a prompt's message on `agent` as a followup; its ticket tells the turn's outcome.

    Raises:
        RpcError: the agent refused it (`input_refusals`).
    """
    with input_refusals(agent.session.id):
        return agent.submit(message)


def closed_error(session_id: str, exc: AgentClosedError) -> RpcError:
    """The -32603 (`closed`) answer for input to an agent that closed first."""
    return RpcError(INTERNAL_ERROR, f"session {session_id!r}: {exc}", {"reason": "closed"})


async def answer_at_outcome(
    ticket: TurnTicket, cursor: PromptCursor, connection: Connection
) -> None:
    """Once the prompt's message has its outcome (`ticket`), answer what the log cannot show.

    The prompt's cursor finds its turn in the log by the prompt's message and
    answers at its `turn/end`; this answers the rest: a turn whose first step
    never opened (`adopt`: refused → `refusal`, or failed → -32603 with
    `turnEnd`), input dropped before any turn took it (`cancelled`), and an
    agent that closed first (-32603). Cancelled with the connection, the
    queued prompt still gets its turn (it survives its client).
    """
    framing = connection.transport.framing
    try:
        try:
            turn: int | None = (await ticket.outcome()).turn
        except TurnFailedError as failed:
            turn = failed.turn
        frames = cursor.cancel_if_waiting(framing) if turn is None else cursor.adopt(turn, framing)
        if frames:
            await connection.put_log(frames)
    except OutboxClosed:
        return
    except AgentClosedError as exc:
        connection.end_prompt(cursor.session_id, closed_error(cursor.session_id, exc))


def _prompt_done(call: Call, session_id: str, request_id: Any) -> None:
    cursor = call.connection.prompts.pop(session_id, None)
    if cursor is not None and cursor.turn is not None:
        call.gateway.release_turn(session_id, cursor.turn)
    call.connection.release(request_id)


async def cancel(params: SessionRef, call: Call) -> None:
    """Notification: cancel the live turn (queued input kept); a waiting prompt ends cancelled."""
    directory = call.gateway.directory
    if not directory.visible(call.principal, params.session_id):
        return
    agent = directory.live_agent(params.session_id)
    if agent is not None:
        agent.cancel(keep_inbox=True)
    pending = call.connection.prompts.get(params.session_id)
    if pending is not None:
        frames = pending.cancel_if_waiting(call.connection.transport.framing)
        if frames:
            await call.connection.put_log(frames)


async def load(params: LoadSessionParams, call: Call) -> Any:
    """Replay the conversation as `session/update`s, then answer null; starts the agent."""
    await require_session(call, params.session_id)
    agent = await attach(call, params.session_id)
    end = agent.session.durable_seq
    if end < 0:
        return None
    connection = call.connection
    request_id = call.id
    connection.follow(
        ReplayCursor(
            request_id=request_id,
            session_id=params.session_id,
            next_seq=0,
            end_seq=end,
            on_done=lambda: connection.release(request_id),
        )
    )
    return DEFERRED


async def resume(params: LoadSessionParams, call: Call) -> dict[str, Any]:
    """Attach without replay; starts the agent if needed."""
    await require_session(call, params.session_id)
    await attach(call, params.session_id)
    return {}


async def list_sessions(params: ListSessionsParams, call: Call) -> dict[str, Any]:
    """Pages of `SESSION_LIST_PAGE` visible sessions; each row's `_meta.harness` is its summary.

    Every session works in the gateway's directory (`cwd` of each row), so
    ACP's `cwd` filter naming another directory lists none.
    """
    directory = call.gateway.directory
    if params.cwd is not None and PurePath(params.cwd) != PurePath(call.gateway.cwd):
        return {"sessions": []}
    ids = [sid for sid in await directory.session_ids() if directory.visible(call.principal, sid)]
    start = cursor_position(params.cursor, "/cursor")
    page = ids[start : start + SESSION_LIST_PAGE]
    rows = []
    for sid in page:
        summary = await directory.summary(sid)
        rows.append(
            {
                "sessionId": sid,
                "cwd": call.gateway.cwd,
                "updatedAt": _iso(summary["updatedAt"]),
                "_meta": {"harness": summary},
            }
        )
    result: dict[str, Any] = {"sessions": rows}
    if start + SESSION_LIST_PAGE < len(ids):
        result["nextCursor"] = str(start + SESSION_LIST_PAGE)
    return result


async def close(params: SessionRef, call: Call) -> dict[str, Any]:
    """Dispose the session's agent; its log stays."""
    await require_session(call, params.session_id)
    await call.gateway.directory.close(params.session_id)
    return {}


async def attach(call: Call, session_id: str) -> Agent:
    """The live agent of `session_id`, started when it is stored but not running.

    Raises:
        RpcError: -32002 for a session that does not exist; -32603 when it
            could not start.
    """
    try:
        return await call.gateway.directory.attach(session_id)
    except UnknownSessionError:
        raise not_found(f"session {session_id!r}") from None
    except (SessionError, SupervisionError) as exc:
        raise RpcError(-32603, f"session {session_id!r} could not start: {exc}") from exc


_CURSOR = re.compile(r"[0-9]{1,18}")
"""A page cursor as issued: a position, in ASCII digits (`str.isdigit` takes "²" too)."""


def cursor_position(cursor: str | None, path: str) -> int:
    """The position a list cursor names (0 without one).

    Raises:
        RpcError: -32602 `invalid_cursor` for a cursor this gateway could not have issued.
    """
    if cursor is None:
        return 0
    if _CURSOR.fullmatch(cursor) is None:
        raise invalid_params(
            path, "invalid_cursor", f"cursor {clip(repr(cursor))} was not issued here"
        )
    return int(cursor)


def _iso(epoch_ms: int) -> str:
    return (
        datetime.datetime.fromtimestamp(epoch_ms / 1000, tz=datetime.UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )
