"""The provider actor: one per configured provider, shared by every agent that uses it.

It owns the provider's `httpx.AsyncClient` (explicit `Limits` and
`Timeout`), caps the requests in flight (DeepSeek limits concurrency per
account) and sets stalled requests aside so they cannot starve healthy ones
(`actors.providers.admission`). Callers hold a `Provider`-compatible handle
(the actor itself): `stream(request)` waits for admission, then streams the
request in the caller's own task, yielding chunks as they arrive: no task
and no channel per request, so a chunk costs no hop between tasks. A caller
that stops reading or is cancelled closes its HTTP stream at once; the actor
stopping ends every request it admitted (see `ProviderActor.serve`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import aclosing

import attrs
import httpx
import trio

from actors.latency import NO_SAMPLES, LatencySummary, LatencyWindow
from actors.providers.admission import Admission, StallPolicy
from actors.providers.base import ChunkBatch, Provider, ProviderError, chunk_batches, unbatched
from actors.providers.chunks import Chunk, Failure, FinishChunk
from actors.providers.http_client import HttpClientSettings, open_http_client
from actors.providers.request import GenerateRequest

ProviderFactory = Callable[[httpx.AsyncClient], Provider]
"""Builds the adapter over the actor's client (e.g. an OpenAI-compatible adapter)."""

_STOP_GRACE = 10.0
"""How long a stopping actor waits for the requests it cancelled to close their streams."""


@attrs.frozen(kw_only=True)
class ProviderActorStatistics:
    """Counters of a provider actor."""

    name: str
    queued: int
    """Requests waiting for admission."""
    in_flight: int
    max_in_flight: int
    completed: int
    failed: int
    cancelled: int
    stalled: int = 0
    """Requests in flight set aside as stalled now (they count in `in_flight` too)."""
    stalls: int = 0
    """Times a request was set aside as stalled, in total."""
    failures_by_code: Mapping[str, int] = attrs.field(factory=dict)
    """Failed requests (those the provider ended with an error) by failure code."""
    latency: LatencySummary = NO_SAMPLES
    """Start-to-finish time of the recent requests that completed or failed (the last 1,024)."""


@attrs.define(eq=False)
class _Serving:
    """One run of `ProviderActor.serve`: its adapter, its admission, its requests mid-step.

    `steps` holds the cancel scope of every admitted request that is waiting
    on the adapter right now (a request between two chunks, its caller busy
    elsewhere, has none); `stop` cancels them, and marks the run stopped so
    that no request takes another step.
    """

    provider: Provider
    admission: Admission
    stopped: bool = False
    steps: set[trio.CancelScope] = attrs.field(factory=set)
    _steps_ended: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)

    def stop(self) -> None:
        """Admit nothing more and cancel every step in progress."""
        self.stopped = True
        self.admission.close()
        for scope in self.steps:
            scope.cancel()

    def step_ended(self, scope: trio.CancelScope) -> None:
        self.steps.discard(scope)
        if self.stopped and not self.steps:
            self._steps_ended.unpark_all()

    async def wait_steps_ended(self) -> None:
        """Return once no request is mid-step (after `stop`, none starts another)."""
        while self.steps:
            await self._steps_ended.park()


@attrs.define(eq=False)
class ProviderActor:
    """Serves one provider's requests under a concurrency cap.

    Run it with `await nursery.start(actor.serve)`; until then (and after it
    stops) `stream` reports a `provider_unavailable` failure. Callers wait
    for admission in arrival order (each waiting caller is its own task:
    backpressure, nothing is buffered); at most `max_in_flight` progress at
    once, and up to `stall.max_stalled` more that produced no chunk for
    `stall.stall_after` seconds are set aside beside them (see
    `actors.providers.admission`). An admitted request streams in its
    caller's task: the adapter reads the next chunks only when the caller
    asks for them, so a slow reader slows its own stream only. The client is
    built by `open_http_client` from `timeout`, `limits`, `http2` and
    `pools` (see `HttpClientSettings`).
    """

    name: str
    factory: ProviderFactory
    timeout: httpx.Timeout = attrs.field(factory=lambda: httpx.Timeout(30.0, connect=10.0))
    limits: httpx.Limits = attrs.field(
        factory=lambda: httpx.Limits(max_connections=64, max_keepalive_connections=16)
    )
    http2: bool = False
    pools: int = 1
    max_in_flight: int = 16
    stall: StallPolicy = attrs.field(factory=StallPolicy)
    _serving: _Serving | None = attrs.field(default=None, init=False)
    _in_flight: int = attrs.field(default=0, init=False)
    _completed: int = attrs.field(default=0, init=False)
    _failed: int = attrs.field(default=0, init=False)
    _cancelled: int = attrs.field(default=0, init=False)
    _admission: Admission | None = attrs.field(default=None, init=False)
    _failures_by_code: dict[str, int] = attrs.field(factory=dict, init=False)
    _latency: LatencyWindow = attrs.field(factory=LatencyWindow, init=False)

    def __attrs_post_init__(self) -> None:
        if self.max_in_flight < 1:
            raise ProviderError(f"provider {self.name!r}: max_in_flight must be >= 1")
        if self.pools < 1:
            raise ProviderError(f"provider {self.name!r}: pools must be >= 1")

    @property
    def running(self) -> bool:
        """True while `serve` admits requests."""
        return self._serving is not None

    def statistics(self) -> ProviderActorStatistics:
        """Requests waiting and in flight (and how many are set aside), outcomes and latency."""
        admission = self._admission
        serving = self._serving
        return ProviderActorStatistics(
            name=self.name,
            queued=serving.admission.waiting if serving is not None else 0,
            in_flight=self._in_flight,
            max_in_flight=self.max_in_flight,
            completed=self._completed,
            failed=self._failed,
            cancelled=self._cancelled,
            stalled=admission.stalled if admission is not None else 0,
            stalls=admission.stalls if admission is not None else 0,
            failures_by_code=dict(self._failures_by_code),
            latency=self._latency.summary(),
        )

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the actor until cancelled; `task_status.started()` once it admits requests.

        Cancellation stops the actor: callers still waiting for admission,
        and every admitted request at its next step (at once for one waiting
        on the adapter, whose HTTP stream is closed), end their streams with
        a `provider_unavailable` failure. The actor waits (shielded, at most
        `_STOP_GRACE` seconds) for the requests it cancelled to close their
        streams, then closes the client; a request whose caller was busy
        between two chunks closes its own stream when it next reads.
        """
        admission = Admission(max_in_flight=self.max_in_flight, policy=self.stall)
        self._admission = admission
        settings = HttpClientSettings(
            timeout=self.timeout, limits=self.limits, http2=self.http2, pools=self.pools
        )
        async with open_http_client(settings) as client, trio.open_nursery() as nursery:
            serving = _Serving(provider=self.factory(client), admission=admission)
            nursery.start_soon(admission.watch)
            self._serving = serving
            try:
                task_status.started()
                await trio.sleep_forever()
            finally:
                self._serving = None
                serving.stop()
                with trio.move_on_after(_STOP_GRACE, shield=True):
                    await serving.wait_steps_ended()
                nursery.cancel_scope.cancel()

    def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
        """Admit `request` and yield its chunks one by one (see `stream_batches`)."""
        return unbatched(self.stream_batches(request))

    async def stream_batches(self, request: GenerateRequest) -> AsyncGenerator[ChunkBatch, None]:
        """Admit `request` and yield its chunks in arrival batches; the last ends with the one
        `FinishChunk`.

        The request waits for admission (in arrival order), then streams in
        the caller's task. Closing the generator early (or cancelling the
        caller) closes the request's HTTP stream. If the actor is not
        running, or stops before the request finished, the stream ends with
        a retryable `provider_unavailable` failure (so does a provider stream
        that ends without a finish).

        Cancellation: cancellable while waiting for admission (nothing is
        admitted then) and at every step of the stream.
        """
        serving = self._serving
        if serving is None:
            yield (self._unavailable("is not running"),)
            return
        ticket = await serving.admission.acquire()
        if ticket is None:
            yield (self._unavailable("stopped"),)
            return
        finished = False
        ended = "stopped before the request finished"
        started = trio.current_time()
        self._in_flight += 1
        try:
            async with aclosing(chunk_batches(serving.provider, request)) as batches:
                while not serving.stopped:
                    with trio.CancelScope() as step:
                        serving.steps.add(step)
                        try:
                            batch = await anext(batches, None)
                        finally:
                            serving.step_ended(step)
                    if step.cancelled_caught:
                        break  # the actor stopped
                    if batch is None:
                        finished = True
                        self._failed += 1
                        ended = "got a stream without a finish chunk from its provider"
                        break
                    ticket.progressed()
                    last = batch[-1]
                    if isinstance(last, FinishChunk):
                        finished = True
                        self._finished(last, started)
                    yield batch
                    if finished:
                        return
        finally:
            self._in_flight -= 1
            ticket.release()
            if not finished:
                self._cancelled += 1
        yield (self._unavailable(ended),)

    def _finished(self, finish: FinishChunk, started: float) -> None:
        """Count a request that reached its finish, and time it."""
        self._latency.record(trio.current_time() - started)
        if finish.failure is None:
            self._completed += 1
            return
        self._failed += 1
        code = finish.failure.code
        self._failures_by_code[code] = self._failures_by_code.get(code, 0) + 1

    def _unavailable(self, what: str) -> FinishChunk:
        return FinishChunk(
            reason="error",
            failure=Failure(
                code="provider_unavailable",
                message=f"provider actor {self.name!r} {what}",
                retryable=True,
            ),
        )
