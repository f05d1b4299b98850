"""The provider actor: concurrency cap, bounded streaming, prompt cancellation, statistics."""

from __future__ import annotations

from collections.abc import AsyncGenerator

import attrs
import httpx
import trio

from actors.providers import Chunk, FinishChunk, GenerateRequest, TextDelta
from actors.providers.actor import ProviderActor

REQUEST = GenerateRequest(config={"provider": "p", "model": "m"})


@attrs.define
class GatedProvider:
    """Streams one chunk, then waits for `release` before finishing; records what it saw."""

    release: trio.Event = attrs.field(factory=trio.Event)
    active: int = 0
    peak: int = 0
    closed: int = 0

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            yield TextDelta(text="hello")
            await self.release.wait()
            yield FinishChunk(reason="completed")
        finally:
            self.active -= 1
            self.closed += 1


def actor_for(provider: GatedProvider, **kwargs: int) -> ProviderActor:
    return ProviderActor(name="gated", factory=lambda client: provider, **kwargs)


async def collect(actor: ProviderActor) -> list[Chunk]:
    out: list[Chunk] = []
    async for chunk in actor.stream(REQUEST):
        out.append(chunk)
    return out


async def test_requests_in_flight_never_exceed_the_cap() -> None:
    provider = GatedProvider()
    actor = actor_for(provider, max_in_flight=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.serve)
        async with trio.open_nursery() as callers:
            for _ in range(5):
                callers.start_soon(collect, actor)
            await trio.testing.wait_all_tasks_blocked()
            stats = actor.statistics()
            assert (stats.in_flight, provider.active) == (2, 2)
            provider.release.set()
        nursery.cancel_scope.cancel()
    assert provider.peak == 2
    assert actor.statistics().completed == 5


async def test_a_cancelled_caller_closes_its_upstream_stream_promptly() -> None:
    provider = GatedProvider()
    actor = actor_for(provider)
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.serve)
        with trio.move_on_after(0.01) as scope:
            await collect(actor)
        assert scope.cancelled_caught
        await trio.testing.wait_all_tasks_blocked()
        assert (provider.active, provider.closed) == (0, 1)
        assert actor.statistics().cancelled == 1
        nursery.cancel_scope.cancel()


async def test_stream_fails_as_data_when_the_actor_is_not_running() -> None:
    actor = actor_for(GatedProvider())
    chunks = await collect(actor)
    assert len(chunks) == 1
    finish = chunks[0]
    assert isinstance(finish, FinishChunk) and finish.failure is not None
    assert (finish.failure.code, finish.failure.retryable) == ("provider_unavailable", True)


async def test_the_actor_builds_its_adapter_over_one_client_with_explicit_limits() -> None:
    seen: list[httpx.AsyncClient] = []
    provider = GatedProvider()
    provider.release.set()

    def factory(client: httpx.AsyncClient) -> GatedProvider:
        seen.append(client)
        return provider

    limits = httpx.Limits(max_connections=3, max_keepalive_connections=1)
    actor = ProviderActor(name="x", factory=factory, limits=limits)
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.serve)
        await collect(actor)
        await collect(actor)
        nursery.cancel_scope.cancel()
    assert len(seen) == 1
    assert seen[0].is_closed
