"""Scope layers: the global layer plus a chain of scopes, nearest wins a name."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest

from actors.prompt import (
    PERSONA_SECTION,
    AssembleContext,
    NextListener,
    PromptAssembly,
    PromptContext,
    PromptError,
    PromptProtection,
    PromptSection,
    SystemPrompt,
    ToolProviderResult,
    ToolSchema,
)
from actors.scope import Scope


@attrs.frozen
class Chain:
    root: Scope
    child: Scope
    grandchild: Scope


def chain() -> Chain:
    root = Scope("root")
    child = Scope("child", parent=root)
    return Chain(root=root, child=child, grandchild=Scope("grandchild", parent=child))


def bare() -> SystemPrompt:
    return SystemPrompt(include_harness_identity=False)


def texts(assembly: PromptAssembly) -> dict[str, str]:
    return {section.name: section.text for section in assembly.sections}


async def assemble(prompt: SystemPrompt, scope: Scope | None) -> PromptAssembly:
    return await prompt.assemble(AssembleContext(scope=scope))


async def test_nearest_scope_wins_a_section_name_three_levels_deep() -> None:
    prompt = bare()
    layers = chain()
    prompt.section(PromptSection(name="s", order=1, text="global"))
    prompt.section(PromptSection(name="s", order=1, text="root"), scope=layers.root)
    prompt.section(PromptSection(name="s", order=1, text="grandchild"), scope=layers.grandchild)

    assert texts(await assemble(prompt, None))["s"] == "global"
    assert texts(await assemble(prompt, layers.root))["s"] == "root"
    assert texts(await assemble(prompt, layers.child))["s"] == "root"
    assert texts(await assemble(prompt, layers.grandchild))["s"] == "grandchild"


async def test_nearest_scope_wins_a_context_name() -> None:
    prompt = bare()
    layers = chain()
    prompt.context(PromptContext(name="c", order=1, text="global"))
    prompt.context(PromptContext(name="c", order=1, text="child"), scope=layers.child)

    assembly = await assemble(prompt, layers.grandchild)

    assert [(c.name, c.text) for c in assembly.contexts] == [("c", "child")]


async def test_nearest_scope_wins_a_variable_name() -> None:
    prompt = bare()
    layers = chain()
    prompt.variable("model", lambda ctx: "global")
    prompt.variable("model", lambda ctx: "root", scope=layers.root)
    prompt.variable("model", lambda ctx: "child", scope=layers.child)

    assert (await assemble(prompt, layers.grandchild)).variables == {"model": "child"}


async def test_scoped_persona_replaces_the_global_one_only_for_that_scope() -> None:
    prompt = SystemPrompt(persona="global persona", include_harness_identity=False)
    layers = chain()
    prompt.section(PromptSection(name=PERSONA_SECTION, order=0, text="mine"), scope=layers.child)

    assert texts(await assemble(prompt, layers.grandchild))[PERSONA_SECTION] == "mine"
    assert texts(await assemble(prompt, layers.root))[PERSONA_SECTION] == "global persona"


async def test_shadowed_section_provider_is_never_called() -> None:
    prompt = bare()
    layers = chain()
    called: list[str] = []

    def provider(label: str) -> PromptSection:
        def text(ctx: AssembleContext) -> str:
            called.append(label)
            return label

        return PromptSection(name="s", order=1, text=text)

    prompt.section(provider("global"))
    prompt.section(provider("root"), scope=layers.root)
    prompt.section(provider("grandchild"), scope=layers.grandchild)

    await assemble(prompt, layers.grandchild)

    assert called == ["grandchild"]


async def test_shadowed_context_provider_is_never_called() -> None:
    prompt = bare()
    layers = chain()
    called: list[str] = []

    def text(label: str) -> Callable[[AssembleContext], str]:
        def run(ctx: AssembleContext) -> str:
            called.append(label)
            return label

        return run

    prompt.context(PromptContext(name="c", order=1, text=text("global")))
    prompt.context(PromptContext(name="c", order=1, text=text("child")), scope=layers.child)

    await assemble(prompt, layers.grandchild)

    assert called == ["child"]


async def test_closing_a_scope_disposes_all_its_registrations() -> None:
    prompt = bare()
    layers = chain()
    scope = layers.child
    prompt.section(PromptSection(name="s", order=1, text="s"), scope=scope)
    prompt.context(PromptContext(name="c", order=1, text="c"), scope=scope)
    prompt.suppress_runtime_context(scope=scope)
    prompt.tools(lambda ctx: ToolProviderResult(schemas=[]), scope=scope)
    prompt.variable("v", lambda ctx: "v", scope=scope)
    prompt.protect(PromptProtection(tools=["t"]), scope=scope)
    prompt.on_assemble(lambda assembly, ctx, next: next(), scope=scope)
    prompt.on_change(lambda: None, scope=scope)
    before_close = prompt.statistics()

    scope.close()

    after = prompt.statistics()
    assert before_close.scoped_layers == 1
    assert after.scoped_layers == 0
    assert (after.sections, after.contexts, after.suppressors, after.tool_providers) == (1, 0, 0, 0)
    assert (after.variables, after.protections, after.listeners, after.change_callbacks) == (
        0,
        0,
        0,
        0,
    )


async def test_closing_a_scope_brings_back_the_shadowed_entry() -> None:
    prompt = bare()
    layers = chain()
    prompt.section(PromptSection(name="s", order=1, text="global"))
    prompt.section(PromptSection(name="s", order=1, text="child"), scope=layers.child)

    layers.child.close()

    assert texts(await assemble(prompt, layers.grandchild))["s"] == "global"


async def test_scope_sees_ancestor_registrations_but_not_descendants() -> None:
    prompt = bare()
    layers = chain()
    prompt.section(PromptSection(name="root", order=1, text="r"), scope=layers.root)
    prompt.section(PromptSection(name="child", order=2, text="c"), scope=layers.child)
    prompt.section(PromptSection(name="grandchild", order=3, text="g"), scope=layers.grandchild)

    assert list(texts(await assemble(prompt, layers.child))) == [PERSONA_SECTION, "root", "child"]


async def test_sibling_scope_registrations_are_invisible() -> None:
    prompt = bare()
    root = Scope("root")
    left, right = Scope("left", parent=root), Scope("right", parent=root)
    prompt.variable("side", lambda ctx: "left", scope=left)

    assert (await assemble(prompt, right)).variables == {}


async def test_scoped_tool_provider_is_consulted_only_for_its_chain() -> None:
    prompt = bare()
    layers = chain()
    tool = ToolSchema(name="spawn", description="d", parameters={})
    prompt.tools(lambda ctx: ToolProviderResult(schemas=[tool]), scope=layers.child)

    assert (await assemble(prompt, layers.root)).tools == []
    assert (await assemble(prompt, layers.grandchild)).tools == [tool]


async def test_scoped_suppressor_applies_to_descendants_only() -> None:
    prompt = bare()
    layers = chain()
    prompt.context(PromptContext(name="c", order=1, text="c"))
    prompt.suppress_runtime_context(scope=layers.child)

    assert (await assemble(prompt, layers.root)).contexts != []
    assert (await assemble(prompt, layers.grandchild)).contexts == []


async def test_scoped_listener_runs_for_its_scope_and_descendants_only() -> None:
    prompt = bare()
    layers = chain()
    seen: list[Scope | None] = []

    async def listener(
        assembly: PromptAssembly, ctx: AssembleContext, next: NextListener
    ) -> PromptAssembly:
        seen.append(ctx.scope)
        return await next()

    prompt.on_assemble(listener, scope=layers.child)
    for scope in (None, layers.root, layers.child, layers.grandchild):
        await assemble(prompt, scope)

    assert seen == [layers.child, layers.grandchild]


def test_scoped_section_cannot_shadow_a_globally_protected_name() -> None:
    prompt = bare()
    layers = chain()
    prompt.protect(PromptProtection(sections=[PERSONA_SECTION]))

    with pytest.raises(PromptError, match="protected globally"):
        prompt.section(PromptSection(name=PERSONA_SECTION, order=0, text="x"), scope=layers.child)


def test_global_protection_of_an_already_shadowed_name_raises() -> None:
    prompt = bare()
    layers = chain()
    prompt.section(PromptSection(name=PERSONA_SECTION, order=0, text="x"), scope=layers.grandchild)

    with pytest.raises(PromptError, match="scope 'grandchild' already shadows it"):
        prompt.protect(PromptProtection(sections=[PERSONA_SECTION]))


def test_scoped_protection_does_not_reserve_the_name() -> None:
    prompt = bare()
    layers = chain()
    prompt.protect(PromptProtection(sections=[PERSONA_SECTION]), scope=layers.root)

    prompt.section(PromptSection(name=PERSONA_SECTION, order=0, text="x"), scope=layers.child)

    assert prompt.statistics().sections == 2


async def test_closed_scope_is_assembled_with_its_ancestors_registrations() -> None:
    prompt = bare()
    layers = chain()
    prompt.variable("model", lambda ctx: "root", scope=layers.root)
    prompt.variable("model", lambda ctx: "child", scope=layers.child)

    layers.child.close()

    assert (await assemble(prompt, layers.grandchild)).variables == {"model": "root"}
