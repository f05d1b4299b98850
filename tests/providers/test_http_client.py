"""The provider actor's HTTP client: sharded pools and HTTP/2 to a real loopback server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

import httpx
import pytest
import trio

from actors.messages import Message
from actors.providers import FinishChunk, GenerateRequest, ProviderError
from actors.providers.actor import ProviderActor
from actors.providers.http_client import (
    HttpClientError,
    HttpClientSettings,
    ProviderClient,
    ShardedTransport,
    open_http_client,
)
from actors.providers.openai_compat import OpenAICompatProvider
from actors.providers.simulator import SimulatorEngine, serve_simulator


class _Body(httpx.AsyncByteStream):
    def __init__(self, data: bytes) -> None:
        self._data = data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._data


def _shard(name: str, fail: bool = False) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        if fail:
            raise httpx.ConnectError(f"shard {name} refuses", request=request)
        return httpx.Response(200, stream=_Body(name.encode()))

    return httpx.MockTransport(handler)


async def test_each_request_goes_to_the_shard_with_the_fewest_open_responses() -> None:
    transport = ShardedTransport([_shard("a"), _shard("b"), _shard("c")])
    async with httpx.AsyncClient(transport=transport) as client:
        first = await client.send(client.build_request("GET", "http://x/"), stream=True)
        second = await client.send(client.build_request("GET", "http://x/"), stream=True)
        assert transport.open_responses == (1, 1, 0)
        await first.aclose()
        assert transport.open_responses == (0, 1, 0)
        third = await client.send(client.build_request("GET", "http://x/"), stream=True)
        assert transport.open_responses == (1, 1, 0)
        # Reading a body to its end closes the response.
        assert (await third.aread(), transport.open_responses) == (b"a", (0, 1, 0))
        await second.aclose()
        assert transport.open_responses == (0, 0, 0)


async def test_a_request_that_fails_before_its_response_no_longer_counts_as_open() -> None:
    transport = ShardedTransport([_shard("a", fail=True), _shard("b")])
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(httpx.ConnectError, match="shard a refuses"):
            await client.get("http://x/")
        assert transport.open_responses == (0, 0)


def test_pool_limits_split_the_total_over_the_pools_rounding_up() -> None:
    settings = HttpClientSettings(
        limits=httpx.Limits(max_connections=10, max_keepalive_connections=None), pools=4
    )
    limits = settings.pool_limits()
    assert (limits.max_connections, limits.max_keepalive_connections) == (3, None)


def test_fewer_than_one_pool_is_refused_by_name() -> None:
    with pytest.raises(HttpClientError, match="pools must be >= 1"):
        HttpClientSettings(pools=0)
    with pytest.raises(ProviderError, match="'p': pools must be >= 1"):
        ProviderActor(
            name="p",
            factory=lambda client: OpenAICompatProvider(client, base_url="http://x", api_key=None),
            pools=0,
        )


async def test_the_default_client_is_a_provider_client_over_one_pool_with_the_given_limits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in (
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
    ):
        monkeypatch.delenv(name, raising=False)
    settings = HttpClientSettings(limits=httpx.Limits(max_connections=3))
    async with open_http_client(settings) as client:
        assert isinstance(client, ProviderClient)
        assert isinstance(client.transport, httpx.AsyncHTTPTransport)
        # httpx exposes no public view of the pool limits.
        assert client.transport._pool._max_connections == 3  # type: ignore[attr-defined]
    assert client.is_closed


async def test_with_a_proxy_in_the_environment_the_default_client_is_httpxs_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    settings = HttpClientSettings(limits=httpx.Limits(max_connections=3))
    async with open_http_client(settings) as client:
        # httpx routes through the proxy only when it builds its transports itself.
        assert not isinstance(client, ProviderClient)
        assert client._transport._pool._max_connections == 3  # type: ignore[attr-defined]
        assert any(mount is not None for mount in client._mounts.values())
    assert client.is_closed


@pytest.mark.parametrize(
    ("http2", "pools", "version"),
    [(True, 1, "HTTP/2"), (True, 3, "HTTP/2"), (False, 3, "HTTP/1.1")],
)
async def test_requests_reach_a_real_loopback_server_over_the_configured_http(
    http2: bool, pools: int, version: str
) -> None:
    engine = SimulatorEngine()
    settings = HttpClientSettings(http2=http2, pools=pools)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_simulator, engine)
        async with open_http_client(settings) as client:
            response = await client.get(
                url + "/models", headers={"authorization": "Bearer sk-simulator"}
            )
            assert (response.status_code, response.http_version) == (200, version)
        nursery.cancel_scope.cancel()


async def test_the_provider_actor_streams_many_requests_over_http2() -> None:
    engine = SimulatorEngine()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_simulator, engine)
        actor = ProviderActor(
            name="sim",
            factory=lambda client: OpenAICompatProvider(
                client, base_url=url, api_key="sk-simulator"
            ),
            http2=True,
            pools=2,
            max_in_flight=20,
        )
        await nursery.start(actor.serve)
        finishes: list[FinishChunk] = []

        async def one(index: int) -> None:
            request = GenerateRequest(
                config={"provider": "sim", "model": "deepseek-chat"},
                messages=[Message.user(f"request {index}")],
            )
            async with aclosing(actor.stream(request)) as chunks:
                async for chunk in chunks:
                    if isinstance(chunk, FinishChunk):
                        finishes.append(chunk)

        with trio.fail_after(30):
            async with trio.open_nursery() as callers:
                for index in range(40):
                    callers.start_soon(one, index)
        assert [f.reason for f in finishes] == ["completed"] * 40
        nursery.cancel_scope.cancel()


async def test_a_response_is_closed_before_its_finish_is_handed_over() -> None:
    engine = SimulatorEngine()
    settings = HttpClientSettings(pools=2)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_simulator, engine)
        async with open_http_client(settings) as client:
            provider = OpenAICompatProvider(client, base_url=url, api_key="sk-simulator")
            assert isinstance(client, ProviderClient)
            transport = client.transport
            assert isinstance(transport, ShardedTransport)
            for index in range(3):
                request = GenerateRequest(
                    config={"provider": "sim", "model": "deepseek-chat"},
                    messages=[Message.user(f"request {index}")],
                )
                async with aclosing(provider.stream_batches(request)) as batches:
                    async for batch in batches:
                        if isinstance(batch[-1], FinishChunk):
                            # Handed over with the response closed: nothing open in any pool.
                            assert transport.open_responses == (0, 0)
                            break
                    else:
                        raise AssertionError("no finish")
        nursery.cancel_scope.cancel()
