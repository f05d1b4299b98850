"""Fault injection for the simulator: what to break in one chat request.

A `Fault` is chosen per chat request, in this order: the request's
`X-Sim-Fault` header (a JSON object of `Fault` fields), then a fault
scheduled for that request number with `FaultPlan.at`, then the next fault
queued for the request's model with `FaultPlan.for_model`, then the next
fault queued with `FaultPlan.queue`. Faults apply to requests that passed
authentication and validation.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Mapping
from typing import Any, Literal, TypeAlias

import attrs

SimFinishReason: TypeAlias = Literal[
    "stop", "length", "tool_calls", "insufficient_system_resource", "content_filter"
]
"""A chat-completions `finish_reason` the simulator can end a stream with."""
UsageMode: TypeAlias = Literal["separate", "final", "none"]
"""Where usage goes: its own `choices: []` chunk, on the finish chunk, or nowhere."""

_FINISH_REASONS = ("stop", "length", "tool_calls", "insufficient_system_resource", "content_filter")
FAULT_HEADER = "x-sim-fault"
"""The request header carrying a JSON `Fault` for that request."""


class FaultError(ValueError):
    """A fault description is invalid; the message names the field."""


def _optional_count(
    instance: object, attribute: attrs.Attribute[int | None], value: object
) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise FaultError(f"fault field {attribute.name} must be a count >= 0, got {value!r}")


def _count(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise FaultError(f"fault field {attribute.name} must be a count >= 0, got {value!r}")


def _seconds(instance: object, attribute: attrs.Attribute[float], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise FaultError(f"fault field {attribute.name} must be seconds >= 0, got {value!r}")


def _status(instance: object, attribute: attrs.Attribute[int | None], value: object) -> None:
    if value is not None and (
        not isinstance(value, int) or isinstance(value, bool) or not 400 <= value <= 599
    ):
        raise FaultError(f"fault field status must be an HTTP error status 400-599, got {value!r}")


def _flag(instance: object, attribute: attrs.Attribute[bool], value: object) -> None:
    if not isinstance(value, bool):
        raise FaultError(f"fault field {attribute.name} must be true or false, got {value!r}")


def _one_of(*choices: str) -> Any:
    def check(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if value is not None and value not in choices:
            raise FaultError(
                f"fault field {attribute.name} must be one of {', '.join(choices)}; got {value!r}"
            )

    return check


def _line(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or "\n" in value or "\r" in value:
        raise FaultError(f"fault field {attribute.name} must be one line of text, got {value!r}")


def _optional_text(instance: object, attribute: attrs.Attribute[str | None], value: object) -> None:
    if value is not None:
        _line(instance, attribute, value)


@attrs.frozen(kw_only=True)
class Fault:
    """What to break in one chat request; the defaults break nothing.

    Attributes:
        status: Answer with this error status and a DeepSeek error body.
        retry_after: `Retry-After` header value sent with `status` (seconds
            or an HTTP date, verbatim).
        retry_after_ms: `retry-after-ms` header value sent with `status`.
        reset_before_headers: Drop the connection before any response.
        reset_after_chunks: Drop the connection after this many data events.
        stall_after_chunks: Go silent forever after this many data events.
        trickle_after_chunks: After this many data events, send only
            keep-alive lines (`keepalive_line` every `keepalive_interval`
            seconds) forever: the connection looks alive, no data comes.
        malformed_after_chunks: Send an event that is not JSON after this many
            data events (then go on normally).
        first_byte_delay: Seconds to wait before the response headers.
        keepalives: Keep-alive lines sent after the headers, before the first
            event, as if the request were queued.
        keepalive_interval: Seconds before each keep-alive line.
        keepalive_line: The keep-alive line: a comment (`: keep-alive`) or a
            data-only keep-alive (`data: : keep-alive`).
        finish_reason: End with this `finish_reason` instead of the natural one.
        usage: Where the usage goes (`"separate"`, `"final"`, `"none"`).
        omit_done: End the body without `data: [DONE]`.
        llama_cpp: Imitate llama.cpp's server: id and name repeated on every
            tool-call fragment, no usage, `: ping` comments between events.
        crlf: End lines with CRLF.
        write_size: Re-cut the body into writes of exactly this many bytes
            (1 splits every event; a large size puts several in one write).
    """

    status: int | None = attrs.field(default=None, validator=_status)
    retry_after: str | None = attrs.field(default=None, validator=_optional_text)
    retry_after_ms: int | None = attrs.field(default=None, validator=_optional_count)
    reset_before_headers: bool = attrs.field(default=False, validator=_flag)
    reset_after_chunks: int | None = attrs.field(default=None, validator=_optional_count)
    stall_after_chunks: int | None = attrs.field(default=None, validator=_optional_count)
    trickle_after_chunks: int | None = attrs.field(default=None, validator=_optional_count)
    malformed_after_chunks: int | None = attrs.field(default=None, validator=_optional_count)
    first_byte_delay: float = attrs.field(default=0.0, validator=_seconds)
    keepalives: int = attrs.field(default=0, validator=_count)
    keepalive_interval: float = attrs.field(default=1.0, validator=_seconds)
    keepalive_line: str = attrs.field(default=": keep-alive", validator=_line)
    finish_reason: SimFinishReason | None = attrs.field(
        default=None, validator=_one_of(*_FINISH_REASONS)
    )
    usage: UsageMode = attrs.field(
        default="separate", validator=_one_of("separate", "final", "none")
    )
    omit_done: bool = attrs.field(default=False, validator=_flag)
    llama_cpp: bool = attrs.field(default=False, validator=_flag)
    crlf: bool = attrs.field(default=False, validator=_flag)
    write_size: int | None = attrs.field(default=None, validator=_optional_count)

    def __attrs_post_init__(self) -> None:
        if self.write_size == 0:
            raise FaultError("fault field write_size must be at least 1 byte")
        if self.trickle_after_chunks is not None and not self.keepalive_interval > 0:
            raise FaultError("fault field trickle_after_chunks needs a keepalive_interval > 0")

    @classmethod
    def from_json(cls, value: object) -> Fault:
        """A fault from a JSON object of its fields.

        Raises:
            FaultError: not an object, an unknown field, or a bad value.
        """
        if not isinstance(value, Mapping):
            raise FaultError(f"a fault must be a JSON object, got {value!r}")
        known = {field.name for field in attrs.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise FaultError(
                f"unknown fault field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        return cls(**value)

    @classmethod
    def from_header(cls, text: str) -> Fault:
        """A fault from the text of an `X-Sim-Fault` header.

        Raises:
            FaultError: the header is not JSON or not a valid fault.
        """
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise FaultError(f"X-Sim-Fault header is not JSON: {exc}") from exc
        return cls.from_json(value)


NO_FAULT = Fault()
"""The fault that breaks nothing."""


class FaultPlan:
    """Faults scheduled for upcoming chat requests.

    Args:
        max_pending: The most faults queued or scheduled at once.
    """

    def __init__(self, *, max_pending: int = 1024) -> None:
        self._max_pending = max_pending
        self._queue: deque[Fault] = deque()
        self._scheduled: dict[int, Fault] = {}
        self._by_model: dict[str, deque[Fault]] = {}

    @property
    def pending(self) -> int:
        """Faults queued or scheduled and not yet used."""
        by_model = sum(len(faults) for faults in self._by_model.values())
        return len(self._queue) + len(self._scheduled) + by_model

    def queue(self, *faults: Fault) -> None:
        """Apply `faults` to the next chat requests, one each, in order.

        Raises:
            FaultError: more than `max_pending` faults would be pending.
        """
        self._check_room(len(faults))
        self._queue.extend(faults)

    def for_model(self, model: str, *faults: Fault) -> None:
        """Apply `faults` to the next chat requests naming `model`, one each, in order.

        Requests for other models are untouched, so faulty and healthy
        traffic can share one simulator at the same time.

        Raises:
            FaultError: more than `max_pending` faults would be pending.
        """
        self._check_room(len(faults))
        self._by_model.setdefault(model, deque()).extend(faults)

    def at(self, request_number: int, fault: Fault) -> None:
        """Apply `fault` to chat request number `request_number` (0-based).

        Raises:
            FaultError: the number is negative or already has a fault, or
                more than `max_pending` faults would be pending.
        """
        if request_number < 0:
            raise FaultError(f"request numbers start at 0, got {request_number}")
        if request_number in self._scheduled:
            raise FaultError(f"chat request {request_number} already has a scheduled fault")
        self._check_room(1)
        self._scheduled[request_number] = fault

    def take(self, request_number: int, header: str | None, model: str | None = None) -> Fault:
        """The fault for chat request `request_number` (for `model`), consuming it.

        Raises:
            FaultError: `header` is given and is not a valid fault.
        """
        scheduled = self._scheduled.pop(request_number, None)
        if header is not None:
            return Fault.from_header(header)
        if scheduled is not None:
            return scheduled
        if model is not None and (for_model := self._by_model.get(model)):
            fault = for_model.popleft()
            if not for_model:
                del self._by_model[model]
            return fault
        if self._queue:
            return self._queue.popleft()
        return NO_FAULT

    def _check_room(self, more: int) -> None:
        if self.pending + more > self._max_pending:
            raise FaultError(
                f"at most {self._max_pending} faults may be pending; {self.pending} already are"
            )
