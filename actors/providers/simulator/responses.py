"""The simulator's HTTP responses: JSON bodies, DeepSeek error bodies, event streams."""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import TypeAlias

from actors.providers.simulator.exchange import SimResponse, SimStream
from actors.providers.simulator.faults import Fault

Headers: TypeAlias = tuple[tuple[str, str], ...]

_SSE_HEADERS = (
    ("content-type", "text/event-stream; charset=utf-8"),
    ("cache-control", "no-cache"),
)
_JSON_HEADERS = (("content-type", "application/json"),)
_STATUS_MESSAGES = {
    400: "Invalid Format",
    401: "Authentication Fails",
    402: "Insufficient Balance",
    422: "Invalid Parameters",
    429: "Rate Limit Reached",
    500: "Server Error",
    503: "Server Overloaded",
}


def json_response(status: int, body: object, extra_headers: Headers = ()) -> SimResponse:
    """A compact JSON response.

    Args:
        status: The HTTP status.
        body: The JSON value to send.
        extra_headers: Headers sent after `content-type`.
    """
    data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    return SimResponse(status=status, headers=_JSON_HEADERS + extra_headers, body=data)


def error_response(
    status: int,
    message: str,
    *,
    type_: str | None = None,
    param: str | None = None,
    code: str | None = None,
    extra_headers: Headers = (),
) -> SimResponse:
    """A DeepSeek error body: `{"error": {"message", "type", "param", "code"}}`.

    Args:
        status: The HTTP status.
        message: The error message.
        type_: The error type; None derives it from `status`
            (`rate_limit_error` for 429, `server_error` for 5xx, else
            `invalid_request_error`).
        param: The offending request parameter, if any.
        code: The error code, if any.
        extra_headers: Headers sent after `content-type`.
    """
    if type_ is None:
        type_ = "invalid_request_error" if status < 500 else "server_error"
        if status == 429:
            type_ = "rate_limit_error"
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return json_response(status, body, extra_headers)


def fault_response(fault: Fault) -> SimResponse | None:
    """The error `fault` answers with instead of a stream, or None when it has no status.

    The message is DeepSeek's for the status (else the HTTP reason phrase),
    and the fault's `retry-after` and `retry-after-ms` headers go with it.
    """
    if fault.status is None:
        return None
    headers: list[tuple[str, str]] = []
    if fault.retry_after is not None:
        headers.append(("retry-after", fault.retry_after))
    if fault.retry_after_ms is not None:
        headers.append(("retry-after-ms", str(fault.retry_after_ms)))
    return error_response(fault.status, _status_message(fault.status), extra_headers=tuple(headers))


def stream_response(stream: SimStream) -> SimResponse:
    """A `200` server-sent-events response whose body is `stream`."""
    return SimResponse(status=200, headers=_SSE_HEADERS, stream=stream)


def _status_message(status: int) -> str:
    if status in _STATUS_MESSAGES:
        return _STATUS_MESSAGES[status]
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return f"Error {status}"
