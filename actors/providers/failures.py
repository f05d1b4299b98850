"""Failure classification for HTTP providers: what went wrong, as a `Failure`.

Maps an HTTP error status to its failure code (with `Retry-After` /
`retry-after-ms` turned into a capped `retry_after_ms`), an httpx transport
exception to a connection or timeout failure, and an error body to a short
human message (DeepSeek's `{"error": {"message": ...}}` when present). The
codes are listed in `actors.providers.openai_compat`.
"""

from __future__ import annotations

import email.utils
import json
import math
from collections.abc import Mapping

import httpx

from actors.providers.chunks import Failure, FinishChunk

_EXCERPT = 200

_STATUS_CODES: dict[int, tuple[str, bool]] = {
    400: ("bad_request", False),
    401: ("unauthorized", False),
    402: ("insufficient_balance", False),
    403: ("forbidden", False),
    404: ("not_found", False),
    408: ("request_timeout", True),
    409: ("conflict", True),
    422: ("invalid_parameters", False),
    429: ("rate_limited", True),
    500: ("server_error", True),
    502: ("bad_gateway", True),
    503: ("server_overloaded", True),
    504: ("gateway_timeout", True),
}

_TIMEOUT_CODES: dict[type[httpx.TimeoutException], str] = {
    httpx.ConnectTimeout: "connect_timeout",
    httpx.ReadTimeout: "read_timeout",
    httpx.WriteTimeout: "write_timeout",
}


def error_finish(failure: Failure) -> FinishChunk:
    """The finish chunk that ends a stream with `failure`."""
    return FinishChunk(reason="error", failure=failure)


def excerpt(text: str) -> str:
    """`text`, cut to its first 200 characters plus `...` when longer."""
    return text if len(text) <= _EXCERPT else text[:_EXCERPT] + "..."


def failure_for_status(
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float,
    retry_after_cap_ms: int,
) -> Failure:
    """Classify an HTTP error response.

    Args:
        status: The response status.
        headers: Response headers (names case-insensitive, as httpx gives them).
        body: The (possibly truncated) response body; DeepSeek's
            `{"error": {"message", "type", "code"}}` message is carried over.
        now: Epoch seconds, to resolve a `Retry-After` HTTP date.
        retry_after_cap_ms: The longest wait to report.

    Returns:
        The failure, with `retry_after_ms` from `retry-after-ms` or `Retry-After`.
    """
    code, retryable = _STATUS_CODES.get(status, ("http_error", status >= 500))
    message = error_message(body)
    if status == 402:
        message = f"the account balance is exhausted (HTTP 402): {message}"
    else:
        message = f"HTTP {status}: {message}"
    return Failure(
        code=code,
        message=message,
        status=status,
        retry_after_ms=parse_retry_after(headers, now=now, cap_ms=retry_after_cap_ms),
        retryable=retryable,
    )


def parse_retry_after(headers: Mapping[str, str], *, now: float, cap_ms: int) -> int | None:
    """The server's requested wait in milliseconds, capped at `cap_ms`.

    `retry-after-ms` (milliseconds) wins over `Retry-After` (seconds or an
    HTTP date, resolved against `now`). A date in the past means 0; an
    unparseable value is ignored.
    """
    wait_ms: float | None = None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        wait_ms = _finite(raw_ms)
    raw = headers.get("retry-after")
    if wait_ms is None and raw is not None:
        seconds = _finite(raw)
        if seconds is None:
            try:
                when = email.utils.parsedate_to_datetime(raw)
            except (TypeError, ValueError):
                when = None
            if when is not None and when.tzinfo is not None:
                seconds = when.timestamp() - now
        if seconds is not None:
            wait_ms = seconds * 1000
    if wait_ms is None:
        return None
    return min(cap_ms, max(0, math.ceil(wait_ms)))


def _finite(text: str) -> float | None:
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def error_message(body: bytes) -> str:
    """DeepSeek's `error.message` from an error body, or the body's text.

    Args:
        body: An error response body or the data of an error event.

    Returns:
        `error.message` (or `error` itself when it is a string) from a JSON
        body; otherwise the text, cut by `excerpt`, or `"(empty body)"` for
        an empty non-JSON body.
    """
    text = body.decode("utf-8", errors="replace").strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        return excerpt(text) or "(empty body)"
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return excerpt(text)


def transport_failure(exc: httpx.RequestError, url: httpx.URL, *, started: bool) -> Failure:
    """Classify an httpx exception raised while sending or reading a request.

    Args:
        exc: What httpx raised.
        url: The request's URL, named in the message.
        started: Whether response headers had arrived (the body was streaming).

    Returns:
        A timeout failure named after httpx's own timeout (`connect_timeout`,
        `read_timeout`, `write_timeout`, else `pool_timeout`), all retryable;
        `transport_error` for a local protocol error or an unsupported URL;
        otherwise `connection_lost` once started, `connect_error` before,
        both retryable.
    """
    detail = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, httpx.TimeoutException):
        code = _TIMEOUT_CODES.get(type(exc), "pool_timeout")
        return Failure(code=code, message=f"{url}: {detail}", retryable=True)
    if isinstance(exc, (httpx.UnsupportedProtocol, httpx.LocalProtocolError)):
        return Failure(code="transport_error", message=f"{url}: {detail}")
    if started:
        return Failure(
            code="connection_lost",
            message=f"the connection to {url} broke mid-stream: {detail}",
            retryable=True,
        )
    return Failure(
        code="connect_error", message=f"no response from {url}: {detail}", retryable=True
    )
