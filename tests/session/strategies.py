"""Hypothesis strategies for session events: every data class, with every optional field."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from actors.messages import (
    Block,
    Message,
    PluginSource,
    ReasoningBlock,
    Source,
    TextBlock,
    ToolCallBlock,
    ToolSource,
    UserSource,
)
from actors.prompt.types import ToolSchema
from actors.providers.chunks import (
    Chunk,
    Failure,
    FinishChunk,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
)
from actors.session.events import (
    EVENT_TYPES,
    SURFACE_TYPES,
    AbortCause,
    AssistantChunk,
    AssistantMessage,
    CompactionEnded,
    CompactionRequested,
    Event,
    EventData,
    RequestHeaderLogged,
    RequestRetry,
    StepEnd,
    StepStart,
    ToolCallRequested,
    ToolError,
    ToolResult,
    TurnEnd,
    TurnEndReason,
    TurnError,
    TurnStart,
    UnknownData,
    UserMessage,
    type_of,
)
from actors.session.header import RequestHeader

texts = st.text(max_size=12)
counts = st.integers(min_value=0, max_value=2**53)
optional_counts = st.none() | counts

json_values: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(texts, children, max_size=3),
    max_leaves=8,
)
json_objects = st.dictionaries(texts, json_values, max_size=4)

blocks: st.SearchStrategy[Block] = st.one_of(
    st.builds(TextBlock, text=texts),
    st.builds(ReasoningBlock, text=texts),
    st.builds(ToolCallBlock, id=texts, name=texts, arguments=texts),
)
sources: st.SearchStrategy[Source] = st.one_of(
    st.builds(UserSource),
    st.builds(ToolSource, call_id=texts),
    st.builds(
        PluginSource,
        plugin=texts,
        form=st.none() | texts,
        sections=st.none() | st.lists(texts, max_size=3),
    ),
)
usages = st.builds(
    Usage,
    input_tokens=counts,
    output_tokens=counts,
    cache_read_tokens=counts,
    reasoning_tokens=optional_counts,
)
failures = st.builds(
    Failure,
    code=texts,
    message=texts,
    status=optional_counts,
    retry_after_ms=optional_counts,
    retryable=st.booleans(),
)
chunks: st.SearchStrategy[Chunk] = st.one_of(
    st.builds(TextDelta, text=texts),
    st.builds(ReasoningDelta, text=texts),
    st.builds(
        ToolCallDelta,
        index=counts,
        id=st.none() | texts,
        name=st.none() | texts,
        arguments=texts,
    ),
    st.builds(UsageChunk, usage=usages),
    st.builds(FinishChunk, reason=st.sampled_from(["completed", "tool-calls", "max-tokens"])),
    st.builds(FinishChunk, reason=st.just("error"), failure=failures),
)
tool_schemas = st.builds(ToolSchema, name=texts, description=texts, parameters=json_objects)
headers = st.builds(
    RequestHeader,
    config=json_objects,
    # Canonical: an empty system text is written absent (see test_codec).
    system=st.none() | st.text(min_size=1, max_size=12),
    tools=st.lists(tool_schemas, max_size=3),
)
assistant_messages = st.builds(
    Message, role=st.just("assistant"), content=st.lists(blocks, max_size=3)
)
turn_end_reasons = st.one_of(
    st.builds(
        TurnEndReason, kind=st.sampled_from(["completed", "blocked", "max-tokens", "interrupted"])
    ),
    st.builds(
        TurnEndReason,
        kind=st.just("aborted"),
        reason=st.builds(AbortCause, kind=st.sampled_from(["user", "parent", "disposed"])),
    ),
    st.builds(
        TurnError,
        message=texts,
        code=texts,
        status=optional_counts,
        retry_after_ms=optional_counts,
    ).map(TurnEndReason.failed),
)

user_messages = st.builds(UserMessage, content=st.lists(blocks, max_size=3), source=sources)
tool_results = st.builds(
    ToolResult,
    turn=counts,
    step=counts,
    call_id=texts,
    content=texts,
    is_error=st.booleans(),
    error=st.none() | st.builds(ToolError, name=texts, code=texts),
)
assistant_message_data = st.builds(
    AssistantMessage,
    turn=counts,
    step=counts,
    message=assistant_messages,
    usage=st.none() | usages,
    interrupted=st.booleans(),
)

DATA: dict[str, st.SearchStrategy[EventData]] = {
    "turn/start": st.builds(TurnStart, turn=counts),
    "step/start": st.builds(StepStart, turn=counts, step=counts),
    "user/message": user_messages,
    "request/header": st.builds(
        RequestHeaderLogged, header=headers, reason=st.sampled_from(["initial", "resume", "change"])
    ),
    "assistant/chunk": st.builds(AssistantChunk, turn=counts, step=counts, chunk=chunks),
    "assistant/message": assistant_message_data,
    "tool/call": st.builds(
        ToolCallRequested, turn=counts, step=counts, call_id=texts, name=texts, arguments=texts
    ),
    "tool/result": tool_results,
    "request/retry": st.builds(
        RequestRetry, turn=counts, step=counts, attempt=counts, delay_ms=counts, failure=failures
    ),
    "step/end": st.builds(StepEnd, turn=counts, step=counts),
    "turn/end": st.builds(TurnEnd, turn=counts, reason=turn_end_reasons),
    "compaction/request": st.builds(
        CompactionRequested,
        compaction=counts,
        turn=counts,
        step=counts,
        replaces=st.lists(counts, max_size=4),
        instruction=texts,
    ),
    "compaction/end": st.builds(
        CompactionEnded,
        compaction=counts,
        usage=st.none() | usages,
        failure=st.none() | failures,
    ),
}
"""A strategy for the data of every known event type."""

surface_data: st.SearchStrategy[EventData] = st.one_of(
    user_messages, assistant_message_data, tool_results
)
"""Data of the surface (model-visible) event types."""

non_surface_data: st.SearchStrategy[EventData] = st.one_of(
    *(strategy for name, strategy in DATA.items() if name not in SURFACE_TYPES)
)
"""Data of the event types the model never sees."""


@st.composite
def known_events(draw: st.DrawFn, type_: str | None = None) -> Event:
    """An event of a known type (any type when `type_` is None), with any envelope."""
    data = draw(DATA[type_] if type_ is not None else st.one_of(*DATA.values()))
    name = type_of(data)
    replaces = name in SURFACE_TYPES and draw(st.booleans())
    return Event(
        type=name,
        seq=draw(counts),
        time=draw(counts),
        data=data,
        surface_op="replace" if replaces else None,
        source_event_seqs=draw(st.lists(counts, max_size=3)) if replaces else None,
        ignorable=draw(st.booleans()),
    )


unknown_events = st.builds(
    Event,
    type=texts.filter(lambda name: name not in EVENT_TYPES),
    seq=counts,
    time=counts,
    data=st.builds(UnknownData, raw=json_objects),
    ignorable=st.just(True),
)
"""Ignorable events of a type this version does not know."""
