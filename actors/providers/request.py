"""The frozen model request a provider receives."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from actors.jsonvalue import freeze_object
from actors.messages import Message
from actors.prompt.types import ToolSchema


def _freeze_config(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return freeze_object(value, where="config")


def _tools(value: Iterable[ToolSchema]) -> tuple[ToolSchema, ...]:
    return tuple(value)


def _messages(value: Iterable[Message]) -> tuple[Message, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class GenerateRequest:
    """One model request: call config, system text, ordered tools, messages.

    `config` always holds `provider` and `model`; optional settings
    (`max_tokens`, `temperature`, ...) appear only when set. `system` is None
    and `tools` empty when there is nothing to send.
    """

    config: Mapping[str, Any] = attrs.field(converter=_freeze_config)
    system: str | None = None
    tools: tuple[ToolSchema, ...] = attrs.field(default=(), converter=_tools)
    messages: tuple[Message, ...] = attrs.field(default=(), converter=_messages)

    @property
    def model(self) -> str:
        """The configured model name."""
        return str(self.config["model"])

    def to_json(self) -> dict[str, Any]:
        """The request as JSON: `{"config", "system"?, "tools"?, "messages"}`.

        Keys come in a fixed order, so `json.dumps` of two equal requests
        gives identical bytes.
        """
        # Imported here: the log codec imports the event types, which import
        # this package's chunk types.
        from actors.session.codec import unstructure_messages, unstructure_tools

        out: dict[str, Any] = {"config": self.config}
        if self.system:
            out["system"] = self.system
        if self.tools:
            out["tools"] = unstructure_tools(self.tools)
        out["messages"] = unstructure_messages(self.messages)
        return out

    def with_messages(self, messages: Sequence[Message]) -> GenerateRequest:
        """A copy carrying `messages` instead."""
        return attrs.evolve(self, messages=tuple(messages))
