"""Where each effective prompt entry of a scope chain comes from (for inspection).

`PromptOrigins` answers, for one scope chain, which layer (the global one
or a scope) supplies each effective section, context and tool, and which
layers' entries of the same name it shadows. It reads the registrations
only; it never calls a provider, so building it has no effects.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from actors.prompt.registrations import Registrations
from actors.scope import Scope


@attrs.frozen(kw_only=True)
class EntryOrigin:
    """The layer an effective entry comes from, and the layers it shadows.

    Attributes:
        scope: the supplying scope; None for the global layer.
        order: the entry's order (None for tools).
        complete: True for a complete section.
        shadows: the farther layers (None: global) that register the same name.
    """

    scope: Scope | None
    order: float | None
    complete: bool = False
    shadows: tuple[Scope | None, ...] = ()


@attrs.frozen(kw_only=True)
class PromptOrigins:
    """For one scope chain: the origin of each effective section, context and tool by name.

    `tools` covers the names each provider returned at its latest assembly
    (nearest layer wins a name, as sections do).
    """

    sections: Mapping[str, EntryOrigin]
    contexts: Mapping[str, EntryOrigin]
    tools: Mapping[str, EntryOrigin]


def prompt_origins(registrations: Registrations, scope: Scope | None) -> PromptOrigins:
    """The origins of `scope`'s chain (global layer only when None), global first, nearest last."""
    scopes: list[Scope | None] = [None]
    if scope is not None:
        scopes.extend(reversed(scope.chain()))
    sections: dict[str, EntryOrigin] = {}
    contexts: dict[str, EntryOrigin] = {}
    tools: dict[str, EntryOrigin] = {}
    for layer_scope in scopes:
        layer = (
            registrations.global_layer
            if layer_scope is None
            else registrations.layers.get(layer_scope)
        )
        if layer is None:
            continue
        for name, section in layer.sections.items():
            sections[name] = _nearer(
                sections.get(name), layer_scope, section.order, complete=section.complete
            )
        for name, context in layer.contexts.items():
            contexts[name] = _nearer(contexts.get(name), layer_scope, context.order)
        for entry in layer.tool_providers:
            if entry.checked is None:
                continue
            for schema in entry.checked.schemas:
                tools[schema.name] = _nearer(tools.get(schema.name), layer_scope, None)
    return PromptOrigins(sections=sections, contexts=contexts, tools=tools)


def _nearer(
    farther: EntryOrigin | None, scope: Scope | None, order: float | None, *, complete: bool = False
) -> EntryOrigin:
    if farther is None:
        return EntryOrigin(scope=scope, order=order, complete=complete)
    if farther.scope is scope:
        return farther
    return EntryOrigin(
        scope=scope, order=order, complete=complete, shadows=(*farther.shadows, farther.scope)
    )
