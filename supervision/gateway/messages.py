"""Typed params of every gateway method, structured by the wire converter (`protocol.py`).

Field names are snake_case here and camelCase on the wire (`meta` is
`_meta`, which every params object accepts, as ACP's extensibility rules
say). The `_harness/*` params are ours and as strict as their JSON Schema:
an unknown member is refused (-32602 naming it). ACP params ignore members
they do not know (`EXTENSIBLE`): ACP reserves every name at the root of its
types for future protocol versions, and its SDKs ignore the ones they do
not know, so a client of a later version stays understood.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import attrs

# -- ACP ---------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class InitializeParams:
    """`initialize`."""

    EXTENSIBLE: ClassVar[bool] = True

    protocol_version: int
    client_capabilities: dict[str, Any] | None = None
    client_info: dict[str, Any] | None = None
    meta: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class NewSessionParams:
    """`session/new`: `_meta.harness.agent` names the profile (default `default`)."""

    EXTENSIBLE: ClassVar[bool] = True

    cwd: str
    mcp_servers: list[Any]
    meta: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class PromptParams:
    """`session/prompt`."""

    EXTENSIBLE: ClassVar[bool] = True

    session_id: str
    prompt: list[dict[str, Any]]
    meta: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class SessionRef:
    """ACP params naming one session (`session/cancel`, `session/close`)."""

    EXTENSIBLE: ClassVar[bool] = True

    session_id: str
    meta: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class LoadSessionParams:
    """`session/load` and `session/resume`."""

    EXTENSIBLE: ClassVar[bool] = True

    session_id: str
    cwd: str | None = None
    mcp_servers: list[Any] | None = None
    meta: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class ListSessionsParams:
    """`session/list`."""

    EXTENSIBLE: ClassVar[bool] = True

    cursor: str | None = None
    cwd: str | None = None
    meta: dict[str, Any] | None = None


# -- _harness/* ----------------------------------------------------------------


@attrs.frozen(kw_only=True)
class SessionFilter:
    """Which sessions `_harness/sessions/list` and `watch` cover."""

    status: str | None = None
    parent_session_id: str | None = None
    agent: str | None = None


@attrs.frozen(kw_only=True)
class SessionsListParams:
    """`_harness/sessions/list`."""

    filter: SessionFilter | None = None
    cursor: str | None = None
    limit: int | None = None
    meta: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class SessionsWatchParams:
    """`_harness/sessions/watch`."""

    filter: SessionFilter | None = None
    meta: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class LogSubscribeParams:
    """`_harness/log/subscribe`."""

    session_id: str
    from_seq: int | None = None
    types: list[str] | None = None
    batch: bool = False
    merge: bool = False
    meta: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class SubscriptionRef:
    """`_harness/log/unsubscribe`."""

    subscription: str
    meta: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class LogReadParams:
    """`_harness/log/read`."""

    session_id: str
    from_seq: int
    limit: int | None = None
    meta: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class SendParams:
    """`_harness/session/send`."""

    session_id: str
    content: list[dict[str, Any]]
    placement: Literal["next_turn", "next_step", "inject"]
    meta: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class HarnessCancelParams:
    """`_harness/session/cancel`."""

    session_id: str
    keep_inbox: bool = True
    meta: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class SessionStateParams:
    """`_harness/session/state`."""

    session_id: str
    meta: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class InspectParams:
    """`_harness/prompt/inspect`."""

    session_id: str
    meta: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class RebuildParams:
    """`_harness/request/rebuild`."""

    session_id: str
    turn: int
    step: int
    attempt: int = -1
    meta: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class Empty:
    """Methods without params (`_harness/stats`, `_harness/supervision/tree`)."""

    meta: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class RestartParams:
    """`_harness/supervision/restart`."""

    path: str
    meta: dict[str, Any] | None = None
