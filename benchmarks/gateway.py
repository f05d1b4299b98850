"""Gateway fan-out cost: N supervisors subscribed to M running sessions on the simulator.

The server process runs the runtime (M agents on the in-process simulator,
`MemoryStore`) and the gateway; the supervisors run in a second process (so
their JSON decoding is not billed to the server), N websockets, connected
from the start. Phases:

1. burst pairs (`--repeat` of them, default 3), each: every session runs
   `--turns` turns with no subscription ("alone"), then the N supervisors
   subscribe live to every session and every session runs `--turns` turns
   again ("attached", until every event reached every supervisor), then
   they unsubscribe. Alone and attached alternate, so a change in the
   machine's load moves one pair rather than the whole figure; the burst
   figures are the pairs' medians (each pair's increase is printed too);
2. paced pairs (`--paced-pairs` of them, default 3), each: `--paced-turns`
   turns started at `--rate` turns/s (an unsaturated runtime), one per
   session, alone, then as many attached on the next sessions (each phase
   on sessions of its own while the fleet lasts, so every phase's steps are
   turns of the same age); CPU per step both ways (each pair's increase,
   their median and range) and commit-to-delivery latency; one unmeasured
   paced phase alone comes first.

"The agents' CPU per step" is the server process's CPU (user + kernel,
`time.process_time()`) divided by the agent steps of the phase: the gateway
runs in the same process and the same Trio run, so "attached" includes the
fan-out, the encoding, the socket writes (their kernel time too) and the
garbage the gateway makes, and "alone" includes the idle gateway (its
durability listener and empty fan-out rounds). The increase is the
difference of two such figures, so the machine's load moves it; two
measures that the load does not move as much:

- the fan-out's own CPU per step: the process CPU spent inside the
  gateway's fan-out rounds (reading the new events, encoding them, handing
  them to every subscription and the direct socket writes at the round's
  end), summed over the attached phase; it leaves out the garbage
  collector, the writer tasks and the scheduler passes, so it is a lower
  bound of the gateway's cost;
- `--instructions`: the server runs under `valgrind --tool=callgrind`
  (only the paced pairs; the supervisors' process is not traced) and each
  paced phase is counted in instructions (`callgrind_control` zeroes and
  dumps the counters at the phase's ends), so alone and attached are
  compared without the load's noise; callgrind does not see the kernel
  (socket writes), and everything runs ~50x slower, so divide `--rate` and
  multiply the fan-out's waits (`--time-scale`) by about that much, to keep
  a step's events in as few fan-out rounds as natively (the table prints
  events per fan-out batch).

Reported: server CPU per agent step alone and attached (and the increase),
in the burst and paced phases, the gateway's CPU per delivered event (and
how much of it is the kernel's: socket writes), events/s delivered, and
p50/p99 delivery latency (supervisor clock minus the event's `time`, i.e.
from append, which is before commit: an upper bound on commit-to-delivery),
and in the paced phases commit-to-delivery itself (the server notes when
each event's append, the memory store's commit, returned; the supervisor
when the frame carrying it arrived, before decoding it).

    .venv/bin/python benchmarks/gateway.py --sessions 1000 --supervisors 10
    .venv/bin/python benchmarks/gateway.py --sessions 120 --supervisors 10 --instructions \
        --repeat 0 --paced-turns 16 --rate 0.5 --time-scale 50

Supervisors subscribe with `merge: true` (every session's new events of a
fan-out round in one `_harness/log/merged` notification per connection);
`--mode batched` measures `batch: true` (one `_harness/log/events` per
session per round), `--mode plain` plain subscriptions (one
`_harness/log/event` frame per event).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio
import trio_websocket

# No sys.path entry of its own: what is measured is the installed (editable) package, or a
# tree put first on PYTHONPATH (a "before" tree from `git archive`, run with this script).
from actors.agent import Agent, AgentOptions
from actors.prompt import SystemPrompt
from actors.providers import Provider
from actors.providers.actor import ProviderActor
from actors.providers.openai_compat import OpenAICompatProvider
from actors.providers.simulator import SimulatorConfig, SimulatorEngine, simulator_transport
from actors.session import Event, Lease, MemoryStore
from supervision.bench.simulator_process import start_simulator_process
from supervision.bench.workload import API_KEY
from supervision.gateway import AgentProfile, Token, open_gateway
from supervision.gateway.server import Gateway
from supervision.runtime import open_runtime

SECRET = "bench-secret"
RESULTS = Path(__file__).with_name("results")


# -- the supervisors' process --------------------------------------------------------


MODES = {
    "merged": {"batch": True, "merge": True},
    "batched": {"batch": True},
    "plain": {},
}
"""`--mode`: the subscription params each mode adds to `_harness/log/subscribe`."""


@attrs.define(eq=False)
class _Supervisor:
    """One supervisor connection: its subscriptions and the answers it waits for."""

    ws: trio_websocket.WebSocketConnection
    subscriptions: list[str] = attrs.field(factory=list)
    pending: int = 0
    answered: trio.Event = attrs.field(factory=trio.Event)
    window: trio.Semaphore = attrs.field(factory=lambda: trio.Semaphore(32))
    """Requests in flight at most (under the gateway's per-connection limit)."""
    next_id: int = 0

    def answer(self, message: dict[str, Any]) -> None:
        """Count one answer; a refused request ends the benchmark, saying why."""
        if "error" in message:
            raise RuntimeError(f"a supervisor's request failed: {message['error']}")
        result = message["result"]
        if "subscription" in result:
            self.subscriptions.append(result["subscription"])
        self.window.release()
        self.pending -= 1
        if not self.pending:
            self.answered.set()

    async def call_all(self, calls: list[tuple[str, dict[str, Any]]]) -> None:
        """Send every request (a window of them in flight), then wait until each is answered."""
        self.pending, self.answered = len(calls), trio.Event()
        for method, params in calls:
            await self.window.acquire()
            self.next_id += 1
            await self.ws.send_message(
                json.dumps(
                    {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
                )
            )
        if calls:
            await self.answered.wait()


async def _client_main(url: str, connections: int, mode: str) -> None:
    host, port = url.removeprefix("ws://").removesuffix("/acp").split(":")
    session_ids: list[str] = json.loads(sys.stdin.readline())
    stdin = trio.lowlevel.FdStream(0)
    latencies: list[int] = []
    arrivals: list[tuple[str, int, int]] = []
    """(session id, seq, arrival ns) of every event since the last reset (for the commit clock)."""
    received = 0
    changed = trio.Event()
    supervisors: list[_Supervisor] = []

    async def supervise(ready: trio.Event) -> None:
        nonlocal received, changed
        async with trio_websocket.open_websocket(
            host,
            int(port),
            "/acp",
            use_ssl=False,
            extra_headers=[(b"Authorization", f"Bearer {SECRET}".encode())],
            message_queue_size=256,
            max_message_size=16 * 1024 * 1024,
        ) as ws:
            supervisor = _Supervisor(ws=ws)
            await ws.send_message(
                json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}})
            )
            await ws.get_message()
            supervisors.append(supervisor)
            ready.set()
            while True:
                text = await ws.get_message()
                arrived = time.time_ns()  # delivered: the frame is here (decoding is ours)
                message = json.loads(text)
                method = message.get("method")
                if method is None:
                    supervisor.answer(message)
                    continue
                params = message.get("params", {})
                if method == "_harness/log/event":
                    batches = [(params["sessionId"], [params["event"]])]
                elif method == "_harness/log/events":
                    batches = [(params["sessionId"], params["events"])]
                elif method == "_harness/log/merged":
                    batches = [(b["sessionId"], b["events"]) for b in params["batches"]]
                else:
                    continue
                now = arrived // 1_000_000
                for session_id, events in batches:
                    latencies.extend(now - event["time"] for event in events)
                    arrivals.extend((session_id, event["seq"], arrived) for event in events)
                    received += len(events)
                changed.set()
                changed = trio.Event()

    async def attach(supervisor: _Supervisor) -> None:
        subscribe = [
            ("_harness/log/subscribe", {"sessionId": sid, **MODES[mode]}) for sid in session_ids
        ]
        await supervisor.call_all(subscribe)

    async def detach(supervisor: _Supervisor) -> None:
        subscriptions, supervisor.subscriptions = supervisor.subscriptions, []
        await supervisor.call_all(
            [("_harness/log/unsubscribe", {"subscription": name}) for name in subscriptions]
        )

    async def commands() -> None:
        buffer = b""
        while True:
            while b"\n" not in buffer:
                buffer += await stdin.receive_some()
            line, buffer = buffer.split(b"\n", 1)
            command = json.loads(line)
            if command["cmd"] in ("attach", "detach"):
                action = attach if command["cmd"] == "attach" else detach
                async with trio.open_nursery() as calls:
                    for supervisor in supervisors:
                        calls.start_soon(action, supervisor)
                print(json.dumps({command["cmd"]: True}), flush=True)
            elif command["cmd"] == "reset":
                latencies.clear()
                arrivals.clear()
                print(json.dumps({"reset": True}), flush=True)
            elif command["cmd"] == "commit_latency":
                commits = command["commits"]  # session id -> {seq: commit ns}
                delays = sorted(
                    (arrived - commits[sid][str(seq)]) / 1e6 for sid, seq, arrived in arrivals
                )
                print(
                    json.dumps(
                        {
                            "p50": delays[len(delays) // 2] if delays else None,
                            "p99": delays[int(len(delays) * 0.99)] if delays else None,
                            "max": delays[-1] if delays else None,
                        }
                    ),
                    flush=True,
                )
            elif command["cmd"] == "report":
                while received < command["until"]:
                    await changed.wait()
                ordered = sorted(latencies)
                print(
                    json.dumps(
                        {
                            "received": received,
                            "p50": ordered[len(ordered) // 2] if ordered else None,
                            "p99": ordered[int(len(ordered) * 0.99)] if ordered else None,
                        }
                    ),
                    flush=True,
                )
            elif command["cmd"] == "quit":
                return

    async with trio.open_nursery() as nursery:
        readies = []
        for _ in range(connections):
            ready = trio.Event()
            readies.append(ready)
            nursery.start_soon(supervise, ready)
        for ready in readies:
            await ready.wait()
        print(json.dumps({"ready": True}), flush=True)
        await commands()
        nursery.cancel_scope.cancel()


# -- the server process ---------------------------------------------------------------


async def _run_turns(agents: list[Agent], turns: int) -> tuple[float, float, int]:
    """Every agent runs `turns` turns at once; returns (cpu s, wall s, steps)."""
    before = sum(agent.statistics().loop.steps for agent in agents)
    cpu, wall = time.process_time(), time.perf_counter()
    for agent in agents:
        for turn in range(turns):
            agent.followup(f"turn {turn}: say something")
    for agent in agents:
        await agent.when_idle()
    steps = sum(agent.statistics().loop.steps for agent in agents) - before
    return time.process_time() - cpu, time.perf_counter() - wall, steps


class _StampedStore(MemoryStore):
    """A `MemoryStore` that notes when each event became durable (wall clock, ns).

    A memory store's append is its commit: the durable mark advances as the
    append returns (no scheduling point in between), so the time read right
    after it is the commit's. Stamped in every phase alike, alone or attached.
    """

    def __init__(self) -> None:
        super().__init__()
        self.commits: dict[str, dict[str, int]] = {}

    async def append(
        self, session_id: str, events: Sequence[Event], *, lease: Lease | None = None
    ) -> None:
        """Append, then note the commit time of each event."""
        await super().append(session_id, events, lease=lease)
        now = time.time_ns()
        stamps = self.commits.setdefault(session_id, {})
        for event in events:
            stamps[str(event.seq)] = now


class _GcTime:
    """Process CPU seconds spent in the garbage collector so far (via `gc.callbacks`)."""

    def __init__(self) -> None:
        self.total = 0.0
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.process_time()
        else:
            self.total += time.process_time() - self._start


GC = _GcTime()


def _settle_gc() -> None:
    """Collect, then freeze what survived, so every phase starts from the same collector state.

    Without it, whether one of the full collections (hundreds of ms over
    1,000 sessions' logs) lands inside a phase decides that phase's figure.
    """
    gc.collect()
    gc.freeze()


def _system_time() -> float:
    """Kernel CPU seconds of this process so far."""
    return os.times().system


async def _paced(agents: list[Agent], turns: int, rate: float, first: int = 0) -> int:
    """Start `turns` turns at `rate` turns/s, one on each session from `first` on (round the
    fleet); returns the steps they took."""
    before = sum(agent.statistics().loop.steps for agent in agents)
    for index in range(first, first + turns):
        agents[index % len(agents)].followup("paced turn")
        await trio.sleep(1.0 / rate)
    for agent in agents:
        await agent.when_idle()
    return sum(agent.statistics().loop.steps for agent in agents) - before


@attrs.define
class _Burst:
    """One burst phase's figures (the server process's CPU, kernel CPU, collector, wall)."""

    cpu: float
    system: float
    gc: float
    wall: float
    steps: int


async def _burst(agents: list[Agent], turns: int) -> _Burst:
    _settle_gc()
    system, collected = _system_time(), GC.total
    cpu, wall, steps = await _run_turns(agents, turns)
    return _Burst(cpu, _system_time() - system, GC.total - collected, wall, steps)


class _RoundClock:
    """The fan-out's `work_clock`, also summing the process CPU spent inside its rounds.

    The fan-out reads its clock when a round starts and when it ends (a round
    never yields in between), so every second reading closes a round.
    """

    def __init__(self) -> None:
        self.total = 0.0
        self._start: float | None = None

    def __call__(self) -> float:
        now = time.process_time()
        if self._start is None:
            self._start = now
        else:
            self.total += now - self._start
            self._start = None
        return now


class _Instructions:
    """Counts phases in instructions when this process runs under callgrind (`directory`:
    where callgrind writes its dumps; None: not under callgrind, nothing is counted)."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory

    async def _control(self, option: str) -> None:
        if self.directory is not None:
            await trio.run_process(
                ["callgrind_control", option, str(os.getpid())], capture_stdout=True
            )

    async def start(self) -> None:
        """Zero the counters (a phase starts)."""
        await self._control("--zero")

    async def stop(self, label: str) -> None:
        """Dump the counters since `start` as `label`."""
        await self._control(f"--dump={label}")

    def counts(self) -> dict[str, int]:
        """Instructions of every dumped phase, by label."""
        if self.directory is None:
            return {}
        counts: dict[str, int] = {}
        for path in self.directory.glob("cg.out.*"):
            label = total = None
            with path.open() as dump:
                for line in dump:
                    if line.startswith("desc: Trigger: dump "):
                        label = line.removeprefix("desc: Trigger: dump ").strip()
                    elif line.startswith("totals:"):
                        total = int(line.split()[1])
            if label is not None and total is not None:
                counts[label] = total
        return counts


@attrs.define
class _Phase:
    """One paced phase's figures: the server process's CPU, kernel CPU, collector, the CPU
    inside the fan-out's rounds, agent steps, fan-out batches and events."""

    cpu: float
    system: float
    gc: float
    fanout: float
    steps: int
    rounds: int
    events: int

    def per_step(self) -> float:
        return self.cpu / self.steps


async def _paced_phase(
    agents: list[Agent],
    args: argparse.Namespace,
    gateway: Gateway,
    clock: _RoundClock,
    counter: _Instructions,
    label: str,
    first: int,
    drain: Callable[[], Awaitable[None]] | None = None,
) -> _Phase:
    """A paced phase (`_paced`, from session `first` on), then `drain()` (until the
    supervisors have every event), measured as a whole; counted in instructions as `label`
    under callgrind."""
    _settle_gc()
    await counter.start()
    fanout, rounds, events = clock.total, gateway.fanout.rounds, gateway.fanout.events
    cpu, system, collected = time.process_time(), _system_time(), GC.total
    steps = await _paced(agents, args.paced_turns, args.rate, first)
    if drain is not None:
        await drain()
    phase = _Phase(
        cpu=time.process_time() - cpu,
        system=_system_time() - system,
        gc=GC.total - collected,
        fanout=clock.total - fanout,
        steps=steps,
        rounds=gateway.fanout.rounds - rounds,
        events=gateway.fanout.events - events,
    )
    await counter.stop(label)
    return phase


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def _range(values: list[float]) -> list[float]:
    return [min(values), max(values)] if values else [math.nan, math.nan]


@asynccontextmanager
async def _provider(kind: str, sessions: int) -> AsyncIterator[Provider]:
    """The agents' model: the in-process simulator, or the benchmark simulator's own process
    over HTTP through a `ProviderActor` (the issue-12 workload's client path)."""
    if kind == "inprocess":
        engine = SimulatorEngine()
        async with httpx.AsyncClient(transport=simulator_transport(engine)) as client:
            yield OpenAICompatProvider(
                client, base_url="http://simulator.test", api_key=engine.config.api_key
            )
        return
    with start_simulator_process(latency=0.0, reply_tokens=SimulatorConfig().reply_tokens) as sim:
        in_flight = min(sessions, 1000)
        yield ProviderActor(
            name="default",
            factory=lambda client: OpenAICompatProvider(client, base_url=sim.url, api_key=API_KEY),
            timeout=httpx.Timeout(120.0, connect=60.0),
            limits=httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight),
            max_in_flight=in_flight,
        )


async def _server(args: argparse.Namespace) -> dict[str, Any]:
    store = _StampedStore()
    counter = _Instructions(None if args.callgrind_dir is None else Path(args.callgrind_dir))
    async with (
        _provider(args.simulator, args.sessions) as provider,
        open_runtime(
            system_prompt=SystemPrompt(persona="bench"),
            store=store,
            providers={"default": provider},
        ) as runtime,
        open_gateway(
            runtime,
            tokens=[Token(secret=SECRET)],
            profiles={"default": AgentProfile(options=AgentOptions(model="deepseek-chat"))},
            write_deadline=60.0,
        ) as gateway,
    ):
        clock = _RoundClock()
        gateway.fanout.work_clock = clock
        if args.time_scale != 1:
            # The fan-out's waits, stretched like everything else (under callgrind).
            fanout = gateway.fanout
            for name in ("linger", "linger_max", "linger_quiet", "linger_streaming"):
                if hasattr(fanout, name):  # an older tree may not have them all
                    setattr(fanout, name, getattr(fanout, name) * args.time_scale)
        agents = [
            await gateway.directory.create(profile="default", owner=None)
            for _ in range(args.sessions)
        ]
        await _run_turns(agents, 1)  # warm-up
        process = await trio.lowlevel.open_process(
            [
                sys.executable,
                __file__,
                "--client",
                gateway.url,
                "--supervisors",
                str(args.supervisors),
                "--mode",
                args.mode,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert process.stdin is not None and process.stdout is not None
        stdin, lines = process.stdin, _Lines(process.stdout)

        async def command(cmd: str, **fields: Any) -> dict[str, Any]:
            await stdin.send_all((json.dumps({"cmd": cmd, **fields}) + "\n").encode())
            return await lines.next()

        await stdin.send_all((json.dumps([a.session.id for a in agents]) + "\n").encode())
        await lines.next()  # connected and initialized, nothing subscribed yet
        expected = 0
        pairs: list[tuple[_Burst, _Burst]] = []
        deliveries: list[int] = []
        rounds = events = catch_ups = 0
        reports = []
        for repeat in range(args.repeat):
            # Alone and attached alternate, so a change in the machine's load between them
            # moves one pair, not the whole figure.
            alone = await _burst(agents, args.turns)
            await command("attach")
            start_events = sum(len(agent.session) for agent in agents)
            start_rounds, start_events_out = gateway.fanout.rounds, gateway.fanout.events
            profiler = cProfile.Profile(time.process_time) if args.profile and not repeat else None
            if profiler is not None:
                profiler.enable()
            _settle_gc()
            cpu, system, collected = time.process_time(), _system_time(), GC.total
            _, wall, steps = await _run_turns(agents, args.turns)
            appended = sum(len(agent.session) for agent in agents) - start_events
            expected += appended * args.supervisors
            deliveries.append(appended * args.supervisors)
            reports.append(await command("report", until=expected))
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(f"{args.profile}-burst.prof")
            attached = _Burst(
                time.process_time() - cpu,
                _system_time() - system,
                GC.total - collected,
                wall,
                steps,
            )
            pairs.append((alone, attached))
            rounds += gateway.fanout.rounds - start_rounds
            events += gateway.fanout.events - start_events_out
            catch_ups = sum(c.statistics().catch_ups for c in gateway.connections)
            await command("detach")

        # Paced pairs: alone, then attached, alternating like the burst's. Each phase's turns
        # go to sessions of their own (as far as the fleet goes), so every phase finds its
        # sessions at the same age (a step costs more the longer the conversation), after an
        # unmeasured phase alone (the first paced phase of a run costs more, even in
        # instructions: 20.0M per step against 17.3M in the next alone phase).
        paced: list[tuple[_Phase, _Phase]] = []
        paced_reports: list[dict[str, Any]] = []
        paced_commits: list[dict[str, Any]] = []
        first = 0
        if args.paced_pairs:
            await _paced(agents, args.paced_turns, args.rate, first)
            first += args.paced_turns
        for repeat in range(args.paced_pairs):
            alone_phase = await _paced_phase(
                agents, args, gateway, clock, counter, f"alone-{repeat}", first
            )
            first += args.paced_turns
            await command("attach")
            await command("reset")
            store.commits.clear()
            start = sum(len(agent.session) for agent in agents)
            profiler = cProfile.Profile(time.process_time) if args.profile and not repeat else None

            async def drain(start: int = start) -> None:
                nonlocal expected
                appended = sum(len(agent.session) for agent in agents) - start
                expected += appended * args.supervisors
                paced_reports.append(await command("report", until=expected))

            if profiler is not None:
                profiler.enable()
            attached_phase = await _paced_phase(
                agents, args, gateway, clock, counter, f"attached-{repeat}", first, drain
            )
            first += args.paced_turns
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(f"{args.profile}-paced.prof")
            paced.append((alone_phase, attached_phase))
            paced_commits.append(await command("commit_latency", commits=store.commits))
            await command("detach")
        await stdin.send_all(b'{"cmd": "quit"}\n')
        await process.wait()
        stats = gateway.statistics()

    def per_step(burst: _Burst) -> float:
        return burst.cpu / burst.steps

    increases = [100 * (per_step(b) / per_step(a) - 1) for a, b in pairs]
    gateway_cpu = [
        (b.cpu - a.cpu * b.steps / a.steps) / d for (a, b), d in zip(pairs, deliveries, strict=True)
    ]
    gateway_sys = [
        (b.system - a.system * b.steps / a.steps) / d
        for (a, b), d in zip(pairs, deliveries, strict=True)
    ]
    alone_steps = sum(a.steps for a, _ in pairs)
    attached_steps = sum(b.steps for _, b in pairs)
    paced_increases = [100 * (b.per_step() / a.per_step() - 1) for a, b in paced]
    paced_fanout_pct = [100 * (b.fanout / b.steps) / a.per_step() for a, b in paced]
    counts = counter.counts()
    instructions = [
        (counts[f"alone-{i}"] / a.steps, counts[f"attached-{i}"] / b.steps)
        for i, (a, b) in enumerate(paced)
        if f"alone-{i}" in counts and f"attached-{i}" in counts
    ]
    instruction_increases = [100 * (b / a - 1) for a, b in instructions]
    return {
        "sessions": args.sessions,
        "supervisors": args.supervisors,
        "mode": args.mode,
        "simulator": args.simulator,
        "turns": args.turns,
        "repeats": args.repeat,
        "steps": pairs[0][1].steps if pairs else 0,
        "alone_cpu_ms_per_step": 1000 * _median([per_step(a) for a, _ in pairs]),
        "attached_cpu_ms_per_step": 1000 * _median([per_step(b) for _, b in pairs]),
        "increase_pct": _median(increases),
        "increase_pct_each": increases,
        "events_delivered": deliveries[0] if deliveries else 0,
        "events_per_s": _median(
            [d / max(b.wall, 1e-9) for (_, b), d in zip(pairs, deliveries, strict=True)]
        ),
        "gateway_cpu_us_per_event": 1e6 * _median(gateway_cpu),
        "gateway_system_us_per_event": 1e6 * _median(gateway_sys),
        "alone_gc_ms_per_step": 1000 * sum(a.gc for a, _ in pairs) / max(alone_steps, 1),
        "attached_gc_ms_per_step": 1000 * sum(b.gc for _, b in pairs) / max(attached_steps, 1),
        "paced_pairs": args.paced_pairs,
        "paced_steps": [b.steps for _, b in paced],
        "paced_alone_cpu_ms_per_step": 1000 * _median([a.per_step() for a, _ in paced]),
        "paced_attached_cpu_ms_per_step": 1000 * _median([b.per_step() for _, b in paced]),
        "paced_alone_cpu_ms_per_step_each": [1000 * a.per_step() for a, _ in paced],
        "paced_attached_cpu_ms_per_step_each": [1000 * b.per_step() for _, b in paced],
        "paced_increase_pct": _median(paced_increases),
        "paced_increase_pct_each": paced_increases,
        "paced_increase_pct_range": _range(paced_increases),
        "paced_alone_system_ms_per_step": 1000 * _median([a.system / a.steps for a, _ in paced]),
        "paced_attached_system_ms_per_step": 1000 * _median([b.system / b.steps for _, b in paced]),
        "paced_alone_gc_ms_per_step": 1000 * _median([a.gc / a.steps for a, _ in paced]),
        "paced_attached_gc_ms_per_step": 1000 * _median([b.gc / b.steps for _, b in paced]),
        "paced_fanout_cpu_ms_per_step": 1000 * _median([b.fanout / b.steps for _, b in paced]),
        "paced_fanout_pct_of_alone": _median(paced_fanout_pct),
        "paced_fanout_pct_of_alone_each": paced_fanout_pct,
        "paced_alone_fanout_cpu_ms_per_step": 1000
        * _median([a.fanout / a.steps for a, _ in paced]),
        "paced_instructions_per_step_each": instructions,
        "paced_instruction_increase_pct": _median(instruction_increases),
        "paced_instruction_increase_pct_each": instruction_increases,
        "saturated_p50_ms": _median([r["p50"] for r in reports]),
        "saturated_p99_ms": _median([r["p99"] for r in reports]),
        "paced_rate_turns_per_s": args.rate,
        "paced_p50_ms": _median([r["p50"] for r in paced_reports]),
        "paced_p99_ms": _median([r["p99"] for r in paced_reports]),
        "paced_commit_p50_ms": _median([c["p50"] for c in paced_commits]),
        "paced_commit_p99_ms": _median([c["p99"] for c in paced_commits]),
        "paced_commit_p99_ms_range": _range([c["p99"] for c in paced_commits]),
        "paced_commit_max_ms": max((c["max"] for c in paced_commits), default=math.nan),
        "burst_events_per_feed_batch": events / max(rounds, 1),
        "paced_events_per_feed_batch": sum(b.events for _, b in paced)
        / max(sum(b.rounds for _, b in paced), 1),
        "slow_consumer_closes": stats.slow_consumer_closes,
        "burst_catch_ups": catch_ups,
        "load_average_at_start": args.load_at_start,
    }


class _Lines:
    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def next(self) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            chunk = await self.stream.receive_some()
            if not chunk:
                raise RuntimeError("the supervisors' process ended early")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        value: dict[str, Any] = json.loads(line)
        return value


def _pcts(values: list[float]) -> str:
    return ", ".join(f"{x:+.1f}" for x in values)


def _table(result: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [
        ("sessions x supervisors", f"{result['sessions']} x {result['supervisors']}"),
        ("subscriptions, simulator", f"{result['mode']}, {result['simulator']}"),
        ("load average at start", f"{result['load_average_at_start']:.2f}"),
    ]
    if result["repeats"]:
        rows += [
            ("burst: agent steps per phase", f"{result['steps']}"),
            ("burst: server CPU per step alone", f"{result['alone_cpu_ms_per_step']:.3f} ms"),
            (
                "burst: server CPU per step attached",
                f"{result['attached_cpu_ms_per_step']:.3f} ms",
            ),
            (
                "burst: increase (median of the pairs)",
                f"{result['increase_pct']:.1f} % ({_pcts(result['increase_pct_each'])})",
            ),
            (
                "burst: of it GC per step alone/attached",
                f"{result['alone_gc_ms_per_step']:.3f}/{result['attached_gc_ms_per_step']:.3f} ms",
            ),
            ("burst: events delivered", f"{result['events_delivered']}"),
            ("burst: events/s delivered", f"{result['events_per_s']:.0f}"),
            (
                "burst: gateway CPU per delivered event",
                f"{result['gateway_cpu_us_per_event']:.1f} µs "
                f"(kernel {result['gateway_system_us_per_event']:.1f} µs)",
            ),
            (
                "burst: delivery p50/p99",
                f"{result['saturated_p50_ms']}/{result['saturated_p99_ms']} ms",
            ),
        ]
    if result["paced_pairs"]:
        low, high = result["paced_increase_pct_range"]
        rows += [
            ("paced: agent steps per phase", f"{result['paced_steps']}"),
            (
                "paced: CPU per step alone/attached (medians)",
                f"{result['paced_alone_cpu_ms_per_step']:.3f}/"
                f"{result['paced_attached_cpu_ms_per_step']:.3f} ms",
            ),
            (
                "paced: increase, median [range] (each pair)",
                f"{result['paced_increase_pct']:+.1f} % [{low:+.1f} .. {high:+.1f}] "
                f"({_pcts(result['paced_increase_pct_each'])})",
            ),
            (
                "paced: fan-out rounds' CPU per step",
                f"{result['paced_fanout_cpu_ms_per_step']:.3f} ms = "
                f"{result['paced_fanout_pct_of_alone']:.1f} % of alone "
                f"({_pcts(result['paced_fanout_pct_of_alone_each'])}; alone "
                f"{result['paced_alone_fanout_cpu_ms_per_step']:.3f} ms)",
            ),
            (
                "paced: kernel CPU per step alone/attached",
                f"{result['paced_alone_system_ms_per_step']:.3f}/"
                f"{result['paced_attached_system_ms_per_step']:.3f} ms",
            ),
            (
                "paced: GC per step alone/attached",
                f"{result['paced_alone_gc_ms_per_step']:.3f}/"
                f"{result['paced_attached_gc_ms_per_step']:.3f} ms",
            ),
            (
                f"paced: delivery p50/p99 at {result['paced_rate_turns_per_s']:g} turns/s",
                f"{result['paced_p50_ms']}/{result['paced_p99_ms']} ms",
            ),
            (
                "paced: commit-to-delivery p50/p99 [range]/max",
                f"{result['paced_commit_p50_ms']:.1f}/{result['paced_commit_p99_ms']:.1f} "
                f"[{result['paced_commit_p99_ms_range'][0]:.1f} .. "
                f"{result['paced_commit_p99_ms_range'][1]:.1f}]/"
                f"{result['paced_commit_max_ms']:.1f} ms",
            ),
        ]
    if result["paced_instructions_per_step_each"]:
        each = result["paced_instructions_per_step_each"]
        rows += [
            (
                "paced: instructions per step alone/attached",
                "; ".join(f"{a / 1e6:.3f}M/{b / 1e6:.3f}M" for a, b in each),
            ),
            (
                "paced: increase in instructions, median (each)",
                f"{result['paced_instruction_increase_pct']:+.1f} % "
                f"({_pcts(result['paced_instruction_increase_pct_each'])})",
            ),
        ]
    rows += [
        (
            "events per fan-out batch, burst/paced",
            f"{result['burst_events_per_feed_batch']:.1f}/"
            f"{result['paced_events_per_feed_batch']:.1f}",
        ),
        ("slow-consumer closes", f"{result['slow_consumer_closes']}"),
        ("subscriptions that fell behind (burst)", f"{result['burst_catch_ups']}"),
    ]
    return rows


def _under_callgrind(argv: list[str]) -> None:
    """Run this benchmark's server under callgrind (the supervisors' process is not traced)."""
    directory = Path(tempfile.mkdtemp(prefix="gateway-callgrind-"))
    command = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={directory}/cg.out",
        "--dump-instr=no",
        sys.executable,
        __file__,
        *argv,
        "--callgrind-dir",
        str(directory),
    ]
    # One hash seed, so both trees hash (and so iterate sets) alike.
    subprocess.run(command, check=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    shutil.rmtree(directory)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--supervisors", type=int, default=10)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument(
        "--simulator",
        choices=["inprocess", "http"],
        default="inprocess",
        help="inprocess: the agents' model answers in this process (no HTTP); http: the "
        "benchmark simulator in its own process, over HTTP (the issue-12 client path)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="burst pairs (alone, then attached), alternating; figures are their medians",
    )
    parser.add_argument("--paced-turns", type=int, default=300)
    parser.add_argument("--rate", type=float, default=50.0, help="paced turns per second")
    parser.add_argument(
        "--paced-pairs",
        type=int,
        default=3,
        help="paced pairs (alone, then attached), alternating; figures are their medians",
    )
    parser.add_argument(
        "--mode",
        choices=sorted(MODES),
        default="merged",
        help="merged: merge: true (_harness/log/merged, one per connection per round); batched: "
        "batch: true (_harness/log/events); plain: one _harness/log/event per event",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="multiply the fan-out's waits (its linger and their limits) by this; under "
        "--instructions, where everything runs ~50x slower, 50 keeps a step's events in as "
        "few fan-out rounds as natively (divide --rate by the same)",
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="run the server under valgrind's callgrind and count each paced phase in "
        "instructions (slow: use --repeat 0, few --paced-turns and a low --rate)",
    )
    parser.add_argument(
        "--profile",
        default=None,
        metavar="PREFIX",
        help="write cProfiles of the server's attached phases (process CPU time) to "
        "PREFIX-burst.prof and PREFIX-paced.prof",
    )
    parser.add_argument("--client", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--callgrind-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client is not None:
        trio.run(_client_main, args.client, args.supervisors, args.mode)
        return
    if args.instructions and args.callgrind_dir is None:
        _under_callgrind(sys.argv[1:])
        return
    args.load_at_start = os.getloadavg()[0]
    result = trio.run(_server, args)
    rows = _table(result)
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    RESULTS.mkdir(exist_ok=True)
    suffix = "-instructions" if args.instructions else ""
    out = RESULTS / f"gateway-{result['mode']}-{result['simulator']}{suffix}.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
