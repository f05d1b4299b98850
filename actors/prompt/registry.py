"""The prompt registry's public face: `SystemPrompt`, registration methods and `assemble()`.

`SystemPrompt` holds a global layer and one layer per scope that registered
something (`actors.prompt.registrations`). Every registration returns a
`Registration` whose disposal removes exactly that entry. `assemble()` runs
the pipeline of `actors.prompt.pipeline` over the plan of one scope chain
(`actors.prompt.plan`), which is computed once per scope and reused until the
next registration or disposal.
"""

from __future__ import annotations

from collections.abc import Sequence

from actors.prompt.errors import PromptError
from actors.prompt.origins import PromptOrigins, prompt_origins
from actors.prompt.pipeline import assemble
from actors.prompt.plan import PlanCache
from actors.prompt.registrations import PromptStatistics as PromptStatistics
from actors.prompt.registrations import Registrations
from actors.prompt.tool_order import ToolOrder, parse_tool_order
from actors.prompt.types import (
    HARNESS_IDENTITY_ORDER,
    HARNESS_IDENTITY_SECTION,
    PERSONA_ORDER,
    PERSONA_SECTION,
    AssembleContext,
    PromptAssembly,
    PromptContext,
    PromptProtection,
    PromptSection,
)
from actors.prompt.types import AssembleListener as AssembleListener
from actors.prompt.types import ChangeCallback as ChangeCallback
from actors.prompt.types import NextListener as NextListener
from actors.prompt.types import ToolProvider as ToolProvider
from actors.prompt.types import VariableProvider as VariableProvider
from actors.scope import Registration, Scope

HARNESS_IDENTITY_TEXT = "You are an agent running on harness, a Trio agent runtime."
"""Text of the built-in `harness:identity` section: a harness fact, not a deployment choice."""


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
        self._plans = PlanCache()
        self._registrations = Registrations(invalidate=self._plans.clear)
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
        return self._registrations.add_section(section, scope)

    def context(self, context: PromptContext, *, scope: Scope | None = None) -> Registration:
        """Register a volatile runtime-context section.

        Raises:
            PromptError: `context` is not a `PromptContext`, its text is
                neither a str nor callable, or the layer already has its name.
            ScopeClosedError: `scope` is closed.
        """
        return self._registrations.add_context(context, scope)

    def suppress_runtime_context(self, *, scope: Scope | None = None) -> Registration:
        """Suppress runtime contexts for this layer's assemblies while registered.

        Any suppressor in the global layer or on an assembly's scope chain
        empties that assembly's contexts (their providers are not called).
        Disposal removes only this suppressor.

        Raises:
            ScopeClosedError: `scope` is closed.
        """
        return self._registrations.add_suppressor(scope)

    def tools(self, provider: ToolProvider, *, scope: Scope | None = None) -> Registration:
        """Register a tool-schema provider, called once per assembly of this layer's chains.

        Raises:
            PromptError: `provider` is not callable.
            ScopeClosedError: `scope` is closed.
        """
        return self._registrations.add_tool_provider(provider, scope)

    def variable(
        self, name: str, provider: VariableProvider, *, scope: Scope | None = None
    ) -> Registration:
        """Register the prompt variable `{{name}}`, evaluated once per assembly.

        Raises:
            PromptError: `name` does not match `[a-z][a-z0-9_]*`, `provider`
                is not callable, or the layer already has the name.
            ScopeClosedError: `scope` is closed.
        """
        return self._registrations.add_variable(name, provider, scope)

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
        return self._registrations.add_protection(protection, scope)

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
        return self._registrations.add_listener(listener, scope)

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
        return self._registrations.add_change_callback(callback, scope)

    def statistics(self) -> PromptStatistics:
        """Counts of live registrations per kind and of change notifications so far."""
        return self._registrations.statistics()

    # Assembly

    def forget_plan(self, scope: Scope) -> None:
        """Drop the cached assembly plan of `scope`'s chain (none cached: nothing happens).

        For a caller that will not assemble for `scope` for a while (an
        agent going idle): the plan is rebuilt by the next assembly, the
        same as before, and the idle caller keeps no plan in the cache.
        """
        self._plans.discard(scope)

    def origins(self, scope: Scope | None = None) -> PromptOrigins:
        """Which layer supplies each effective section, context and tool of `scope`'s chain.

        Reads the registrations only (no provider runs); tool names are those
        each provider returned at its latest assembly.
        """
        return prompt_origins(self._registrations, scope)

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
        return await assemble(self._registrations, self._plans, self._tool_order, ctx)
