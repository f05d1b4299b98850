"""Chat-completions stream parsing: SSE bytes in, chunks and one finish out.

`StreamParser` is pure (no I/O, no clock): it decodes the event stream,
turns each event's deltas into text, reasoning and tool-call chunks
(announcing each tool call's id and name once; the deltas of one read that
go together come joined), reads the usage and maps the
finish reason, and records the first failure (a malformed event, an error
event, an oversized event, too many tool calls) as the finish to end with.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs
import orjson

from actors.providers.chunks import (
    Chunk,
    Failure,
    FinishChunk,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
)
from actors.providers.failures import error_finish, error_message, excerpt
from actors.providers.sse import DEFAULT_MAX_EVENT_BYTES, SSEDecoder, SSEError

_MAX_TOOL_CALLS = 256

_FINISH_REASONS: dict[str, FinishReason] = {
    "stop": "completed",
    "length": "max-tokens",
    "tool_calls": "tool-calls",
    "function_call": "tool-calls",
}


def parse_usage(usage: Mapping[str, Any]) -> Usage:
    """Map a chat-completions `usage` object to `Usage`.

    `cache_read_tokens` comes from DeepSeek's `prompt_cache_hit_tokens`, else
    OpenAI's `prompt_tokens_details.cached_tokens`; `reasoning_tokens` from
    `completion_tokens_details.reasoning_tokens` when reported. Missing or
    non-integer counts read as 0 (None for reasoning).
    """
    prompt_details = usage.get("prompt_tokens_details")
    completion_details = usage.get("completion_tokens_details")
    cache = _count(usage.get("prompt_cache_hit_tokens"))
    if cache is None and isinstance(prompt_details, Mapping):
        cache = _count(prompt_details.get("cached_tokens"))
    reasoning = None
    if isinstance(completion_details, Mapping):
        reasoning = _count(completion_details.get("reasoning_tokens"))
    return Usage(
        input_tokens=_count(usage.get("prompt_tokens")) or 0,
        output_tokens=_count(usage.get("completion_tokens")) or 0,
        cache_read_tokens=cache or 0,
        reasoning_tokens=reasoning,
    )


class _Malformed(Exception):
    """An event broke the wire format; the message says how."""


class _TooManyToolCalls(Exception):
    """A stream opened more tool-call indexes than the adapter tracks."""


@attrs.define(eq=False)
class _ToolCallState:
    id_sent: bool = False
    name_sent: bool = False


@attrs.define(eq=False)
class StreamParser:
    """Turns the bytes of one chat-completions event stream into chunks.

    Feed it the body as it arrives; once `outcome` is set the stream is over
    and `final_chunks()` gives what ends it. Nothing is raised: every problem
    with the stream becomes the error finish in `outcome`.

    Args:
        max_event_bytes: The largest single SSE event accepted; a larger one
            ends the stream with an `event_too_large` failure.

    Attributes:
        outcome: The finish chunk to end with, once the stream is over.
        done: Whether the stream ended with `data: [DONE]` (so the rest of the
            body can be drained and the connection reused).
        data_events: Events that carried data so far; keep-alives (comment
            lines, `data: : keep-alive`) do not count, so a clock can tell a
            server that only keeps the connection open from one that answers.
    """

    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES
    outcome: FinishChunk | None = attrs.field(default=None, init=False)
    done: bool = attrs.field(default=False, init=False)
    data_events: int = attrs.field(default=0, init=False)
    _usage: Usage | None = attrs.field(default=None, init=False)
    _finish_reason: str | None = attrs.field(default=None, init=False)
    _calls: dict[int, _ToolCallState] = attrs.field(factory=dict, init=False)
    _decoder: SSEDecoder = attrs.field(init=False)

    @_decoder.default
    def _new_decoder(self) -> SSEDecoder:
        return SSEDecoder(max_event_bytes=self.max_event_bytes)

    def feed(self, data: bytes) -> list[Chunk]:
        """The chunks carried by the next bytes of the body.

        The deltas of one read that follow each other and go together are
        joined into one: adjacent text, adjacent reasoning, and a tool call's
        argument pieces after the one that introduced it (or after the
        read's first piece of it). They arrived at the same moment, so
        nothing is streamed later for it, and what they add up to is
        unchanged. Events after the one that ends the stream are ignored.
        """
        try:
            events = self._decoder.feed_data(data)
        except SSEError as exc:
            self.fail(Failure(code="event_too_large", message=str(exc)))
            return []
        runs = _Runs()
        for text in events:
            stripped = text.strip()
            if not stripped or stripped[0] == ":":  # a data-only keep-alive ("data: : keep-alive")
                if self.outcome is not None:
                    break
                continue
            self.data_events += 1
            if stripped == "[DONE]":
                self.done = True
                self.outcome = self._finish()
                break
            try:
                deltas = self._event(text)
            except _Malformed as exc:
                self.fail(
                    Failure(
                        code="malformed_event",
                        message=f"malformed stream event ({exc}): {excerpt(text)!r}",
                    )
                )
                break
            except _TooManyToolCalls as exc:
                self.fail(Failure(code="too_many_tool_calls", message=str(exc)))
                break
            # All of an event's deltas, or none if it is malformed.
            for delta in deltas:
                runs.add(delta)
            if self.outcome is not None:
                break
        return runs.chunks()

    def fail(self, failure: Failure) -> None:
        """End the stream with `failure` (for failures found outside the body)."""
        self.outcome = error_finish(failure)

    def final_chunks(self) -> list[Chunk]:
        """What ends the stream: the usage, when reported, then `outcome`."""
        assert self.outcome is not None, "final_chunks() before the stream ended"
        if self._usage is None:
            return [self.outcome]
        return [UsageChunk(usage=self._usage), self.outcome]

    def _event(self, data: str) -> list[_Delta]:
        """The deltas of one event (of its choice 0); its usage and finish reason are kept.

        Raises:
            _Malformed: the event breaks the wire format.
            _TooManyToolCalls: it opens one tool call too many.
        """
        try:
            obj = _loads(data)
        except (ValueError, RecursionError) as exc:
            raise _Malformed(f"not JSON: {exc}") from exc
        if not isinstance(obj, dict):
            raise _Malformed("not a JSON object")
        if obj.get("error") is not None:
            message = error_message(data.encode())
            self.fail(
                Failure(code="stream_error", message=f"error event: {message}", retryable=True)
            )
            return []
        usage = obj.get("usage")
        if usage is not None:
            if not isinstance(usage, dict):
                raise _Malformed("usage is not an object")
            self._usage = parse_usage(usage)
        deltas: list[_Delta] = []
        choices = obj.get("choices")
        if choices is None:
            return deltas
        if not isinstance(choices, list):
            raise _Malformed("choices is not a list")
        # One pass with the checks inline: this runs for every event of every reply.
        for choice in choices:
            if not isinstance(choice, dict):
                raise _Malformed("a choice is not an object")
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if delta is not None:
                if not isinstance(delta, dict):
                    raise _Malformed("delta is not an object")
                reasoning = delta.get("reasoning_content")
                if reasoning is not None:
                    if not isinstance(reasoning, str):
                        raise _Malformed("reasoning_content is not a string")
                    if reasoning:
                        deltas.append((ReasoningDelta, reasoning, 0, None, None))
                content = delta.get("content")
                if content is not None:
                    if not isinstance(content, str):
                        raise _Malformed("content is not a string")
                    if content:
                        deltas.append((TextDelta, content, 0, None, None))
                calls = delta.get("tool_calls")
                if calls is not None:
                    if not isinstance(calls, list):
                        raise _Malformed("tool_calls is not a list")
                    for position, call in enumerate(calls):
                        call_delta = self._tool_call(position, call)
                        if call_delta is not None:
                            deltas.append(call_delta)
            reason = choice.get("finish_reason")
            if reason is not None:
                if not isinstance(reason, str):
                    raise _Malformed("finish_reason is not a string")
                self._finish_reason = reason
        return deltas

    def _tool_call(self, position: int, call: object) -> _Delta | None:
        if not isinstance(call, dict):
            raise _Malformed("a tool call is not an object")
        index = _count(call.get("index", position))
        if index is None:
            raise _Malformed("a tool call index is not a non-negative integer")
        function = _optional_object(call, "function", "a tool call's function")
        call_id = _optional_str(call, "id")
        name = _optional_str(function, "name")
        arguments = _optional_str(function, "arguments") or ""
        state = self._calls.get(index)
        if state is None:
            if len(self._calls) >= _MAX_TOOL_CALLS:
                raise _TooManyToolCalls(
                    f"the stream opened more than {_MAX_TOOL_CALLS} tool calls (index {index})"
                )
            state = self._calls[index] = _ToolCallState()
        # Servers that repeat id and name on every fragment (llama.cpp) must
        # not make the loop join "echoecho": each is announced once.
        new_id = call_id if call_id and not state.id_sent else None
        new_name = name if name and not state.name_sent else None
        state.id_sent = state.id_sent or new_id is not None
        state.name_sent = state.name_sent or new_name is not None
        if new_id is None and new_name is None and not arguments:
            return None
        return (ToolCallDelta, arguments, index, new_id, new_name)

    def _finish(self) -> FinishChunk:
        reason = self._finish_reason
        if reason is None or (reason == "stop" and self._calls):
            # No finish_reason, or "stop" after tool calls (older llama.cpp):
            # what was streamed says how the step ends.
            return FinishChunk(reason="tool-calls" if self._calls else "completed")
        mapped = _FINISH_REASONS.get(reason)
        if mapped is not None:
            return FinishChunk(reason=mapped)
        if reason == "insufficient_system_resource":
            return error_finish(
                Failure(
                    code="insufficient_system_resource",
                    message="the server stopped generating: insufficient system resource",
                    retryable=True,
                )
            )
        if reason == "content_filter":
            return error_finish(
                Failure(code="content_filter", message="the server's content filter stopped it")
            )
        return error_finish(
            Failure(
                code="unknown_finish_reason",
                message=f"unknown finish_reason {reason!r}; known: "
                + ", ".join(sorted([*_FINISH_REASONS, "insufficient_system_resource"])),
            )
        )


_DIGITS_ONLY = bytes(ord("0") if byte in b"0123456789" else ord(" ") for byte in range(256))
"""A `bytes.translate` table: every ASCII digit to `0`, every other byte to a space."""

_LONG_DIGITS = b"0" * 19
"""A run of digits that may be an integer beyond 64 bits, which orjson would make a float."""


def _loads(text: str) -> Any:
    """`json.loads(text)`: the same value, or the same exception, at orjson's speed where it can.

    orjson parses an event it can give the same value for (it refuses NaN,
    infinities, numbers out of a double's range and invalid JSON, and
    `json` then parses or fails with its own message); an event with 19
    digits in a row goes to `json` at once, since orjson makes an integer
    beyond 64 bits a float (as `actors.providers.simulator.body_json` does
    for request bodies). One difference: orjson parses nesting up to 1,024
    levels deep, where `json` gives up with `RecursionError` at about 1,000.

    Raises:
        ValueError: `text` is not JSON (`json.JSONDecodeError`, as `json.loads` raises it).
        RecursionError: nested too deeply for either.
    """
    raw = text.encode()  # decoded with errors="replace": never a lone surrogate
    if _LONG_DIGITS not in raw.translate(_DIGITS_ONLY):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)


def _count(value: object) -> int | None:
    """`value` if it is a non-negative integer (not a bool), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _optional_str(obj: Mapping[str, Any], key: str) -> str | None:
    value = obj.get(key)
    if value is None or isinstance(value, str):
        return value
    raise _Malformed(f"{key} is not a string")


_Delta = tuple[type[Chunk], str, int, str | None, str | None]
"""One delta of an event, before it is joined: its kind, its text (a tool call's arguments),
and for a tool call its index, new id and new name."""


class _Runs:
    """The chunks of one read, built as its deltas come: each run of deltas that go together
    (adjacent text, adjacent reasoning, one tool call's argument pieces after the piece that
    introduced it) becomes one chunk."""

    __slots__ = ("_call", "_kind", "_out", "_pieces")

    def __init__(self) -> None:
        self._out: list[Chunk] = []
        self._kind: type[Chunk] | None = None
        self._pieces: list[str] = []
        self._call: tuple[int, str | None, str | None] = (0, None, None)

    def add(self, delta: _Delta) -> None:
        kind, text, index, call_id, name = delta
        if kind is self._kind and (
            kind is not ToolCallDelta
            or (call_id is None and name is None and self._call[0] == index)
        ):
            self._pieces.append(text)
            return
        self._flush()
        self._kind = kind
        self._call = (index, call_id, name)
        self._pieces = [text]

    def chunks(self) -> list[Chunk]:
        """The read's chunks, in order."""
        self._flush()
        return self._out

    def _flush(self) -> None:
        kind = self._kind
        if kind is None:
            return
        pieces = self._pieces
        text = pieces[0] if len(pieces) == 1 else "".join(pieces)
        if kind is ToolCallDelta:
            index, call_id, name = self._call
            self._out.append(ToolCallDelta(index=index, id=call_id, name=name, arguments=text))
        elif kind is TextDelta:
            self._out.append(TextDelta(text=text))
        else:
            self._out.append(ReasoningDelta(text=text))
        self._kind = None


def _optional_object(obj: Mapping[str, Any], key: str, what: str) -> dict[str, Any]:
    """`obj[key]` when it is an object, `{}` when it is missing or null."""
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _Malformed(f"{what} is not an object")
    return value
