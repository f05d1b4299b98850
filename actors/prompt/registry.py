"""The prompt registry: layered, reversible registrations and the per-step assembly pipeline.

`SystemPrompt` holds a global layer and one layer per scope that registered
something. Every registration returns a `Registration` whose disposal removes
exactly that entry. `assemble()` evaluates the effective registrations for
one scope chain, in the order fixed by DESIGN §4, and returns a fresh
`PromptAssembly`. Everything that only depends on the registrations (the
effective, sorted section and context maps, the tool providers, listeners and
protections of a chain) is computed once per scope and reused until the next
registration or disposal.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from operator import attrgetter
from typing import Literal, TypeAlias, TypeVar, get_args

import attrs
import trio

from actors.prompt.errors import PromptError
from actors.prompt.tool_order import ToolOrder, order_tools, parse_tool_order
from actors.prompt.types import (
    HARNESS_IDENTITY_ORDER,
    HARNESS_IDENTITY_SECTION,
    PERSONA_ORDER,
    PERSONA_SECTION,
    TOOL_ORDER_REST,
    AssembleContext,
    AssembledContext,
    AssembledSection,
    PromptAssembly,
    PromptContext,
    PromptProtection,
    PromptSection,
    TextProvider,
    ToolProviderResult,
    ToolSchema,
)
from actors.scope import Registration, Scope, ScopeClosedError

HARNESS_IDENTITY_TEXT = "You are an agent running on harness, a Trio agent runtime."
"""Text of the built-in `harness:identity` section: a harness fact, not a deployment choice."""

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

_VARIABLE_NAME = re.compile(r"[a-z][a-z0-9_]*")
_BY_ORDER = attrgetter("order")
# Plans are dropped on every change; the cap only bounds scopes that are
# assembled repeatedly while nothing is registered or disposed.
_PLAN_CACHE_LIMIT = 256
_logger = logging.getLogger(__name__)

_Kind: TypeAlias = Literal[
    "sections",
    "contexts",
    "suppressors",
    "tool_providers",
    "variables",
    "protections",
    "listeners",
    "change_callbacks",
]
_Named = TypeVar("_Named", AssembledSection, ToolSchema)
_T = TypeVar("_T")


@attrs.frozen(kw_only=True)
class PromptStatistics:
    """A point-in-time summary of a `SystemPrompt`, cheap to take.

    The first eight fields count live registrations of each kind, over every
    layer. `scoped_layers` counts scopes that currently hold registrations.
    `changes_notified` counts change notifications fired (one per
    registration or disposal of anything but a change callback);
    `change_callback_errors` counts change callbacks that raised.
    """

    sections: int
    contexts: int
    suppressors: int
    tool_providers: int
    variables: int
    protections: int
    listeners: int
    change_callbacks: int
    scoped_layers: int
    changes_notified: int
    change_callback_errors: int


@attrs.define(eq=False)
class _Variable:
    name: str
    provider: VariableProvider
    seq: int


@attrs.define(eq=False)
class _ToolProvider:
    provider: ToolProvider
    label: str
    # The last result this provider returned, once validated. Results are
    # immutable, so a provider returning the same object again skips the checks.
    checked: ToolProviderResult | None = None
    known: frozenset[str] = frozenset()
    returns_marker: bool = False

    def check(self, result: object) -> ToolProviderResult:
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
        names = frozenset(schema.name for schema in result.schemas)
        self.known = names if result.known_names is None else frozenset(result.known_names)
        self.returns_marker = TOOL_ORDER_REST in names or TOOL_ORDER_REST in self.known
        self.checked = result
        return result


@attrs.define(eq=False)
class _Protection:
    protection: PromptProtection


@attrs.define(eq=False)
class _Listener:
    listener: AssembleListener
    label: str
    scope: Scope | None


@attrs.define(eq=False)
class _ChangeCallback:
    callback: ChangeCallback
    label: str


@attrs.define(eq=False)
class _Layer:
    """The registrations of one layer (the global one, or one scope's)."""

    sections: dict[str, PromptSection] = attrs.field(factory=dict)
    contexts: dict[str, PromptContext] = attrs.field(factory=dict)
    suppressors: int = 0
    tool_providers: list[_ToolProvider] = attrs.field(factory=list)
    variables: dict[str, _Variable] = attrs.field(factory=dict)
    protections: list[_Protection] = attrs.field(factory=list)

    def is_empty(self) -> bool:
        return not (
            self.sections
            or self.contexts
            or self.suppressors
            or self.tool_providers
            or self.variables
            or self.protections
        )


@attrs.frozen(kw_only=True)
class _Plan:
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
    tool_providers: tuple[_ToolProvider, ...]
    listeners: tuple[_Listener, ...]
    protected_sections: frozenset[str]
    protected_tools: frozenset[str]


def _label(fn: object) -> str:
    name = getattr(fn, "__qualname__", None)
    return name if isinstance(name, str) else repr(fn)


def _remove_identical(items: list[_T], item: _T) -> None:
    for index, candidate in enumerate(items):
        if candidate is item:
            del items[index]
            return


class SystemPrompt:
    """The scoped prompt registry and its assembly pipeline.

    Registration methods are synchronous and take keyword `scope` (None: the
    global layer). Each returns a `Registration`; disposing it removes exactly
    that entry, and a scope disposes everything registered in it when it
    closes. Within one layer names are unique; a scope's entry shadows a
    same-named entry of the global layer or of an ancestor for that scope and
    its descendants. Every registration and disposal (except of change
    callbacks) notifies the change callbacks.

    The constructor registers the global sections `harness:identity` (unless
    `include_harness_identity` is False) and `deployment:persona` (text
    `persona`), and a global runtime-context suppressor when
    `include_runtime_context` is False.

    Raises:
        PromptError: `tool_order` lacks exactly one `TOOL_ORDER_REST` entry,
            or repeats a name.
    """

    def __init__(
        self,
        *,
        persona: str = "",
        tool_order: Sequence[str] | None = None,
        include_harness_identity: bool = True,
        include_runtime_context: bool = True,
    ) -> None:
        if not isinstance(persona, str):
            raise PromptError(f"persona must be a str, got {type(persona).__name__}")
        self._tool_order: ToolOrder | None = (
            None if tool_order is None else parse_tool_order(tool_order)
        )
        self._global = _Layer()
        self._layers: dict[Scope, _Layer] = {}
        self._listeners: list[_Listener] = []
        self._change_callbacks: list[_ChangeCallback] = []
        self._plans: dict[Scope | None, _Plan] = {}
        self._generation = 0
        self._variable_seq = 0
        self._counts: dict[_Kind, int] = dict.fromkeys(get_args(_Kind), 0)
        self._changes_notified = 0
        self._change_callback_errors = 0
        if include_harness_identity:
            self.section(
                PromptSection(
                    name=HARNESS_IDENTITY_SECTION,
                    order=HARNESS_IDENTITY_ORDER,
                    text=HARNESS_IDENTITY_TEXT,
                )
            )
        self.section(PromptSection(name=PERSONA_SECTION, order=PERSONA_ORDER, text=persona))
        if not include_runtime_context:
            self.suppress_runtime_context()

    # Registration

    def section(self, section: PromptSection, *, scope: Scope | None = None) -> Registration:
        """Register a stable system-text section.

        Raises:
            PromptError: `section` is not a `PromptSection`, its text is
                neither a str nor callable, the layer already has its name, or
                it is scoped and its name is protected globally.
            ScopeClosedError: `scope` is closed.
        """
        if not isinstance(section, PromptSection):
            raise PromptError(f"section() takes a PromptSection, got {type(section).__name__}")
        _check_entry(section.name, section.text, "section")
        self._check_open(scope)
        if section.name in self._existing(scope).sections:
            raise PromptError(f"section {section.name!r} is already registered in {_where(scope)}")
        if scope is not None and section.name in self._globally_protected_sections():
            raise PromptError(
                f"section {section.name!r} is protected globally; {_where(scope)} cannot shadow it"
            )
        layer = self._layer(scope)
        layer.sections[section.name] = section

        def remove() -> None:
            if layer.sections.get(section.name) is section:
                del layer.sections[section.name]
                self._drop_if_empty(scope, layer)

        return self._commit(scope, "sections", remove)

    def context(self, context: PromptContext, *, scope: Scope | None = None) -> Registration:
        """Register a volatile runtime-context section.

        Raises:
            PromptError: `context` is not a `PromptContext`, its text is
                neither a str nor callable, or the layer already has its name.
            ScopeClosedError: `scope` is closed.
        """
        if not isinstance(context, PromptContext):
            raise PromptError(f"context() takes a PromptContext, got {type(context).__name__}")
        _check_entry(context.name, context.text, "context")
        self._check_open(scope)
        if context.name in self._existing(scope).contexts:
            raise PromptError(f"context {context.name!r} is already registered in {_where(scope)}")
        layer = self._layer(scope)
        layer.contexts[context.name] = context

        def remove() -> None:
            if layer.contexts.get(context.name) is context:
                del layer.contexts[context.name]
                self._drop_if_empty(scope, layer)

        return self._commit(scope, "contexts", remove)

    def suppress_runtime_context(self, *, scope: Scope | None = None) -> Registration:
        """Suppress runtime contexts for this layer's assemblies while registered.

        Any suppressor in the global layer or on an assembly's scope chain
        empties that assembly's contexts (their providers are not called).
        Disposal removes only this suppressor.

        Raises:
            ScopeClosedError: `scope` is closed.
        """
        self._check_open(scope)
        layer = self._layer(scope)
        layer.suppressors += 1

        def remove() -> None:
            layer.suppressors -= 1
            self._drop_if_empty(scope, layer)

        return self._commit(scope, "suppressors", remove)

    def tools(self, provider: ToolProvider, *, scope: Scope | None = None) -> Registration:
        """Register a tool-schema provider, called once per assembly of this layer's chains.

        Raises:
            PromptError: `provider` is not callable.
            ScopeClosedError: `scope` is closed.
        """
        if not callable(provider):
            raise PromptError(f"tools() takes a callable provider, got {provider!r}")
        self._check_open(scope)
        layer = self._layer(scope)
        entry = _ToolProvider(provider=provider, label=_label(provider))
        layer.tool_providers.append(entry)

        def remove() -> None:
            _remove_identical(layer.tool_providers, entry)
            self._drop_if_empty(scope, layer)

        return self._commit(scope, "tool_providers", remove)

    def variable(
        self, name: str, provider: VariableProvider, *, scope: Scope | None = None
    ) -> Registration:
        """Register the prompt variable `{{name}}`, evaluated once per assembly.

        Raises:
            PromptError: `name` does not match `[a-z][a-z0-9_]*`, `provider`
                is not callable, or the layer already has the name.
            ScopeClosedError: `scope` is closed.
        """
        if not isinstance(name, str) or _VARIABLE_NAME.fullmatch(name) is None:
            raise PromptError(f"variable name {name!r} must match [a-z][a-z0-9_]*")
        if not callable(provider):
            raise PromptError(f"variable {name!r} needs a callable provider, got {provider!r}")
        self._check_open(scope)
        if name in self._existing(scope).variables:
            raise PromptError(f"variable {name!r} is already registered in {_where(scope)}")
        layer = self._layer(scope)
        self._variable_seq += 1
        entry = _Variable(name=name, provider=provider, seq=self._variable_seq)
        layer.variables[name] = entry

        def remove() -> None:
            if layer.variables.get(name) is entry:
                del layer.variables[name]
                self._drop_if_empty(scope, layer)

        return self._commit(scope, "variables", remove)

    def protect(self, protection: PromptProtection, *, scope: Scope | None = None) -> Registration:
        """Make named sections and tools authoritative after the waterfall.

        For assemblies of this layer's scope and its descendants (every
        assembly, when global), each protected name ends up exactly as it was
        before the listeners ran: present with its canonical definition, or
        absent. A global section protection also reserves the name against
        scoped shadows.

        Raises:
            PromptError: `protection` is not a `PromptProtection`, is empty,
                holds a non-str name, or (global only) protects a section name
                some scope already shadows.
            ScopeClosedError: `scope` is closed.
        """
        if not isinstance(protection, PromptProtection):
            raise PromptError(
                f"protect() takes a PromptProtection, got {type(protection).__name__}"
            )
        if not protection.sections and not protection.tools:
            raise PromptError("protect() needs at least one section or tool name")
        for name in (*protection.sections, *protection.tools):
            if not isinstance(name, str):
                raise PromptError(f"protected name {name!r} is not a str")
        self._check_open(scope)
        if scope is None:
            for shadowing_scope, shadowing_layer in self._layers.items():
                for name in protection.sections:
                    if name in shadowing_layer.sections:
                        raise PromptError(
                            f"cannot protect section {name!r} globally: "
                            f"{_where(shadowing_scope)} already shadows it"
                        )
        layer = self._layer(scope)
        entry = _Protection(protection=protection)
        layer.protections.append(entry)

        def remove() -> None:
            _remove_identical(layer.protections, entry)
            self._drop_if_empty(scope, layer)

        return self._commit(scope, "protections", remove)

    def on_assemble(
        self, listener: AssembleListener, *, scope: Scope | None = None
    ) -> Registration:
        """Register a waterfall listener.

        It runs for assemblies of its scope and that scope's descendants
        (every assembly, when global), after every listener registered
        before it.

        Raises:
            PromptError: `listener` is not callable.
            ScopeClosedError: `scope` is closed.
        """
        if not callable(listener):
            raise PromptError(f"on_assemble() takes a callable listener, got {listener!r}")
        self._check_open(scope)
        entry = _Listener(listener=listener, label=_label(listener), scope=scope)
        self._listeners.append(entry)

        def remove() -> None:
            _remove_identical(self._listeners, entry)

        return self._commit(scope, "listeners", remove)

    def on_change(self, callback: ChangeCallback, *, scope: Scope | None = None) -> Registration:
        """Register a callback run synchronously after every registration or disposal.

        Change callbacks are not scope-filtered, and registering or disposing
        one notifies nothing. A callback that raises is logged (logger
        `actors.prompt.registry`) and counted in `statistics()`; it never makes
        the registration or disposal that triggered it fail.

        Raises:
            PromptError: `callback` is not callable.
            ScopeClosedError: `scope` is closed.
        """
        if not callable(callback):
            raise PromptError(f"on_change() takes a callable, got {callback!r}")
        self._check_open(scope)
        entry = _ChangeCallback(callback=callback, label=_label(callback))
        self._change_callbacks.append(entry)

        def remove() -> None:
            _remove_identical(self._change_callbacks, entry)

        return self._commit(scope, "change_callbacks", remove, notify=False)

    def statistics(self) -> PromptStatistics:
        """Counts of live registrations per kind and of change notifications so far."""
        return PromptStatistics(
            **self._counts,
            scoped_layers=len(self._layers),
            changes_notified=self._changes_notified,
            change_callback_errors=self._change_callback_errors,
        )

    # Assembly

    async def assemble(self, ctx: AssembleContext | None = None) -> PromptAssembly:
        """Assemble the prompt for one caller.

        Follows DESIGN §4 step by step: resolve the chain and suppression;
        evaluate variables (live, global then farthest to nearest); take the
        effective section and context maps and the tool-provider membership;
        call the tool providers; stable-sort, evaluate texts and order tools;
        run the scope-filtered waterfall; re-apply suppression, protections and
        the complete section. The result and its lists are fresh objects.

        Args:
            ctx: What the assembly is for; None assembles the global layer
                only. Providers and listeners receive this object.

        Returns:
            The assembly: texts evaluated, not yet interpolated.

        Raises:
            PromptError: a provider or listener failed (other exceptions are
                wrapped, naming it), more than one effective section is
                complete, a provider returned the `TOOL_ORDER_REST` name, or
                `tool_order` lists a name no provider knows.

        Cancellation:
            Always checkpoints on entry and is cancellable wherever a listener
            awaits. Assembly never changes the registry, so cancelling it
            leaves the registry exactly as it was.
        """
        await trio.lowlevel.checkpoint()
        if ctx is None:
            ctx = AssembleContext()
        generation = self._generation
        plan = self._plan(ctx.scope)
        suppressed = plan.suppressed
        variables = self._evaluate_variables(plan.scopes, ctx)
        if self._generation != generation:
            plan = self._plan(ctx.scope)

        schemas, known_sets, marker_provider = self._collect_tools(plan.tool_providers, ctx)

        if len(plan.complete) > 1:
            names = ", ".join(repr(plan.sections[index].name) for index in plan.complete)
            raise PromptError(f"more than one effective complete section: {names}")
        sections = [
            built or AssembledSection(name=s.name, text=_evaluate(s.text, ctx, "section", s.name))
            for s, built in zip(plan.sections, plan.prebuilt_sections, strict=True)
        ]
        contexts = (
            []
            if suppressed
            else [
                built
                or AssembledContext(name=c.name, text=_evaluate(c.text, ctx, "context", c.name))
                for c, built in zip(plan.contexts, plan.prebuilt_contexts, strict=True)
            ]
        )
        if marker_provider is not None:
            raise PromptError(
                f"tool provider {marker_provider!r} returned the reserved tool name "
                f"{TOOL_ORDER_REST!r}"
            )
        tools = order_tools(
            schemas,
            order=self._tool_order,
            known_names=frozenset().union(*known_sets) if self._tool_order is not None else (),
        )
        complete = sections[plan.complete[0]] if plan.complete else None

        assembly = PromptAssembly(
            sections=sections, contexts=contexts, tools=tools, variables=variables
        )
        if plan.listeners:
            canonical_sections = list(sections) if plan.protected_sections else []
            canonical_tools = list(tools) if plan.protected_tools else []
            assembly = await _run_waterfall(plan.listeners, assembly, ctx)
            if suppressed and assembly.contexts:
                assembly.contexts = []
            if plan.protected_sections:
                assembly.sections = _restore(
                    canonical_sections, assembly.sections, plan.protected_sections
                )
            if plan.protected_tools:
                assembly.tools = _restore(canonical_tools, assembly.tools, plan.protected_tools)
        if complete is not None:
            assembly.sections = [complete]
        return assembly

    # Internals

    def _check_open(self, scope: Scope | None) -> None:
        if scope is not None and scope.closed:
            raise ScopeClosedError(f"scope {scope.name!r} is closed; cannot register into it")

    def _existing(self, scope: Scope | None) -> _Layer:
        if scope is None:
            return self._global
        return self._layers.get(scope) or _EMPTY_LAYER

    def _layer(self, scope: Scope | None) -> _Layer:
        if scope is None:
            return self._global
        layer = self._layers.get(scope)
        if layer is None:
            layer = self._layers[scope] = _Layer()
        return layer

    def _drop_if_empty(self, scope: Scope | None, layer: _Layer) -> None:
        if scope is not None and layer.is_empty() and self._layers.get(scope) is layer:
            del self._layers[scope]

    def _globally_protected_sections(self) -> set[str]:
        return {name for entry in self._global.protections for name in entry.protection.sections}

    def _commit(
        self,
        scope: Scope | None,
        kind: _Kind,
        remove: Callable[[], None],
        *,
        notify: bool = True,
    ) -> Registration:
        def dispose() -> None:
            remove()
            self._counts[kind] -= 1
            self._changed(notify)

        registration = Registration(remove=dispose)
        self._counts[kind] += 1
        if scope is not None:
            scope.own(registration)
        self._changed(notify)
        return registration

    def _changed(self, notify: bool) -> None:
        # Change callbacks are no assembly input: adding or removing one
        # neither invalidates plans nor notifies.
        if not notify:
            return
        self._generation += 1
        self._plans.clear()
        self._changes_notified += 1
        for entry in tuple(self._change_callbacks):
            try:
                entry.callback()
            except Exception:
                self._change_callback_errors += 1
                _logger.exception("prompt change callback %r raised", entry.label)

    def _plan(self, scope: Scope | None) -> _Plan:
        plan = self._plans.get(scope)
        if plan is None:
            plan = self._build_plan(scope)
            if len(self._plans) >= _PLAN_CACHE_LIMIT:
                self._plans.clear()
            self._plans[scope] = plan
        return plan

    def _build_plan(self, scope: Scope | None) -> _Plan:
        scopes = () if scope is None else tuple(reversed(scope.chain()))
        layers = [self._global]
        layers.extend(self._layers[s] for s in scopes if s in self._layers)
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
        return _Plan(
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
                entry for entry in self._listeners if entry.scope is None or entry.scope in members
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

    def _evaluate_variables(
        self, scopes: tuple[Scope, ...], ctx: AssembleContext
    ) -> dict[str, str | None]:
        values: dict[str, str | None] = {}
        self._evaluate_layer_variables(self._global, ctx, values)
        for scope in scopes:
            # Looked up now, not from the plan: an earlier provider may have
            # registered the first variable of this scope.
            layer = self._layers.get(scope)
            if layer is not None and layer.variables:
                self._evaluate_layer_variables(layer, ctx, values)
        return values

    def _evaluate_layer_variables(
        self, layer: _Layer, ctx: AssembleContext, values: dict[str, str | None]
    ) -> None:
        # Live iteration: a variable registered by a provider during this pass
        # is evaluated in this pass too; one disposed before its turn is not.
        last_seq = -1
        while True:
            generation = self._generation
            for entry in tuple(layer.variables.values()):
                if entry.seq <= last_seq or layer.variables.get(entry.name) is not entry:
                    continue
                values[entry.name] = _evaluate_variable(entry, ctx)
                last_seq = entry.seq
            if self._generation == generation:
                return

    def _collect_tools(
        self, providers: tuple[_ToolProvider, ...], ctx: AssembleContext
    ) -> tuple[list[ToolSchema], list[frozenset[str]], str | None]:
        schemas: list[ToolSchema] = []
        known: list[frozenset[str]] = []
        marker_provider: str | None = None
        for entry in providers:
            try:
                result = entry.provider(ctx)
            except PromptError:
                raise
            except Exception as exc:
                raise PromptError(
                    f"tool provider {entry.label!r} failed: {type(exc).__name__}: {exc}"
                ) from exc
            schemas.extend(entry.check(result).schemas)
            known.append(entry.known)
            if entry.returns_marker and marker_provider is None:
                marker_provider = entry.label
        return schemas, known, marker_provider


_EMPTY_LAYER = _Layer()


def _where(scope: Scope | None) -> str:
    return "the global layer" if scope is None else f"scope {scope.name!r}"


def _check_entry(name: object, text: object, kind: str) -> None:
    if not isinstance(name, str) or not name:
        raise PromptError(f"{kind} name must be a non-empty str, got {name!r}")
    if not isinstance(text, str) and not callable(text):
        raise PromptError(f"{kind} {name!r}: text must be a str or a callable, got {text!r}")


def _evaluate(text: TextProvider, ctx: AssembleContext, kind: str, name: str) -> str:
    if isinstance(text, str):
        return text
    try:
        value = text(ctx)
    except PromptError:
        raise
    except Exception as exc:
        raise PromptError(
            f"{kind} {name!r} text provider failed: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(value, str):
        raise PromptError(f"{kind} {name!r} text provider returned {type(value).__name__}, not str")
    return value


def _evaluate_variable(entry: _Variable, ctx: AssembleContext) -> str | None:
    try:
        value = entry.provider(ctx)
    except PromptError:
        raise
    except Exception as exc:
        raise PromptError(
            f"variable {entry.name!r} provider failed: {type(exc).__name__}: {exc}"
        ) from exc
    if value is not None and not isinstance(value, str):
        raise PromptError(
            f"variable {entry.name!r} provider returned {type(value).__name__}, not str or None"
        )
    return value


async def _run_waterfall(
    listeners: tuple[_Listener, ...], assembly: PromptAssembly, ctx: AssembleContext
) -> PromptAssembly:
    async def run(index: int, current: PromptAssembly) -> PromptAssembly:
        if index == len(listeners):
            return current
        entry = listeners[index]

        async def next_listener() -> PromptAssembly:
            return await run(index + 1, current)

        try:
            result = await entry.listener(current, ctx, next_listener)
        except PromptError:
            raise
        except Exception as exc:
            raise PromptError(
                f"assemble listener {entry.label!r} failed: {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(result, PromptAssembly):
            raise PromptError(
                f"assemble listener {entry.label!r} returned {type(result).__name__}, "
                "not PromptAssembly"
            )
        return result

    return await run(0, assembly)


def _restore(
    canonical: list[_Named], current: Iterable[_Named], protected: frozenset[str]
) -> list[_Named]:
    """Put protected entries back exactly as they were before the waterfall.

    Protected names are removed from `current` (canonical absence wins too)
    and the canonical protected entries re-inserted, each before its first
    later unprotected canonical neighbour that survived in `current` (or at
    the end); when anchors would invert them, a restored entry goes right
    after the previous one, so restored entries keep canonical order.
    """
    kept = [item for item in current if item.name not in protected]
    position: dict[str, int] = {}
    for index, item in enumerate(kept):
        position.setdefault(item.name, index)
    anchors: list[tuple[int, _Named]] = []
    anchor = len(kept)
    for item in reversed(canonical):
        if item.name in protected:
            anchors.append((anchor, item))
        elif item.name in position:
            anchor = position[item.name]
    slots: dict[int, list[_Named]] = {}
    floor = 0
    for slot, item in reversed(anchors):
        floor = max(slot, floor)
        slots.setdefault(floor, []).append(item)
    restored: list[_Named] = []
    for index, item in enumerate(kept):
        restored.extend(slots.get(index, ()))
        restored.append(item)
    restored.extend(slots.get(len(kept), ()))
    return restored
