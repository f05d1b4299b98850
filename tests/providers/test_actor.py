"""The provider actor: concurrency cap, bounded streaming, prompt cancellation, statistics."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing

import attrs
import httpx
import pytest
import trio

from actors.messages import Message
from actors.providers import Chunk, Failure, FinishChunk, GenerateRequest, TextDelta
from actors.providers.actor import ProviderActor
from actors.providers.openai_compat import OpenAICompatProvider
from actors.providers.simulator import Fault, SimulatorEngine, simulator_transport
from tests.providers.simulator_helpers import API_KEY

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


async def test_waiting_callers_are_admitted_in_arrival_order_one_freed_slot_at_a_time() -> None:
    @attrs.define
    class Ordered:
        """Each request waits for its own event (its model names it); records the start order."""

        releases: dict[str, trio.Event] = attrs.field(factory=dict)
        started: list[str] = attrs.field(factory=list)

        async def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
            self.started.append(request.model)
            await self.releases.setdefault(request.model, trio.Event()).wait()
            yield FinishChunk(reason="completed")

    provider = Ordered()
    actor = ProviderActor(name="ordered", factory=lambda client: provider, max_in_flight=1)

    async def call(model: str) -> None:
        async for _ in actor.stream(GenerateRequest(config={"provider": "p", "model": model})):
            pass

    async with trio.open_nursery() as nursery:
        await nursery.start(actor.serve)
        async with trio.open_nursery() as callers:
            for model in "abcd":
                callers.start_soon(call, model)
                await trio.testing.wait_all_tasks_blocked()
            stats = actor.statistics()
            assert (stats.in_flight, stats.queued, provider.started) == (1, 3, ["a"])
            for model in "abc":
                provider.releases.setdefault(model, trio.Event()).set()
                await trio.testing.wait_all_tasks_blocked()
            assert provider.started == ["a", "b", "c", "d"]
            assert actor.statistics().queued == 0
            provider.releases.setdefault("d", trio.Event()).set()
        nursery.cancel_scope.cancel()
    assert actor.statistics().completed == 4


async def test_a_caller_cancelled_while_waiting_for_admission_is_admitted_to_nothing() -> None:
    provider = GatedProvider()
    actor = actor_for(provider, max_in_flight=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.serve)
        async with trio.open_nursery() as callers:
            callers.start_soon(collect, actor)
            await trio.testing.wait_all_tasks_blocked()
            with trio.move_on_after(0.01) as waiting:
                await collect(actor)
            assert waiting.cancelled_caught
            assert actor.statistics().queued == 0
            callers.start_soon(collect, actor)  # admitted once the first ends
            await trio.testing.wait_all_tasks_blocked()
            provider.release.set()
        nursery.cancel_scope.cancel()
    stats = actor.statistics()
    assert (provider.peak, stats.completed, stats.cancelled) == (1, 2, 0)


async def test_stopping_the_actor_ends_queued_and_running_streams_as_unavailable() -> None:
    provider = GatedProvider()
    actor = actor_for(provider, max_in_flight=1)
    results: list[list[Chunk]] = []

    async def caller() -> None:
        results.append(await collect(actor))

    async with trio.open_nursery() as callers, trio.open_nursery() as nursery:
        await nursery.start(actor.serve)
        callers.start_soon(caller)
        callers.start_soon(caller)
        await trio.testing.wait_all_tasks_blocked()
        assert actor.statistics().queued == 1
        nursery.cancel_scope.cancel()
    assert len(results) == 2
    for chunks in results:
        finish = chunks[-1]
        assert isinstance(finish, FinishChunk) and finish.failure is not None
        assert finish.failure.code == "provider_unavailable"
    assert actor.statistics().queued == 0


async def test_a_slow_reader_slows_its_own_stream_only() -> None:
    produced = 0

    class Chatty:
        async def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
            nonlocal produced
            for _ in range(50):
                produced += 1
                yield TextDelta(text="x")
            yield FinishChunk(reason="completed")

    actor = ProviderActor(name="chatty", factory=lambda client: Chatty())
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.serve)
        async with aclosing(actor.stream(REQUEST)) as stream:
            await anext(stream)
            await trio.testing.wait_all_tasks_blocked()
            # The request streams in the reader's task: nothing is read ahead of it.
            assert produced == 1
            other = [chunk async for chunk in actor.stream(REQUEST)]
            assert len(other) == 51
        assert actor.statistics().cancelled == 1
        nursery.cancel_scope.cancel()


async def test_statistics_count_failed_streams() -> None:
    class Failing:
        async def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
            await trio.lowlevel.checkpoint()
            yield FinishChunk(reason="error", failure=Failure(code="rate_limited"))

    actor = ProviderActor(name="failing", factory=lambda client: Failing())
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.serve)
        chunks = await collect(actor)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert isinstance(chunks[-1], FinishChunk) and chunks[-1].failure == Failure(
        code="rate_limited"
    )
    stats = actor.statistics()
    assert (stats.completed, stats.failed, stats.cancelled) == (0, 1, 0)


async def test_the_client_gets_the_configured_timeout_and_limits() -> None:
    seen: list[httpx.AsyncClient] = []

    def factory(client: httpx.AsyncClient) -> GatedProvider:
        seen.append(client)
        return GatedProvider()

    timeout = httpx.Timeout(7.0, connect=2.0)
    limits = httpx.Limits(max_connections=3, max_keepalive_connections=1)
    actor = ProviderActor(name="x", factory=factory, timeout=timeout, limits=limits)
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.serve)
        (client,) = seen
        assert client.timeout == timeout
        # httpx exposes no public view of the pool limits.
        pool = client._transport._pool  # type: ignore[attr-defined]
        assert (pool._max_connections, pool._max_keepalive_connections) == (3, 1)
        nursery.cancel_scope.cancel()


async def test_a_cancelled_caller_closes_the_http_stream_through_the_mock_front_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = SimulatorEngine()
    engine.faults.queue(Fault(stall_after_chunks=3))
    async with httpx.AsyncClient(transport=simulator_transport(engine)) as mock_client:
        # The adapter goes through the socket-free front end instead of the actor's client.
        actor = ProviderActor(
            name="sim",
            factory=lambda client: OpenAICompatProvider(
                mock_client, base_url="http://simulator.test", api_key=API_KEY
            ),
        )
        request = GenerateRequest(
            config={"provider": "sim", "model": "deepseek-chat"}, messages=[Message.user("hi")]
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(actor.serve)
            with trio.move_on_after(5.0) as scope:
                async with aclosing(actor.stream(request)) as stream:
                    async for _ in stream:
                        pass
            assert scope.cancelled_caught
            with trio.fail_after(1):
                assert await engine.requests[0].wait_settled() == "disconnected"
            await trio.testing.wait_all_tasks_blocked()
            assert engine.statistics().streaming == 0
            assert actor.statistics().in_flight == 0
            assert actor.statistics().cancelled == 1
            nursery.cancel_scope.cancel()


async def test_statistics_count_failures_by_code_and_time_finished_requests(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class Slow:
        async def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
            await trio.sleep(request.config["seconds"])
            if request.config["fail"]:
                yield FinishChunk(reason="error", failure=Failure(code=request.config["fail"]))
            else:
                yield FinishChunk(reason="completed")

    actor = ProviderActor(name="slow", factory=lambda client: Slow())
    assert actor.statistics().latency.p50_ms is None
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.serve)
        for seconds, fail in [(1.0, ""), (2.0, "rate_limited"), (3.0, "rate_limited"), (4, "auth")]:
            config = {"provider": "p", "model": "m", "seconds": seconds, "fail": fail}
            async for _ in actor.stream(GenerateRequest(config=config)):
                pass
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    stats = actor.statistics()
    assert stats.failures_by_code == {"rate_limited": 2, "auth": 1}
    assert stats.latency.samples == 4
    assert stats.latency.p50_ms == pytest.approx(2000.0)
    assert stats.latency.p99_ms == pytest.approx(4000.0)
