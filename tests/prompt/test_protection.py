"""Named protections: canonical presence, definition, absence and position after the waterfall."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st

from actors.prompt import (
    AssembleContext,
    AssembledSection,
    NextListener,
    PromptAssembly,
    PromptProtection,
    PromptSection,
    SystemPrompt,
    ToolProviderResult,
    ToolSchema,
)
from actors.prompt.protection import restore_protected
from actors.scope import Scope

Edit = Callable[[PromptAssembly], None]


def tool(name: str, description: str = "canonical") -> ToolSchema:
    return ToolSchema(name=name, description=description, parameters={})


def prompt_with(names: list[str], edit: Edit, scope: Scope | None = None) -> SystemPrompt:
    """A registry with sections `names` (orders 1, 2, ...) and one listener applying `edit`."""
    prompt = SystemPrompt(include_harness_identity=False)
    for order, name in enumerate(names, start=1):
        prompt.section(PromptSection(name=name, order=order, text=f"canonical {name}"))

    async def listener(
        assembly: PromptAssembly, ctx: AssembleContext, next: NextListener
    ) -> PromptAssembly:
        edit(assembly)
        return await next()

    prompt.on_assemble(listener)
    return prompt


def keep_only(*names: str) -> Edit:
    def edit(assembly: PromptAssembly) -> None:
        by_name = {section.name: section for section in assembly.sections}
        assembly.sections = [by_name[name] for name in names]

    return edit


async def rendered(prompt: SystemPrompt, scope: Scope | None = None) -> list[str]:
    assembly = await prompt.assemble(AssembleContext(scope=scope))
    return [section.name for section in assembly.sections]


async def test_protected_section_removed_by_a_listener_is_restored() -> None:
    prompt = prompt_with(["a", "b"], keep_only("b"))
    prompt.protect(PromptProtection(sections=["a"]))

    assert await rendered(prompt) == ["a", "b"]


async def test_protected_section_keeps_its_canonical_definition() -> None:
    def rewrite(assembly: PromptAssembly) -> None:
        assembly.sections = [
            AssembledSection(name=s.name, text="rewritten") for s in assembly.sections
        ]

    prompt = prompt_with(["a", "b"], rewrite)
    prompt.protect(PromptProtection(sections=["a"]))

    assembly = await prompt.assemble()

    assert [s.text for s in assembly.sections] == ["rewritten", "canonical a", "rewritten"]


async def test_protected_section_absent_canonically_cannot_be_added() -> None:
    def fabricate(assembly: PromptAssembly) -> None:
        assembly.sections.append(AssembledSection(name="ghost", text="fake"))

    prompt = prompt_with(["a"], fabricate)
    prompt.protect(PromptProtection(sections=["ghost"]))

    assert "ghost" not in await rendered(prompt)


async def test_restored_section_sits_before_its_first_surviving_later_neighbour() -> None:
    prompt = prompt_with(["a", "b", "c", "d"], keep_only("d", "a"))
    prompt.protect(PromptProtection(sections=["b"]))

    # b's later unprotected neighbours are c (dropped) and d (kept): b goes before d.
    assert await rendered(prompt) == ["b", "d", "a"]


async def test_restored_section_goes_last_without_a_surviving_later_neighbour() -> None:
    prompt = prompt_with(["a", "b", "c"], keep_only("a"))
    prompt.protect(PromptProtection(sections=["b"]))

    assert await rendered(prompt) == ["a", "b"]


async def test_restored_sections_keep_canonical_order_among_themselves() -> None:
    # Anchors alone would put b before d (index 0) and ahead of a's anchor c.
    prompt = prompt_with(["a", "c", "b", "d"], keep_only("d", "c"))
    prompt.protect(PromptProtection(sections=["a", "b"]))

    names = await rendered(prompt)

    assert names.index("a") < names.index("b")
    assert names == ["d", "a", "b", "c"]


async def test_listener_reordering_of_unprotected_sections_survives() -> None:
    prompt = prompt_with(["a", "p", "b", "c"], keep_only("c", "b", "a"))
    prompt.protect(PromptProtection(sections=["p"]))

    assert await rendered(prompt) == ["c", "p", "b", "a"]


async def test_protected_tool_replaced_by_a_listener_is_restored() -> None:
    def swap(assembly: PromptAssembly) -> None:
        assembly.tools = [tool(t.name, "listener") for t in assembly.tools]

    prompt = prompt_with([], swap)
    prompt.tools(lambda ctx: ToolProviderResult(schemas=[tool("bash"), tool("read")]))
    prompt.protect(PromptProtection(tools=["bash"]))

    assembly = await prompt.assemble()

    assert [(t.name, t.description) for t in assembly.tools] == [
        ("bash", "canonical"),
        ("read", "listener"),
    ]


async def test_hidden_protected_tool_cannot_be_fabricated() -> None:
    def fabricate(assembly: PromptAssembly) -> None:
        assembly.tools.append(tool("write", "fake"))

    prompt = prompt_with([], fabricate)
    prompt.tools(
        lambda ctx: ToolProviderResult(schemas=[tool("read")], known_names=["read", "write"])
    )
    prompt.protect(PromptProtection(tools=["write"]))

    assert [t.name for t in (await prompt.assemble()).tools] == ["read"]


async def test_scoped_protection_applies_to_its_scope_and_descendants_only() -> None:
    root = Scope("root")
    child = Scope("child", parent=root)
    prompt = prompt_with(["a", "b"], keep_only("b"))
    prompt.protect(PromptProtection(sections=["a"]), scope=root)

    assert await rendered(prompt, child) == ["a", "b"]
    assert await rendered(prompt, None) == ["b"]
    assert await rendered(prompt, Scope("sibling")) == ["b"]


async def test_protected_scoped_shadow_is_restored_with_the_shadow_definition() -> None:
    scope = Scope("agent")
    prompt = prompt_with(["a"], keep_only())
    prompt.section(PromptSection(name="a", order=1, text="scoped a"), scope=scope)
    prompt.protect(PromptProtection(sections=["a"]), scope=scope)

    assembly = await prompt.assemble(AssembleContext(scope=scope))

    assert assembly.sections == [AssembledSection(name="a", text="scoped a")]


async def test_complete_section_wins_over_restored_protections() -> None:
    prompt = prompt_with(["a"], keep_only())
    prompt.section(PromptSection(name="all", order=9, text="everything", complete=True))
    prompt.protect(PromptProtection(sections=["a"]))

    assert await rendered(prompt) == ["all"]


def insert_one_by_one(
    canonical: list[AssembledSection], kept: list[AssembledSection], protected: set[str]
) -> list[AssembledSection]:
    """Oracle: insert each protected entry, in canonical order, before its anchor.

    The anchor is the first later unprotected canonical entry that survived (in
    canonical order, wherever the listener moved it); an
    entry whose anchor lies before the previously restored entry goes right
    after that entry instead, so restored entries keep canonical order.
    """
    result = list(kept)
    previous = -1
    for index, entry in enumerate(canonical):
        if entry.name not in protected:
            continue
        surviving = {e.name: e for e in reversed(kept)}
        neighbours = [e.name for e in canonical[index + 1 :] if e.name in surviving]
        anchor = result.index(surviving[neighbours[0]]) if neighbours else len(result)
        at = max(anchor, previous + 1)
        result.insert(at, entry)
        previous = at
    return result


@given(data=st.data(), size=st.integers(min_value=0, max_value=8))
def test_restored_entries_follow_the_anchor_rule(data: st.DataObject, size: int) -> None:
    names = [f"s{i}" for i in range(size)]
    canonical = [AssembledSection(name=name, text="canonical") for name in names]
    protected = data.draw(st.sets(st.sampled_from([*names, "ghost"])))
    survivors = data.draw(st.permutations(names)).copy()
    del survivors[data.draw(st.integers(min_value=0, max_value=size)) :]
    # The waterfall's view: survivors (rewritten), plus fabricated entries.
    current = [AssembledSection(name=name, text="listener") for name in survivors]
    for name in data.draw(st.lists(st.sampled_from(["ghost", "extra1", "extra2"]), unique=True)):
        current.insert(
            data.draw(st.integers(0, len(current))), AssembledSection(name=name, text="x")
        )
    kept = [entry for entry in current if entry.name not in protected]

    restored = restore_protected(canonical, current, frozenset(protected))

    assert restored == insert_one_by_one(canonical, kept, protected)
    assert [e for e in restored if e.name not in protected] == kept
    assert [e for e in restored if e.name in protected] == [
        e for e in canonical if e.name in protected
    ]
