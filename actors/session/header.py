"""Request headers: the stable half of a request (config, system text, tools).

A header is logged as a `request/header` event only when it differs from the
last one, so the log stays small while every request stays rebuildable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from actors.jsonvalue import freeze_object
from actors.prompt.types import ToolSchema


def _freeze_config(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return freeze_object(value, where="config")


def _tools(value: Iterable[ToolSchema]) -> tuple[ToolSchema, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class RequestHeader:
    """Resolved call config, rendered system text and ordered tool schemas."""

    config: Mapping[str, Any] = attrs.field(converter=_freeze_config)
    system: str | None = None
    tools: tuple[ToolSchema, ...] = attrs.field(default=(), converter=_tools)


def canonical_header(header: RequestHeader) -> RequestHeader:
    """The header with an empty system text or tool list made absent."""
    return RequestHeader(config=header.config, system=header.system or None, tools=header.tools)


def header_equals(a: RequestHeader | None, b: RequestHeader | None) -> bool:
    """True when both canonical headers agree on config, system bytes and tools in order."""
    if a is None or b is None:
        return a is b
    a, b = canonical_header(a), canonical_header(b)
    return a.config == b.config and a.system == b.system and a.tools == b.tools
