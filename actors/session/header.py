"""Request headers: the stable half of a request (config, system text, tools).

A header is logged as a `request/header` event only when it differs from the
last one, so the log stays small while every request stays rebuildable.

`shared_header` gives every agent that builds an equal header the same
immutable object, so thousands of sessions of one deployment hold one
header between them rather than one each (built during their first turn
and kept while they idle).
"""

from __future__ import annotations

import weakref
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


_shared_headers: weakref.WeakValueDictionary[
    tuple[int, str | None, tuple[int, ...]], RequestHeader
] = weakref.WeakValueDictionary()
"""Canonical headers by the identity of their config and tool schemas and their system text.

An entry lives as long as its header: the header keeps its config and
schemas alive, so an id in a live key is never reused for another object."""


def shared_header(
    config: Mapping[str, Any], system: str | None, tools: tuple[ToolSchema, ...]
) -> RequestHeader:
    """The canonical header of `config`, `system` and `tools`, shared by every caller asking for it.

    Callers that pass the same frozen config object and tool
    schema objects with equal system text get the same `RequestHeader`
    while any of them holds it; otherwise a new one is built (and shared
    from then on).

    Raises:
        TypeError: `config` is not a JSON object of JSON-like values.
    """
    frozen = freeze_object(config, where="config")  # the object the header holds
    key = (id(frozen), system or None, tuple(map(id, tools)))
    header = _shared_headers.get(key)
    if header is None:
        header = canonical_header(RequestHeader(config=frozen, system=system, tools=tools))
        _shared_headers[key] = header
    return header
