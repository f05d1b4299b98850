"""The provider fault matrix over real loopback HTTP, with 20 healthy sessions alongside.

The simulator serves a real socket in this process and the clocks are Trio's
`autojump_clock`: virtual time moves only when every task (client, server,
agents) waits, so each fault's duration is exactly what the configured clocks
make it, however loaded the machine is. The healthy sessions pause
(`think`) between turns so that the loop is idle now and then and virtual
time can advance. `benchmarks/fault_matrix.py` runs the same scenarios in
real time and measures the healthy sessions' latency against a no-fault run.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from benchmarks.fault_matrix import Clocks, HealthyLoad, run_matrix, scenarios

HEALTHY = 20
THINK = 0.5


async def test_every_fault_ends_within_its_bound_while_healthy_sessions_complete(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clocks = Clocks(slack=0.25)
    selected = [s for s in scenarios(clocks) if s.sessions == 1]
    assert len(selected) == 9
    run = await run_matrix(selected, clocks=clocks, healthy=HEALTHY, think=THINK)
    by_name = {outcome.scenario: outcome for outcome in run.outcomes}
    assert sorted(by_name) == sorted(s.name for s in selected)
    for scenario in selected:
        outcome = by_name[scenario.name]
        assert outcome.outcome == scenario.expect, scenario.name
        assert outcome.elapsed <= scenario.bound, (scenario.name, outcome.elapsed)
    # The persistent faults took all their attempts: their clocks, not luck, ended them.
    assert by_name["stall"].elapsed >= clocks.attempts * clocks.read_idle
    assert by_name["keep-alive trickle"].elapsed >= clocks.attempts * clocks.no_data
    assert by_name["slow first byte"].elapsed >= clocks.attempts * clocks.connect
    assert run.healthy.failures == []
    assert len(run.healthy.latencies) >= HEALTHY


async def test_sixteen_stalls_at_once_do_not_block_the_healthy_sessions(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # One attempt of 3 s per stalled session: with the default cap of 16 in
    # flight, 16 stalls hold every slot for those 3 s unless they are set
    # aside. Healthy turns must keep completing inside that window.
    clocks = Clocks(read_idle=3.0, no_data=6.0, max_retries=0, slack=0.25)
    (sixteen,) = [s for s in scenarios(clocks) if s.sessions == 16]
    run = await run_matrix([sixteen], clocks=clocks, healthy=HEALTHY, max_in_flight=16, think=THINK)
    assert len(run.outcomes) == 16
    assert {outcome.outcome for outcome in run.outcomes} == {"read_timeout"}
    assert max(outcome.elapsed for outcome in run.outcomes) <= sixteen.bound
    first_stall_end = min(outcome.ended for outcome in run.outcomes)
    assert first_stall_end - run.started >= clocks.read_idle
    during = run.healthy.completed_between(run.started + 1.0, first_stall_end - 0.5)
    # Without the stall budget this is 0: every slot is held by a stalled request.
    assert during >= HEALTHY, f"only {during} healthy turns completed while 16 stalled"
    assert run.healthy.failures == []


@pytest.mark.parametrize("fraction", [0.5, 0.99])
def test_percentiles_use_the_nearest_rank(fraction: float) -> None:
    load = HealthyLoad(latencies=[float(n) for n in range(1, 101)])
    assert load.percentile(fraction) == fraction * 100
