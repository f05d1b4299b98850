"""`tool_choice` as the simulator honours it, and arguments made up from a tool's schema."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal, TypeAlias

import attrs

ToolChoiceMode: TypeAlias = Literal["none", "auto", "required", "function"]
"""`none`: never call; `auto`: call when the input asks; `required`: always
call some tool; `function`: always call the named one."""

_PLACEHOLDERS: Mapping[str, Any] = {
    "string": "",
    "number": 0,
    "integer": 0,
    "boolean": False,
    "array": [],
    "object": {},
    "null": None,
}


@attrs.frozen(kw_only=True)
class ToolChoice:
    """A request's validated `tool_choice`.

    Attributes:
        mode: What the model must do about tools.
        name: The function to call, for mode `function`.
    """

    mode: ToolChoiceMode = "auto"
    name: str | None = None


AUTO = ToolChoice()
"""The default choice when the request names none."""


def placeholder_arguments(tool: Mapping[str, Any]) -> str:
    """Arguments for a forced call of `tool`: each required property with an empty value.

    The value follows the property's JSON-schema `type` (`""`, `0`, `false`,
    `[]`, `{}`, `null`; the first of a list of types); properties without
    a known type get `null`.
    """
    parameters = tool.get("function", {}).get("parameters") or {}
    properties = parameters.get("properties") or {}
    arguments: dict[str, Any] = {}
    for name in parameters.get("required") or ():
        schema = properties.get(name)
        kind = schema.get("type") if isinstance(schema, Mapping) else None
        if isinstance(kind, list):
            kind = kind[0] if kind else None
        arguments[str(name)] = _PLACEHOLDERS.get(kind, None) if isinstance(kind, str) else None
    return json.dumps(arguments, separators=(",", ":"))
