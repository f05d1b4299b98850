"""Stopping the provider actor while its requests stream in their callers' tasks.

Every request the actor admitted ends with a stated `provider_unavailable`
failure, its provider stream is closed, and nothing hangs: neither the
stopping actor nor the callers, whether a caller was waiting on its stream
or busy between two chunks when the actor stopped.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing

import attrs
import httpx
import trio
import trio.testing

from actors.messages import Message
from actors.providers import Chunk, FinishChunk, GenerateRequest, TextDelta
from actors.providers.actor import ProviderActor
from actors.providers.base import ChunkBatch
from actors.providers.openai_compat import OpenAICompatProvider
from actors.providers.simulator import SimulatorConfig, SimulatorEngine, serve_simulator

REQUEST = GenerateRequest(config={"provider": "p", "model": "m"})


@attrs.define
class Endless:
    """Streams one chunk per `tick` until closed; counts open streams and closes."""

    close_takes: float = 0.0
    open: int = 0
    closed: int = 0
    tick: trio.Event = attrs.field(factory=trio.Event)

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
        self.open += 1
        try:
            while True:
                yield TextDelta(text="x")
                await trio.sleep_forever()
        finally:
            if self.close_takes:
                with trio.move_on_after(self.close_takes * 2, shield=True):
                    await trio.sleep(self.close_takes)
            self.open -= 1
            self.closed += 1


@attrs.define
class Running:
    """An actor served in a task of its own, stopped by `stop()`; `stopped` is set on return."""

    scope: trio.CancelScope
    stopped: trio.Event

    def stop(self) -> None:
        self.scope.cancel()


async def _serve(actor: ProviderActor, *, task_status: trio.TaskStatus[Running]) -> None:
    stopped = trio.Event()
    try:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                await nursery.start(actor.serve)
                task_status.started(Running(scope=scope, stopped=stopped))
    finally:
        stopped.set()


async def _stop_when_blocked(running: Running) -> None:
    await trio.testing.wait_all_tasks_blocked()
    running.stop()


def _unavailable(batch: ChunkBatch) -> str:
    (finish,) = batch
    assert isinstance(finish, FinishChunk) and finish.failure is not None
    assert (finish.failure.code, finish.failure.retryable) == ("provider_unavailable", True)
    return finish.failure.message


async def test_a_request_waiting_on_its_stream_ends_unavailable_when_the_actor_stops() -> None:
    provider = Endless()
    actor = ProviderActor(name="endless", factory=lambda client: provider)
    async with trio.open_nursery() as nursery:
        running: Running = await nursery.start(_serve, actor)
        async with aclosing(actor.stream_batches(REQUEST)) as batches:
            assert await anext(batches) == (TextDelta(text="x"),)
            nursery.start_soon(_stop_when_blocked, running)
            with trio.fail_after(1):
                # Waits on the provider when the actor stops: cancelled at once.
                message = _unavailable(await anext(batches))
            assert "stopped before the request finished" in message
            assert (provider.open, provider.closed) == (0, 1)
            with trio.fail_after(1):
                await running.stopped.wait()
    stats = actor.statistics()
    assert (stats.in_flight, stats.cancelled, stats.completed) == (0, 1, 0)
    assert not actor.running


async def test_a_request_whose_caller_is_busy_ends_unavailable_at_its_next_read() -> None:
    provider = Endless()
    actor = ProviderActor(name="endless", factory=lambda client: provider)
    async with trio.open_nursery() as nursery:
        running: Running = await nursery.start(_serve, actor)
        async with aclosing(actor.stream_batches(REQUEST)) as batches:
            assert await anext(batches) == (TextDelta(text="x"),)
            # The caller is between two chunks: the stopping actor does not wait for it.
            running.stop()
            with trio.fail_after(1):
                await running.stopped.wait()
            assert provider.open == 1
            _unavailable(await anext(batches))
            assert (provider.open, provider.closed) == (0, 1)
            assert [batch async for batch in batches] == []
    assert actor.statistics().cancelled == 1


async def test_the_stopping_actor_waits_for_the_streams_it_cancelled_to_close(
    autojump_clock: trio.testing.MockClock,
) -> None:
    provider = Endless(close_takes=3.0)
    actor = ProviderActor(name="endless", factory=lambda client: provider)
    ended: list[float] = []

    async def caller() -> None:
        async with aclosing(actor.stream_batches(REQUEST)) as batches:
            await anext(batches)
            _unavailable(await anext(batches))
            ended.append(trio.current_time())

    async with trio.open_nursery() as callers:
        async with trio.open_nursery() as nursery:
            await nursery.start(actor.serve)
            callers.start_soon(caller)
            callers.start_soon(caller)
            await trio.testing.wait_all_tasks_blocked()
            started = trio.current_time()
            nursery.cancel_scope.cancel()
        # serve returned only once both streams had closed (3 s each, side by side).
        assert trio.current_time() - started == 3.0
        assert provider.open == 0
    assert ended == [started + 3.0] * 2


async def test_requests_after_the_actor_stopped_are_refused_as_not_running() -> None:
    actor = ProviderActor(name="endless", factory=lambda client: Endless())
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.serve)
        nursery.cancel_scope.cancel()
    async with aclosing(actor.stream_batches(REQUEST)) as batches:
        assert "is not running" in _unavailable(await anext(batches))


def _http_actor(engine: SimulatorEngine, url: str) -> ProviderActor:
    def factory(client: httpx.AsyncClient) -> OpenAICompatProvider:
        return OpenAICompatProvider(client, base_url=url, api_key=engine.config.api_key)

    return ProviderActor(name="sim", factory=factory)


_HTTP_REQUEST = GenerateRequest(
    config={"provider": "sim", "model": "deepseek-chat"}, messages=[Message.user("a long story")]
)


async def test_stopping_mid_stream_over_http_closes_the_connection_and_ends_unavailable() -> None:
    engine = SimulatorEngine(SimulatorConfig(reply_tokens=400, token_rate=20.0))
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_simulator, engine)
        actor = _http_actor(engine, url)
        running: Running = await nursery.start(_serve, actor)
        with trio.fail_after(10):
            async with aclosing(actor.stream_batches(_HTTP_REQUEST)) as batches:
                first = await anext(batches)
                assert any(isinstance(chunk, TextDelta) for chunk in first)
                nursery.start_soon(_stop_when_blocked, running)
                # The next chunks are far off (20 tokens/s): it waits on the socket.
                last = await anext(batches)
                while not isinstance(last[-1], FinishChunk):
                    last = await anext(batches)
                assert "stopped before the request finished" in _unavailable(last)
            assert await engine.requests[0].wait_settled() == "disconnected"
            await running.stopped.wait()
        nursery.cancel_scope.cancel()
    assert actor.statistics().cancelled == 1


async def test_a_busy_caller_over_http_closes_its_stream_after_the_client_closed() -> None:
    engine = SimulatorEngine(SimulatorConfig(reply_tokens=400, token_rate=20.0))
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_simulator, engine)
        actor = _http_actor(engine, url)
        running: Running = await nursery.start(_serve, actor)
        with trio.fail_after(10):
            async with aclosing(actor.stream_batches(_HTTP_REQUEST)) as batches:
                await anext(batches)
                running.stop()  # the caller holds a batch: it is busy
                await running.stopped.wait()  # serve closed its client under the open response
                assert "stopped before the request finished" in _unavailable(await anext(batches))
            assert await engine.requests[0].wait_settled() == "disconnected"
        nursery.cancel_scope.cancel()
    assert actor.statistics().in_flight == 0
