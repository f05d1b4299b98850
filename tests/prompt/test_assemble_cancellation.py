"""Cancelling `assemble()`: at any await, with the registry left as it was."""

from __future__ import annotations

import trio
import trio.testing

from actors.prompt import (
    AssembleContext,
    NextListener,
    PromptAssembly,
    PromptSection,
    SystemPrompt,
)


def bare() -> SystemPrompt:
    return SystemPrompt(include_harness_identity=False)


async def slow_listener(
    assembly: PromptAssembly, ctx: AssembleContext, next: NextListener
) -> PromptAssembly:
    await trio.sleep(10)
    return await next()


async def test_assemble_blocked_in_a_listener_is_cancellable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = bare()
    prompt.on_assemble(slow_listener)

    with trio.move_on_after(1) as cancel_scope:
        await prompt.assemble()

    assert cancel_scope.cancelled_caught
    assert trio.current_time() == 1


async def test_cancelled_assembly_leaves_the_registry_unchanged(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = bare()
    prompt.section(PromptSection(name="s", order=1, text="s"))
    prompt.variable("v", lambda ctx: "v")
    listener = prompt.on_assemble(slow_listener)
    before = prompt.statistics()

    with trio.move_on_after(1):
        await prompt.assemble()

    assert prompt.statistics() == before
    listener.dispose()
    assembly = await prompt.assemble()
    assert [s.name for s in assembly.sections][1:] == ["s"]
    assert assembly.variables == {"v": "v"}


async def test_cancellation_can_land_after_next_returns() -> None:
    prompt = bare()
    downstream_done = trio.Event()

    async def outer(
        assembly: PromptAssembly, ctx: AssembleContext, next: NextListener
    ) -> PromptAssembly:
        result = await next()
        downstream_done.set()
        await trio.sleep_forever()
        return result

    prompt.on_assemble(outer)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(prompt.assemble)
        await downstream_done.wait()
        nursery.cancel_scope.cancel()

    assert prompt.statistics().listeners == 1


async def test_assemble_without_listeners_checkpoints_before_calling_providers() -> None:
    prompt = bare()
    called: list[str] = []

    def provider(ctx: AssembleContext) -> str:
        called.append("v")
        return "v"

    prompt.variable("v", provider)

    with trio.CancelScope() as cancel_scope:
        cancel_scope.cancel()
        await prompt.assemble()

    assert cancel_scope.cancelled_caught
    assert called == []
