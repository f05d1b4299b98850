"""The provider actor's stall budget: stalled requests give their slot back to healthy ones."""

from __future__ import annotations

from collections.abc import AsyncGenerator

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.providers import Chunk, FinishChunk, GenerateRequest, TextDelta
from actors.providers.actor import ProviderActor
from actors.providers.admission import StallPolicy


def _request(model: str) -> GenerateRequest:
    return GenerateRequest(config={"provider": "p", "model": model})


@attrs.define
class SometimesStalls:
    """Model "stall" waits for `resume` before its first chunk; every other model answers."""

    resume: trio.Event = attrs.field(factory=trio.Event)

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
        if request.config["model"] == "stall":
            await self.resume.wait()
        yield TextDelta(text="hello")
        yield FinishChunk(reason="completed")


async def _finish_time(actor: ProviderActor, model: str, times: list[float]) -> None:
    async for chunk in actor.stream(_request(model)):
        if isinstance(chunk, FinishChunk):
            assert chunk.reason == "completed"
    times.append(trio.current_time())


async def _run(
    policy: StallPolicy, *, max_in_flight: int, stalls: int
) -> tuple[float, ProviderActor, SometimesStalls]:
    """Start `stalls` stalled requests, then time a healthy one; resume the stalls at 100 s."""
    provider = SometimesStalls()
    actor = ProviderActor(
        name="p", factory=lambda client: provider, max_in_flight=max_in_flight, stall=policy
    )
    healthy: list[float] = []
    stalled: list[float] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.serve)
        async with trio.open_nursery() as callers:
            for _ in range(stalls):
                callers.start_soon(_finish_time, actor, "stall", stalled)
            await trio.testing.wait_all_tasks_blocked()
            start = trio.current_time()
            callers.start_soon(_finish_time, actor, "healthy", healthy)
            await trio.sleep(100)
            provider.resume.set()
        nursery.cancel_scope.cancel()
    assert len(stalled) == stalls
    return healthy[0] - start, actor, provider


async def test_stalled_requests_are_set_aside_so_a_healthy_one_runs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    waited, actor, _ = await _run(StallPolicy(stall_after=1.0), max_in_flight=2, stalls=2)
    assert waited == pytest.approx(1.0)
    stats = actor.statistics()
    assert (stats.stalls, stats.stalled, stats.completed) == (2, 0, 3)


async def test_without_a_stall_budget_stalls_block_the_cap(
    autojump_clock: trio.testing.MockClock,
) -> None:
    waited, actor, _ = await _run(
        StallPolicy(stall_after=1.0, max_stalled=0), max_in_flight=2, stalls=2
    )
    assert waited == pytest.approx(100.0)  # only once the stalls answered
    assert actor.statistics().stalls == 0


async def test_a_full_stall_budget_keeps_the_next_stall_in_its_slot(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # One slot, room to set aside one stall: the first stall is set aside at
    # 1 s, the second takes the slot and keeps it, as the budget is full.
    waited, actor, _ = await _run(
        StallPolicy(stall_after=1.0, max_stalled=1), max_in_flight=1, stalls=2
    )
    assert waited == pytest.approx(100.0)
    assert actor.statistics().stalls == 1
    # With room for both, the second is set aside at 2 s and the healthy one runs.
    waited, actor, _ = await _run(
        StallPolicy(stall_after=1.0, max_stalled=2), max_in_flight=1, stalls=2
    )
    assert waited == pytest.approx(2.0)
    assert actor.statistics().stalls == 2


async def test_statistics_count_requests_set_aside_now(
    autojump_clock: trio.testing.MockClock,
) -> None:
    provider = SometimesStalls()
    actor = ProviderActor(
        name="p", factory=lambda client: provider, stall=StallPolicy(stall_after=1.0)
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.serve)
        done: list[float] = []
        nursery.start_soon(_finish_time, actor, "stall", done)
        await trio.sleep(0.5)
        assert actor.statistics().stalled == 0
        await trio.sleep(1.0)
        assert (actor.statistics().stalled, actor.statistics().in_flight) == (1, 1)
        provider.resume.set()
        await trio.testing.wait_all_tasks_blocked()
        stats = actor.statistics()
        assert (stats.stalled, stats.in_flight, stats.completed, stats.stalls) == (0, 0, 1, 1)
        nursery.cancel_scope.cancel()


async def test_a_set_aside_request_that_resumes_counts_against_the_cap_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    @attrs.define
    class Slow:
        """Silent for 5 s, then streams two chunks a second for 10 s."""

        async def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
            if request.config["model"] == "slow":
                await trio.sleep(5)
                for _ in range(20):
                    yield TextDelta(text="x")
                    await trio.sleep(0.5)
            yield FinishChunk(reason="completed")

    actor = ProviderActor(
        name="p", factory=lambda client: Slow(), max_in_flight=1, stall=StallPolicy(stall_after=1)
    )
    times: list[float] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.serve)
        nursery.start_soon(_finish_time, actor, "slow", times)
        await trio.sleep(4)  # the slow one is set aside: a healthy request runs at once
        await _finish_time(actor, "healthy", times)
        assert times == [pytest.approx(4)]
        await trio.sleep(2)  # the slow one streams again and holds the only slot
        await _finish_time(actor, "healthy", times)
        assert times[-1] == pytest.approx(15)  # once the slow one finished
        nursery.cancel_scope.cancel()


def test_a_stall_policy_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="stall_after"):
        StallPolicy(stall_after=0)
    with pytest.raises(ValueError, match="max_stalled"):
        StallPolicy(max_stalled=-1)


@attrs.define
class Scripted:
    """Each request's model names its gaps: "0.5,3,0.1" waits 0.5 s, sends, waits 3 s, sends..."""

    actor: ProviderActor | None = None
    worst_open: int = 0
    worst_stalled: int = 0

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
        for gap in str(request.config["model"]).split(","):
            await trio.sleep(float(gap))
            self._sample()
            yield TextDelta(text="x")
        yield FinishChunk(reason="completed")

    def _sample(self) -> None:
        assert self.actor is not None
        stats = self.actor.statistics()
        self.worst_open = max(self.worst_open, stats.in_flight)
        self.worst_stalled = max(self.worst_stalled, stats.stalled)


@settings(max_examples=40, deadline=None)
@given(
    schedules=st.lists(
        st.lists(st.sampled_from([0.0, 0.05, 0.5, 1.5, 4.0]), min_size=1, max_size=5),
        min_size=1,
        max_size=12,
    ),
    max_in_flight=st.integers(min_value=1, max_value=4),
    max_stalled=st.integers(min_value=0, max_value=4),
)
def test_the_budget_bounds_open_and_stalled_requests_and_every_request_finishes(
    schedules: list[list[float]], max_in_flight: int, max_stalled: int
) -> None:
    provider = Scripted()
    actor = ProviderActor(
        name="p",
        factory=lambda client: provider,
        max_in_flight=max_in_flight,
        stall=StallPolicy(stall_after=1.0, max_stalled=max_stalled),
    )
    provider.actor = actor
    times: list[float] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(actor.serve)
            async with trio.open_nursery() as callers:
                for schedule in schedules:
                    model = ",".join(str(gap) for gap in schedule)
                    callers.start_soon(_finish_time, actor, model, times)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    stats = actor.statistics()
    assert len(times) == len(schedules) == stats.completed
    assert (stats.in_flight, stats.stalled, stats.queued) == (0, 0, 0)
    assert provider.worst_stalled <= max_stalled
    assert provider.worst_open <= max_in_flight + max_stalled


async def test_the_stall_watcher_keeps_no_checks_for_finished_requests(
    autojump_clock: trio.testing.MockClock,
) -> None:
    provider = SometimesStalls()
    actor = ProviderActor(
        name="p", factory=lambda client: provider, stall=StallPolicy(stall_after=1.0)
    )
    times: list[float] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.serve)
        admission = actor._admission
        assert admission is not None
        for _ in range(5):  # one at a time: each check is dropped as its request ends
            await _finish_time(actor, "healthy", times)
            await trio.testing.wait_all_tasks_blocked()  # the job's task releases its ticket
            assert admission._due == []
        async with trio.open_nursery() as callers:
            for _ in range(10):
                callers.start_soon(_finish_time, actor, "healthy", times)
        await trio.sleep(1.5)  # any check left behind has come due and gone
        assert admission._due == []
        assert actor.statistics().stalls == 0
        nursery.cancel_scope.cancel()
    assert len(times) == 15
