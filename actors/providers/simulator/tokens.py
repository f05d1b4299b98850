"""The simulator's deterministic tokenizer and the canonical prompt render it counts.

Tokens are runs of up to four ASCII letters or digits (with the space before
them), runs of whitespace, or runs of up to three other characters: about
four characters per token on prose, two to three on JSON. A prompt is
rendered as the tool header followed by each message in order, every
message tokenized on its own, so the tokens of a prompt followed by the
assistant message it produced are exactly a prefix of the next prompt that
replays that message: what a server's prefix cache needs.

The render keeps tool JSON and message text verbatim (only the message
envelope is normalized), so a client that changes a byte of its tools or
history changes the tokens and loses the cache from there on.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_TOKEN = re.compile(r" ?[A-Za-z0-9]{1,4}|\s+|[^A-Za-z0-9\s]{1,3}")


def tokenize(text: str) -> list[str]:
    """Split `text` into tokens; joining them gives `text` back."""
    if len(text) < _CACHED_FROM:
        return _TOKEN.findall(text)
    return list(_tokenize_long(text))


_CACHED_FROM = 256
"""Texts at least this long (system prompts, tool headers) are tokenized once, then cached."""


@functools.lru_cache(maxsize=256)
def _tokenize_long(text: str) -> tuple[str, ...]:
    return tuple(_TOKEN.findall(text))


def content_text(content: object) -> str:
    """The text of a message `content`: a string, null, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(str(part["text"]) for part in content if isinstance(part, Mapping))
    raise TypeError(f"content must be a string, null or a list of text parts, got {content!r}")


def tools_text(tools: Sequence[Any] | None) -> str:
    """The rendered text of the tool header (empty when there are no tools)."""
    if not tools:
        return ""
    text = json.dumps(list(tools), separators=(",", ":"), ensure_ascii=False)
    return f"<|tools|>{text}<|/tools|>"


def render_tools(tools: Sequence[Any] | None) -> list[str]:
    """The tokens of the tool header (none when there are no tools)."""
    text = tools_text(tools)
    return tokenize(text) if text else []


def message_text(message: Mapping[str, Any]) -> str:
    """The rendered text of one (validated) chat message, which `render_message` tokenizes."""
    role = message["role"]
    parts = [f"<|{role}|>"]
    if role == "tool":
        parts.append(f"<|result {message['tool_call_id']}|>")
    reasoning = message.get("reasoning_content")
    if reasoning is not None:
        parts.append(f"<|think|>{reasoning}<|/think|>")
    parts.append(content_text(message.get("content")))
    for call in message.get("tool_calls") or ():
        function = call["function"]
        parts.append(f"<|call {call['id']} {function['name']}|>{function['arguments']}")
    parts.append("<|end|>")
    return "".join(parts)


def render_message(message: Mapping[str, Any]) -> list[str]:
    """The tokens of one (validated) chat message."""
    return tokenize(message_text(message))


def render_prompt(tools: Sequence[Any] | None, messages: Iterable[Mapping[str, Any]]) -> list[str]:
    """The tokens of a whole prompt: the tool header, then every message."""
    tokens = render_tools(tools)
    for message in messages:
        tokens.extend(render_message(message))
    return tokens
