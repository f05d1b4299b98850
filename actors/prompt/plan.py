"""The per-scope assembly plan: what one scope chain's assembly needs from the registrations.

A `Plan` holds everything that depends only on the registrations, not on
the assembly context: the chain, suppression, the effective section and
context maps (nearest scope wins a name, DESIGN §4 order) stably sorted by
order with plain-string texts prebuilt, the complete sections, the chain's
tool providers and scope-filtered listeners, and its protected names.
`PlanCache` builds one per scope on demand and keeps it until the next
registration or disposal. Internal to `actors.prompt`.
"""

from __future__ import annotations

from operator import attrgetter

import attrs

from actors.prompt.entries import ListenerEntry, ToolProviderEntry
from actors.prompt.registrations import Registrations
from actors.prompt.types import AssembledContext, AssembledSection, PromptContext, PromptSection
from actors.scope import Scope

_BY_ORDER = attrgetter("order")
# Plans are dropped on every change; the cap only bounds scopes that are
# assembled repeatedly while nothing is registered or disposed.
_PLAN_CACHE_LIMIT = 256


@attrs.frozen(kw_only=True)
class Plan:
    """What one scope chain's assembly needs that only depends on the registrations."""

    scopes: tuple[Scope, ...]
    suppressed: bool
    sections: tuple[PromptSection, ...]
    # Entries with a plain-string text, built once per plan; None where a
    # text provider must run at every assembly.
    prebuilt_sections: tuple[AssembledSection | None, ...]
    complete: tuple[int, ...]
    contexts: tuple[PromptContext, ...]
    prebuilt_contexts: tuple[AssembledContext | None, ...]
    tool_providers: tuple[ToolProviderEntry, ...]
    listeners: tuple[ListenerEntry, ...]
    protected_sections: frozenset[str]
    protected_tools: frozenset[str]


class PlanCache:
    """Plans by scope (None: the global layer only), valid until `clear()`.

    The owner clears it on every registration or disposal; at most
    `_PLAN_CACHE_LIMIT` plans are kept in between.
    """

    def __init__(self) -> None:
        self._plans: dict[Scope | None, Plan] = {}

    def get(self, registrations: Registrations, scope: Scope | None) -> Plan:
        """The plan for `scope`'s chain, built from `registrations` if not cached."""
        plan = self._plans.get(scope)
        if plan is None:
            plan = build_plan(registrations, scope)
            if len(self._plans) >= _PLAN_CACHE_LIMIT:
                self._plans.clear()
            self._plans[scope] = plan
        return plan

    def clear(self) -> None:
        """Drop every plan: the registrations changed."""
        self._plans.clear()


def build_plan(registrations: Registrations, scope: Scope | None) -> Plan:
    """Derive the plan for `scope`'s chain (global layer only when None) from the registrations.

    Layers apply global first, then farthest ancestor to nearest. Sorting is
    stable, so equal orders keep the effective-map order.
    """
    scopes = () if scope is None else tuple(reversed(scope.chain()))
    layers = [registrations.global_layer]
    layers.extend(registrations.layers[s] for s in scopes if s in registrations.layers)
    # dict.update keeps a shadowed key's position and replaces its value:
    # exactly the effective-map order of DESIGN §4.
    sections: dict[str, PromptSection] = {}
    contexts: dict[str, PromptContext] = {}
    for layer in layers:
        sections.update(layer.sections)
        contexts.update(layer.contexts)
    ordered_sections = tuple(sorted(sections.values(), key=_BY_ORDER))
    ordered_contexts = tuple(sorted(contexts.values(), key=_BY_ORDER))
    members = set(scopes)
    return Plan(
        scopes=scopes,
        suppressed=any(layer.suppressors for layer in layers),
        sections=ordered_sections,
        prebuilt_sections=tuple(
            AssembledSection(name=s.name, text=s.text) if isinstance(s.text, str) else None
            for s in ordered_sections
        ),
        complete=tuple(i for i, s in enumerate(ordered_sections) if s.complete),
        contexts=ordered_contexts,
        prebuilt_contexts=tuple(
            AssembledContext(name=c.name, text=c.text) if isinstance(c.text, str) else None
            for c in ordered_contexts
        ),
        tool_providers=tuple(p for layer in layers for p in layer.tool_providers),
        listeners=tuple(
            entry
            for entry in registrations.listeners
            if entry.scope is None or entry.scope in members
        ),
        protected_sections=frozenset(
            name
            for layer in layers
            for entry in layer.protections
            for name in entry.protection.sections
        ),
        protected_tools=frozenset(
            name
            for layer in layers
            for entry in layer.protections
            for name in entry.protection.tools
        ),
    )
