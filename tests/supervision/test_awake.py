"""`AwakeAgents`: the bound on awake agents, and the allocator trim after a burst, debounced.

The trim itself is glibc's `malloc_trim` where the C library has it
(`find_malloc_trim`); these tests give `AwakeAgents` a recording stand-in,
and check the lookup's platform and missing-symbol paths separately.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable

import pytest
import trio
import trio.testing

import supervision.awake
import supervision.runtime
from actors.agent import AgentOptions
from actors.prompt import SystemPrompt
from actors.providers import Reply, ScriptedProvider
from supervision import AwakeAgents, open_runtime
from supervision.awake import find_malloc_trim


class Trims:
    """A stand-in for `malloc_trim`: records the (Trio) time of each call, made in a thread."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.done = trio.Event()

    def __call__(self) -> int:
        self.times.append(trio.from_thread.run_sync(trio.current_time))
        trio.from_thread.run_sync(self.done.set)
        return 1


async def _admitted(awake: AwakeAgents) -> None:
    """Wait until `awake` admits a caller (which then holds a slot until `release`)."""
    admitted = trio.Event()

    def start() -> bool:
        admitted.set()
        return True

    awake.admit(start)
    await admitted.wait()


async def _awake_for(awake: AwakeAgents, seconds: float) -> None:
    await _admitted(awake)
    try:
        await trio.sleep(seconds)
    finally:
        awake.release()


async def test_one_trim_after_a_burst_once_all_slept_and_it_stayed_quiet(
    autojump_clock: trio.testing.MockClock,
) -> None:
    trims = Trims()
    awake = AwakeAgents(trim=trims, trim_after=3, quiet=0.5)
    async with trio.open_nursery() as nursery:
        await nursery.start(awake.serve)
        for seconds in (1.0, 2.0, 3.0):
            nursery.start_soon(_awake_for, awake, seconds)
        await trio.sleep(0.1)
        assert awake.statistics().awake == 3
        await trims.done.wait()
        assert trims.times == [pytest.approx(3.5)]  # the last slept at 3.0, then 0.5 quiet
        await trio.sleep(100)
        assert trims.times == [pytest.approx(3.5)] and awake.statistics().trims == 1
        nursery.cancel_scope.cancel()


async def test_no_trim_while_one_is_awake_nor_after_too_few_slept(
    autojump_clock: trio.testing.MockClock,
) -> None:
    trims = Trims()
    awake = AwakeAgents(trim=trims, trim_after=3, quiet=0.5)
    async with trio.open_nursery() as nursery:
        await nursery.start(awake.serve)
        nursery.start_soon(_awake_for, awake, 50.0)  # stays awake
        for _ in range(5):
            await _awake_for(awake, 1.0)
        await trio.sleep(20)
        assert trims.times == []  # five slept, but one is still awake
        await trims.done.wait()  # (no other deadline: the clock waits for the thread)
        assert trims.times == [pytest.approx(50.5)]
        trims.done = trio.Event()
        for _ in range(2):  # fewer than trim_after since that trim
            await _awake_for(awake, 1.0)
        await trio.sleep(100)
        assert len(trims.times) == 1
        await _awake_for(awake, 1.0)  # the third
        await trims.done.wait()
        assert len(trims.times) == 2
        nursery.cancel_scope.cancel()


async def test_a_wake_in_the_quiet_period_postpones_the_trim(
    autojump_clock: trio.testing.MockClock,
) -> None:
    trims = Trims()
    awake = AwakeAgents(trim=trims, trim_after=1, quiet=1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(awake.serve)
        await _awake_for(awake, 1.0)  # all asleep at 1.0
        await trio.sleep(0.5)
        await _awake_for(awake, 0.25)  # woke within the quiet period; asleep at 1.75
        await trims.done.wait()
        assert trims.times == [pytest.approx(2.75)]
        nursery.cancel_scope.cancel()


async def test_the_limit_bounds_how_many_are_awake(
    autojump_clock: trio.testing.MockClock,
) -> None:
    awake = AwakeAgents(limit=2, trim=None)
    order: list[int] = []
    seen: list[int] = []

    async def agent(index: int) -> None:
        await _admitted(awake)
        order.append(index)
        seen.append(awake.statistics().awake)
        await trio.sleep(1)
        awake.release()

    async with trio.open_nursery() as nursery:
        for index in range(5):
            nursery.start_soon(agent, index)
            await trio.testing.wait_all_tasks_blocked()
    assert order[:2] == [0, 1] and sorted(order) == [0, 1, 2, 3, 4] and max(seen) == 2
    assert trio.current_time() == pytest.approx(3.0)
    stats = awake.statistics()
    assert (stats.awake, stats.waiting, stats.limit, stats.trims, stats.trim_supported) == (
        0,
        0,
        2,
        0,
        False,
    )


async def test_a_free_slot_admits_at_once_and_others_wait_in_order_as_callbacks() -> None:
    awake = AwakeAgents(limit=1, trim=None)
    started: list[str] = []

    def start(name: str) -> Callable[[], bool]:
        def callback() -> bool:
            started.append(name)
            return True

        return callback

    awake.admit(start("a"))
    assert started == ["a"]  # synchronously: no task, no scheduling point
    b, c = start("b"), start("c")
    awake.admit(b)
    awake.admit(c)
    stats = awake.statistics()
    assert (stats.awake, stats.waiting, started) == (1, 2, ["a"])
    awake.release()
    assert started == ["a", "b"] and awake.statistics().waiting == 1
    awake.release()
    awake.release()
    assert started == ["a", "b", "c"]
    assert (awake.statistics().awake, awake.statistics().waiting) == (0, 0)


async def test_a_declined_slot_goes_to_the_next_waiting() -> None:
    awake = AwakeAgents(limit=1, trim=None)
    started: list[str] = []

    def first() -> bool:
        started.append("first")
        return True

    def declines() -> bool:
        started.append("declines")
        return False

    def last() -> bool:
        started.append("last")
        return True

    awake.admit(first)
    awake.admit(declines)
    awake.admit(last)
    awake.release()  # "declines" takes the slot and gives it back: "last" gets it
    assert started == ["first", "declines", "last"]
    assert (awake.statistics().awake, awake.statistics().waiting) == (1, 0)
    awake.release()
    awake.admit(declines)  # a free slot declined at once is free again
    assert (awake.statistics().awake, awake.statistics().waiting) == (0, 0)


async def test_without_a_trim_serve_only_waits() -> None:
    awake = AwakeAgents(trim=None, trim_after=1, quiet=0.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(awake.serve)
        await _awake_for(awake, 0.0)
        await trio.testing.wait_all_tasks_blocked()
        assert awake.statistics().trims == 0
        nursery.cancel_scope.cancel()


def test_the_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_awake must be at least 1, got 0"):
        AwakeAgents(limit=0)


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's malloc_trim is looked up on Linux")
def test_malloc_trim_is_found_in_glibc_and_runs() -> None:
    trim = find_malloc_trim()
    assert trim is not None
    assert trim() in (0, 1)  # 1: memory was given back


def test_no_malloc_trim_off_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervision.awake.sys, "platform", "darwin")
    assert find_malloc_trim() is None


def test_no_malloc_trim_when_the_c_library_lacks_it_or_cannot_be_opened(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(supervision.awake.sys, "platform", "linux")

    class MuslLike:
        """A C library without a `malloc_trim` attribute, as musl's."""

        def __init__(self, name: str | None) -> None:
            self.name = name

    monkeypatch.setattr(supervision.awake.ctypes, "CDLL", MuslLike)
    assert find_malloc_trim() is None

    def unopenable(name: str | None) -> ctypes.CDLL:
        raise OSError("no C library here")

    monkeypatch.setattr(supervision.awake.ctypes, "CDLL", unopenable)
    assert find_malloc_trim() is None


async def _burst(trim: Callable[[], object] | None, *, trim_memory: bool = True) -> list[str]:
    sessions = supervision.awake.TRIM_AFTER_SLEEPS
    provider = ScriptedProvider([Reply.text(f"r{n}") for n in range(sessions)])
    options = AgentOptions(model="m", hibernate=True)
    async with open_runtime(
        system_prompt=SystemPrompt(), providers={"default": provider}, trim_memory=trim_memory
    ) as rt:
        agents = [(await rt.start_agent(options=options)).value for _ in range(sessions)]
        for agent in agents:
            agent.followup("hello")
        for agent in agents:
            await agent.when_idle()
        if isinstance(trim, Trims):
            await trim.done.wait()
        else:
            await trio.sleep(supervision.awake.TRIM_QUIET_SECONDS * 4)
        stats = rt.statistics()
        assert stats.awake.awake == 0
        return [*stats.services, f"trims={stats.awake.trims}"]


async def test_the_runtime_trims_once_after_a_burst_of_hibernations(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    trims = Trims()
    monkeypatch.setattr(supervision.runtime, "find_malloc_trim", lambda: trims)
    seen = await _burst(trims)
    assert "awake" in seen and seen[-1] == "trims=1" and len(trims.times) == 1


async def test_the_runtime_does_not_trim_where_it_cannot_or_when_told_not_to(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    monkeypatch.setattr(supervision.runtime, "find_malloc_trim", lambda: None)
    seen = await _burst(None)
    assert "awake" not in seen and seen[-1] == "trims=0"
    trims = Trims()
    monkeypatch.setattr(supervision.runtime, "find_malloc_trim", lambda: trims)
    seen = await _burst(None, trim_memory=False)
    assert "awake" not in seen and seen[-1] == "trims=0" and trims.times == []
