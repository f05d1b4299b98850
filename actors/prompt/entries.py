"""The records registrations leave behind: one entry per registration, and the `Layer` holding them.

A `Layer` is the registrations of the global layer or of one scope; listeners
and change callbacks are not per layer and live in `Registrations` directly.
Internal to `actors.prompt`.
"""

from __future__ import annotations

import functools

import attrs

from actors.prompt.errors import PromptError
from actors.prompt.types import (
    TOOL_ORDER_REST,
    AssembleListener,
    ChangeCallback,
    PromptContext,
    PromptProtection,
    PromptSection,
    ToolProvider,
    ToolProviderResult,
    ToolSchema,
    VariableProvider,
)
from actors.scope import Scope


@attrs.define(eq=False)
class VariableEntry:
    """A registered variable; `seq` orders registrations across one live evaluation pass."""

    name: str
    provider: VariableProvider
    seq: int


@functools.lru_cache(maxsize=256)
def _interned(names: tuple[str, ...]) -> frozenset[str]:
    """One frozenset per distinct list of tool names, shared by every agent that has it."""
    return frozenset(names)


@attrs.define(eq=False)
class ToolProviderEntry:
    """A registered tool provider and what its last validated result said."""

    provider: ToolProvider
    label: str
    # The last result this provider returned, once validated. Results are
    # immutable, so a provider returning the same object again skips the checks.
    checked: ToolProviderResult | None = None
    known: frozenset[str] = frozenset()
    returns_marker: bool = False

    def check(self, result: object) -> ToolProviderResult:
        """Validate one result of the provider and remember its known names.

        Raises:
            PromptError: `result` is not a `ToolProviderResult`, or holds
                something other than `ToolSchema`s.
        """
        if self.checked is not None and result is self.checked:
            return self.checked
        if not isinstance(result, ToolProviderResult):
            raise PromptError(
                f"tool provider {self.label!r} returned {type(result).__name__}, "
                "not ToolProviderResult"
            )
        for schema in result.schemas:
            if not isinstance(schema, ToolSchema):
                raise PromptError(
                    f"tool provider {self.label!r} returned {type(schema).__name__} "
                    "among its schemas, not ToolSchema"
                )
        names = _interned(tuple(schema.name for schema in result.schemas))
        self.known = names if result.known_names is None else _interned(tuple(result.known_names))
        self.returns_marker = TOOL_ORDER_REST in names or TOOL_ORDER_REST in self.known
        self.checked = result
        return result


@attrs.define(eq=False)
class ProtectionEntry:
    """A registered protection (an identity, so equal protections dispose separately)."""

    protection: PromptProtection


@attrs.define(eq=False)
class ListenerEntry:
    """A registered waterfall listener and the scope it applies to (None: every assembly)."""

    listener: AssembleListener
    label: str
    scope: Scope | None


@attrs.define(eq=False)
class ChangeCallbackEntry:
    """A registered change callback."""

    callback: ChangeCallback
    label: str


@attrs.define(eq=False)
class Layer:
    """The registrations of one layer (the global one, or one scope's)."""

    sections: dict[str, PromptSection] = attrs.field(factory=dict)
    contexts: dict[str, PromptContext] = attrs.field(factory=dict)
    suppressors: int = 0
    tool_providers: list[ToolProviderEntry] = attrs.field(factory=list)
    variables: dict[str, VariableEntry] = attrs.field(factory=dict)
    protections: list[ProtectionEntry] = attrs.field(factory=list)

    def is_empty(self) -> bool:
        """True when the layer holds no registration."""
        return not (
            self.sections
            or self.contexts
            or self.suppressors
            or self.tool_providers
            or self.variables
            or self.protections
        )
