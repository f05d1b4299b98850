"""The `Provider` protocol: how the agent loop talks to a model."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol, runtime_checkable

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
