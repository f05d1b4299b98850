"""The provider fault matrix: each fault ends within its bound; healthy sessions keep moving.

Twenty healthy agent sessions run turns back to back through one
`ProviderActor` and the OpenAI-compatible adapter, over loopback HTTP to the
simulator, while fault sessions (a model of their own, so the simulator
faults only them) hit one fault each: 429 + Retry-After, 500, 503, a reset
mid-stream, a reset before the headers, a malformed event, a stall, a
keep-alive-only trickle, a slow first byte, and 16 stalls at once. Every
fault lasts for all of a session's attempts (the worst case) unless it is
transient by nature (429, 5xx, resets: one attempt, then a healthy answer).

For each fault this prints how the fault session's turn ended, how long it
took against its stated bound (derived from the configured clocks), and the
healthy sessions' turn latency (p50, p99) against a no-fault run of the same
length. Writes benchmarks/results/fault_matrix.json.

The simulator runs in this process (one Trio loop), so healthy latency
includes the simulator's own CPU; the ratio to the no-fault run is what
matters.

Run: .venv/bin/python benchmarks/fault_matrix.py [--healthy 20] [--runs 1] [--max-stalled 16]
     [--read-idle 0.5] [--no-data 1.0] [--only "16 stalls at once"]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from actors.agent import Agent, AgentOptions, RetryPolicy, open_agent
from actors.prompt import SystemPrompt
from actors.providers.actor import ProviderActor
from actors.providers.admission import StallPolicy
from actors.providers.openai_compat import OpenAICompatProvider, StreamTimeouts
from actors.providers.simulator import (
    Fault,
    Profile,
    SimulatorConfig,
    SimulatorEngine,
    serve_simulator,
)
from actors.session.events import TurnEnd

RESULTS = Path(__file__).parent / "results" / "fault_matrix.json"
HEALTHY_MODEL = "deepseek-chat"


@attrs.frozen(kw_only=True)
class Clocks:
    """The configured bounds every fault is measured against (seconds unless named)."""

    connect: float = 1.0
    read_idle: float = 0.5
    no_data: float = 1.0
    keepalive_interval: float = 0.2
    stall_after: float = 0.1
    max_stalled: int = 16
    base_delay_ms: int = 100
    jitter: float = 0.2
    retry_after: int = 1
    max_retries: int = 2
    slack: float = 2.0
    """Allowed on top of each computed bound: scheduling and loopback I/O on a loaded machine."""

    def timeouts(self) -> StreamTimeouts:
        """The adapter's clocks."""
        return StreamTimeouts(
            connect=self.connect, read_idle=self.read_idle, no_data=self.no_data, deadline=60.0
        )

    def retry(self) -> RetryPolicy:
        """The agents' retry policy."""
        return RetryPolicy(
            max_retries=self.max_retries, base_delay_ms=self.base_delay_ms, jitter=self.jitter
        )

    def backoff(self, retries: int) -> float:
        """The longest total backoff before `retries` retries."""
        total_ms = sum(self.base_delay_ms << attempt for attempt in range(retries))
        return total_ms * (1 + self.jitter) / 1000

    @property
    def attempts(self) -> int:
        """Attempts per step."""
        return self.max_retries + 1


@attrs.frozen(kw_only=True)
class Scenario:
    """One fault: what each attempt of its sessions meets, and how its turn must end.

    Attributes:
        name: The row name.
        faults: The fault of each attempt, in order (the simulator answers
            normally once they are used up).
        sessions: How many sessions meet it at once.
        expect: `"completed"` or the error code the turn must end with.
        bound: The longest the turn may take, in seconds (slack included).
    """

    name: str
    faults: tuple[Fault, ...]
    sessions: int = 1
    expect: str
    bound: float

    @property
    def model(self) -> str:
        """The model name that routes the simulator's faults to this scenario's sessions."""
        return f"fault-{self.name.replace(' ', '-')}"


def scenarios(clocks: Clocks) -> list[Scenario]:
    """The fault matrix under `clocks`, with each bound derived from them."""
    every = clocks.attempts
    retried = clocks.backoff(1) + clocks.slack
    persistent = clocks.backoff(clocks.max_retries) + clocks.slack
    stall = Fault(stall_after_chunks=2)
    return [
        Scenario(
            name="429 + Retry-After",
            faults=(Fault(status=429, retry_after=str(clocks.retry_after)),),
            expect="completed",
            bound=clocks.retry_after + clocks.slack,
        ),
        Scenario(name="500", faults=(Fault(status=500),), expect="completed", bound=retried),
        Scenario(name="503", faults=(Fault(status=503),), expect="completed", bound=retried),
        Scenario(
            name="reset mid-stream",
            faults=(Fault(reset_after_chunks=2),),
            expect="completed",
            bound=retried,
        ),
        Scenario(
            name="reset before headers",
            faults=(Fault(reset_before_headers=True),),
            expect="completed",
            bound=retried,
        ),
        Scenario(
            name="malformed SSE",
            faults=(Fault(malformed_after_chunks=2),),
            expect="malformed_event",
            bound=clocks.slack,
        ),
        Scenario(
            name="stall",
            faults=(stall,) * every,
            expect="read_timeout",
            bound=every * clocks.read_idle + persistent,
        ),
        Scenario(
            name="keep-alive trickle",
            faults=(Fault(trickle_after_chunks=2, keepalive_interval=clocks.keepalive_interval),)
            * every,
            expect="read_timeout",
            bound=every * clocks.no_data + persistent,
        ),
        Scenario(
            name="slow first byte",
            faults=(Fault(first_byte_delay=clocks.connect * 10),) * every,
            expect="connect_timeout",
            bound=every * clocks.connect + persistent,
        ),
        Scenario(
            name="16 stalls at once",
            faults=(stall,) * (every * 16),
            sessions=16,
            expect="read_timeout",
            bound=every * clocks.read_idle + persistent,
        ),
    ]


@attrs.frozen(kw_only=True)
class FaultOutcome:
    """How one fault session's turn ended."""

    scenario: str
    outcome: str
    elapsed: float
    ended: float
    """`trio.current_time()` when the turn ended."""


@attrs.define(kw_only=True)
class HealthyLoad:
    """The healthy sessions' turn latencies, when each completed, and turns that did not."""

    latencies: list[float] = attrs.field(factory=list)
    completed_at: list[float] = attrs.field(factory=list)
    failures: list[str] = attrs.field(factory=list)

    def completed_between(self, start: float, end: float) -> int:
        """Turns that completed within [`start`, `end`] (`trio.current_time()` values)."""
        return sum(1 for at in self.completed_at if start <= at <= end)

    def percentile(self, fraction: float) -> float:
        """The latency below which `fraction` of the turns completed (nearest rank)."""
        ordered = sorted(self.latencies)
        if not ordered:
            return float("nan")
        index = min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))
        return ordered[index]


@attrs.frozen(kw_only=True)
class MatrixRun:
    """What one run measured: the fault outcomes and the healthy load beside them."""

    outcomes: tuple[FaultOutcome, ...]
    healthy: HealthyLoad
    started: float
    """`trio.current_time()` when the fault sessions started."""
    duration: float


def turn_outcome(agent: Agent) -> str:
    """The last turn's end: `"completed"`, the error code, or the end kind."""
    for event in reversed(agent.session.events):
        if isinstance(event.data, TurnEnd):
            reason = event.data.reason
            if reason.error is not None:
                return reason.error.code
            return reason.kind
    return "no turn ended"


async def _healthy_session(agent: Agent, load: HealthyLoad, stop: trio.Event, think: float) -> None:
    turn = 0
    while not stop.is_set():
        if think:
            await trio.sleep(think)
        start = trio.current_time()
        agent.followup(f"Healthy turn {turn}: say something.")
        await agent.when_idle()
        outcome = turn_outcome(agent)
        if outcome == "completed":
            load.completed_at.append(trio.current_time())
            load.latencies.append(load.completed_at[-1] - start)
        else:
            load.failures.append(outcome)
        turn += 1


async def _fault_session(agent: Agent, scenario: Scenario, out: list[FaultOutcome]) -> None:
    start = trio.current_time()
    agent.followup(f"A turn that meets {scenario.name}.")
    await agent.when_idle()
    end = trio.current_time()
    out.append(
        FaultOutcome(
            scenario=scenario.name, outcome=turn_outcome(agent), elapsed=end - start, ended=end
        )
    )


async def run_matrix(
    selected: Sequence[Scenario],
    *,
    clocks: Clocks,
    healthy: int = 20,
    min_duration: float = 0.0,
    max_in_flight: int = 16,
    think: float = 0.0,
) -> MatrixRun:
    """Run `healthy` sessions beside every session of `selected` and measure both.

    The healthy sessions start first and warm up (one turn each); then the
    fault sessions start, all at once. The run ends when every fault session's
    turn has ended and at least `min_duration` seconds have passed since the
    fault sessions started (so a no-fault baseline can run as long).
    Each healthy session waits `think` seconds before each turn: under
    `autojump_clock` the healthy load must leave the loop idle now and then,
    or virtual time (and so every fault's clock) would never advance.
    """
    # Each scenario's sessions use a model of their own, known to the simulator.
    profiles: dict[str, Profile] = {HEALTHY_MODEL: "v4"}
    profiles.update({scenario.model: "v4" for scenario in selected})
    engine = SimulatorEngine(SimulatorConfig(profiles=profiles))
    for scenario in selected:
        engine.faults.for_model(scenario.model, *scenario.faults)
    load = HealthyLoad()
    outcomes: list[FaultOutcome] = []
    prompt = SystemPrompt(persona="You are a benchmark agent. Answer briefly.")
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_simulator, engine)

        def factory(client: httpx.AsyncClient) -> OpenAICompatProvider:
            return OpenAICompatProvider(
                client, base_url=url, api_key=engine.config.api_key, timeouts=clocks.timeouts()
            )

        actor = ProviderActor(
            name="sim",
            factory=factory,
            max_in_flight=max_in_flight,
            stall=StallPolicy(stall_after=clocks.stall_after, max_stalled=clocks.max_stalled),
        )
        await nursery.start(actor.serve)
        stop = trio.Event()
        async with trio.open_nursery() as sessions:

            async def open_session(model: str, *, task_status: trio.TaskStatus[Agent]) -> None:
                options = AgentOptions(model=model, retry=clocks.retry())
                async with open_agent(
                    system_prompt=prompt, provider=actor, options=options
                ) as agent:
                    task_status.started(agent)
                    await trio.sleep_forever()

            healthy_agents = [
                await sessions.start(open_session, HEALTHY_MODEL) for _ in range(healthy)
            ]
            async with trio.open_nursery() as warm:
                for agent in healthy_agents:
                    warm.start_soon(_warm_up, agent)
            async with trio.open_nursery() as load_nursery:
                for agent in healthy_agents:
                    load_nursery.start_soon(_healthy_session, agent, load, stop, think)
                start = trio.current_time()
                async with trio.open_nursery() as faults:
                    for scenario in selected:
                        for _ in range(scenario.sessions):
                            agent = await sessions.start(open_session, scenario.model)
                            faults.start_soon(_fault_session, agent, scenario, outcomes)
                await trio.sleep_until(start + min_duration)
                duration = trio.current_time() - start
                stop.set()
            sessions.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
    return MatrixRun(outcomes=tuple(outcomes), healthy=load, started=start, duration=duration)


async def _warm_up(agent: Agent) -> None:
    agent.followup("Warm-up turn.")
    await agent.when_idle()


def _row(scenario: Scenario, run: MatrixRun, baseline: MatrixRun) -> dict[str, Any]:
    outcomes = [o for o in run.outcomes if o.scenario == scenario.name]
    worst = max(o.elapsed for o in outcomes)
    p99 = run.healthy.percentile(0.99)
    base_p99 = baseline.healthy.percentile(0.99)
    return {
        "fault": scenario.name,
        "sessions": scenario.sessions,
        "expect": scenario.expect,
        "outcomes": sorted({o.outcome for o in outcomes}),
        "worst_s": round(worst, 3),
        "bound_s": round(scenario.bound, 3),
        "within_bound": worst <= scenario.bound
        and all(o.outcome == scenario.expect for o in outcomes),
        "healthy_turns": len(run.healthy.latencies),
        "healthy_failures": len(run.healthy.failures),
        "healthy_p50_ms": round(run.healthy.percentile(0.5) * 1000, 1),
        "healthy_p99_ms": round(p99 * 1000, 1),
        "baseline_p99_ms": round(base_p99 * 1000, 1),
        "p99_ratio": round(p99 / base_p99, 2),
    }


async def main(healthy: int, runs: int, clocks: Clocks, only: str | None) -> list[dict[str, Any]]:
    """Run each scenario beside `healthy` sessions, `runs` times, with a baseline each."""
    rows: list[dict[str, Any]] = []
    for _ in range(runs):
        for scenario in scenarios(clocks):
            if only is not None and scenario.name != only:
                continue
            run = await run_matrix([scenario], clocks=clocks, healthy=healthy)
            baseline = await run_matrix(
                [], clocks=clocks, healthy=healthy, min_duration=run.duration
            )
            row = _row(scenario, run, baseline)
            rows.append(row)
            print(
                f"{row['fault']:<22} {row['sessions']:>3} {','.join(row['outcomes']):<16} "
                f"{row['worst_s']:>7.2f} {row['bound_s']:>6.2f} "
                f"{'ok' if row['within_bound'] else 'OVER':<4} {row['healthy_turns']:>6} "
                f"{row['healthy_failures']:>4} {row['healthy_p50_ms']:>8.1f} "
                f"{row['healthy_p99_ms']:>8.1f} {row['baseline_p99_ms']:>8.1f} "
                f"{row['p99_ratio']:>6.2f}",
                flush=True,
            )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--healthy", type=int, default=20, help="healthy sessions")
    parser.add_argument("--runs", type=int, default=1, help="repetitions of the matrix")
    parser.add_argument(
        "--max-stalled", type=int, default=16, help="stall budget (0: a plain in-flight cap)"
    )
    parser.add_argument("--read-idle", type=float, default=0.5, help="adapter read-idle s")
    parser.add_argument("--no-data", type=float, default=1.0, help="adapter no-data bound s")
    parser.add_argument("--only", help="run only the scenario of this name")
    args = parser.parse_args()
    clocks = Clocks(max_stalled=args.max_stalled, read_idle=args.read_idle, no_data=args.no_data)
    print(
        f"{'fault':<22} {'n':>3} {'outcome':<16} {'worst s':>7} {'bound':>6} {'':<4} "
        f"{'turns':>6} {'fail':>4} {'p50 ms':>8} {'p99 ms':>8} {'base p99':>8} {'ratio':>6}"
    )
    results = trio.run(main, args.healthy, args.runs, clocks, args.only)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {"healthy": args.healthy, "clocks": attrs.asdict(clocks), "rows": results}, indent=2
        )
        + "\n"
    )
    print(f"wrote {RESULTS}")
