"""Pure reducers: the model-visible surface, replacement (compaction), and request headers."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from actors.messages import Message, TextBlock, UserSource
from actors.prompt.types import ToolSchema
from actors.session import (
    ReplacementError,
    RequestHeader,
    canonical_header,
    derive_messages,
    fold_request_header,
    header_equals,
)
from actors.session.events import (
    AssistantMessage,
    Event,
    EventData,
    RequestHeaderLogged,
    StepStart,
    ToolResult,
    TurnStart,
    UserMessage,
    type_of,
)


def log(*items: EventData | tuple[EventData, Sequence[int]]) -> list[Event]:
    """Events numbered from 0; a `(data, seqs)` pair is a replacement citing `seqs`."""
    events = []
    for seq, item in enumerate(items):
        data, cited = item if isinstance(item, tuple) else (item, None)
        events.append(
            Event(
                type=type_of(data),
                seq=seq,
                time=0,
                data=data,
                surface_op=None if cited is None else "replace",
                source_event_seqs=cited,
            )
        )
    return events


def user(text: str) -> UserMessage:
    return UserMessage(content=text, source=UserSource())


def assistant(text: str) -> AssistantMessage:
    return AssistantMessage(turn=0, step=0, message=Message(role="assistant", content=text))


def texts(events: Sequence[Event]) -> list[str]:
    return [message.text for message in derive_messages(events)]


def header(system: str | None = None, tools: Sequence[ToolSchema] = ()) -> RequestHeader:
    return RequestHeader(config={"model": "m"}, system=system, tools=tools)


def tool(name: str) -> ToolSchema:
    return ToolSchema(name=name, description=f"{name} tool", parameters={"type": "object"})


def test_derive_messages_keeps_surface_events_in_order() -> None:
    result = ToolResult(turn=0, step=0, call_id="c1", content="42", is_error=True)
    events = log(TurnStart(turn=0), user("q"), StepStart(turn=0, step=0), assistant("a"), result)
    messages = derive_messages(events)
    assert [m.role for m in messages] == ["user", "assistant", "user"]
    assert messages[0] == Message(role="user", content=(TextBlock(text="q"),), source=UserSource())
    assert messages[2] == result.to_message()
    assert messages[2].is_error


def test_replacement_takes_the_place_of_the_run_it_cites() -> None:
    events = log(user("a"), user("b"), assistant("c"), user("d"), (user("summary"), [1, 2]))
    assert texts(events) == ["a", "summary", "d"]


def test_replacement_of_a_replacement_is_allowed() -> None:
    events = log(user("a"), user("b"), (user("ab"), [0, 1]), user("c"), (user("abc"), [2, 3]))
    assert texts(events) == ["abc"]


@pytest.mark.parametrize(
    ("cited", "reason"),
    [
        ([1], "not a surface event"),
        ([9], "not an earlier event"),
        ([3], "not an earlier event"),
        ([4], "not an earlier event"),
    ],
    ids=["non-surface", "missing", "itself", "later"],
)
def test_replacement_citing_an_invalid_event_is_refused(cited: list[int], reason: str) -> None:
    events = log(user("a"), TurnStart(turn=0), user("b"), (user("x"), cited), user("later"))
    with pytest.raises(ReplacementError, match=rf"replacement event seq 3 cites seq \d+.*{reason}"):
        derive_messages(events)


def test_replacement_citing_an_already_replaced_event_is_refused() -> None:
    events = log(user("a"), user("b"), (user("ab"), [0, 1]), (user("again"), [0]))
    with pytest.raises(ReplacementError, match="already removed from the surface"):
        derive_messages(events)


def test_replacement_citing_a_seq_twice_is_refused() -> None:
    events = log(user("a"), user("b"), user("c"), (user("x"), [0, 0]))
    with pytest.raises(ReplacementError, match=r"cites a seq more than once: \[0, 0\]"):
        derive_messages(events)


def test_replacement_citing_nothing_is_refused() -> None:
    events = log(user("a"), (user("x"), []))
    with pytest.raises(ReplacementError, match="cites no events"):
        derive_messages(events)


def test_fold_request_header_yields_the_latest_canonical_header() -> None:
    first, second = header("one"), header("", tools=[tool("t")])
    events = log(
        RequestHeaderLogged(header=first, reason="initial"),
        user("q"),
        RequestHeaderLogged(header=second, reason="change"),
    )
    folded = fold_request_header(events)
    assert folded == canonical_header(second)
    assert folded is not None and folded.system is None


def test_fold_request_header_without_headers_yields_start() -> None:
    start = header("s")
    assert fold_request_header(log(user("q"))) is None
    assert fold_request_header(log(user("q")), start) is start


def test_canonical_header_makes_empty_system_and_tools_absent() -> None:
    canonical = canonical_header(header(""))
    assert canonical.system is None
    assert canonical.tools == ()
    assert canonical == canonical_header(header(None))


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        (header("s", [tool("a")]), header("s", [tool("a")]), True),
        (header(""), header(None), True),
        (header("s"), RequestHeader(config={"model": "other"}, system="s"), False),
        (header("s"), header("s "), False),
        (header("s", [tool("a"), tool("b")]), header("s", [tool("b"), tool("a")]), False),
        (header("s", [tool("a")]), header("s"), False),
        (header("s"), None, False),
        (None, None, True),
    ],
    ids=[
        "same",
        "empty-system-is-absent",
        "config",
        "system-bytes",
        "tool-order",
        "tool-set",
        "one-missing",
        "both-missing",
    ],
)
def test_header_equals(a: RequestHeader | None, b: RequestHeader | None, equal: bool) -> None:
    assert header_equals(a, b) is equal
    assert header_equals(b, a) is equal
