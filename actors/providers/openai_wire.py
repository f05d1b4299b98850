"""Chat-completions request serialization: model profiles, messages, the tools cache.

Serialization is byte-stable: the system text is the first message, history
follows in order, and everything is written with compact separators and
without ASCII escaping, so identical requests give identical bytes and the
provider's prefix cache can hit on every request after the first. The parts
that rarely change are encoded to bytes once and reused: the body's head (the
model and the system message) once per distinct model and system text, the
tool schemas once per distinct tool tuple. A body is exactly
`json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()` of
the whole request object; only the work of producing it is shared.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Literal, TypeAlias

import attrs

from actors.messages import Message, ReasoningBlock, TextBlock, ToolSource
from actors.prompt.types import ToolSchema
from actors.providers.base import ProviderError
from actors.providers.request import GenerateRequest

ReasoningReplay: TypeAlias = Literal["with-tool-calls", "never"]
"""When a model wants its own reasoning sent back as `reasoning_content`."""

_CONFIG_KEYS = (
    "max_tokens",
    "temperature",
    "thinking",
    "reasoning_effort",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "stop",
)
_TOOLS_CACHE_SIZE = 16
_HEAD_CACHE_SIZE = 16
_TAIL = b',"stream":true,"stream_options":{"include_usage":true}}'


@attrs.frozen(kw_only=True)
class ModelProfile:
    """What a model family expects back in its history.

    Attributes:
        name: A short label for messages and logs (`"v4"`, `"r1"`).
        reasoning_replay: `"with-tool-calls"`: every assistant message that
            carries tool calls is sent with `reasoning_content` (its reasoning
            text, `""` when it had none), other assistant messages without;
            `"never"`: `reasoning_content` is never sent (the server refuses it).
            Reasoning is always kept in the log either way.
    """

    name: str
    reasoning_replay: ReasoningReplay


V4_PROFILE = ModelProfile(name="v4", reasoning_replay="with-tool-calls")
"""DeepSeek V3.x/V4 thinking models: reasoning goes back with tool calls."""
R1_PROFILE = ModelProfile(name="r1", reasoning_replay="never")
"""DeepSeek R1-style reasoners: sending `reasoning_content` back is an error."""


class RequestEncoder:
    """Turns a `GenerateRequest` into the exact chat-completions request body.

    Keeps two small caches of encoded bytes: body heads (the model and the
    system message) by model and system text, and tool tuples by the
    identity of their schemas, so a request that reuses the previous
    request's system text and tools encodes only its messages and options.

    Args:
        profiles: The `ModelProfile` of each model name that differs from
            `default_profile`.
        default_profile: The profile of every other model.
    """

    def __init__(
        self, *, profiles: Mapping[str, ModelProfile] | None, default_profile: ModelProfile
    ) -> None:
        self._profiles = dict(profiles or {})
        self._default_profile = default_profile
        self._tools_cache: OrderedDict[tuple[int, ...], tuple[tuple[ToolSchema, ...], bytes]] = (
            OrderedDict()
        )
        self._heads: OrderedDict[tuple[str, str | None], bytes] = OrderedDict()
        self._tool_encodings = 0

    @property
    def tool_encodings(self) -> int:
        """Times a tool tuple was serialized (cache misses)."""
        return self._tool_encodings

    def profile_for(self, model: str) -> ModelProfile:
        """The profile that decides how `model`'s history is serialized."""
        return self._profiles.get(model, self._default_profile)

    def encode(self, request: GenerateRequest) -> bytes:
        """The exact request body sent for `request`.

        Keys come in a fixed order (`model`, `messages`, `tools`, the
        configured options, `stream`, `stream_options`), so equal requests
        give equal bytes. `config` keys other than `model`, `max_tokens`,
        `temperature`, `thinking`, `reasoning_effort`, `tool_choice`,
        `parallel_tool_calls`, `response_format` and `stop` are not sent.

        Raises:
            ProviderError: a message or config value cannot be serialized.
        """
        model = request.model
        profile = self.profile_for(model)
        try:
            parts = [self._head(model, request.system)]
            if request.messages:
                # The items of the list `json.dumps` would write, after the system message's.
                items = _dumps([_encode_message(message, profile) for message in request.messages])
                if request.system:
                    parts.append(b",")
                parts.append(items[1:-1].encode())
            parts.append(b"]")
            if request.tools:
                parts.append(self._encode_tools(request.tools))
            for key in _CONFIG_KEYS:
                value = request.config.get(key)
                if value is not None:
                    parts.append(f',"{key}":{_dumps(value)}'.encode())
        except (TypeError, ValueError) as exc:
            raise ProviderError(f"request for model {model!r} is not JSON: {exc}") from exc
        parts.append(_TAIL)
        return b"".join(parts)

    def _head(self, model: str, system: str | None) -> bytes:
        """`{"model":...,"messages":[` and the system message, if any (no closing `]`)."""
        key = (model, system or None)
        head = self._heads.get(key)
        if head is not None:
            self._heads.move_to_end(key)
            return head
        text = '{"model":' + _dumps(model) + ',"messages":['
        if system:
            text += _dumps({"role": "system", "content": system})
        head = text.encode()
        self._heads[key] = head
        if len(self._heads) > _HEAD_CACHE_SIZE:
            self._heads.popitem(last=False)
        return head

    def _encode_tools(self, tools: tuple[ToolSchema, ...]) -> bytes:
        """`,"tools":[...]` for `tools`."""
        # Keyed by identity: the cached entry holds the schemas, so their ids
        # cannot be reused while the entry lives. Equal tuples of other
        # objects serialize to the same bytes anyway; this only saves work.
        key = tuple(map(id, tools))
        cached = self._tools_cache.get(key)
        if cached is not None:
            self._tools_cache.move_to_end(key)
            return cached[1]
        schemas = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                },
            }
            for tool in tools
        ]
        encoded = (',"tools":' + _dumps(schemas)).encode()
        self._tool_encodings += 1
        self._tools_cache[key] = (tools, encoded)
        if len(self._tools_cache) > _TOOLS_CACHE_SIZE:
            self._tools_cache.popitem(last=False)
        return encoded


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _text(message: Message) -> str:
    """`message.text`, without its generator for the common message of one text block."""
    content = message.content
    if len(content) == 1 and type(content[0]) is TextBlock:
        return content[0].text
    return message.text


def _encode_message(message: Message, profile: ModelProfile) -> dict[str, Any]:
    if message.role == "user":
        if isinstance(message.source, ToolSource):
            return {
                "role": "tool",
                "tool_call_id": message.source.call_id,
                "content": _text(message),
            }
        return {"role": "user", "content": _text(message)}
    out: dict[str, Any] = {"role": "assistant", "content": _text(message)}
    calls = message.tool_calls
    if calls and profile.reasoning_replay == "with-tool-calls":
        out["reasoning_content"] = "".join(
            block.text for block in message.content if isinstance(block, ReasoningBlock)
        )
    if calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in calls
        ]
    return out
