"""How a provider actor's `httpx.AsyncClient` is built: pools, HTTP version, limits.

httpcore's connection pool scans every pooled connection and every waiting
request each time a request starts or ends, so with hundreds of requests in
flight through one pool the cost of a request grows with the pool and a
burst costs quadratic time. Two library-based ways past it, combinable:

- `http2=True`: HTTP/2 only (prior knowledge on `http://`, ALPN on
  `https://`), so many requests share a few multiplexed connections and the
  pool stays small. Needs a server that speaks HTTP/2 (Hypercorn serves it
  in the clear on loopback; DeepSeek's API serves it over TLS).
- `pools=K`: K independent httpx transports, each with `1/K` of the
  limits; each request goes to the transport with the fewest responses
  open, so each pool's scan covers at most `1/K` of the connections.

The client is a `ProviderClient`: an `httpx.AsyncClient` that names the
transport it was built with, so a provider adapter can hand each request
straight to that transport (`httpx.AsyncBaseTransport.handle_async_request`)
and skip the client's per-request layers (auth, redirects, cookies, event
hooks), about a quarter of httpx's CPU per request. With the defaults
(`http2=False`, `pools=1`) that transport is one `httpx.AsyncHTTPTransport`
with the given limits, which is what `httpx.AsyncClient(limits=...)` builds;
when the environment names a proxy (`HTTP_PROXY` and the like, which httpx
honours only for a client that builds its own transports), the default
client is instead a plain `httpx.AsyncClient(timeout=..., limits=...)`, so
requests still go through the proxy. HTTP/2 is not the default
because httpcore does not reset the stream of a cancelled request
(encode/httpcore#943, #1022): the connection keeps counting it as open, so
cancellations (timeouts, cancelled turns) can stall or fail the other
requests multiplexed on it. Sharded HTTP/1.1 pools have no such coupling.
"""

from __future__ import annotations

import math
import urllib.request
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import attrs
import httpx


class HttpClientError(ValueError):
    """An HTTP client setting is out of range; the message names it."""


def _at_least_one(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise HttpClientError(f"{attribute.name} must be >= 1, got {value}")


@attrs.frozen(kw_only=True)
class HttpClientSettings:
    """What a provider actor's HTTP client looks like.

    Attributes:
        timeout: The client's timeouts.
        limits: Connection limits, in total over all pools (each of `pools`
            gets its ceiling share of `max_connections` and
            `max_keepalive_connections`).
        http2: Speak HTTP/2 only (see the module docstring).
        pools: How many independent connection pools to spread requests over.
    """

    timeout: httpx.Timeout = attrs.field(factory=lambda: httpx.Timeout(30.0, connect=10.0))
    limits: httpx.Limits = attrs.field(
        factory=lambda: httpx.Limits(max_connections=64, max_keepalive_connections=16)
    )
    http2: bool = False
    pools: int = attrs.field(default=1, validator=_at_least_one)

    def pool_limits(self) -> httpx.Limits:
        """The limits of one of the `pools` pools."""

        def share(total: int | None) -> int | None:
            return None if total is None else max(1, math.ceil(total / self.pools))

        return httpx.Limits(
            max_connections=share(self.limits.max_connections),
            max_keepalive_connections=share(self.limits.max_keepalive_connections),
            keepalive_expiry=self.limits.keepalive_expiry,
        )


class ProviderClient(httpx.AsyncClient):
    """An `httpx.AsyncClient` built over `transport`, which adapters may drive directly.

    Everything sent through the client's own methods behaves as in any
    `httpx.AsyncClient` over that transport. An adapter that sends a request
    with `transport.handle_async_request` instead skips the client's auth,
    redirects, cookies and event hooks; `open_http_client` builds the client
    with none of those, so nothing is lost there.

    Args:
        transport: The transport every request goes through.
        timeout: The client's timeouts.
    """

    def __init__(self, *, transport: httpx.AsyncBaseTransport, timeout: httpx.Timeout) -> None:
        super().__init__(transport=transport, timeout=timeout)
        self.transport = transport


@asynccontextmanager
async def open_http_client(settings: HttpClientSettings) -> AsyncIterator[httpx.AsyncClient]:
    """An `httpx.AsyncClient` built from `settings`, closed (with its pools) on exit.

    A `ProviderClient` unless the defaults are used while the environment
    names a proxy (see the module docstring).

    Cancellation: closing the client on exit is what httpx does on
    `aclose()`; a cancelled exit still closes every pool.
    """
    if settings.pools == 1 and not settings.http2:
        if urllib.request.getproxies():
            async with httpx.AsyncClient(
                timeout=settings.timeout, limits=settings.limits
            ) as client:
                yield client
            return
        single = httpx.AsyncHTTPTransport(limits=settings.limits)
        async with ProviderClient(transport=single, timeout=settings.timeout) as client:
            yield client
        return
    # One TLS context for every pool: building one loads the CA bundle (tens of ms).
    ssl_context = httpx.create_ssl_context()
    transports = [
        httpx.AsyncHTTPTransport(
            verify=ssl_context,
            limits=settings.pool_limits(),
            http1=not settings.http2,
            http2=settings.http2,
        )
        for _ in range(settings.pools)
    ]
    transport: httpx.AsyncBaseTransport = (
        transports[0] if len(transports) == 1 else ShardedTransport(transports)
    )
    async with ProviderClient(transport=transport, timeout=settings.timeout) as client:
        yield client


class ShardedTransport(httpx.AsyncBaseTransport):
    """Spreads requests over several httpx transports, each with its own pool.

    Each request goes to the transport with the fewest responses open (the
    first such one), and counts as open until its response is closed, so
    long event streams and short requests balance alike. Closing this
    transport closes every shard.

    Args:
        shards: The transports; at least one.
    """

    def __init__(self, shards: Sequence[httpx.AsyncBaseTransport]) -> None:
        if not shards:
            raise HttpClientError("a sharded transport needs at least one shard")
        self._shards = tuple(shards)
        self._open = [0] * len(shards)

    @property
    def open_responses(self) -> tuple[int, ...]:
        """Responses open per shard, in shard order."""
        return tuple(self._open)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send `request` through the least-loaded shard.

        Cancellation and errors: as the shard's; a request that fails or is
        cancelled before its response no longer counts as open.
        """
        index = self._open.index(min(self._open))
        self._open[index] += 1
        sent = False
        try:
            response = await self._shards[index].handle_async_request(request)
            sent = True
        finally:
            if not sent:
                self._open[index] -= 1
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        response.stream = _CountedStream(stream, self._open, index)
        return response

    async def aclose(self) -> None:
        """Close every shard."""
        for shard in self._shards:
            await shard.aclose()


class _CountedStream(httpx.AsyncByteStream):
    """A response body that stops counting as open once closed (once)."""

    def __init__(self, inner: httpx.AsyncByteStream, counts: list[int], index: int) -> None:
        self._inner = inner
        self._counts = counts
        self._index = index
        self._closed = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._inner.__aiter__()

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._counts[self._index] -= 1
        await self._inner.aclose()
