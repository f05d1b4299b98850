"""The simulator's deterministic model and its scripted replies.

Without a script, the reply depends only on the prompt, and reads the new
input: the messages after the last assistant message (so a context snapshot
appended after the user's text does not hide it):

- when the new input holds tool results, it answers with a short text citing
  each of them;
- lines `call NAME {json}` in the new user messages make those tool calls,
  in order (a line whose JSON is not an object is plain text);
- anything else gets a filler reply of `reply_tokens` tokens, chosen from
  the prompt's digest.

`tool_choice` shapes this: `none` ignores the call lines; `required` with
no call line calls the first tool, a named function calls that tool (only
the call lines naming it, else one call); a forced call made up without a
call line gets `placeholder_arguments`. With `response_format` `json_object`
the text is a JSON object, `{"text": ...}`. With thinking on (or for a
reasoner) a short reasoning text comes first.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from actors.providers.simulator.choice import AUTO, ToolChoice, placeholder_arguments
from actors.providers.simulator.faults import SimFinishReason
from actors.providers.simulator.tokens import content_text, tokenize

_CALL_LINE = re.compile(r"^[ \t]*call[ \t]+([A-Za-z_][A-Za-z0-9_.-]*)[ \t]+(\{.*\})[ \t]*$", re.M)
_WORDS = (
    "the",
    "simulator",
    "streams",
    "a",
    "deterministic",
    "answer",
    "so",
    "tests",
    "can",
    "compare",
    "every",
    "byte",
    "of",
    "text",
    "usage",
    "and",
    "cache",
    "accounting",
    "across",
    "runs",
    "without",
    "a",
    "real",
    "model",
    "behind",
    "it",
)
_CITE = 60


@attrs.frozen(kw_only=True)
class SimToolCall:
    """A tool call in a reply.

    Attributes:
        name: The tool's name.
        arguments: The raw JSON argument text, streamed in fragments.
        id: The call id; None derives one from the prompt.
    """

    name: str
    arguments: str
    id: str | None = None


def tool_call_json(call: SimToolCall, arguments: str | None = None) -> dict[str, Any]:
    """The chat-completions JSON of `call`: `{"id", "type", "function": {"name", "arguments"}}`.

    Args:
        call: The tool call.
        arguments: The argument text to send (a streamed fragment); None
            sends all of `call.arguments`.
    """
    return {
        "id": call.id,
        "type": "function",
        "function": {
            "name": call.name,
            "arguments": call.arguments if arguments is None else arguments,
        },
    }


def _calls(value: Iterable[SimToolCall]) -> tuple[SimToolCall, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class SimReply:
    """One reply of the model.

    Attributes:
        text: The assistant text.
        reasoning: Reasoning text, streamed first as `reasoning_content`.
        tool_calls: Tool calls, streamed interleaved.
        finish_reason: The finish reason; None means `tool_calls` when there
            are calls, else `stop` (or `length` when `max_tokens` cut the text).
    """

    text: str = ""
    reasoning: str = ""
    tool_calls: tuple[SimToolCall, ...] = attrs.field(default=(), converter=_calls)
    finish_reason: SimFinishReason | None = None


class ReplyScript:
    """Exact replies for upcoming chat requests, consumed in order.

    Args:
        max_pending: The most replies queued at once.
    """

    def __init__(self, *, max_pending: int = 1024) -> None:
        self._max_pending = max_pending
        self._replies: deque[SimReply] = deque()

    @property
    def pending(self) -> int:
        """Replies queued and not yet used."""
        return len(self._replies)

    def queue(self, *replies: SimReply) -> None:
        """Answer the next chat requests with `replies`, one each, in order.

        Raises:
            ValueError: more than `max_pending` replies would be queued.
        """
        if len(self._replies) + len(replies) > self._max_pending:
            raise ValueError(
                f"at most {self._max_pending} scripted replies may be queued; "
                f"{len(self._replies)} already are"
            )
        self._replies.extend(replies)

    def take(self) -> SimReply | None:
        """The next scripted reply, or None when the script is empty."""
        return self._replies.popleft() if self._replies else None


def deterministic_reply(
    messages: Sequence[Mapping[str, Any]],
    *,
    thinking: bool,
    reply_tokens: int,
    seed: bytes,
    tools: Sequence[Mapping[str, Any]] = (),
    choice: ToolChoice = AUTO,
    json_mode: bool = False,
) -> SimReply:
    """The model's reply to validated `messages`; see the module docstring.

    Args:
        messages: The request's messages (at least one).
        thinking: Whether to reason first.
        reply_tokens: The length of a filler reply, in tokens.
        seed: A digest of the prompt, choosing the filler words and call ids.
        tools: The request's tools (validated; a forced call needs them).
        choice: The request's `tool_choice`.
        json_mode: Whether the text must be a JSON object.
    """
    tail = since_last_assistant(messages)
    text = "\n".join(content_text(m.get("content")) for m in tail if m["role"] == "user")
    reasoning = default_reasoning(messages) if thinking else ""
    results = [message for message in tail if message["role"] == "tool"]
    lines = [] if results else _call_lines(text, seed, choice)
    calls = _forced(lines, tools, choice, seed)
    if calls:
        return SimReply(reasoning=reasoning, tool_calls=tuple(calls))
    answer = _cite(results) if results else _filler(seed, reply_tokens)
    if json_mode:
        answer = json.dumps({"text": answer}, ensure_ascii=False)
    return SimReply(reasoning=reasoning, text=answer)


def default_reasoning(messages: Sequence[Mapping[str, Any]]) -> str:
    """The built-in model's reasoning text for validated `messages`, in thinking mode."""
    tail = since_last_assistant(messages)
    text = "\n".join(content_text(m.get("content")) for m in tail if m["role"] == "user")
    return f"The new input has {len(text.split())} words; I will answer it directly."


def _call_lines(text: str, seed: bytes, choice: ToolChoice) -> list[SimToolCall]:
    if choice.mode == "none":
        return []
    calls = []
    for number, match in enumerate(_CALL_LINE.finditer(text)):
        try:
            arguments = json.loads(match.group(2))
        except ValueError:
            continue
        if isinstance(arguments, dict):
            calls.append(
                SimToolCall(name=match.group(1), arguments=match.group(2), id=call_id(seed, number))
            )
    return calls


def _forced(
    calls: list[SimToolCall],
    tools: Sequence[Mapping[str, Any]],
    choice: ToolChoice,
    seed: bytes,
) -> list[SimToolCall]:
    """`calls` as `choice` allows them, or the one call `choice` forces."""
    if choice.mode == "function":
        calls = [call for call in calls if call.name == choice.name]
        forced = [tool for tool in tools if tool["function"]["name"] == choice.name]
    elif choice.mode == "required":
        forced = list(tools[:1])
    else:
        return calls
    if calls or not forced:
        return calls
    tool = forced[0]
    return [
        SimToolCall(
            name=tool["function"]["name"],
            arguments=placeholder_arguments(tool),
            id=call_id(seed, 0),
        )
    ]


def since_last_assistant(messages: Sequence[Mapping[str, Any]]) -> Sequence[Mapping[str, Any]]:
    """The new input: the messages after the last assistant message (all when there is none)."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index]["role"] == "assistant":
            return messages[index + 1 :]
    return messages


def call_id(seed: bytes, number: int) -> str:
    """A deterministic id for the `number`-th tool call of the reply to the prompt `seed`."""
    return "call_" + hashlib.sha256(seed + f":{number}".encode()).hexdigest()[:16]


def _cite(results: Sequence[Mapping[str, Any]]) -> str:
    cited: list[str] = []
    for message in results:
        content = content_text(message.get("content"))
        if len(content) > _CITE:
            content = content[:_CITE] + "..."
        cited.append(f"{message['tool_call_id']} returned {json.dumps(content)}")
    return "Tool results: " + "; ".join(cited) + "."


def _filler(seed: bytes, reply_tokens: int) -> str:
    tokens: list[str] = []
    index = 0
    while len(tokens) < reply_tokens:
        word = _WORDS[(seed[index % len(seed)] + index) % len(_WORDS)]
        tokens.extend(tokenize(("" if index == 0 else " ") + word))
        index += 1
    return "".join(tokens[:reply_tokens])
