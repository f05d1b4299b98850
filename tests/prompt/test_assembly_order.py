"""The assembly pipeline of DESIGN §4: step order, snapshots, sorting, complete, waterfall."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.prompt import (
    PERSONA_SECTION,
    AssembleContext,
    AssembledContext,
    AssembledSection,
    NextListener,
    PromptAssembly,
    PromptContext,
    PromptError,
    PromptSection,
    SystemPrompt,
    ToolProviderResult,
    ToolSchema,
)
from actors.scope import Registration, Scope


def bare() -> SystemPrompt:
    return SystemPrompt(include_harness_identity=False)


def tool(name: str, parameters: dict[str, object] | None = None) -> ToolSchema:
    return ToolSchema(name=name, description=name, parameters=parameters or {"type": "object"})


def section_names(assembly: PromptAssembly) -> list[str]:
    return [section.name for section in assembly.sections]


def logging_text(log: list[str], label: str) -> Callable[[AssembleContext], str]:
    def text(ctx: AssembleContext) -> str:
        log.append(label)
        return label

    return text


async def test_pipeline_evaluates_variables_tools_sections_contexts_then_listeners() -> None:
    prompt = bare()
    log: list[str] = []
    prompt.context(PromptContext(name="c", order=1, text=logging_text(log, "context")))
    prompt.section(PromptSection(name="s", order=1, text=logging_text(log, "section")))

    def tools(ctx: AssembleContext) -> ToolProviderResult:
        log.append("tools")
        return ToolProviderResult(schemas=[])

    async def listener(
        assembly: PromptAssembly, ctx: AssembleContext, next: NextListener
    ) -> PromptAssembly:
        log.append("listener")
        return await next()

    prompt.on_assemble(listener)
    prompt.tools(tools)
    prompt.variable("v", logging_text(log, "variable"))

    await prompt.assemble()

    assert log == ["variable", "tools", "section", "context", "listener"]


async def test_variables_evaluate_global_then_farthest_to_nearest_scope() -> None:
    prompt = bare()
    root = Scope("root")
    child = Scope("child", parent=root)
    log: list[str] = []
    prompt.variable("b", logging_text(log, "child b"), scope=child)
    prompt.variable("a", logging_text(log, "root a"), scope=root)
    prompt.variable("a", logging_text(log, "global a"))

    assembly = await prompt.assemble(AssembleContext(scope=child))

    assert log == ["global a", "root a", "child b"]
    assert assembly.variables == {"a": "root a", "b": "child b"}


async def test_valueless_variable_stays_registered_with_none() -> None:
    prompt = bare()
    prompt.variable("cwd", lambda ctx: None)

    assert (await prompt.assemble()).variables == {"cwd": None}


async def test_nearer_valueless_variable_wins_over_farther_value() -> None:
    prompt = bare()
    scope = Scope("agent")
    prompt.variable("cwd", lambda ctx: "/global")
    prompt.variable("cwd", lambda ctx: None, scope=scope)

    assert (await prompt.assemble(AssembleContext(scope=scope))).variables == {"cwd": None}


async def test_variable_registered_by_an_earlier_provider_is_seen_in_the_same_assembly() -> None:
    prompt = bare()

    def first(ctx: AssembleContext) -> str:
        prompt.variable("late", lambda ctx: "late value")
        return "first value"

    prompt.variable("first", first)

    assembly = await prompt.assemble()

    assert assembly.variables == {"first": "first value", "late": "late value"}


async def test_variable_disposed_by_an_earlier_provider_is_not_evaluated() -> None:
    prompt = bare()
    called: list[str] = []
    handles: dict[str, Registration] = {}

    def first(ctx: AssembleContext) -> str:
        handles["second"].dispose()
        return "1"

    prompt.variable("first", first)
    handles["second"] = prompt.variable("second", logging_text(called, "second"))

    assert (await prompt.assemble()).variables == {"first": "1"}
    assert called == []


async def test_tool_provider_registered_during_assembly_is_seen_only_by_the_next() -> None:
    prompt = bare()
    late = tool("late")

    def registering(ctx: AssembleContext) -> ToolProviderResult:
        if prompt.statistics().tool_providers == 1:
            prompt.tools(lambda ctx: ToolProviderResult(schemas=[late]))
        return ToolProviderResult(schemas=[])

    prompt.tools(registering)

    first = await prompt.assemble()
    second = await prompt.assemble()

    assert first.tools == []
    assert second.tools == [late]


async def test_section_registered_by_a_variable_provider_is_in_the_same_assembly() -> None:
    prompt = bare()

    def registering(ctx: AssembleContext) -> str:
        if prompt.statistics().sections == 1:
            prompt.section(PromptSection(name="late", order=1, text="late"))
        return "v"

    prompt.variable("v", registering)

    assert section_names(await prompt.assemble()) == [PERSONA_SECTION, "late"]


async def test_section_registered_by_a_text_provider_waits_for_the_next_assembly() -> None:
    prompt = bare()

    def registering(ctx: AssembleContext) -> str:
        if prompt.statistics().sections == 2:
            prompt.section(PromptSection(name="late", order=2, text="late"))
            prompt.context(PromptContext(name="late", order=2, text="late"))
        return "s"

    prompt.section(PromptSection(name="s", order=1, text=registering))

    first = await prompt.assemble()
    second = await prompt.assemble()

    assert section_names(first) == [PERSONA_SECTION, "s"]
    assert first.contexts == []
    assert section_names(second) == [PERSONA_SECTION, "s", "late"]
    assert [c.name for c in second.contexts] == ["late"]


async def test_scoped_variable_registered_by_a_global_provider_is_seen_in_the_same_assembly() -> (
    None
):
    prompt = bare()
    scope = Scope("agent")

    def first(ctx: AssembleContext) -> str:
        if prompt.statistics().variables == 1:
            prompt.variable("cwd", lambda ctx: "/scoped", scope=scope)
        return "g"

    prompt.variable("first", first)

    assembly = await prompt.assemble(AssembleContext(scope=scope))

    assert assembly.variables == {"first": "g", "cwd": "/scoped"}


async def test_every_assembly_gets_fresh_containers() -> None:
    prompt = bare()
    prompt.context(PromptContext(name="c", order=1, text="c"))
    prompt.tools(lambda ctx: ToolProviderResult(schemas=[tool("t")]))
    prompt.variable("v", lambda ctx: "v")
    first = await prompt.assemble()
    first.sections.clear()
    first.contexts.append(AssembledContext(name="x", text="x"))
    first.tools.clear()
    first.variables["v"] = "changed"

    second = await prompt.assemble()

    assert section_names(second) == [PERSONA_SECTION]
    assert [c.name for c in second.contexts] == ["c"]
    assert [t.name for t in second.tools] == ["t"]
    assert second.variables == {"v": "v"}


async def test_tool_parameters_are_detached_from_the_provider() -> None:
    prompt = bare()
    parameters: dict[str, object] = {"type": "object", "properties": {"path": {"type": "string"}}}
    schema = tool("read", parameters)
    prompt.tools(lambda ctx: ToolProviderResult(schemas=[schema]))
    parameters["properties"] = {}

    assembly = await prompt.assemble()

    assert assembly.tools[0].parameters["properties"] == {"path": {"type": "string"}}
    with pytest.raises(TypeError):
        assembly.tools[0].parameters["properties"]["path"]["type"] = "int"


async def test_sections_and_contexts_sort_by_numeric_order() -> None:
    prompt = bare()
    for name, order in [("c", 10.5), ("a", -3), ("b", 2)]:
        prompt.section(PromptSection(name=name, order=order, text=name))
        prompt.context(PromptContext(name=name, order=order, text=name))

    assembly = await prompt.assemble()

    assert section_names(assembly) == ["a", PERSONA_SECTION, "b", "c"]
    assert [c.name for c in assembly.contexts] == ["a", "b", "c"]


async def test_equal_orders_keep_registration_order() -> None:
    prompt = bare()
    for name in ["z", "a", "m"]:
        prompt.section(PromptSection(name=name, order=5, text=name))

    assert section_names(await prompt.assemble())[1:] == ["z", "a", "m"]


async def test_shadowing_entry_takes_the_shadowed_entry_place_in_ties() -> None:
    prompt = bare()
    root = Scope("root")
    child = Scope("child", parent=root)
    prompt.section(PromptSection(name="a", order=5, text="global a"))
    prompt.section(PromptSection(name="b", order=5, text="global b"))
    prompt.section(PromptSection(name="new", order=5, text="child new"), scope=child)
    prompt.section(PromptSection(name="b", order=5, text="child b"), scope=child)
    prompt.section(PromptSection(name="a", order=5, text="root a"), scope=root)

    assembly = await prompt.assemble(AssembleContext(scope=child))

    assert [s.text for s in assembly.sections[1:]] == ["root a", "child b", "child new"]


# (layer, name, order) registrations: layer 0 is global, 1..3 a three-deep chain.
layered_entries = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=3),
        st.sampled_from("abcdef"),
        st.sampled_from([-1, 0, 0.5, 2]),
    ),
    max_size=14,
).map(lambda entries: list({(layer, name): order for layer, name, order in entries}.items()))


@given(entries=layered_entries)
async def test_sort_is_stable_over_the_effective_map_order(
    entries: list[tuple[tuple[int, str], float]],
) -> None:
    prompt = SystemPrompt(include_harness_identity=False, persona="")
    root = Scope("root")
    child = Scope("child", parent=root)
    grandchild = Scope("grandchild", parent=child)
    scopes: list[Scope | None] = [None, root, child, grandchild]
    # Registration interleaves layers; the effective-map order must not depend on it.
    for (layer, name), order in entries:
        text = f"{name}@{layer}"
        prompt.section(PromptSection(name=name, order=order, text=text), scope=scopes[layer])
        prompt.context(PromptContext(name=name, order=order, text=text), scope=scopes[layer])

    assembly = await prompt.assemble(AssembleContext(scope=grandchild))

    effective: list[tuple[str, float, str]] = [(PERSONA_SECTION, 0, "")]
    for layer in range(4):
        for (entry_layer, name), order in entries:
            if entry_layer != layer:
                continue
            item = (name, order, f"{name}@{layer}")
            names = [existing[0] for existing in effective]
            if name in names:
                effective[names.index(name)] = item
            else:
                effective.append(item)
    expected = [(name, text) for name, _, text in sorted(effective, key=lambda item: item[1])]
    assert [(s.name, s.text) for s in assembly.sections] == expected
    assert [(c.name, c.text) for c in assembly.contexts] == [
        item for item in expected if item[0] != PERSONA_SECTION
    ]


async def test_more_than_one_effective_complete_section_fails() -> None:
    prompt = bare()
    prompt.section(PromptSection(name="one", order=1, text="1", complete=True))
    prompt.section(PromptSection(name="two", order=2, text="2", complete=True))

    with pytest.raises(PromptError, match="'one', 'two'"):
        await prompt.assemble()


async def test_shadowed_complete_section_does_not_count() -> None:
    prompt = bare()
    scope = Scope("agent")
    prompt.section(PromptSection(name="one", order=1, text="1", complete=True))
    prompt.section(PromptSection(name="two", order=2, text="2", complete=True))
    prompt.section(PromptSection(name="two", order=2, text="plain"), scope=scope)

    assembly = await prompt.assemble(AssembleContext(scope=scope))

    assert section_names(assembly) == ["one"]


async def test_complete_section_becomes_the_only_section() -> None:
    prompt = SystemPrompt(persona="persona")
    prompt.section(PromptSection(name="all", order=50, text="everything", complete=True))
    prompt.context(PromptContext(name="c", order=1, text="c"))
    prompt.tools(lambda ctx: ToolProviderResult(schemas=[tool("t")]))

    assembly = await prompt.assemble()

    assert assembly.sections == [AssembledSection(name="all", text="everything")]
    assert [c.name for c in assembly.contexts] == ["c"]
    assert [t.name for t in assembly.tools] == ["t"]


async def test_waterfall_sees_every_section_alongside_the_complete_one() -> None:
    prompt = bare()
    prompt.section(PromptSection(name="all", order=50, text="everything", complete=True))
    seen: list[list[str]] = []

    async def listener(
        assembly: PromptAssembly, ctx: AssembleContext, next: NextListener
    ) -> PromptAssembly:
        seen.append(section_names(assembly))
        return await next()

    prompt.on_assemble(listener)
    await prompt.assemble()

    assert seen == [[PERSONA_SECTION, "all"]]


async def test_complete_section_is_restored_after_a_listener_rewrites_sections() -> None:
    prompt = bare()
    prompt.section(PromptSection(name="all", order=50, text="everything", complete=True))

    async def listener(
        assembly: PromptAssembly, ctx: AssembleContext, next: NextListener
    ) -> PromptAssembly:
        assembly.sections = [
            AssembledSection(name="all", text="hijacked"),
            AssembledSection(name="extra", text="x"),
        ]
        return await next()

    prompt.on_assemble(listener)

    assert (await prompt.assemble()).sections == [AssembledSection(name="all", text="everything")]


async def test_listeners_run_in_registration_order_across_layers() -> None:
    prompt = bare()
    scope = Scope("agent")
    order: list[str] = []

    def listener(label: str, where: Scope | None) -> None:
        async def run(
            assembly: PromptAssembly, ctx: AssembleContext, next: NextListener
        ) -> PromptAssembly:
            order.append(label)
            return await next()

        prompt.on_assemble(run, scope=where)

    listener("global 1", None)
    listener("scoped 2", scope)
    listener("global 3", None)

    await prompt.assemble(AssembleContext(scope=scope))

    assert order == ["global 1", "scoped 2", "global 3"]


async def test_listener_that_does_not_call_next_short_circuits_the_rest() -> None:
    prompt = bare()
    later: list[str] = []
    replacement = PromptAssembly(sections=[AssembledSection(name="only", text="o")])

    async def short(
        assembly: PromptAssembly, ctx: AssembleContext, next: NextListener
    ) -> PromptAssembly:
        return replacement

    async def never(
        assembly: PromptAssembly, ctx: AssembleContext, next: NextListener
    ) -> PromptAssembly:
        later.append("called")
        return await next()

    prompt.on_assemble(short)
    prompt.on_assemble(never)

    assert await prompt.assemble() is replacement
    assert later == []


async def test_next_runs_downstream_on_the_edited_assembly_and_returns_its_result() -> None:
    prompt = bare()
    observed: list[list[str]] = []
    downstream_result = PromptAssembly()

    async def upstream(
        assembly: PromptAssembly, ctx: AssembleContext, next: NextListener
    ) -> PromptAssembly:
        assembly.sections.append(AssembledSection(name="added", text="a"))
        result = await next()
        assert result is downstream_result
        result.sections.append(AssembledSection(name="after", text="b"))
        return result

    async def downstream(
        assembly: PromptAssembly, ctx: AssembleContext, next: NextListener
    ) -> PromptAssembly:
        observed.append(section_names(assembly))
        return downstream_result

    prompt.on_assemble(upstream)
    prompt.on_assemble(downstream)

    result = await prompt.assemble()

    assert observed == [[PERSONA_SECTION, "added"]]
    assert section_names(result) == ["after"]


async def test_final_next_returns_the_assembly_as_it_then_is() -> None:
    prompt = bare()
    received: list[PromptAssembly] = []

    async def listener(
        assembly: PromptAssembly, ctx: AssembleContext, next: NextListener
    ) -> PromptAssembly:
        received.append(assembly)
        assembly.variables["extra"] = "x"
        return await next()

    prompt.on_assemble(listener)
    result = await prompt.assemble()

    assert result is received[0]
    assert result.variables == {"extra": "x"}


async def test_suppression_clears_contexts_a_listener_re_added() -> None:
    prompt = bare()
    prompt.suppress_runtime_context()

    async def listener(
        assembly: PromptAssembly, ctx: AssembleContext, next: NextListener
    ) -> PromptAssembly:
        assembly.contexts.append(AssembledContext(name="sneaky", text="s"))
        return await next()

    prompt.on_assemble(listener)

    assert (await prompt.assemble()).contexts == []


async def test_suppressed_context_providers_are_not_called() -> None:
    prompt = bare()
    called: list[str] = []
    prompt.context(PromptContext(name="c", order=1, text=logging_text(called, "c")))
    prompt.suppress_runtime_context()

    await prompt.assemble()

    assert called == []


async def test_texts_are_evaluated_but_not_interpolated() -> None:
    prompt = SystemPrompt(persona="I am {{model}}", include_harness_identity=False)
    prompt.context(PromptContext(name="c", order=1, text=lambda ctx: "in {{cwd}}"))

    assembly = await prompt.assemble()

    assert assembly.sections[0].text == "I am {{model}}"
    assert assembly.contexts[0].text == "in {{cwd}}"


async def test_assemble_without_context_uses_the_global_layer_only() -> None:
    prompt = bare()
    prompt.variable("scoped", lambda ctx: "s", scope=Scope("agent"))
    prompt.variable("global_one", lambda ctx: "g")

    assert (await prompt.assemble()).variables == {"global_one": "g"}


async def test_providers_and_listeners_receive_the_callers_context() -> None:
    prompt = bare()
    ctx = AssembleContext(scope=Scope("agent"), agent=object())
    received: list[AssembleContext] = []

    def capture(value: AssembleContext) -> str:
        received.append(value)
        return "x"

    async def listener(
        assembly: PromptAssembly, value: AssembleContext, next: NextListener
    ) -> PromptAssembly:
        received.append(value)
        return await next()

    prompt.variable("v", capture)
    prompt.section(PromptSection(name="s", order=1, text=capture))
    prompt.context(PromptContext(name="c", order=1, text=capture))

    def tools(value: AssembleContext) -> ToolProviderResult:
        received.append(value)
        return ToolProviderResult(schemas=[])

    prompt.tools(tools)
    prompt.on_assemble(listener)
    await prompt.assemble(ctx)

    assert len(received) == 5
    assert all(value is ctx for value in received)
