"""The provider actor: one per configured provider, shared by every agent that uses it.

It owns the provider's `httpx.AsyncClient` (explicit `Limits` and
`Timeout`), caps the requests in flight (DeepSeek limits concurrency per
account), sets stalled requests aside so they cannot starve healthy ones
(`actors.providers.admission`), and streams each request's chunks to its
caller over a bounded channel. Callers hold a `Provider`-compatible handle
(the actor itself): `stream(request)` queues a job and yields chunks as they
arrive. A caller that stops reading or is cancelled cancels its job, which
closes the HTTP stream at once.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import aclosing

import attrs
import httpx
import trio

from actors.latency import NO_SAMPLES, LatencySummary, LatencyWindow
from actors.providers.admission import Admission, StallPolicy, Ticket
from actors.providers.base import ChunkBatch, Provider, ProviderError, chunk_batches, unbatched
from actors.providers.chunks import Chunk, Failure, FinishChunk
from actors.providers.http_client import HttpClientSettings, open_http_client
from actors.providers.request import GenerateRequest

ProviderFactory = Callable[[httpx.AsyncClient], Provider]
"""Builds the adapter over the actor's client (e.g. an OpenAI-compatible adapter)."""


@attrs.frozen(kw_only=True)
class ProviderActorStatistics:
    """Counters of a provider actor."""

    name: str
    queued: int
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
class _Job:
    request: GenerateRequest
    chunks: trio.MemorySendChannel[ChunkBatch]
    cancel_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)


@attrs.define(eq=False)
class ProviderActor:
    """Serves one provider's requests under a concurrency cap.

    Run it with `await nursery.start(actor.serve)`; until then (and after it
    stops) `stream` reports a `provider_unavailable` failure. Jobs wait in a
    bounded queue (`queue_size`; a full queue blocks the caller:
    backpressure); at most `max_in_flight` progress at once, and up to
    `stall.max_stalled` more that produced no chunk for `stall.stall_after`
    seconds are set aside beside them (see `actors.providers.admission`);
    each job's chunks travel over a channel of `chunk_buffer` batches (the
    chunks of one network read travel together; a slow reader slows its own
    stream only). The client is built by `open_http_client`
    from `timeout`, `limits`, `http2` and `pools` (see `HttpClientSettings`).
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
    queue_size: int = 256
    chunk_buffer: int = 64
    _jobs_send: trio.MemorySendChannel[_Job] | None = attrs.field(default=None, init=False)
    _queued: int = attrs.field(default=0, init=False)
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
        """True while `serve` accepts jobs."""
        return self._jobs_send is not None

    def statistics(self) -> ProviderActorStatistics:
        """Queue depth, requests in flight (and how many are set aside), outcomes and latency."""
        admission = self._admission
        return ProviderActorStatistics(
            name=self.name,
            queued=self._queued,
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
        """Run the actor until cancelled; `task_status.started()` once it accepts jobs.

        A job is taken from the queue only when a slot in flight is free
        (fewer than `max_in_flight` jobs progressing), so waiting jobs stay in
        the bounded queue (and count as `queued`).
        Cancellation stops every job in flight and every queued job (their
        callers see the stream end with a `provider_unavailable` failure) and
        closes the client.
        """
        send, receive = trio.open_memory_channel[_Job](self.queue_size)
        admission = Admission(max_in_flight=self.max_in_flight, policy=self.stall)
        self._admission = admission
        settings = HttpClientSettings(
            timeout=self.timeout, limits=self.limits, http2=self.http2, pools=self.pools
        )
        async with open_http_client(settings) as client, trio.open_nursery() as nursery:
            provider = self.factory(client)
            nursery.start_soon(admission.watch)
            self._jobs_send = send
            try:
                task_status.started()
                while True:
                    await admission.wait_slot()
                    job = await receive.receive()
                    started = False
                    try:
                        # Immediate unless a set-aside job resumed meanwhile.
                        ticket = await admission.acquire()
                        nursery.start_soon(self._run_job, provider, ticket, job)
                        started = True
                    finally:
                        self._queued -= 1
                        if not started:
                            job.chunks.close()
            finally:
                self._jobs_send = None
                # Jobs still queued end at once: their callers are waiting on them.
                while True:
                    try:
                        job = receive.receive_nowait()
                    except trio.WouldBlock:
                        break
                    self._queued -= 1
                    job.chunks.close()
                receive.close()
                nursery.cancel_scope.cancel()

    async def _run_job(self, provider: Provider, ticket: Ticket, job: _Job) -> None:
        outcome = "cancelled"
        started = trio.current_time()
        try:
            async with job.chunks:
                with job.cancel_scope:
                    self._in_flight += 1
                    try:
                        outcome = await self._pump(provider, job, ticket)
                    finally:
                        self._in_flight -= 1
        finally:
            ticket.release()
            # Counted here: the actor stopping may cancel a job that has already finished.
            if outcome == "completed":
                self._completed += 1
                self._latency.record(trio.current_time() - started)
            elif outcome == "failed":
                self._failed += 1
                self._latency.record(trio.current_time() - started)
            else:
                self._cancelled += 1

    async def _pump(self, provider: Provider, job: _Job, ticket: Ticket) -> str:
        outcome = "failed"
        try:
            async with aclosing(chunk_batches(provider, job.request)) as batches:
                async for batch in batches:
                    ticket.progressed()
                    last = batch[-1]
                    if isinstance(last, FinishChunk):
                        outcome = "failed" if last.reason == "error" else "completed"
                        if last.failure is not None:
                            code = last.failure.code
                            self._failures_by_code[code] = self._failures_by_code.get(code, 0) + 1
                    await job.chunks.send(batch)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return "cancelled"
        return outcome

    def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
        """Queue `request` and yield its chunks one by one (see `stream_batches`)."""
        return unbatched(self.stream_batches(request))

    async def stream_batches(self, request: GenerateRequest) -> AsyncGenerator[ChunkBatch, None]:
        """Queue `request` and yield its chunks in arrival batches; the last ends with the one
        `FinishChunk`.

        Closing the generator early (or cancelling the caller) cancels the
        job and its HTTP stream. If the actor is not running, or stops
        mid-stream, the stream ends with a retryable `provider_unavailable`
        failure.
        """
        send_jobs = self._jobs_send
        if send_jobs is None:
            yield (self._unavailable("is not running"),)
            return
        chunk_send, chunk_receive = trio.open_memory_channel[ChunkBatch](self.chunk_buffer)
        job = _Job(request=request, chunks=chunk_send)
        self._queued += 1
        sent = False
        try:
            await send_jobs.send(job)
            sent = True
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            if not sent:
                self._queued -= 1
        if not sent:
            yield (self._unavailable("stopped"),)
            return
        try:
            async with chunk_receive:
                async for batch in chunk_receive:
                    yield batch
                    if isinstance(batch[-1], FinishChunk):
                        return
            yield (self._unavailable("stopped before the request finished"),)
        finally:
            job.cancel_scope.cancel()

    def _unavailable(self, what: str) -> FinishChunk:
        return FinishChunk(
            reason="error",
            failure=Failure(
                code="provider_unavailable",
                message=f"provider actor {self.name!r} {what}",
                retryable=True,
            ),
        )
