"""Stalls and keep-alive trickles end within the adapter's own clocks, whatever the client says."""

from __future__ import annotations

import gc
import warnings
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from actors.messages import Message
from actors.providers.chunks import Failure, FinishChunk, TextDelta
from actors.providers.openai_compat import OpenAICompatProvider, StreamTimeouts
from actors.providers.request import GenerateRequest
from actors.providers.simulator import (
    Fault,
    FaultError,
    SimulatorConfig,
    SimulatorEngine,
    serve_simulator,
    simulator_transport,
)
from tests.providers.simulator_helpers import API_KEY, collect, finish_of


def _request(model: str = "deepseek-chat") -> GenerateRequest:
    return GenerateRequest(
        config={"provider": "sim", "model": model}, messages=(Message.user("hi"),)
    )


def _mock_provider(engine: SimulatorEngine, **options: Any) -> OpenAICompatProvider:
    client = httpx.AsyncClient(transport=simulator_transport(engine))
    return OpenAICompatProvider(
        client, base_url="http://simulator.test", api_key=API_KEY, **options
    )


def _failure(chunks: list[Any]) -> Failure:
    finish = finish_of(chunks)
    assert finish.reason == "error" and finish.failure is not None, finish
    return finish.failure


async def test_a_keep_alive_trickle_after_data_ends_at_the_no_data_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = SimulatorEngine()
    engine.faults.queue(Fault(trickle_after_chunks=3, keepalive_interval=1.0))
    provider = _mock_provider(engine, timeouts=StreamTimeouts(read_idle=5.0, no_data=12.0))
    start = trio.current_time()
    chunks = await collect(provider, _request())
    failure = _failure(chunks)
    assert (failure.code, failure.retryable) == ("read_timeout", True)
    assert "no data for 12.0 s" in failure.message
    assert trio.current_time() - start == pytest.approx(12.0)
    assert any(isinstance(chunk, TextDelta) for chunk in chunks)
    assert engine.requests[0].outcome == "disconnected"


async def test_keep_alives_before_the_first_event_end_at_the_no_data_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = SimulatorEngine()
    engine.faults.queue(Fault(keepalives=1000, keepalive_interval=2.0))
    provider = _mock_provider(engine, timeouts=StreamTimeouts(read_idle=5.0, no_data=30.0))
    start = trio.current_time()
    assert _failure(await collect(provider, _request())).code == "read_timeout"
    assert trio.current_time() - start == pytest.approx(30.0)


async def test_data_only_keep_alives_do_not_count_as_data(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = SimulatorEngine()
    engine.faults.queue(
        Fault(trickle_after_chunks=1, keepalive_interval=1.0, keepalive_line="data: : keep-alive")
    )
    provider = _mock_provider(engine, timeouts=StreamTimeouts(read_idle=5.0, no_data=10.0))
    start = trio.current_time()
    assert "no data" in _failure(await collect(provider, _request())).message
    assert trio.current_time() - start == pytest.approx(10.0)


async def test_keep_alives_within_the_no_data_bound_keep_a_stream_alive(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = SimulatorEngine()
    engine.faults.queue(Fault(keepalives=10, keepalive_interval=4.0))
    provider = _mock_provider(engine, timeouts=StreamTimeouts(read_idle=5.0, no_data=45.0))
    assert finish_of(await collect(provider, _request())).reason == "completed"


async def test_the_default_clocks_bound_silence_and_trickles() -> None:
    timeouts = StreamTimeouts()
    assert (timeouts.read_idle, timeouts.no_data) == (30.0, 60.0)
    with pytest.raises(ValueError, match="no_data"):
        StreamTimeouts(no_data=0)


async def test_the_clients_shorter_read_timeout_never_cuts_a_stream_over_loopback(
    nursery: trio.Nursery,
) -> None:
    # The client would give up after 0.2 s of silence; the adapter allows 5 s.
    engine = SimulatorEngine(SimulatorConfig(reply_tokens=2, token_rate=2.5))
    engine.faults.queue(Fault(first_byte_delay=0.5))
    url = await nursery.start(serve_simulator, engine)
    async with httpx.AsyncClient(timeout=httpx.Timeout(0.2)) as client:
        provider = OpenAICompatProvider(
            client,
            base_url=url,
            api_key=API_KEY,
            timeouts=StreamTimeouts(connect=5.0, read_idle=5.0),
        )
        with trio.fail_after(20):
            chunks = await collect(provider, _request())
    assert finish_of(chunks).reason == "completed", chunks


async def test_the_clients_write_and_pool_timeouts_still_apply() -> None:
    client = httpx.AsyncClient(timeout=httpx.Timeout(3.0, pool=1.5))
    provider = OpenAICompatProvider(client, base_url="http://simulator.test", api_key=None)
    sent = provider._request_timeout
    assert (sent.connect, sent.read, sent.write, sent.pool) == (3.0, None, 3.0, 1.5)
    await client.aclose()


async def test_faults_for_a_model_leave_other_models_alone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = SimulatorEngine(SimulatorConfig(profiles={"deepseek-chat": "v4", "faulty": "v4"}))
    engine.faults.for_model("faulty", Fault(status=503), Fault(status=500))
    provider = _mock_provider(engine)
    assert finish_of(await collect(provider, _request())).reason == "completed"
    assert _failure(await collect(provider, _request("faulty"))).code == "server_overloaded"
    assert engine.faults.pending == 1
    assert finish_of(await collect(provider, _request())).reason == "completed"
    assert _failure(await collect(provider, _request("faulty"))).code == "server_error"
    assert finish_of(await collect(provider, _request("faulty"))).reason == "completed"
    assert engine.faults.pending == 0


def test_a_trickle_needs_a_positive_keep_alive_interval() -> None:
    with pytest.raises(FaultError, match="keepalive_interval"):
        Fault(trickle_after_chunks=0, keepalive_interval=0)
    assert Fault.from_json({"trickle_after_chunks": 2}).trickle_after_chunks == 2


async def test_a_trickle_writes_only_keep_alives_after_its_events(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = SimulatorEngine()
    engine.faults.queue(Fault(trickle_after_chunks=2, keepalive_interval=1.0))
    provider = _mock_provider(engine, timeouts=StreamTimeouts(read_idle=5.0, no_data=3.5))
    chunks = await collect(provider, _request())
    assert len([c for c in chunks if not isinstance(c, FinishChunk)]) <= 2
    assert engine.statistics().disconnects == 1


async def test_a_request_cut_off_while_its_body_is_written_leaves_nothing_to_finalize(
    nursery: trio.Nursery,
) -> None:
    # A server that accepts and never reads: a 4 MB body cannot be written,
    # so the connect clock ends the request mid-write.
    async def hold(stream: trio.SocketStream) -> None:
        async with stream:
            await trio.sleep_forever()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    nursery.start_soon(trio.serve_listeners, hold, listeners)
    request = GenerateRequest(
        config={"provider": "sim", "model": "m"}, messages=(Message.user("x" * 4_000_000),)
    )
    async with httpx.AsyncClient() as client:
        provider = OpenAICompatProvider(
            client,
            base_url=f"http://127.0.0.1:{port}",
            api_key=None,
            timeouts=StreamTimeouts(connect=0.2),
        )
        for _ in range(3):
            assert _failure(await collect(provider, request)).code == "connect_timeout"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    assert [str(w.message) for w in caught] == []
