"""Event JSON for the wire: exactly `session.to_json()`'s event, compact and ASCII, made cheaply.

`encode_event(event)` is `dumps(event_to_json(event)).encode()` (the
gateway's compact, ASCII-escaping, NaN-refusing encoder), byte for byte.
Two things make it cheaper than that expression, which costs 3-5 µs per
event and is the fan-out's largest cost per event:

- a streamed text or reasoning chunk (`assistant/chunk`, most of a step's
  events) is written from a template around its JSON-escaped text: no
  converter call, no dict, no encoder pass;
- every other event goes through `json`'s C encoder made once, not once
  per call as `JSONEncoder.encode` does.

`tests/gateway/test_encoding.py` checks with Hypothesis that both paths
give the generic expression's bytes, so a change to the log's JSON form
fails there rather than on the wire.
"""

from __future__ import annotations

import json.encoder
from collections.abc import Callable
from typing import Any

from actors.providers.chunks import ReasoningDelta, TextDelta
from actors.session import Event, event_to_json
from actors.session.events import AssistantChunk
from supervision.gateway.protocol import dumps


def _refuse(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _c_encoder() -> Callable[[Any], str]:
    """`dumps` through the C encoder made once (`dumps` itself when there is no C encoder)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return dumps
    # The arguments `JSONEncoder(separators=(",", ":"), allow_nan=False).iterencode` passes:
    # no circular-reference markers (event JSON is a tree), no indent, unsorted keys.
    encoder = make(None, _refuse, _escape, None, ":", ",", False, False, False)

    def encode(value: Any) -> str:
        return "".join(encoder(value, 0))

    return encode


_escape: Callable[[str], str] = json.encoder.encode_basestring_ascii
"""`json`'s ASCII string escaper (its C version when there is one), as the encoder uses."""

_encode_json = _c_encoder()

_CHUNK = (
    '{"type":"assistant/chunk","seq":%d,"time":%d,'
    '"data":{"turn":%d,"step":%d,"chunk":{"type":"%s","text":%s}}}'
)
_DELTA_TAGS: dict[type, str] = {TextDelta: "text", ReasoningDelta: "reasoning"}


def encode_event(event: Event) -> bytes:
    """The JSON of `event` as in `session.to_json()`, compact, as UTF-8 (ASCII) bytes.

    Raises:
        ValueError, TypeError: the event holds something JSON cannot carry
            (as `json.dumps`).
    """
    data = event.data
    if type(data) is AssistantChunk and event.surface_op is None and not event.ignorable:
        chunk = data.chunk
        tag = _DELTA_TAGS.get(type(chunk))
        seq, time, turn, step = event.seq, event.time, data.turn, data.step
        if tag is not None and type(seq) is type(time) is type(turn) is type(step) is int:
            text: str = chunk.text  # type: ignore[union-attr]
            return (_CHUNK % (seq, time, turn, step, tag, _escape(text))).encode()
    return _encode_json(event_to_json(event)).encode()
