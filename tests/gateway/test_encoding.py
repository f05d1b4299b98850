"""The gateway's event encoder writes exactly the generic encoding of each log event."""

from __future__ import annotations

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.providers.chunks import ReasoningDelta, TextDelta
from actors.session import Event, MemoryStore, SessionError, event_to_json
from actors.session.events import AssistantChunk
from supervision.gateway.encoding import encode_event
from supervision.gateway.protocol import dumps
from tests.session.strategies import counts, known_events

# Any code point, lone surrogates and control characters included.
any_text = st.text(
    st.characters(min_codepoint=0, max_codepoint=0x10FFFF, categories=None)
    | st.sampled_from(["\ud800", "\udfff", "\x00", "\x7f", "é", "\u2028", '"', "\\"])
)

chunk_events = st.builds(
    Event,
    type=st.just("assistant/chunk"),
    seq=counts,
    time=counts,
    data=st.builds(
        AssistantChunk,
        turn=counts,
        step=counts,
        chunk=st.builds(TextDelta, text=any_text) | st.builds(ReasoningDelta, text=any_text),
    ),
    ignorable=st.booleans(),
)


def _generic(event: Event) -> bytes:
    return dumps(event_to_json(event)).encode()


@settings(max_examples=500, deadline=None)
@given(event=chunk_events)
def test_streamed_chunks_are_encoded_exactly_as_the_generic_encoder_does(event: Event) -> None:
    assert encode_event(event) == _generic(event)


@settings(max_examples=500, deadline=None)
@given(event=known_events())
def test_every_event_is_encoded_exactly_as_the_generic_encoder_does(event: Event) -> None:
    assert encode_event(event) == _generic(event)


@settings(max_examples=500, deadline=None)
@given(events=st.lists(known_events() | chunk_events, min_size=1, max_size=5))
async def test_a_memory_stores_kept_json_is_the_encoders_bytes_or_none(
    events: list[Event],
) -> None:
    store = MemoryStore()
    await store.create("s")
    stored = [attrs.evolve(event, seq=seq) for seq, event in enumerate(events)]
    try:
        await store.append("s", stored)
    except SessionError:
        return  # an event JSON cannot carry: nothing of the append is kept
    for event in stored:
        kept = store.durable_json("s", event.seq)
        assert kept is None or kept == encode_event(event)
    assert store.durable_json("s", len(stored)) is None
