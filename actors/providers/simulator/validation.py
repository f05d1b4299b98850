"""Chat-request validation, the way DeepSeek checks a chat-completions body.

`parse_chat` checks the model, the message shapes, that tool calls and tool
results pair up, `thinking`, the reasoning-content rule of the model's
profile in that mode, the tools and the other parameters (`parameters`),
and returns what the engine needs to answer. Anything wrong raises
`Rejection` with DeepSeek's status and wording.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import attrs

from actors.providers.simulator.choice import ToolChoice
from actors.providers.simulator.config import Profile, SimulatorConfig
from actors.providers.simulator.parameters import parse_parameters
from actors.providers.simulator.rejection import Rejection as Rejection
from actors.providers.simulator.tokens import tools_text
from actors.providers.simulator.tool_lists import ToolLists

_ROLES = ("system", "user", "assistant", "tool")


@attrs.frozen(kw_only=True)
class Chat:
    """A validated chat request.

    Attributes:
        model: The requested model.
        profile: The model's reasoning-content rule.
        messages: The messages, as sent.
        tools: The tools, as sent, if any.
        tools_header: Their rendered header (`tokens.tools_text`; empty without tools).
        max_tokens: The cap on reply text tokens, if any.
        thinking: Whether the request is in thinking mode: the reply
            reasons first (always for `reasoner` and `r1`).
        cache_key: What separates prefix-cache entries: model, thinking, user.
        stream: Whether to answer with an event stream (else one JSON body).
        include_usage: Whether a stream carries usage (`stream_options`).
        stop: Stop sequences; the reply text ends before the first.
        json_mode: Whether the text must be a JSON object.
        tool_choice: What the model must do about tools.
    """

    model: str
    profile: Profile
    messages: list[dict[str, Any]]
    tools: list[Any] | None
    tools_header: str
    max_tokens: int | None
    thinking: bool
    cache_key: str
    stream: bool
    include_usage: bool
    stop: tuple[str, ...]
    json_mode: bool
    tool_choice: ToolChoice


def parse_chat(
    body: object, config: SimulatorConfig, *, tool_lists: ToolLists | None = None
) -> Chat:
    """Validate a parsed chat-completions body.

    Args:
        body: The request body, parsed from JSON.
        config: Supplies the known models' profiles and the default profile.
        tool_lists: Remembers tools lists that passed their checks, and their
            rendered header, so an equal list is neither checked nor rendered
            again (None: check and render every time).

    Raises:
        Rejection: the body breaks one of DeepSeek's rules; the first
            broken rule is reported.
    """
    if not isinstance(body, dict):
        raise Rejection(422, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str):
        raise Rejection(422, "model must be a string", param="model")
    profile = config.profiles.get(model, config.default_profile)
    if profile is None:
        known = ", ".join(sorted(config.profiles))
        raise Rejection(400, f"Model Not Exist: {model!r}; models: {known}", param="model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Rejection(422, "messages must be a non-empty list", param="messages")
    for index, message in enumerate(messages):
        _check_message(index, message)
    _check_tool_pairing(messages)
    thinking_value = body.get("thinking")
    if thinking_value is not None and not (
        isinstance(thinking_value, dict) and thinking_value.get("type") in ("enabled", "disabled")
    ):
        raise Rejection(
            422,
            'thinking must be {"type": "enabled"} or {"type": "disabled"}',
            param="thinking",
        )
    thinking = profile != "v4" or (
        isinstance(thinking_value, dict) and thinking_value.get("type") == "enabled"
    )
    _check_reasoning(messages, profile, thinking)
    tools = body.get("tools")
    header = ""
    if isinstance(tools, list) and tools and tool_lists is not None:
        header = tool_lists.checked_header(tools, _check_tools)
    elif tools is not None:
        _check_tools(tools)
        header = tools_text(tools)
    parameters = parse_parameters(body, thinking=thinking, tools=tools)
    user = body.get("user")
    return Chat(
        model=model,
        profile=profile,
        messages=messages,
        tools=tools,
        tools_header=header,
        max_tokens=parameters.max_tokens,
        thinking=thinking,
        cache_key=json.dumps([model, thinking, user if isinstance(user, str) else None]),
        stream=parameters.stream,
        include_usage=parameters.include_usage,
        stop=parameters.stop,
        json_mode=parameters.json_mode,
        tool_choice=parameters.tool_choice,
    )


def _check_message(index: int, message: object) -> None:
    where = f"messages[{index}]"

    def invalid(problem: str) -> Rejection:
        return Rejection(422, f"{where}{problem}", param=where)

    if not isinstance(message, dict):
        raise invalid(" must be an object")
    role = message.get("role")
    if role not in _ROLES:
        raise invalid(f".role must be one of {', '.join(_ROLES)}")
    content = message.get("content")
    if not (content is None or isinstance(content, str) or _text_parts(content)):
        raise invalid(".content must be a string, null or a list of text parts")
    reasoning = message.get("reasoning_content")
    if reasoning is not None and not isinstance(reasoning, str):
        raise invalid(".reasoning_content must be a string")
    if role == "tool" and not isinstance(message.get("tool_call_id"), str):
        raise invalid(".tool_call_id must be a string")
    calls = message.get("tool_calls")
    if calls is None:
        return
    if role != "assistant" or not isinstance(calls, list):
        raise invalid(".tool_calls must be a list on an assistant")
    for number, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not (
            isinstance(call, dict)
            and isinstance(call.get("id"), str)
            and call.get("type") == "function"
            and isinstance(function, dict)
            and isinstance(function.get("name"), str)
            and isinstance(function.get("arguments"), str)
        ):
            raise invalid(
                f".tool_calls[{number}] must be "
                '{"id", "type": "function", "function": {"name", "arguments"}} with strings'
            )


def _text_parts(content: object) -> bool:
    return isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        for part in content
    )


def _check_tool_pairing(messages: Sequence[dict[str, Any]]) -> None:
    pending: set[str] = set()
    for index, message in enumerate(messages):
        role = message["role"]
        if role == "tool":
            answered = message["tool_call_id"]
            if answered not in pending:
                raise Rejection(
                    400,
                    f"Messages with role 'tool' must be a response to a preceding message with "
                    f"'tool_calls' (messages[{index}] answers unknown call {answered!r})",
                    param=f"messages[{index}]",
                )
            pending.discard(answered)
            continue
        if pending:
            raise _unanswered(pending, f"before messages[{index}]", param=f"messages[{index}]")
        pending = {call["id"] for call in message.get("tool_calls") or ()}
    if pending:
        raise _unanswered(pending, "at the end", param="messages")


def _unanswered(pending: set[str], where: str, *, param: str) -> Rejection:
    return Rejection(
        400,
        "An assistant message with 'tool_calls' must be followed by tool messages "
        "responding to each 'tool_call_id'. (insufficient tool messages following "
        f"tool_calls message; missing {', '.join(sorted(pending))} {where})",
        param=param,
    )


def _check_reasoning(messages: Sequence[dict[str, Any]], profile: Profile, thinking: bool) -> None:
    """In thinking mode tool-call turns must pass their reasoning back; r1 refuses any."""
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        has_reasoning = message.get("reasoning_content") is not None
        if profile == "r1":
            if has_reasoning:
                raise Rejection(
                    400,
                    f"`reasoning_content` is not allowed in input messages for this model "
                    f"(messages[{index}])",
                    param=f"messages[{index}].reasoning_content",
                )
        elif thinking and message.get("tool_calls") and not has_reasoning:
            raise Rejection(
                400,
                f"Missing `reasoning_content` field in the assistant message at message index "
                f"{index}: in thinking mode an assistant message with tool_calls must carry "
                f"its reasoning_content",
                param=f"messages[{index}].reasoning_content",
            )


def _check_tools(tools: object) -> None:
    if not isinstance(tools, list):
        raise Rejection(422, "tools must be a list", param="tools")
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not (
            isinstance(tool, dict)
            and tool.get("type") == "function"
            and isinstance(function, dict)
            and isinstance(function.get("name"), str)
        ):
            raise Rejection(
                422,
                f'tools[{index}] must be {{"type": "function", "function": {{"name", ...}}}}',
                param=f"tools[{index}]",
            )
