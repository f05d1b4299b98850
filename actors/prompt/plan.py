"""The per-scope assembly plan: what one scope chain's assembly needs from the registrations.

A `Plan` holds everything that depends only on the registrations, not on
the assembly context: the chain, suppression, the effective section and
context maps (nearest scope wins a name, DESIGN §4 order) stably sorted by
order with plain-string texts prebuilt, the complete sections, the chain's
tool providers and scope-filtered listeners, and its protected names.
`PlanCache` builds one per scope on demand and keeps it until the next
registration or disposal. Internal to `actors.prompt`.

A scope's plan is its parent's plan with the scope's own layer applied on
top (the global layer's plan is the empty plan with the global layer
applied), so an agent's scope, which typically registers only variables and
a tool provider, costs a few tuple operations over its parent's cached plan
instead of merging and sorting every layer of its chain again.
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import attrgetter
from types import MappingProxyType

import attrs

from actors.prompt.entries import Layer, ListenerEntry, ToolProviderEntry
from actors.prompt.registrations import Registrations
from actors.prompt.types import AssembledContext, AssembledSection, PromptContext, PromptSection
from actors.scope import Scope

_BY_ORDER = attrgetter("order")
# Plans are dropped on every change; the cap only bounds scopes that are
# assembled repeatedly while nothing is registered or disposed.
_PLAN_CACHE_LIMIT = 256
_NO_SECTIONS: Mapping[str, PromptSection] = MappingProxyType({})
_NO_CONTEXTS: Mapping[str, PromptContext] = MappingProxyType({})
_EMPTY_LAYER = Layer()
"""The layer of a scope that registered nothing (never changed)."""


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
    # The effective maps in effective-map order (before sorting): what a
    # child scope's plan applies its own layer to.
    section_map: Mapping[str, PromptSection]
    context_map: Mapping[str, PromptContext]


_EMPTY_PLAN = Plan(
    scopes=(),
    suppressed=False,
    sections=(),
    prebuilt_sections=(),
    complete=(),
    contexts=(),
    prebuilt_contexts=(),
    tool_providers=(),
    listeners=(),
    protected_sections=frozenset(),
    protected_tools=frozenset(),
    section_map=_NO_SECTIONS,
    context_map=_NO_CONTEXTS,
)


class PlanCache:
    """Plans by scope (None: the global layer only), valid until `clear()`.

    The owner clears it on every registration or disposal; at most
    `_PLAN_CACHE_LIMIT` plans are kept in between (the oldest goes first).
    """

    def __init__(self) -> None:
        self._plans: dict[Scope | None, Plan] = {}

    def get(self, registrations: Registrations, scope: Scope | None) -> Plan:
        """The plan for `scope`'s chain, built from `registrations` if not cached.

        A missing plan is built over its parent's (cached on the way).
        """
        plan = self._plans.get(scope)
        if plan is None:
            if scope is None:
                plan = build_plan(registrations, None, _EMPTY_PLAN)
            else:
                plan = build_plan(registrations, scope, self.get(registrations, scope.parent))
            if len(self._plans) >= _PLAN_CACHE_LIMIT:
                del self._plans[next(iter(self._plans))]
            self._plans[scope] = plan
        return plan

    def clear(self) -> None:
        """Drop every plan: the registrations changed."""
        self._plans.clear()

    def discard(self, scope: Scope) -> None:
        """Drop `scope`'s plan, if cached (its owner will not assemble for a while)."""
        self._plans.pop(scope, None)


def build_plan(registrations: Registrations, scope: Scope | None, parent: Plan) -> Plan:
    """The plan for `scope`'s chain: `parent` (its parent scope's plan) with `scope`'s layer on top.

    `scope` None is the global layer, over the empty plan. Layers apply
    global first, then farthest ancestor to nearest: `dict.update` keeps a
    shadowed key's position and replaces its value, exactly the
    effective-map order of DESIGN §4; sorting is stable, so equal orders
    keep that order.
    """
    if scope is None:
        layer = registrations.global_layer
        scopes: tuple[Scope, ...] = ()
    else:
        layer = registrations.layers.get(scope) or _EMPTY_LAYER
        scopes = (*parent.scopes, scope)
    listeners = parent.listeners
    if any(entry.scope is scope for entry in registrations.listeners):
        members = set(scopes)
        listeners = tuple(
            entry
            for entry in registrations.listeners
            if entry.scope is None or entry.scope in members
        )
    section_map, sections = parent.section_map, parent.sections
    prebuilt_sections, complete = parent.prebuilt_sections, parent.complete
    if layer.sections:
        section_map = {**section_map, **layer.sections}
        sections = tuple(sorted(section_map.values(), key=_BY_ORDER))
        prebuilt_sections = tuple(
            AssembledSection(name=s.name, text=s.text) if isinstance(s.text, str) else None
            for s in sections
        )
        complete = tuple(i for i, s in enumerate(sections) if s.complete)
    context_map, contexts, prebuilt_contexts = (
        parent.context_map,
        parent.contexts,
        parent.prebuilt_contexts,
    )
    if layer.contexts:
        context_map = {**context_map, **layer.contexts}
        contexts = tuple(sorted(context_map.values(), key=_BY_ORDER))
        prebuilt_contexts = tuple(
            AssembledContext(name=c.name, text=c.text) if isinstance(c.text, str) else None
            for c in contexts
        )
    protected_sections, protected_tools = parent.protected_sections, parent.protected_tools
    if layer.protections:
        protected_sections = protected_sections.union(
            *(entry.protection.sections for entry in layer.protections)
        )
        protected_tools = protected_tools.union(
            *(entry.protection.tools for entry in layer.protections)
        )
    return Plan(
        scopes=scopes,
        suppressed=parent.suppressed or layer.suppressors > 0,
        sections=sections,
        prebuilt_sections=prebuilt_sections,
        complete=complete,
        contexts=contexts,
        prebuilt_contexts=prebuilt_contexts,
        tool_providers=(
            (*parent.tool_providers, *layer.tool_providers)
            if layer.tool_providers
            else parent.tool_providers
        ),
        listeners=listeners,
        protected_sections=protected_sections,
        protected_tools=protected_tools,
        section_map=section_map,
        context_map=context_map,
    )
