"""The `Provider` protocol: how the agent loop talks to a model."""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Protocol, cast, runtime_checkable

from actors.providers.chunks import Chunk
from actors.providers.request import GenerateRequest


class ProviderError(Exception):
    """A provider was misconfigured or misused (not a request failure: those are `Failure` data)."""


@runtime_checkable
class Provider(Protocol):
    """Streams one model request as chunks.

    `stream(request)` returns an async generator that yields text,
    reasoning, tool-call-delta and usage chunks and ends with exactly one
    `FinishChunk`. Request failures (HTTP errors, resets, timeouts) are
    reported as `FinishChunk(reason="error", failure=...)`, never raised.
    Closing the generator early (the caller was cancelled or stopped
    reading) must release the underlying request promptly.
    """

    def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
        """Start the request and yield its chunks; see the class docstring."""
        ...


ChunkBatch = tuple[Chunk, ...]
"""Chunks that arrived together (one network read), in order; never empty."""


@runtime_checkable
class BatchingProvider(Provider, Protocol):
    """A `Provider` that can also hand over its chunks in the batches they arrived in.

    `stream_batches(request)` yields non-empty tuples whose concatenation
    is exactly what `stream(request)` yields (ending with the one
    `FinishChunk`), with the same failure and closing behaviour. A consumer
    that logs chunks can then write each batch as one store append instead
    of one per chunk.
    """

    def stream_batches(self, request: GenerateRequest) -> AsyncGenerator[ChunkBatch, None]:
        """Start the request and yield its chunks in arrival batches; see the class docstring."""
        ...


def chunk_batches(provider: Provider, request: GenerateRequest) -> AsyncGenerator[ChunkBatch, None]:
    """`provider`'s chunks for `request` in batches: its own if it batches, else one per chunk.

    A provider's own `stream_batches` is used only when no subclass
    overrides `stream` below the class that defines it (so a subclass that
    changes `stream` is honoured). Use it under `contextlib.aclosing`;
    closing it closes the provider's stream.
    """
    if _batches_natively(type(provider)):
        return cast(BatchingProvider, provider).stream_batches(request)
    return _singletons(provider, request)


@functools.cache
def _batches_natively(cls: type) -> bool:
    """True when `cls.stream_batches` exists and is defined at or below `cls.stream`'s class."""
    owner = {
        name: next((base for base in cls.__mro__ if name in vars(base)), None)
        for name in ("stream", "stream_batches")
    }
    batches, stream = owner["stream_batches"], owner["stream"]
    return batches is not None and (stream is None or issubclass(batches, stream))


async def _singletons(
    provider: Provider, request: GenerateRequest
) -> AsyncGenerator[ChunkBatch, None]:
    async with aclosing(provider.stream(request)) as chunks:
        async for chunk in chunks:
            yield (chunk,)


async def unbatched(batches: AsyncGenerator[ChunkBatch, None]) -> AsyncGenerator[Chunk, None]:
    """The chunks of `batches` one by one; closing this closes `batches`."""
    async with aclosing(batches) as stream:
        async for batch in stream:
            for chunk in batch:
                yield chunk
