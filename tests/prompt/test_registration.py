"""Registration kinds, their disposal, change notifications and registration-time errors."""

from __future__ import annotations

import logging

import pytest

from actors.prompt import (
    HARNESS_IDENTITY_ORDER,
    HARNESS_IDENTITY_SECTION,
    HARNESS_IDENTITY_TEXT,
    PERSONA_ORDER,
    PERSONA_SECTION,
    AssembleContext,
    AssembleListener,
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
from actors.scope import Registration, Scope, ScopeClosedError


def bare() -> SystemPrompt:
    return SystemPrompt(include_harness_identity=False)


def tool(name: str) -> ToolSchema:
    return ToolSchema(name=name, description=f"the {name} tool", parameters={"type": "object"})


def provide(*names: str) -> ToolProviderResult:
    return ToolProviderResult(schemas=[tool(name) for name in names])


def section_names(assembly: PromptAssembly) -> list[str]:
    return [section.name for section in assembly.sections]


async def test_constructor_registers_identity_and_persona_sections() -> None:
    prompt = SystemPrompt(persona="Be brief.")

    assembly = await prompt.assemble()

    assert [(s.name, s.text) for s in assembly.sections] == [
        (HARNESS_IDENTITY_SECTION, HARNESS_IDENTITY_TEXT),
        (PERSONA_SECTION, "Be brief."),
    ]


async def test_identity_and_persona_sit_at_orders_minus_100_and_0() -> None:
    prompt = SystemPrompt(persona="p")
    for name, order in [("before", -101), ("between", -99), ("negative", -1), ("after", 1)]:
        prompt.section(PromptSection(name=name, order=order, text=name))

    names = [section.name for section in (await prompt.assemble()).sections]

    assert (HARNESS_IDENTITY_ORDER, PERSONA_ORDER) == (-100, 0)
    assert names == [
        "before",
        HARNESS_IDENTITY_SECTION,
        "between",
        "negative",
        PERSONA_SECTION,
        "after",
    ]


async def test_identity_section_can_be_left_out() -> None:
    assembly = await SystemPrompt(include_harness_identity=False).assemble()

    assert section_names(assembly) == [PERSONA_SECTION]


async def test_include_runtime_context_false_registers_a_global_suppressor() -> None:
    prompt = SystemPrompt(include_runtime_context=False)
    prompt.context(PromptContext(name="sandbox", order=1, text="read-only"))

    assembly = await prompt.assemble()

    assert assembly.contexts == []
    assert prompt.statistics().suppressors == 1


async def test_section_registration_is_disposed_exactly() -> None:
    prompt = bare()
    keep = prompt.section(PromptSection(name="keep", order=1, text="k"))
    drop = prompt.section(PromptSection(name="drop", order=2, text="d"))

    drop.dispose()

    assert section_names(await prompt.assemble()) == [PERSONA_SECTION, "keep"]
    assert not keep.disposed


async def test_context_registration_is_disposed_exactly() -> None:
    prompt = bare()
    prompt.context(PromptContext(name="keep", order=1, text="k"))
    drop = prompt.context(PromptContext(name="drop", order=2, text="d"))

    drop.dispose()

    assert [c.name for c in (await prompt.assemble()).contexts] == ["keep"]


async def test_disposing_one_suppressor_leaves_the_other_active() -> None:
    prompt = bare()
    prompt.context(PromptContext(name="sandbox", order=1, text="read-only"))
    first = prompt.suppress_runtime_context()
    second = prompt.suppress_runtime_context()

    first.dispose()
    still_suppressed = await prompt.assemble()
    second.dispose()
    unsuppressed = await prompt.assemble()

    assert still_suppressed.contexts == []
    assert [c.name for c in unsuppressed.contexts] == ["sandbox"]


async def test_same_tool_provider_registered_twice_is_disposed_one_at_a_time() -> None:
    prompt = bare()

    def provider(ctx: AssembleContext) -> ToolProviderResult:
        return provide("read")

    prompt.tools(provider)
    second = prompt.tools(provider)
    second.dispose()

    assert [t.name for t in (await prompt.assemble()).tools] == ["read"]


async def test_variable_registration_is_disposed_exactly() -> None:
    prompt = bare()
    prompt.variable("cwd", lambda ctx: "/w")
    drop = prompt.variable("model", lambda ctx: "m")

    drop.dispose()

    assert (await prompt.assemble()).variables == {"cwd": "/w"}


async def test_protection_registration_is_disposed_exactly() -> None:
    prompt = bare()
    prompt.section(PromptSection(name="policy", order=1, text="p"))

    async def drop_all(
        assembly: PromptAssembly, ctx: AssembleContext, next: NextListener
    ) -> PromptAssembly:
        assembly.sections.clear()
        return await next()

    prompt.on_assemble(drop_all)
    protection = prompt.protect(PromptProtection(sections=["policy"]))
    protected = await prompt.assemble()
    protection.dispose()
    unprotected = await prompt.assemble()

    assert section_names(protected) == ["policy"]
    assert section_names(unprotected) == []


async def test_listener_registration_is_disposed_exactly() -> None:
    prompt = bare()
    calls: list[str] = []

    def listener(name: str) -> AssembleListener:
        async def run(
            assembly: PromptAssembly, ctx: AssembleContext, next: NextListener
        ) -> PromptAssembly:
            calls.append(name)
            return await next()

        return run

    prompt.on_assemble(listener("a"))
    drop = prompt.on_assemble(listener("b"))
    drop.dispose()
    await prompt.assemble()

    assert calls == ["a"]


def test_change_callback_fires_on_every_registration_and_disposal() -> None:
    prompt = bare()
    changes: list[int] = []
    prompt.on_change(lambda: changes.append(1))
    registrations: list[Registration] = [
        prompt.section(PromptSection(name="s", order=1, text="s")),
        prompt.context(PromptContext(name="c", order=1, text="c")),
        prompt.suppress_runtime_context(),
        prompt.tools(lambda ctx: provide()),
        prompt.variable("v", lambda ctx: "v"),
        prompt.protect(PromptProtection(tools=["t"])),
        prompt.on_assemble(lambda assembly, ctx, next: next()),
    ]
    assert len(changes) == 7

    for registration in registrations:
        registration.dispose()

    assert len(changes) == 14


def test_change_callback_runs_after_the_change_took_effect() -> None:
    prompt = bare()
    seen: list[int] = []
    prompt.on_change(lambda: seen.append(prompt.statistics().variables))

    registration = prompt.variable("v", lambda ctx: "v")
    registration.dispose()

    assert seen == [1, 0]


def test_repeated_dispose_notifies_nothing() -> None:
    prompt = bare()
    changes: list[int] = []
    registration = prompt.section(PromptSection(name="s", order=1, text="s"))
    prompt.on_change(lambda: changes.append(1))

    registration.dispose()
    registration.dispose()

    assert changes == [1]


def test_registering_a_change_callback_notifies_nothing() -> None:
    prompt = bare()
    changes: list[int] = []
    prompt.on_change(lambda: changes.append(1))

    prompt.on_change(lambda: None).dispose()

    assert changes == []


def test_disposed_change_callback_is_not_called() -> None:
    prompt = bare()
    changes: list[int] = []
    prompt.on_change(lambda: changes.append(1)).dispose()

    prompt.section(PromptSection(name="s", order=1, text="s"))

    assert changes == []


def test_raising_change_callback_is_logged_and_does_not_fail_the_registration(
    caplog: pytest.LogCaptureFixture,
) -> None:
    prompt = bare()
    later: list[int] = []

    def broken() -> None:
        raise RuntimeError("boom")

    prompt.on_change(broken)
    prompt.on_change(lambda: later.append(1))

    with caplog.at_level(logging.ERROR, logger="actors.prompt.registry"):
        registration = prompt.section(PromptSection(name="s", order=1, text="s"))

    assert not registration.disposed
    assert later == [1]
    assert prompt.statistics().change_callback_errors == 1
    assert "broken" in caplog.text


def test_registration_is_a_context_manager_that_disposes() -> None:
    prompt = bare()
    with prompt.variable("v", lambda ctx: "v") as registration:
        assert prompt.statistics().variables == 1

    assert registration.disposed
    assert prompt.statistics().variables == 0


def test_duplicate_section_name_in_one_layer_raises() -> None:
    prompt = bare()
    prompt.section(PromptSection(name="s", order=1, text="a"))

    with pytest.raises(PromptError, match="section 's' is already registered"):
        prompt.section(PromptSection(name="s", order=2, text="b"))


def test_duplicate_context_name_in_one_layer_raises() -> None:
    prompt = bare()
    scope = Scope("agent")
    prompt.context(PromptContext(name="c", order=1, text="a"), scope=scope)

    with pytest.raises(PromptError, match="context 'c' is already registered in scope 'agent'"):
        prompt.context(PromptContext(name="c", order=2, text="b"), scope=scope)


def test_duplicate_variable_name_in_one_layer_raises() -> None:
    prompt = bare()
    prompt.variable("cwd", lambda ctx: "/a")

    with pytest.raises(PromptError, match="variable 'cwd' is already registered"):
        prompt.variable("cwd", lambda ctx: "/b")


def test_disposed_name_can_be_registered_again() -> None:
    prompt = bare()
    prompt.section(PromptSection(name="s", order=1, text="a")).dispose()

    prompt.section(PromptSection(name="s", order=1, text="b"))

    assert prompt.statistics().sections == 2


@pytest.mark.parametrize("name", ["Model", "1st", "_x", "a-b", "", "a b", "é"])
def test_invalid_variable_name_raises(name: str) -> None:
    with pytest.raises(PromptError, match="must match"):
        bare().variable(name, lambda ctx: "v")


@pytest.mark.parametrize("order", [float("nan"), float("inf"), -float("inf"), "1", None, True])
def test_non_finite_or_non_numeric_order_raises(order: float) -> None:
    with pytest.raises(PromptError, match="order of 's' must be a finite number"):
        PromptSection(name="s", order=order, text="t")
    with pytest.raises(PromptError, match="order of 'c' must be a finite number"):
        PromptContext(name="c", order=order, text="t")


def test_prompt_error_is_a_value_error() -> None:
    assert issubclass(PromptError, ValueError)


@pytest.mark.parametrize(
    ("parameters", "detail"),
    [
        ({"default": object()}, "parameters.default holds object"),
        ({"maximum": float("nan")}, "non-finite"),
        ({1: "x"}, "non-string key 1"),
        (["not", "an", "object"], "must be a JSON object"),
    ],
)
def test_tool_schema_with_non_json_parameters_raises_naming_the_tool(
    parameters: object, detail: str
) -> None:
    with pytest.raises(PromptError, match=f"tool 'bash': .*{detail}"):
        ToolSchema(name="bash", description="d", parameters=parameters)  # type: ignore[arg-type]


def test_empty_protection_raises() -> None:
    with pytest.raises(PromptError, match="at least one"):
        bare().protect(PromptProtection())


def test_section_with_non_text_raises() -> None:
    with pytest.raises(PromptError, match="section 's': text must be"):
        bare().section(PromptSection(name="s", order=1, text=42))  # type: ignore[arg-type]


def test_registering_into_a_closed_scope_raises_and_changes_nothing() -> None:
    prompt = bare()
    scope = Scope("done")
    scope.close()
    changes: list[int] = []
    prompt.on_change(lambda: changes.append(1))
    before = prompt.statistics()

    with pytest.raises(ScopeClosedError):
        prompt.variable("v", lambda ctx: "v", scope=scope)
    with pytest.raises(PromptError, match="scope 'done' is closed; cannot register section 's'"):
        prompt.section(PromptSection(name="s", order=1, text="s"), scope=scope)

    assert prompt.statistics() == before
    assert changes == []


def test_statistics_count_registrations_per_kind() -> None:
    prompt = SystemPrompt()
    scope = Scope("agent")
    prompt.section(PromptSection(name="s", order=PERSONA_ORDER + 1, text="s"), scope=scope)
    prompt.tools(lambda ctx: provide())
    prompt.on_change(lambda: None)

    stats = prompt.statistics()

    assert (stats.sections, stats.tool_providers, stats.change_callbacks) == (3, 1, 1)
    assert stats.scoped_layers == 1
    assert stats.changes_notified == 4
