"""The node-stream envelope: round trips, and garbage refused with `EnvelopeError` only."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervision.cluster import wire

texts = st.text(max_size=50)


@given(key=texts, text=texts)
def test_a_frame_to_a_node_round_trips(key: str, text: str) -> None:
    assert wire.parse(wire.to_node(key, text)) == wire.Envelope(key=key, texts=(text,))


@given(key=texts, frames=st.lists(texts, max_size=5))
def test_frames_to_a_gateway_round_trip(key: str, frames: list[str]) -> None:
    assert wire.parse(wire.to_gateway(key, frames)) == wire.Envelope(key=key, texts=tuple(frames))


@given(key=texts, code=st.integers(1000, 4999), reason=texts)
def test_ends_round_trip(key: str, code: int, reason: str) -> None:
    assert wire.parse(wire.end_to_gateway(key, code, reason)) == wire.Envelope(
        key=key, end=code, reason=reason
    )
    assert wire.parse(wire.end_to_node(key)) == wire.Envelope(key=key, end=1000)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=8,
)


@given(
    value=json_values
    | st.fixed_dictionaries({"c": texts}, optional={"m": json_values, "end": json_values})
)
def test_anything_else_is_an_envelope_error_or_an_envelope(value: object) -> None:
    try:
        envelope = wire.parse(json.dumps(value))
    except wire.EnvelopeError as exc:
        assert str(exc)
    else:
        assert isinstance(envelope.key, str)


@pytest.mark.parametrize("frame", [b"binary", "not json", "[]", '{"c": 1, "m": "x"}', '{"c": "k"}'])
def test_garbage_names_what_is_wrong(frame: str | bytes) -> None:
    with pytest.raises(wire.EnvelopeError, match="node-stream frame"):
        wire.parse(frame)
