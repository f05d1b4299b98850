"""Model-visible messages: what `derive_messages()` yields and requests carry.

Content is a tuple of blocks. A user-role message always names its `source`
(the person, a tool result, or a context plugin); assistant messages carry
text, reasoning and tool-call blocks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal, TypeAlias

import attrs


@attrs.frozen(kw_only=True)
class TextBlock:
    """Plain text; JSON `{"type": "text", "text"}`."""

    text: str


@attrs.frozen(kw_only=True)
class ReasoningBlock:
    """Model reasoning ("thinking") text; JSON `{"type": "reasoning", "text"}`."""

    text: str


@attrs.frozen(kw_only=True)
class ToolCallBlock:
    """A tool call the model made; `arguments` is the raw JSON string it produced."""

    id: str
    name: str
    arguments: str


Block: TypeAlias = TextBlock | ReasoningBlock | ToolCallBlock


@attrs.frozen(kw_only=True)
class UserSource:
    """Typed by the person driving the agent; JSON `{"kind": "user"}`.

    `request_id` (JSON `"request_id"`, present only when set) names the
    gateway request that delivered the message, so a node taking a session
    over can find a prompt that was already logged and answer it from the
    log instead of running it again.
    """

    request_id: str | None = None


@attrs.frozen(kw_only=True)
class ToolSource:
    """The result of the tool call `call_id`; JSON `{"kind": "tool", "call_id"}`."""

    call_id: str


def _optional_names(value: Iterable[str] | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(value)


@attrs.frozen(kw_only=True)
class PluginSource:
    """Contributed by a context plugin; `form` and `sections` describe what it is."""

    plugin: str
    form: str | None = None
    sections: tuple[str, ...] | None = attrs.field(default=None, converter=_optional_names)


Source: TypeAlias = UserSource | ToolSource | PluginSource

RUNTIME_CONTEXT_PLUGIN = "runtime-context"
"""The `plugin` name on runtime-context snapshot and tombstone messages."""


def _blocks(value: Sequence[Block] | str) -> tuple[Block, ...]:
    if isinstance(value, str):
        return (TextBlock(text=value),)
    return tuple(value)


@attrs.frozen(kw_only=True)
class Message:
    """One model-visible message.

    `role` is "user" or "assistant"; a user message has a `source`, an
    assistant message has none. A tool result is a user message whose source
    is a `ToolSource`, with `is_error` set when the tool failed. Passing a
    plain string as `content` makes one text block.
    """

    role: Literal["user", "assistant"]
    content: tuple[Block, ...] = attrs.field(converter=_blocks)
    source: Source | None = None
    is_error: bool = False

    @classmethod
    def user(cls, text: str, source: Source | None = None) -> Message:
        """A user-role text message (source defaults to the person)."""
        return cls(role="user", content=text, source=source or UserSource())

    @property
    def text(self) -> str:
        """The concatenated text blocks (reasoning and tool calls excluded)."""
        return "".join(block.text for block in self.content if isinstance(block, TextBlock))

    @property
    def tool_calls(self) -> tuple[ToolCallBlock, ...]:
        """The tool-call blocks, in order."""
        return tuple(block for block in self.content if isinstance(block, ToolCallBlock))
