"""The request parameters besides the messages, checked the way DeepSeek checks them.

Types are checked first (a wrong JSON type is `422`, as DeepSeek's
deserializer answers), then ranges (`400 Invalid X value, the valid range
of X is [a, b]`):

- `stream`: a boolean, default false (a JSON completion, not a stream);
- `stream_options`: `{"include_usage": bool}`; a stream carries usage only
  when it is true (ignored without `stream`, as a completion always has it);
- `temperature` in [0, 2], `top_p` in [0, 1], `presence_penalty` and
  `frequency_penalty` in [-2, 2]; accepted and without effect in thinking
  mode, as DeepSeek documents;
- `max_tokens` in [1, 8192], or [1, 65536] in thinking mode;
- `logprobs` (boolean) and `top_logprobs` in [0, 20], which needs
  `logprobs`; both refused in thinking mode;
- `stop`: a string or a list of at most 16 strings; the reply text ends
  before the first of them;
- `response_format`: `{"type": "text"}` or `{"type": "json_object"}`;
  other types are refused;
- `tool_choice`: `none`, `auto`, `required` or
  `{"type": "function", "function": {"name": N}}` where N is one of the
  tools; `required` and a named function need tools;
- `tools`: at most 128.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from actors.providers.simulator.choice import AUTO, ToolChoice
from actors.providers.simulator.rejection import Rejection, out_of_range, wrong_type

MAX_TOOLS = 128
_MAX_STOP = 16
_RANGES = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}
_MAX_TOKENS = 8192
_MAX_TOKENS_THINKING = 65536


@attrs.frozen(kw_only=True)
class Parameters:
    """A request's validated parameters.

    Attributes:
        stream: Whether to answer with an event stream.
        include_usage: Whether a stream carries usage.
        max_tokens: The cap on reply text tokens, if any.
        stop: Stop sequences; the text ends before the first.
        json_mode: Whether `response_format` asks for a JSON object.
        tool_choice: The request's `tool_choice`.
    """

    stream: bool
    include_usage: bool
    max_tokens: int | None
    stop: tuple[str, ...]
    json_mode: bool
    tool_choice: ToolChoice


def parse_parameters(
    body: Mapping[str, Any], *, thinking: bool, tools: Sequence[Any] | None
) -> Parameters:
    """Validate the parameters of a chat body whose model, messages and tools are valid.

    Raises:
        Rejection: a parameter has the wrong type or is out of range; the
            message names it.
    """
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise wrong_type("stream", stream, "a boolean")
    for field, (low, high) in _RANGES.items():
        value = body.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong_type(field, value, "f32")
        if not low <= value <= high:
            raise out_of_range(field, low, high)
    _check_logprobs(body, thinking)
    if tools is not None and len(tools) > MAX_TOOLS:
        raise Rejection(
            400, f"Too many tools: {len(tools)}; at most {MAX_TOOLS} are allowed", param="tools"
        )
    return Parameters(
        stream=stream,
        include_usage=_include_usage(body.get("stream_options")),
        max_tokens=_max_tokens(body.get("max_tokens"), thinking),
        stop=_stop(body.get("stop")),
        json_mode=_json_mode(body.get("response_format")),
        tool_choice=_tool_choice(body.get("tool_choice"), tools or ()),
    )


def _include_usage(value: object) -> bool:
    if value is None:
        return False
    include = value.get("include_usage", False) if isinstance(value, Mapping) else None
    if not isinstance(include, bool):
        raise wrong_type("stream_options", value, '{"include_usage": true or false}')
    return include


def _max_tokens(value: object, thinking: bool) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise wrong_type("max_tokens", value, "u32")
    high = _MAX_TOKENS_THINKING if thinking else _MAX_TOKENS
    if not 1 <= value <= high:
        raise out_of_range("max_tokens", 1, high)
    return value


def _check_logprobs(body: Mapping[str, Any], thinking: bool) -> None:
    logprobs = body.get("logprobs")
    top = body.get("top_logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise wrong_type("logprobs", logprobs, "a boolean")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int)):
        raise wrong_type("top_logprobs", top, "u32")
    if thinking and (logprobs is not None or top is not None):
        field = "logprobs" if logprobs is not None else "top_logprobs"
        raise Rejection(400, f"{field} is not supported in thinking mode", param=field)
    if top is not None:
        if not 0 <= top <= 20:
            raise out_of_range("top_logprobs", 0, 20)
        if logprobs is not True:
            raise Rejection(400, "top_logprobs requires logprobs to be true", param="top_logprobs")


def _stop(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise wrong_type("stop", value, "a string or a list of strings")
    if len(value) > _MAX_STOP:
        raise Rejection(
            400, f"stop holds {len(value)} sequences; at most {_MAX_STOP} are allowed", param="stop"
        )
    return tuple(value)


def _json_mode(value: object) -> bool:
    if value is None:
        return False
    kind = value.get("type") if isinstance(value, Mapping) else None
    if not isinstance(kind, str):
        raise wrong_type("response_format", value, '{"type": "text"} or {"type": "json_object"}')
    if kind not in ("text", "json_object"):
        raise Rejection(
            400,
            f"This response_format type is unavailable now: {kind!r}; types: text, json_object",
            param="response_format",
        )
    return kind == "json_object"


def _tool_choice(value: object, tools: Sequence[Any]) -> ToolChoice:
    if value is None:
        return AUTO
    if value in ("none", "auto"):
        return ToolChoice(mode=value)
    names = [tool["function"]["name"] for tool in tools]
    if value == "required":
        choice = ToolChoice(mode="required")
    else:
        function = value.get("function") if isinstance(value, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None
        if not (isinstance(value, Mapping) and value.get("type") == "function") or not isinstance(
            name, str
        ):
            raise wrong_type(
                "tool_choice",
                value,
                'none, auto, required or {"type": "function", "function": {"name": ...}}',
            )
        if names and name not in names:
            raise Rejection(
                400,
                f"tool_choice names function {name!r}, which is not in tools: {', '.join(names)}",
                param="tool_choice",
            )
        choice = ToolChoice(mode="function", name=name)
    if not names:
        raise Rejection(
            400, "tool_choice 'required' or a named function needs tools", param="tool_choice"
        )
    return choice
