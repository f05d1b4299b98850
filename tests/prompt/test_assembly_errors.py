"""Assembly failures: every error is a PromptError naming what failed."""

from __future__ import annotations

import pytest

from actors.prompt import (
    AssembleContext,
    NextListener,
    PromptAssembly,
    PromptContext,
    PromptError,
    PromptSection,
    SystemPrompt,
    ToolProviderResult,
)


def bare() -> SystemPrompt:
    return SystemPrompt(include_harness_identity=False)


def broken(ctx: AssembleContext) -> str:
    raise RuntimeError("disk on fire")


async def test_failing_section_provider_is_wrapped_naming_the_section() -> None:
    prompt = bare()
    prompt.section(PromptSection(name="tool:bash", order=1, text=broken))

    with pytest.raises(PromptError, match=r"section 'tool:bash'.*disk on fire") as info:
        await prompt.assemble()

    assert isinstance(info.value.__cause__, RuntimeError)


async def test_failing_context_provider_is_wrapped_naming_the_context() -> None:
    prompt = bare()
    prompt.context(PromptContext(name="sandbox", order=1, text=broken))

    with pytest.raises(PromptError, match="context 'sandbox'"):
        await prompt.assemble()


async def test_failing_variable_provider_is_wrapped_naming_the_variable() -> None:
    prompt = bare()
    prompt.variable("cwd", broken)

    with pytest.raises(PromptError, match="variable 'cwd'"):
        await prompt.assemble()


async def test_failing_tool_provider_is_wrapped_naming_the_provider() -> None:
    prompt = bare()

    def bash_tools(ctx: AssembleContext) -> ToolProviderResult:
        raise KeyError("bash")

    prompt.tools(bash_tools)

    with pytest.raises(PromptError, match=r"tool provider '.*bash_tools'"):
        await prompt.assemble()


async def test_failing_listener_is_wrapped_naming_the_listener() -> None:
    prompt = bare()

    async def filter_tools(
        assembly: PromptAssembly, ctx: AssembleContext, next: NextListener
    ) -> PromptAssembly:
        raise ValueError("nope")

    prompt.on_assemble(filter_tools)

    with pytest.raises(PromptError, match=r"listener '.*filter_tools'.*nope"):
        await prompt.assemble()


async def test_prompt_error_from_a_provider_passes_through_unwrapped() -> None:
    prompt = bare()
    original = PromptError("section 'mine' refuses")

    def refusing(ctx: AssembleContext) -> str:
        raise original

    prompt.section(PromptSection(name="mine", order=1, text=refusing))

    with pytest.raises(PromptError) as info:
        await prompt.assemble()

    assert info.value is original


async def test_text_provider_returning_a_non_string_fails() -> None:
    prompt = bare()
    prompt.section(PromptSection(name="s", order=1, text=lambda ctx: 3))  # type: ignore[arg-type,return-value]

    with pytest.raises(PromptError, match="section 's' text provider returned int"):
        await prompt.assemble()


async def test_variable_provider_returning_a_non_string_fails() -> None:
    prompt = bare()
    prompt.variable("n", lambda ctx: 3)  # type: ignore[arg-type,return-value]

    with pytest.raises(PromptError, match="variable 'n' provider returned int"):
        await prompt.assemble()


async def test_tool_provider_returning_the_wrong_type_fails() -> None:
    prompt = bare()
    prompt.tools(lambda ctx: [])  # type: ignore[arg-type,return-value]

    with pytest.raises(PromptError, match="not ToolProviderResult"):
        await prompt.assemble()


async def test_listener_returning_the_wrong_type_fails() -> None:
    prompt = bare()

    async def forgetful(
        assembly: PromptAssembly, ctx: AssembleContext, next: NextListener
    ) -> PromptAssembly:
        await next()
        return None  # type: ignore[return-value]

    prompt.on_assemble(forgetful)

    with pytest.raises(PromptError, match="forgetful' returned NoneType"):
        await prompt.assemble()


async def test_failed_assembly_leaves_the_registry_usable() -> None:
    prompt = bare()
    registration = prompt.variable("cwd", broken)
    with pytest.raises(PromptError):
        await prompt.assemble()

    registration.dispose()

    assert (await prompt.assemble()).variables == {}
