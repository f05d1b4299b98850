"""The assembly pipeline: one `assemble()` over a cached plan, in the order fixed by DESIGN §4.

`assemble` resolves the plan of the caller's scope chain, evaluates variables
(live), calls the tool providers, evaluates texts and orders tools, runs the
scope-filtered `on_assemble` waterfall and re-applies the hard constraints
(suppression, protections, the complete section). Every call into user code
(text and variable providers, tool providers, listeners) turns a failure into
a `PromptError` naming the culprit. Internal to `actors.prompt`:
`SystemPrompt.assemble` is the public entry point.
"""

from __future__ import annotations

import trio

from actors.prompt.entries import Layer, ListenerEntry, ToolProviderEntry, VariableEntry
from actors.prompt.errors import PromptError
from actors.prompt.plan import PlanCache
from actors.prompt.protection import restore_protected
from actors.prompt.registrations import Registrations
from actors.prompt.tool_order import ToolOrder, order_tools
from actors.prompt.types import (
    TOOL_ORDER_REST,
    AssembleContext,
    AssembledContext,
    AssembledSection,
    PromptAssembly,
    TextProvider,
    ToolSchema,
)
from actors.scope import Scope


async def assemble(
    registrations: Registrations,
    plans: PlanCache,
    tool_order: ToolOrder | None,
    ctx: AssembleContext | None,
) -> PromptAssembly:
    """Assemble the prompt for one caller (see `SystemPrompt.assemble`).

    Args:
        registrations: The live registrations; never changed here.
        plans: The plan cache `registrations` invalidates.
        tool_order: The parsed `tool_order`, or None for name order.
        ctx: What the assembly is for; None assembles the global layer only.

    Returns:
        A fresh assembly: texts evaluated, not yet interpolated.

    Raises:
        PromptError: a provider or listener failed (other exceptions are
            wrapped, naming it), more than one effective section is complete,
            a provider returned the `TOOL_ORDER_REST` name, or `tool_order`
            lists a name no provider knows.

    Cancellation:
        Always checkpoints on entry and is cancellable wherever a listener
        awaits; nothing is left changed.
    """
    await trio.lowlevel.checkpoint()
    if ctx is None:
        ctx = AssembleContext()
    generation = registrations.generation
    plan = plans.get(registrations, ctx.scope)
    suppressed = plan.suppressed
    variables = _evaluate_variables(registrations, plan.scopes, ctx)
    if registrations.generation != generation:
        plan = plans.get(registrations, ctx.scope)

    schemas, known_sets, marker_provider = _collect_tools(plan.tool_providers, ctx)
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
            built or AssembledContext(name=c.name, text=_evaluate(c.text, ctx, "context", c.name))
            for c, built in zip(plan.contexts, plan.prebuilt_contexts, strict=True)
        ]
    )
    if marker_provider is not None:
        raise PromptError(
            f"tool provider {marker_provider!r} returned the reserved tool name {TOOL_ORDER_REST!r}"
        )
    tools = order_tools(
        schemas,
        order=tool_order,
        known_names=frozenset().union(*known_sets) if tool_order is not None else (),
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
            assembly.sections = restore_protected(
                canonical_sections, assembly.sections, plan.protected_sections
            )
        if plan.protected_tools:
            assembly.tools = restore_protected(
                canonical_tools, assembly.tools, plan.protected_tools
            )
    if complete is not None:
        assembly.sections = [complete]
    return assembly


def _evaluate_variables(
    registrations: Registrations, scopes: tuple[Scope, ...], ctx: AssembleContext
) -> dict[str, str | None]:
    values: dict[str, str | None] = {}
    _evaluate_layer_variables(registrations, registrations.global_layer, ctx, values)
    for scope in scopes:
        # Looked up now, not from the plan: an earlier provider may have
        # registered the first variable of this scope.
        layer = registrations.layers.get(scope)
        if layer is not None and layer.variables:
            _evaluate_layer_variables(registrations, layer, ctx, values)
    return values


def _evaluate_layer_variables(
    registrations: Registrations,
    layer: Layer,
    ctx: AssembleContext,
    values: dict[str, str | None],
) -> None:
    # Live iteration: a variable registered by a provider during this pass
    # is evaluated in this pass too; one disposed before its turn is not.
    last_seq = -1
    while True:
        generation = registrations.generation
        for entry in tuple(layer.variables.values()):
            if entry.seq <= last_seq or layer.variables.get(entry.name) is not entry:
                continue
            values[entry.name] = _evaluate_variable(entry, ctx)
            last_seq = entry.seq
        if registrations.generation == generation:
            return


def _collect_tools(
    providers: tuple[ToolProviderEntry, ...], ctx: AssembleContext
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


def _evaluate_variable(entry: VariableEntry, ctx: AssembleContext) -> str | None:
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
    listeners: tuple[ListenerEntry, ...], assembly: PromptAssembly, ctx: AssembleContext
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
