"""Supervisors: restart types, strategies, restart intensity, start and shutdown."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

from supervision import (
    ChildHost,
    ChildSpec,
    ChildStartError,
    DuplicateChildError,
    HostedChildSpec,
    NotRunningError,
    RestartIntensityError,
    Supervisor,
)
from tests.supervision.helpers import Control, WorkerCrash, serving, worker


async def test_permanent_child_is_restarted_after_a_crash(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[str] = []
    async with serving(Supervisor(name="s")) as supervisor:
        child = await supervisor.start_child(ChildSpec(id="a", start=worker("a", log)))
        child.value.crash()
        control = await child.wait_running(incarnation=1)
        assert (control.incarnation, child.restarts) == (1, 1)
    assert log[:3] == ["start a", "stop a", "start a"]


async def test_permanent_child_is_restarted_after_a_normal_exit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[str] = []
    async with serving(Supervisor(name="s")) as supervisor:
        child = await supervisor.start_child(ChildSpec(id="a", start=worker("a", log)))
        child.value.finish()
        control = await child.wait_running(incarnation=1)
        assert control.incarnation == 1
        assert supervisor.statistics().crashes == 0


async def test_transient_child_is_not_restarted_after_a_normal_exit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[str] = []
    async with serving(Supervisor(name="s")) as supervisor:
        spec = ChildSpec(id="a", start=worker("a", log), restart="transient")
        child = await supervisor.start_child(spec)
        child.value.finish()
        with trio.fail_after(1):  # a restarted child would never stop: fail, don't hang
            exit = await child.wait_stopped()
        assert (exit.reason, exit.error) == ("normal", None)
        assert supervisor.children() == []
    assert log == ["start a", "stop a"]


async def test_transient_child_is_restarted_after_a_crash(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[str] = []
    async with serving(Supervisor(name="s")) as supervisor:
        spec = ChildSpec(id="a", start=worker("a", log), restart="transient")
        child = await supervisor.start_child(spec)
        child.value.crash()
        control = await child.wait_running(incarnation=1)
        assert control.incarnation == 1


async def test_temporary_child_is_never_restarted(autojump_clock: trio.testing.MockClock) -> None:
    log: list[str] = []
    async with serving(Supervisor(name="s")) as supervisor:
        spec = ChildSpec(id="a", start=worker("a", log), restart="temporary")
        child = await supervisor.start_child(spec)
        child.value.crash()
        exit = await child.wait_stopped()
        assert exit.reason == "crashed"
        assert isinstance(exit.error, WorkerCrash)
        assert (child.restarts, supervisor.children()) == (0, [])


async def _three_children(supervisor: Supervisor, log: list[str]) -> list[Control]:
    controls = []
    for name in "abc":
        child = await supervisor.start_child(ChildSpec(id=name, start=worker(name, log)))
        controls.append(child.value)
    return controls


async def test_one_for_one_restarts_only_the_crashed_child(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[str] = []
    async with serving(Supervisor(name="s", strategy="one_for_one")) as supervisor:
        _, b, _ = await _three_children(supervisor, log)
        b.crash()
        await supervisor.child("b").wait_running(incarnation=1)
        assert [c.incarnation for c in supervisor.children()] == [0, 1, 0]
        assert log[3:] == ["stop b", "start b"]


async def test_one_for_all_restarts_every_child(autojump_clock: trio.testing.MockClock) -> None:
    log: list[str] = []
    async with serving(Supervisor(name="s", strategy="one_for_all")) as supervisor:
        _, b, _ = await _three_children(supervisor, log)
        b.crash()
        await supervisor.child("c").wait_running(incarnation=1)
        assert [c.incarnation for c in supervisor.children()] == [1, 1, 1]
        assert log[3:] == ["stop b", "stop c", "stop a", "start a", "start b", "start c"]
        assert supervisor.statistics().restarts == 1


async def test_rest_for_one_restarts_the_crashed_child_and_those_started_after_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[str] = []
    async with serving(Supervisor(name="s", strategy="rest_for_one")) as supervisor:
        _, b, _ = await _three_children(supervisor, log)
        b.crash()
        await supervisor.child("c").wait_running(incarnation=1)
        assert [c.incarnation for c in supervisor.children()] == [0, 1, 1]
        assert log[3:] == ["stop b", "stop c", "start b", "start c"]


async def test_temporary_sibling_terminated_by_a_restart_is_removed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[str] = []
    async with serving(Supervisor(name="s", strategy="one_for_all")) as supervisor:
        a = await supervisor.start_child(ChildSpec(id="a", start=worker("a", log)))
        t = await supervisor.start_child(
            ChildSpec(id="t", start=worker("t", log), restart="temporary")
        )
        a.value.crash()
        await a.wait_running(incarnation=1)
        assert (await t.wait_stopped()).reason == "terminated"
        assert [c.id for c in supervisor.children()] == ["a"]


async def test_too_many_restarts_fail_the_supervisor_with_restart_intensity_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[str] = []
    supervisor = Supervisor(name="root", max_restarts=2, period=5.0)
    with pytest.RaisesGroup(
        pytest.RaisesExc(
            RestartIntensityError,
            match=r"supervisor 'root' gave up: child 'a' crashed .*2 restarts within 5.0s",
            check=lambda exc: isinstance(exc.__cause__, WorkerCrash),
        )
    ):
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.serve)
            await supervisor.start_child(ChildSpec(id="calm", start=worker("calm", log)))
            await supervisor.start_child(ChildSpec(id="a", start=worker("a", log, crash_after=1)))
            await trio.sleep_forever()
    assert log.count("start a") == 3
    assert log[-1] == "stop calm"
    assert not supervisor.running


async def test_restarts_spread_wider_than_the_period_never_exhaust_the_intensity(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[str] = []
    async with serving(Supervisor(name="s", max_restarts=1, period=5.0)) as supervisor:
        child = await supervisor.start_child(
            ChildSpec(id="a", start=worker("a", log, crash_after=6))
        )
        await child.wait_running(incarnation=4)
        assert supervisor.running
        assert supervisor.statistics().restarts == 4


async def test_restarts_in_window_forget_restarts_older_than_the_period(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[str] = []
    async with serving(Supervisor(name="s", period=5.0)) as supervisor:
        child = await supervisor.start_child(ChildSpec(id="a", start=worker("a", log)))
        child.value.crash()
        await child.wait_running(incarnation=1)
        stats = supervisor.statistics()
        assert (stats.restarts, stats.restarts_in_window, stats.crashes) == (1, 1, 1)
        await trio.sleep(5.0)
        assert supervisor.statistics().restarts_in_window == 0


async def test_failed_nested_supervisor_is_restarted_by_its_parent_from_its_specs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[str] = []
    inner = Supervisor(
        name="inner", max_restarts=0, specs=[ChildSpec(id="w", start=worker("w", log))]
    )
    async with serving(Supervisor(name="outer")) as outer:
        nested = await outer.start_child(ChildSpec(id="inner", start=inner.serve))
        assert nested.value is inner
        inner.child("w").value.crash()
        await nested.wait_running(incarnation=1)
        assert inner.child("w").value.incarnation == 1
        assert log == ["start w", "stop w", "start w"]
        assert outer.statistics().crashes == 1


async def test_child_failing_to_start_raises_child_start_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def broken(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        raise WorkerCrash("no config")

    async with serving(Supervisor(name="s")) as supervisor:
        with pytest.raises(ChildStartError, match="child 'b' of supervisor 's'") as info:
            await supervisor.start_child(ChildSpec(id="b", start=broken))
        assert isinstance(info.value.__cause__, WorkerCrash)
        assert supervisor.children() == []


async def test_duplicate_child_id_is_rejected(autojump_clock: trio.testing.MockClock) -> None:
    log: list[str] = []
    async with serving(Supervisor(name="s")) as supervisor:
        await supervisor.start_child(ChildSpec(id="a", start=worker("a", log)))
        with pytest.raises(DuplicateChildError, match="'s' already has a child 'a'"):
            await supervisor.start_child(ChildSpec(id="a", start=worker("a", log)))


async def test_stopping_the_supervisor_terminates_children_in_reverse_start_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[str] = []
    async with serving(Supervisor(name="s")) as supervisor:
        await _three_children(supervisor, log)
        children = supervisor.children()
    assert log[3:] == ["stop c", "stop b", "stop a"]
    assert [c.exit.reason if c.exit else None for c in children] == ["terminated"] * 3


async def test_terminated_child_is_removed_and_not_restarted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[str] = []
    async with serving(Supervisor(name="s")) as supervisor:
        child = await supervisor.start_child(ChildSpec(id="a", start=worker("a", log)))
        exit = await supervisor.terminate_child("a")
        assert exit.reason == "terminated"
        assert (child.state, supervisor.children(), child.restarts) == ("stopped", [], 0)
    assert log == ["start a", "stop a"]


async def test_starting_a_child_on_a_supervisor_that_does_not_run_fails(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with pytest.raises(NotRunningError, match="supervisor 'idle' is not running"):
        await Supervisor(name="idle").start_child(ChildSpec(id="a", start=worker("a", [])))


def slow_start(seconds: float, log: list[str], name: str) -> Callable[..., Awaitable[None]]:
    """A child start function that takes `seconds` before it reports started."""

    async def start(task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        await trio.sleep(seconds)
        log.append(f"started {name}")
        task_status.started(name)
        await trio.sleep_forever()

    return start


async def test_one_for_one_children_start_side_by_side(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A node taking a hundred sessions over starts a hundred agents: one slow start
    # (its log loading) must not hold up the others.
    log: list[str] = []
    async with serving(Supervisor(name="s")) as supervisor:
        begun = trio.current_time()
        async with trio.open_nursery() as nursery:
            for index in range(5):
                spec = ChildSpec(id=f"c{index}", start=slow_start(1.0, log, f"c{index}"))
                nursery.start_soon(supervisor.start_child, spec)
        assert trio.current_time() - begun == pytest.approx(1.0)
        assert sorted(child.id for child in supervisor.children()) == [f"c{i}" for i in range(5)]


async def test_other_strategies_start_children_one_at_a_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[str] = []
    async with serving(Supervisor(name="s", strategy="rest_for_one")) as supervisor:
        begun = trio.current_time()
        async with trio.open_nursery() as nursery:
            for index in range(3):
                spec = ChildSpec(id=f"c{index}", start=slow_start(1.0, log, f"c{index}"))
                nursery.start_soon(supervisor.start_child, spec)
        assert trio.current_time() - begun == pytest.approx(3.0)


async def test_one_for_one_children_stop_side_by_side(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A node giving a hundred sessions back to a joining node stops a hundred agents,
    # each writing as it stops: one slow stop must not hold up the others, nor the
    # start of another child (a session taken over meanwhile).
    stops: list[str] = []

    def slow_stop(name: str) -> Callable[..., Awaitable[None]]:
        async def start(task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
            task_status.started(name)
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await trio.sleep(1.0)
                    stops.append(name)

        return start

    async with serving(Supervisor(name="s")) as supervisor:
        for index in range(5):
            await supervisor.start_child(ChildSpec(id=f"c{index}", start=slow_stop(f"c{index}")))
        begun = trio.current_time()
        async with trio.open_nursery() as nursery:
            for index in range(5):
                nursery.start_soon(supervisor.terminate_child, f"c{index}")
            await trio.testing.wait_all_tasks_blocked()
            await supervisor.start_child(ChildSpec(id="new", start=worker("new", [])))
            assert trio.current_time() == begun  # not after the stops
        assert trio.current_time() - begun == pytest.approx(1.0)
        assert sorted(stops) == [f"c{i}" for i in range(5)]
        assert [child.id for child in supervisor.children()] == ["new"]


async def test_a_hosted_child_that_crashes_while_one_for_one_terminates_it_is_not_restarted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Its crash's stop is under way when the termination comes: the termination waits
    # for that stop, outside the supervisor's lock, while the crash is reported.
    stops: list[int] = []
    release = trio.Event()

    async def start(host: ChildHost) -> int:
        async def crash() -> None:
            await release.wait()
            raise RuntimeError("the hosted task broke")

        host.start_soon(crash)
        return len(stops)

    async def stop(value: int) -> None:
        await trio.sleep(1.0)
        stops.append(value)

    async with serving(Supervisor(name="s")) as supervisor:
        child = await supervisor.start_child(HostedChildSpec(id="w", start=start, stop=stop))
        release.set()
        await trio.testing.wait_all_tasks_blocked()  # the crash's stop has begun
        exit = await supervisor.terminate_child("w")
        await trio.testing.wait_all_tasks_blocked()
        assert (exit.reason, child.state, supervisor.children()) == ("terminated", "stopped", [])
        assert (stops, child.restarts) == ([0], 0)
