"""The method table: every method's params class, handler, required scope and framing rules.

It is data, so capabilities (`initialize`'s method list), scope checks and
the schema tests are derived from it rather than kept in parallel.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from supervision.gateway import acp_methods as acp
from supervision.gateway import harness_methods as harness
from supervision.gateway.auth import Scope
from supervision.gateway.messages import (
    Empty,
    HarnessCancelParams,
    InitializeParams,
    InspectParams,
    ListSessionsParams,
    LoadSessionParams,
    LogReadParams,
    LogSubscribeParams,
    NewSessionParams,
    PromptParams,
    RebuildParams,
    RestartParams,
    SendParams,
    SessionRef,
    SessionsListParams,
    SessionStateParams,
    SessionsWatchParams,
    SubscriptionRef,
)
from supervision.gateway.protocol import (
    FORBIDDEN,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    RpcError,
    clip,
    structure_params,
)

if TYPE_CHECKING:
    from supervision.gateway.connection import Call, Connection, Handler


@attrs.frozen(kw_only=True)
class Method:
    """One method.

    Attributes:
        params: the params class the converter structures.
        handler: `async def handler(params, call)`.
        scope: the token scope required (None: any authenticated caller).
        batchable: may appear in a batch (lifecycle and deferred-reply methods may not).
        notification: called as a notification (never answered).
    """

    params: type[Any]
    handler: Any
    scope: Scope | None
    batchable: bool = True
    notification: bool = False


METHODS: Mapping[str, Method] = {
    "initialize": Method(
        params=InitializeParams, handler=acp.initialize, scope=None, batchable=False
    ),
    "session/new": Method(params=NewSessionParams, handler=acp.new_session, scope="control"),
    "session/prompt": Method(
        params=PromptParams, handler=acp.prompt, scope="control", batchable=False
    ),
    "session/cancel": Method(
        params=SessionRef, handler=acp.cancel, scope="control", notification=True
    ),
    "session/load": Method(
        params=LoadSessionParams, handler=acp.load, scope="control", batchable=False
    ),
    "session/resume": Method(params=LoadSessionParams, handler=acp.resume, scope="control"),
    "session/list": Method(params=ListSessionsParams, handler=acp.list_sessions, scope="observe"),
    "session/close": Method(params=SessionRef, handler=acp.close, scope="control"),
    "_harness/sessions/list": Method(
        params=SessionsListParams, handler=harness.sessions_list, scope="observe"
    ),
    "_harness/sessions/watch": Method(
        params=SessionsWatchParams, handler=harness.sessions_watch, scope="observe"
    ),
    "_harness/log/subscribe": Method(
        params=LogSubscribeParams, handler=harness.log_subscribe, scope="observe"
    ),
    "_harness/log/unsubscribe": Method(
        params=SubscriptionRef, handler=harness.log_unsubscribe, scope="observe"
    ),
    "_harness/log/read": Method(params=LogReadParams, handler=harness.log_read, scope="observe"),
    "_harness/session/state": Method(
        params=SessionStateParams, handler=harness.session_state, scope="observe"
    ),
    "_harness/session/send": Method(
        params=SendParams, handler=harness.session_send, scope="control"
    ),
    "_harness/session/cancel": Method(
        params=HarnessCancelParams, handler=harness.session_cancel, scope="control"
    ),
    "_harness/prompt/inspect": Method(
        params=InspectParams, handler=harness.prompt_inspect, scope="observe"
    ),
    "_harness/request/rebuild": Method(
        params=RebuildParams, handler=harness.request_rebuild, scope="observe"
    ),
    "_harness/stats": Method(params=Empty, handler=harness.stats, scope="observe"),
    "_harness/supervision/tree": Method(
        params=Empty, handler=harness.supervision_tree, scope="observe"
    ),
    "_harness/supervision/restart": Method(
        params=RestartParams, handler=harness.supervision_restart, scope="admin"
    ),
}


@attrs.frozen(kw_only=True)
class MethodTable:
    """Admission (existence, order, batching, scope) and dispatch over `methods`."""

    methods: Mapping[str, Method] = METHODS

    def names(self) -> list[str]:
        """Every method name, in table order."""
        return list(self.methods)

    def admit(self, connection: Connection, name: str, *, in_batch: bool) -> RpcError | None:
        """The error refusing request `name` on `connection` before it runs, or None."""
        method = self.methods.get(name)
        if method is None or method.notification:
            return RpcError(
                METHOD_NOT_FOUND,
                f"unknown method {clip(repr(name))}"
                if method is None
                else f"{name!r} is a notification; send it without an id",
            )
        if name == "initialize":
            if connection.initialized:
                return RpcError(INVALID_REQUEST, "initialize was already called on this connection")
            if in_batch and not method.batchable:
                return RpcError(INVALID_REQUEST, f"{name!r} may not be sent in a batch")
            # Admitted in arrival order, so a client may pipeline requests after it.
            connection.initialized = True
        elif not connection.initialized:
            return RpcError(
                INVALID_REQUEST, f"{name!r} before initialize: initialize must come first"
            )
        if in_batch and not method.batchable:
            return RpcError(INVALID_REQUEST, f"{name!r} may not be sent in a batch")
        if method.scope is not None and not connection.principal.has(method.scope):
            return RpcError(
                FORBIDDEN,
                f"{name!r} needs the {method.scope!r} scope, which this token lacks",
                {"reason": "forbidden", "required": method.scope},
            )
        return None

    def notification(self, name: str) -> Handler | None:
        """The handler of notification `name` (params unstructured inside), or None if unknown."""
        method = self.methods.get(name)
        if method is None or not method.notification:
            return None

        async def run(params: Mapping[str, Any], call: Call) -> Any:
            if method.scope is not None and not call.principal.has(method.scope):
                return None
            return await method.handler(structure_params(name, params, method.params), call)

        return run

    async def call(self, name: str, params: Mapping[str, Any], call: Call) -> Any:
        """Structure `params` and run the handler of an admitted request."""
        method = self.methods[name]
        return await method.handler(structure_params(name, params, method.params), call)
