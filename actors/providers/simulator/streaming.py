"""The event stream of one reply: server-sent-event frames, paced and written with stream faults.

`Frames` turns a reply into chat-completion-chunk frames (keep-alives first,
then the role, reasoning, text and tool-call deltas, the finish chunk, usage
and `[DONE]` as the `Fault` asks); `write_events` paces them on the event loop's clock
and writes them through a `Writer` (line ends and write sizes), applying the
fault's resets, stalls, malformed events and llama.cpp pings on the way.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable, Sequence
from json.encoder import encode_basestring  # what json.dumps uses for a str
from typing import Any

import anyio
import attrs

from actors.providers.simulator.exchange import ConnectionReset
from actors.providers.simulator.faults import Fault
from actors.providers.simulator.model import SimReply, tool_call_json

_ARGUMENT_PIECE = 8


@attrs.frozen(kw_only=True)
class Frame:
    """One piece of the stream.

    Attributes:
        text: The text to write, with `\\n` line ends.
        event: Whether it is a data event (counted by the stream faults),
            not a keep-alive.
        delay: Seconds to wait before writing it.
    """

    text: str
    event: bool
    delay: float = 0.0


@attrs.frozen(kw_only=True)
class Frames:
    """Builds the event stream of one reply, as frames to pace and write.

    Attributes:
        model: The model named in every chunk.
        number: The chat request's number, in the chunk id.
        created: Epoch seconds, the chunks' `created` field.
        fault: The request's fault (keep-alives, usage placement, llama.cpp
            fragments, `[DONE]`).
        token_delay: Seconds before each token frame.
    """

    model: str
    number: int
    created: int
    fault: Fault
    token_delay: float

    def build(
        self,
        reply: SimReply,
        reasoning_tokens: list[str],
        text_tokens: list[str],
        finish: str,
        usage: dict[str, Any],
    ) -> list[Frame]:
        """The frames of `reply`, whose text and reasoning are already tokenized.

        Args:
            reply: The reply; its tool calls all have ids.
            reasoning_tokens: The reasoning, one frame per token.
            text_tokens: The text, one frame per token.
            finish: The finish reason of the last chunk.
            usage: The usage, placed as `fault.usage` says.
        """
        fault = self.fault
        frames = [
            Frame(text=f"{fault.keepalive_line}\n\n", event=False, delay=fault.keepalive_interval)
            for _ in range(fault.keepalives)
        ]
        first: dict[str, Any] = {"role": "assistant", "content": ""}
        if reasoning_tokens:
            first = {"role": "assistant", "content": None, "reasoning_content": ""}
        frames.append(self._event({"delta": first}))
        head = self._delta_head()
        frames += [self._text(head, "reasoning_content", token) for token in reasoning_tokens]
        frames += [self._text(head, "content", token) for token in text_tokens]
        frames += [
            self._delta(head, _compact({"tool_calls": [piece]}))
            for piece in self._call_pieces(reply)
        ]
        with_usage = fault.usage == "final" and not fault.llama_cpp
        frames.append(
            self._event(
                {"delta": {"content": ""}, "finish_reason": finish},
                usage=usage if with_usage else None,
            )
        )
        if fault.usage == "separate" and not fault.llama_cpp:
            frames.append(self._event(None, usage=usage))
        if not fault.omit_done:
            frames.append(Frame(text="data: [DONE]\n\n", event=True))
        return frames

    def _call_pieces(self, reply: SimReply) -> list[dict[str, Any]]:
        """Tool-call fragments, the calls interleaved round-robin."""
        sequences: list[list[dict[str, Any]]] = []
        for index, call in enumerate(reply.tool_calls):
            arguments = call.arguments
            pieces = [
                arguments[start : start + _ARGUMENT_PIECE]
                for start in range(0, len(arguments), _ARGUMENT_PIECE)
            ]
            sequence: list[dict[str, Any]] = [{"index": index, **tool_call_json(call, "")}]
            for piece in pieces:
                if self.fault.llama_cpp:
                    # llama.cpp repeats the id and the name on every fragment.
                    sequence.append({"index": index, **tool_call_json(call, piece)})
                else:
                    sequence.append({"index": index, "function": {"arguments": piece}})
            sequences.append(sequence)
        longest = max((len(sequence) for sequence in sequences), default=0)
        return [
            sequence[position]
            for position in range(longest)
            for sequence in sequences
            if position < len(sequence)
        ]

    def _delta_head(self) -> str:
        """The text of a delta event up to its delta: `_delta` completes it.

        Rendered once per reply from the chunk `_event` builds, so a delta
        event's bytes are exactly `_event({"delta": ...})`'s.
        """
        data = self._event({"delta": 0}).text
        return data[: -len(_DELTA_TAIL) - 1]

    def _text(self, head: str, field: str, token: str) -> Frame:
        """The delta event of one reasoning or text token (`{field: token}`)."""
        return self._delta(head, f'{{"{field}":{encode_basestring(token)}}}')

    def _delta(self, head: str, delta: str) -> Frame:
        """A token frame: the delta event whose delta is the JSON text `delta`."""
        return Frame(text=f"{head}{delta}{_DELTA_TAIL}", event=True, delay=self.token_delay)

    def _event(
        self, choice: dict[str, Any] | None, *, usage: dict[str, Any] | None = None
    ) -> Frame:
        chunk: dict[str, Any] = {
            "id": f"chatcmpl-sim-{self.number}",
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "fp_simulator",
            "choices": [],
        }
        if choice is not None:
            chunk["choices"] = [
                {"index": 0, "logprobs": None, "finish_reason": None, **choice},
            ]
        if usage is not None:
            chunk["usage"] = usage
        return Frame(text=f"data: {_compact(chunk)}\n\n", event=True)


_DELTA_TAIL = "}]}\n\n"
"""What follows the delta in a delta event (the delta is the last field of the last object)."""


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


@attrs.define(kw_only=True, eq=False)
class Writer:
    """Encodes frames with `newline` line ends, re-cut into writes of `size` bytes.

    Attributes:
        size: The exact size of every write but the last; None writes each
            frame whole.
        newline: The line end to write.
    """

    size: int | None
    newline: str
    _pending: bytearray = attrs.field(factory=bytearray, init=False)

    def push(self, text: str) -> list[bytes]:
        """Encode `text`; return the writes now complete."""
        data = text.replace("\n", self.newline).encode()
        if self.size is None:
            return [data]
        self._pending += data
        pieces = []
        while len(self._pending) >= self.size:
            pieces.append(bytes(self._pending[: self.size]))
            del self._pending[: self.size]
        return pieces

    def flush(self) -> list[bytes]:
        """The bytes held back for a short last write, if any."""
        if not self._pending:
            return []
        piece = bytes(self._pending)
        self._pending.clear()
        return [piece]


async def write_events(
    frames: Sequence[Frame],
    fault: Fault,
    *,
    on_complete: Callable[[], None],
    on_reset: Callable[[int], ConnectionReset],
) -> AsyncGenerator[bytes, None]:
    """The bytes of `frames`, paced on the event loop's clock, with `fault`'s stream faults applied.

    Data events are counted from 0; before the event numbered
    `reset_after_chunks` the stream flushes and raises, before the one
    numbered `stall_after_chunks` it flushes and sleeps forever, before the
    one numbered `trickle_after_chunks` it flushes and then writes only the
    keep-alive line, every `keepalive_interval` seconds, forever, and before
    the one numbered `malformed_after_chunks` it writes an event that is not
    JSON. With `llama_cpp`, a `: ping` comment precedes every data event.

    Args:
        frames: What to write, in order.
        fault: The request's fault (also line ends and write size).
        on_complete: Called just before the last bytes are handed over: from
            then on, the client may hang up without reading on.
        on_reset: Called with the number of events sent where the fault
            drops the connection; returns the exception to raise.

    Raises:
        ConnectionReset: the one `on_reset` returns.

    Cancellation: cancelling a pacing wait or a stall ends the stream
    without calling `on_complete`.
    """
    writer = Writer(size=fault.write_size, newline="\r\n" if fault.crlf else "\n")
    if frames and writer.size is not None and _unbroken(fault) and not any(f.delay for f in frames):
        # Nothing to pace or break, and the writer re-cuts: the same writes, in one pass.
        await anyio.lowlevel.checkpoint()
        for piece in writer.push("".join(frame.text for frame in frames[:-1])):
            yield piece
        last = [*writer.push(frames[-1].text), *writer.flush()]
        on_complete()
        for piece in last:
            yield piece
        return
    sent = 0
    for position, frame in enumerate(frames):
        pieces: list[bytes] = []
        if frame.event:
            if sent in (fault.reset_after_chunks, fault.stall_after_chunks):
                for piece in writer.flush():
                    yield piece
                if fault.reset_after_chunks == sent:
                    raise on_reset(sent)
                await anyio.sleep_forever()
            if fault.trickle_after_chunks == sent:
                for piece in writer.flush():
                    yield piece
                while True:
                    await anyio.sleep(fault.keepalive_interval)
                    for piece in [*writer.push(f"{fault.keepalive_line}\n\n"), *writer.flush()]:
                        yield piece
            if fault.malformed_after_chunks == sent:
                pieces += writer.push('data: {"choices": [{"delta"\n\n')
            if fault.llama_cpp:
                pieces += writer.push(": ping\n\n")
            sent += 1
        if frame.delay:
            await anyio.sleep(frame.delay)
        else:
            await anyio.lowlevel.checkpoint()
        pieces += writer.push(frame.text)
        if position == len(frames) - 1:
            pieces += writer.flush()
            on_complete()
        for piece in pieces:
            yield piece


def _unbroken(fault: Fault) -> bool:
    """Whether `fault` leaves every event of the stream as it is (line ends and writes aside)."""
    return (
        fault.reset_after_chunks is None
        and fault.stall_after_chunks is None
        and fault.trickle_after_chunks is None
        and fault.malformed_after_chunks is None
        and not fault.llama_cpp
    )
