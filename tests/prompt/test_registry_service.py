"""The registry service on its own: change fan-out, coalescing, ending and its errors.

Runtime integration (the service under `open_runtime`) is tested in
tests/supervision/test_runtime.py.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from actors.prompt import (
    PromptError,
    PromptSection,
    RegistryChange,
    RegistryNotRunningError,
    RegistryService,
    RegistryServiceError,
    SystemPrompt,
)


def section(name: str) -> PromptSection:
    return PromptSection(name=name, order=1, text=name)


async def test_changes_fold_into_one_pending_notice_until_the_subscriber_looks(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = SystemPrompt()
    service = RegistryService(system_prompt=prompt)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.serve)
        async with service.subscribe() as changes:
            for name in "abc":
                prompt.section(section(name))
            assert await changes.receive() == RegistryChange(generation=3, changes=3)
            with trio.move_on_after(1) as waited:
                await changes.receive()
            assert waited.cancelled_caught
            stats = service.statistics()
            assert (stats.subscribers, stats.changes, stats.notices, stats.coalesced) == (
                1,
                3,
                1,
                2,
            )
        nursery.cancel_scope.cancel()


async def test_subscriptions_end_and_the_change_callback_goes_when_the_service_stops(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = SystemPrompt()
    service = RegistryService(system_prompt=prompt)
    received: list[RegistryChange | str] = []
    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as nursery:
            await nursery.start(service.serve)
            assert prompt.statistics().change_callbacks == 1

            async def consume(*, task_status: trio.TaskStatus[None]) -> None:
                async with service.subscribe() as changes:
                    task_status.started()
                    async for change in changes:
                        received.append(change)
                received.append("ended")

            await outer.start(consume)
            prompt.section(section("a"))
            await trio.sleep(1)
            nursery.cancel_scope.cancel()
        await trio.sleep(1)
    assert received == [RegistryChange(generation=1, changes=1), "ended"]
    assert not service.running
    assert service.statistics().subscribers == 0
    assert prompt.statistics().change_callbacks == 0


async def test_closing_a_subscription_forgets_it_and_refuses_to_receive(
    autojump_clock: trio.testing.MockClock,
) -> None:
    service = RegistryService(system_prompt=SystemPrompt())
    async with trio.open_nursery() as nursery:
        await nursery.start(service.serve)
        async with service.subscribe() as changes:
            assert service.statistics().subscribers == 1
        assert service.statistics().subscribers == 0
        with pytest.raises(trio.ClosedResourceError, match="subscription is closed"):
            await changes.receive()
        nursery.cancel_scope.cancel()


async def test_subscribing_while_the_service_does_not_run_raises_registry_not_running_error() -> (
    None
):
    service = RegistryService(system_prompt=SystemPrompt())
    with pytest.raises(RegistryNotRunningError, match="the registry service is not running"):
        async with service.subscribe():
            pytest.fail("subscribed to a registry service that is not running")


async def test_serving_twice_raises_registry_service_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    service = RegistryService(system_prompt=SystemPrompt())
    async with trio.open_nursery() as nursery:
        await nursery.start(service.serve)
        with pytest.raises(RegistryServiceError, match="the registry service is already running"):
            await service.serve()
        nursery.cancel_scope.cancel()


def test_registry_service_errors_are_prompt_errors() -> None:
    assert issubclass(RegistryNotRunningError, RegistryServiceError)
    assert issubclass(RegistryServiceError, PromptError)
