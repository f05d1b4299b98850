"""The node stream: how one gateway multiplexes all its clients over one websocket per node.

A gateway opens one websocket to each node it routes to (authenticated at
the handshake with the cluster secret as a bearer token) and carries every
client connection it forwards over it. Each text frame is one *envelope*:

- gateway → node: `{"c": KEY, "m": TEXT}`: `TEXT` is a JSON-RPC frame of
  the client connection `KEY` (an opaque string the gateway chose). The
  first frame for a key opens a virtual connection on the node (the gateway
  sends `initialize` first); `{"c": KEY, "end": true}` closes it.
- node → gateway: `{"c": KEY, "m": [TEXT, ...]}`: the JSON-RPC frames that
  virtual connection sends, in order (a long batch split over several
  envelopes of about 1 MiB at most); `{"c": KEY, "end": CODE, "reason":
  R}` when the node closed it.

On the node, each virtual connection is an ordinary gateway connection (the
same framing, limits and handlers), so the node protocol is ACP and
`_harness/*` unchanged, plus: `session/new` may name the new session's id
(`_meta.harness.sessionId`), `session/prompt` carries a request id
(`_meta.harness.requestId`), and a call for a session another node holds
is answered `MOVED`.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

MOVED = -33007
"""JSON-RPC error code: the session is held by another node (retry on its owner, or later)."""

MOVED_RETRY_MS = 500
"""The `retryAfterMs` a node suggests with `MOVED`."""


class EnvelopeError(ValueError):
    """A node-stream frame is not an envelope; the message says what is wrong with it."""


@attrs.frozen(kw_only=True)
class Envelope:
    """One node-stream frame: the client key and either its frames or its end.

    Attributes:
        key: the client connection the frames belong to.
        texts: JSON-RPC frame texts (empty for an end).
        end: None while open; the close code once ended (1000 from a gateway).
        reason: why it ended.
    """

    key: str
    texts: tuple[str, ...] = ()
    end: int | None = None
    reason: str = ""


def to_node(key: str, text: str) -> str:
    """The envelope carrying one client frame to a node."""
    return json.dumps({"c": key, "m": text}, separators=(",", ":"), ensure_ascii=False)


def end_to_node(key: str) -> str:
    """The envelope closing client `key`'s virtual connection on a node."""
    return json.dumps({"c": key, "end": True}, separators=(",", ":"))


def to_gateway(key: str, texts: list[str]) -> str:
    """The envelope carrying a virtual connection's frames back to the gateway."""
    return json.dumps({"c": key, "m": texts}, separators=(",", ":"), ensure_ascii=False)


def end_to_gateway(key: str, code: int, reason: str) -> str:
    """The envelope telling the gateway the node closed client `key`."""
    return json.dumps({"c": key, "end": code, "reason": reason}, separators=(",", ":"))


def parse(text: str | bytes) -> Envelope:
    """The envelope in one frame (either direction).

    Raises:
        EnvelopeError: not a JSON object with a string `c` and exactly one of
            `m` (a string or a list of strings) and `end`.
    """
    if isinstance(text, bytes):
        raise EnvelopeError("node-stream frames are text; got a binary frame")
    try:
        obj: Any = json.loads(text)
    except ValueError as exc:
        raise EnvelopeError(f"node-stream frame is not JSON: {exc}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("c"), str):
        raise EnvelopeError('node-stream frame must be an object with a string "c" (client key)')
    key = obj["c"]
    if ("m" in obj) == ("end" in obj):
        raise EnvelopeError(f'node-stream frame for {key!r} needs exactly one of "m" and "end"')
    if "end" in obj:
        end = obj["end"]
        code = 1000 if end is True else end
        if not isinstance(code, int) or isinstance(code, bool):
            raise EnvelopeError(f'node-stream frame for {key!r}: "end" must be true or a code')
        reason = obj.get("reason", "")
        return Envelope(key=key, end=code, reason=reason if isinstance(reason, str) else "")
    message = obj["m"]
    texts = (message,) if isinstance(message, str) else message
    if not isinstance(texts, list | tuple) or not all(isinstance(t, str) for t in texts):
        raise EnvelopeError(f'node-stream frame for {key!r}: "m" must be text or a list of texts')
    return Envelope(key=key, texts=tuple(texts))
