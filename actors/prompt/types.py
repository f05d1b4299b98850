"""Data of the prompt registry: what plugins register and what assembly returns."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeAlias

import attrs

from actors.jsonvalue import freeze_json
from actors.prompt.errors import PromptError
from actors.scope import Scope

HARNESS_IDENTITY_SECTION = "harness:identity"
"""Name of the built-in identity section (order -100)."""
HARNESS_IDENTITY_ORDER = -100
"""Order of the built-in identity section."""
PERSONA_SECTION = "deployment:persona"
"""Name of the deployment persona section."""
PERSONA_ORDER = 0
"""Order of the deployment persona section."""
TOOL_ORDER_REST = "<unlisted-tools>"
"""The marker in `tool_order` where unlisted tools go, sorted by name."""


@attrs.frozen(kw_only=True)
class AssembleContext:
    """What one `assemble()` call is for. Every field is optional.

    `scope` selects the layers (None: the global layer only); `agent` is the
    agent being assembled for, passed through to providers and listeners.
    """

    scope: Scope | None = None
    agent: Any = None


TextProvider: TypeAlias = str | Callable[[AssembleContext], str]
"""A section or context text: a string, or a callable evaluated once per assembly."""


def _check_order(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        name = getattr(instance, "name", "?")
        raise PromptError(f"order of {name!r} must be a finite number, got {value!r}")


@attrs.frozen(kw_only=True)
class PromptSection:
    """A stable instruction section of the system text.

    `text` is a string or a callable of the `AssembleContext`; it is evaluated
    once per assembly and interpolated at render time. At most one effective
    section may be `complete` (it then becomes the only section).
    """

    name: str
    order: float = attrs.field(validator=_check_order)
    text: TextProvider
    complete: bool = False


@attrs.frozen(kw_only=True)
class PromptContext:
    """A volatile runtime fact, rendered into a user-role snapshot, never the system text."""

    name: str
    order: float = attrs.field(validator=_check_order)
    text: TextProvider


@attrs.frozen(kw_only=True)
class ToolSchema:
    """A tool as the model sees it.

    `parameters` is snapshotted deeply and immutably at construction: nothing
    the caller mutates later reaches any assembly, and assemblies can share
    the schema without copying it.

    Raises:
        PromptError: `parameters` is not a JSON object of JSON-like values;
            the message names the tool and the offending path.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]

    def __attrs_post_init__(self) -> None:
        try:
            frozen = freeze_json(self.parameters, where="parameters")
        except TypeError as exc:
            raise PromptError(f"tool {self.name!r}: {exc}") from exc
        if not isinstance(frozen, Mapping):
            raise PromptError(
                f"tool {self.name!r}: parameters must be a JSON object, got {type(frozen).__name__}"
            )
        # A frozen class: the snapshot replaces the caller's object once, here.
        object.__setattr__(self, "parameters", frozen)


def _schema_tuple(value: Iterable[ToolSchema]) -> tuple[ToolSchema, ...]:
    return tuple(value)


def _optional_names(value: Iterable[str] | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(value)


def _names(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class ToolProviderResult:
    """What a tool provider returns for one assembly.

    `schemas` are the tools visible in this assembly's scope; `known_names`
    is the pre-restriction universe `tool_order` is validated against
    (None: the names of `schemas`).
    """

    schemas: Sequence[ToolSchema] = attrs.field(converter=_schema_tuple)
    known_names: Sequence[str] | None = attrs.field(default=None, converter=_optional_names)


@attrs.frozen(kw_only=True)
class PromptProtection:
    """Section and tool names whose canonical pre-waterfall state is authoritative."""

    sections: Sequence[str] = attrs.field(default=(), converter=_names)
    tools: Sequence[str] = attrs.field(default=(), converter=_names)


@attrs.frozen(kw_only=True)
class AssembledSection:
    """A section after its text provider ran; the text is not yet interpolated."""

    name: str
    text: str


@attrs.frozen(kw_only=True)
class AssembledContext:
    """A context after its text provider ran (or after rendering, interpolated)."""

    name: str
    text: str


@attrs.define(kw_only=True)
class PromptAssembly:
    """The mutable result of one assembly, which waterfall listeners may edit or replace.

    Every assembly returns fresh containers; nothing here is shared with the
    registry or with another assembly.
    """

    sections: list[AssembledSection] = attrs.field(factory=list)
    contexts: list[AssembledContext] = attrs.field(factory=list)
    tools: list[ToolSchema] = attrs.field(factory=list)
    variables: dict[str, str | None] = attrs.field(factory=dict)


VariableProvider: TypeAlias = Callable[[AssembleContext], str | None]
"""Returns a variable's value for one assembly; None means "registered, no value"."""
ToolProvider: TypeAlias = Callable[[AssembleContext], ToolProviderResult]
"""Returns the tools visible to one assembly (and, optionally, every name it knows)."""
NextListener: TypeAlias = Callable[[], Awaitable[PromptAssembly]]
"""Runs the rest of the waterfall on the current assembly and returns its result."""
AssembleListener: TypeAlias = Callable[
    [PromptAssembly, AssembleContext, NextListener], Awaitable[PromptAssembly]
]
"""A waterfall listener: may edit the assembly, replace it, or not call `next` at all."""
ChangeCallback: TypeAlias = Callable[[], None]
"""Called synchronously after every registration or disposal."""
