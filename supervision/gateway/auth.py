"""Handshake authentication and per-request authorization.

A `Token` is a secret with scopes (`observe`, `control`, `admin`) and a
session filter (`"*"`, a tuple of ids, or `"own"`). `authenticate` runs on
the websocket handshake's headers, before the connection is accepted: the
token comes from `Authorization: Bearer <token>` or from a
`harness.bearer.<base64url(token)>` subprotocol; query strings are never
read. Secrets are compared in constant time (`hmac.compare_digest`), and
every configured token is compared, so timing says nothing about which one
nearly matched.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import itertools
from collections.abc import Iterable, Sequence
from typing import Literal

import attrs

Scope = Literal["observe", "control", "admin"]
SCOPES: tuple[Scope, ...] = ("observe", "control", "admin")
SUBPROTOCOL = "harness.v1"
"""The subprotocol echoed to browsers that authenticate with a bearer subprotocol."""
BEARER_SUBPROTOCOL_PREFIX = "harness.bearer."


def _scopes(value: Iterable[str]) -> frozenset[Scope]:
    scopes = frozenset(value)
    unknown = sorted(scopes - set(SCOPES))
    if unknown:
        raise ValueError(f"unknown token scope(s) {unknown}; known: {list(SCOPES)}")
    return scopes  # type: ignore[return-value]


def _sessions(value: str | Sequence[str]) -> str | tuple[str, ...]:
    if isinstance(value, str):
        if value not in ("*", "own"):
            raise ValueError(
                f'a token session filter is "*", "own" or a list of ids, not {value!r}'
            )
        return value
    return tuple(value)


@attrs.frozen(kw_only=True)
class Token:
    """A bearer secret, what it may do (`scopes`) and which sessions it sees (`sessions`)."""

    secret: str = attrs.field(repr=False)
    scopes: frozenset[Scope] = attrs.field(default=frozenset(SCOPES), converter=_scopes)
    sessions: str | tuple[str, ...] = attrs.field(default="*", converter=_sessions)
    name: str = "token"

    def __attrs_post_init__(self) -> None:
        if not self.secret:
            raise ValueError(f"token {self.name!r} has an empty secret")


_principal_ids = itertools.count()


@attrs.define(eq=False)
class Principal:
    """Who a connection is: its token, and the sessions it created (for the `own` filter)."""

    token: Token
    created: set[str] = attrs.field(factory=set)
    id: int = attrs.field(factory=lambda: next(_principal_ids))

    def has(self, scope: Scope) -> bool:
        """True when the token carries `scope`."""
        return scope in self.token.scopes


@attrs.frozen(kw_only=True)
class Denial:
    """A refused handshake: the HTTP status and a one-line reason for the body."""

    status: int
    reason: str


@attrs.frozen(kw_only=True)
class Accepted:
    """An accepted handshake: the token that matched and the subprotocol to echo (if any)."""

    token: Token
    subprotocol: str | None


def header(headers: Iterable[tuple[bytes, bytes]], name: str) -> str | None:
    """The first value of header `name` (case-insensitive), decoded as Latin-1."""
    wanted = name.lower().encode()
    for key, value in headers:
        if key.lower() == wanted:
            return value.decode("latin-1")
    return None


def origin_allowed(origin: str | None, allowed: Iterable[str]) -> bool:
    """A request without Origin (a non-browser client) is allowed; else it must be listed."""
    return origin is None or origin in set(allowed)


def authenticate(
    headers: Sequence[tuple[bytes, bytes]],
    subprotocols: Sequence[str],
    tokens: Sequence[Token],
    origins: Iterable[str],
) -> Accepted | Denial:
    """Check a handshake: Origin first (403), then the bearer token (401).

    The token is read from `Authorization: Bearer`, else from a
    `harness.bearer.<base64url>` subprotocol offered next to `harness.v1`
    (then `harness.v1` is echoed). Query-string tokens are not read.
    """
    origin = header(headers, "origin")
    if not origin_allowed(origin, origins):
        return Denial(status=403, reason=f"origin {origin!r} is not allowed")
    secret: str | None = None
    subprotocol: str | None = None
    authorization = header(headers, "authorization")
    if authorization is not None:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            # The header's bytes were read as Latin-1; a token's secret is UTF-8 text.
            try:
                secret = value.strip().encode("latin-1").decode("utf-8")
            except UnicodeDecodeError:
                return Denial(status=401, reason="the bearer token is not valid UTF-8")
    if secret is None:
        for offered in subprotocols:
            if offered.startswith(BEARER_SUBPROTOCOL_PREFIX):
                secret = _decode_bearer(offered[len(BEARER_SUBPROTOCOL_PREFIX) :])
                if SUBPROTOCOL in subprotocols:
                    subprotocol = SUBPROTOCOL
                break
    if secret is None:
        return Denial(status=401, reason="a bearer token is required")
    match = match_token(secret, tokens)
    if match is None:
        return Denial(status=401, reason="the bearer token is not valid")
    if subprotocol is None and SUBPROTOCOL in subprotocols:
        subprotocol = SUBPROTOCOL
    return Accepted(token=match, subprotocol=subprotocol)


def match_token(secret: str, tokens: Sequence[Token]) -> Token | None:
    """The token whose secret equals `secret`, comparing against every token in constant time."""
    offered = secret.encode()
    found: Token | None = None
    for token in tokens:
        if hmac.compare_digest(offered, token.secret.encode()):
            found = found or token
    return found


def _decode_bearer(value: str) -> str | None:
    try:
        return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


def bearer_subprotocol(secret: str) -> str:
    """The `harness.bearer.<base64url>` subprotocol carrying `secret` (unpadded)."""
    return BEARER_SUBPROTOCOL_PREFIX + base64.urlsafe_b64encode(secret.encode()).decode().rstrip(
        "="
    )
