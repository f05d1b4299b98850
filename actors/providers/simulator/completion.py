"""The non-streamed answer (`stream: false`): one `chat.completion` JSON body.

Of a `Fault`, a non-streamed request honours what happens before or
instead of the body (`status` with its retry headers, `reset_before_headers`,
`first_byte_delay`) and `finish_reason`; the faults that only make sense in
an event stream are refused by `stream_only_fields` so a test cannot think
it broke something it did not.
"""

from __future__ import annotations

from typing import Any

import attrs

from actors.providers.simulator.answer import Answer
from actors.providers.simulator.faults import Fault
from actors.providers.simulator.model import tool_call_json

_WHOLE_BODY_FIELDS = frozenset(
    {"status", "retry_after", "retry_after_ms", "reset_before_headers", "first_byte_delay"}
    | {"finish_reason"}
)


def stream_only_fields(fault: Fault) -> list[str]:
    """The fields `fault` sets that only an event stream can honour, sorted."""
    return sorted(
        field.name
        for field in attrs.fields(Fault)
        if field.name not in _WHOLE_BODY_FIELDS and getattr(fault, field.name) != field.default
    )


def completion_body(answer: Answer, *, model: str, number: int, created: int) -> dict[str, Any]:
    """The `chat.completion` object of `answer`.

    The message carries `content` (the text, `""` when there is none),
    `reasoning_content` when the reply reasoned, and `tool_calls` when it
    calls; `usage` is the same as a stream reports.
    """
    reply = answer.reply
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.reasoning:
        message["reasoning_content"] = reply.reasoning
    if reply.tool_calls:
        message["tool_calls"] = [tool_call_json(call) for call in reply.tool_calls]
    return {
        "id": f"chatcmpl-sim-{number}",
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": "fp_simulator",
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": answer.finish}
        ],
        "usage": answer.usage,
    }
