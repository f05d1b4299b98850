"""The parallel-session workload through the gateway: one process against 3 node processes.

Two figures per launcher, on a PostgreSQL server started here (Debian's
binaries, durable settings, a loopback port, stopped by its PID):

- **throughput**: N sessions (default 300) each run one turn of two steps
  (the user message makes the model call `echo`, the tool result goes back,
  the model answers), all at once, with the workload of
  `benchmarks/parallel_sessions.py` (12-paragraph system prompt, 40 tools,
  the time context) against the benchmark simulator in its own process
  (0.05 s per request). Reported: steps/s over the turn phase and harness
  CPU per step: the user+system CPU of every harness process (the nodes
  and the gateway, or the one `harness serve`) over that phase, from /proc;
  and PostgreSQL's CPU per step (the server and its backends) beside it.
- **failover** (node launchers only): sessions run tool-calling turns
  continuously (the chaos test's `chaos_step`, 0.2 s each); one node is
  `kill -9`ed; for each session it held, the time from the kill to that
  session's next `step/end` in the log (the gateway sees the node's stream
  drop at once and sends the calls to the next owner, which takes each
  lease over once it expires: a node's leases last as long as its 5 s
  heartbeat timeout; the cut-off step is closed there and the turn run
  again).

Launchers are entries of `LAUNCHERS`: a name and an async context manager
that starts the harness processes and yields a `Cluster` (gateway `url`
and `token`, `pids()` of the harness processes, `nodes` it may kill). A
Ray-launched mode is one more entry: node processes started as Ray actors
by `supervision.cluster.ray_launcher.RayLauncher`, the gateway as here,
`pids()` the actors' node processes and the gateway.

Prints a table and writes benchmarks/results/cluster.json (see benchmarks/README.md).

Run: .venv/bin/python benchmarks/cluster.py [--sessions 300] [--launchers one-process nodes]
     [--failover-sessions 300] [--runs 1]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import trio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.chaos holds the process orchestration this shares

from benchmarks.cluster_tools import import_paths  # noqa: E402
from supervision.bench.simulator_process import start_simulator_process  # noqa: E402
from supervision.bench.workload import API_KEY, system_prompt_text, user_message  # noqa: E402
from tests.chaos import logcheck  # noqa: E402
from tests.chaos.cluster import Cluster, chaos_deployment, open_cluster  # noqa: E402
from tests.chaos.processes import cpu_seconds_of  # noqa: E402
from tests.chaos.rpc import RpcConnection, RpcError, open_rpc  # noqa: E402
from tests.chaos.tools import owners_at, read_journal  # noqa: E402
from tests.chaos.workload import Workload  # noqa: E402
from tests.postgres import PostgresServer  # noqa: E402

RESULTS = Path(__file__).parent / "results"
SIM_KEY_ENV = "HARNESS_BENCH_SIM_KEY"
SESSIONS_PER_CONNECTION = 50
"""Prompts in flight per websocket (the gateway allows 64)."""
FAILOVER_WARMUP_SECONDS = 6.0
FAILOVER_AFTER_SECONDS = 20.0

Launcher = Callable[[Path, str, str, Mapping[str, str]], AbstractAsyncContextManager[Cluster]]


def _one_process(
    root: Path, dsn: str, deployment: str, env: Mapping[str, str]
) -> AbstractAsyncContextManager[Cluster]:
    return open_cluster(root, dsn, nodes=0, single=True, deployment=deployment, env=env)


def _nodes(
    root: Path, dsn: str, deployment: str, env: Mapping[str, str]
) -> AbstractAsyncContextManager[Cluster]:
    return open_cluster(root, dsn, nodes=3, deployment=deployment, env=env)


LAUNCHERS: dict[str, Launcher] = {"one-process": _one_process, "nodes": _nodes}
"""Name → how to start the harness processes (see the module docstring)."""


def bench_deployment(simulator_url: str) -> str:
    """The parallel-session workload as a deployment: the simulator process, 40 tools, time."""
    tools = ", ".join(json.dumps(path) for path in import_paths())
    return "\n".join(
        [
            "[providers.sim]",
            'kind = "openai-compatible"',
            f"base_url = {json.dumps(simulator_url)}",
            f'api_key_env = "{SIM_KEY_ENV}"',
            "max_in_flight = 1024",
            "",
            "[agents.default]",
            'provider = "sim"',
            'model = "deepseek-chat"',
            f"persona = {json.dumps(system_prompt_text())}",
            f"tools = [{tools}]",
            'contexts = ["time"]',
            "",
        ]
    )


def postgres_cpu(postmaster: int) -> float:
    """CPU seconds used so far by the PostgreSQL server: the postmaster and its live children."""
    total = cpu_seconds_of(postmaster)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited meanwhile
        if int(fields[1]) == postmaster:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def harness_cpu(cluster: Cluster) -> float:
    """CPU seconds used so far by every harness process of `cluster`."""
    return sum(cpu_seconds_of(pid) for pid in cluster.pids().values())


@asynccontextmanager
async def connections(cluster: Cluster, sessions: int) -> AsyncIterator[list[RpcConnection]]:
    """Enough websockets to the gateway for `sessions` prompts in flight at once."""
    async with AsyncExitStack() as stack:
        count = max(1, math.ceil(sessions / SESSIONS_PER_CONNECTION))
        yield [
            await stack.enter_async_context(open_rpc(cluster.url, cluster.token))
            for _ in range(count)
        ]


async def throughput(cluster: Cluster, sessions: int, postmaster: int) -> dict[str, Any]:
    """N sessions, one turn each, all at once: steps/s and harness CPU per step."""
    async with connections(cluster, sessions) as sockets:
        ids: list[str] = [""] * sessions

        async def new(index: int) -> None:
            result = await sockets[index % len(sockets)].call(
                "session/new", {"cwd": "/", "mcpServers": []}
            )
            ids[index] = result["sessionId"]

        async with trio.open_nursery() as nursery:
            for index in range(sessions):
                nursery.start_soon(new, index)
        failures: list[str] = []

        async def prompt(index: int) -> None:
            try:
                result = await sockets[index % len(sockets)].call(
                    "session/prompt",
                    {
                        "sessionId": ids[index],
                        "prompt": [{"type": "text", "text": user_message(index)}],
                    },
                )
                if result.get("stopReason") != "end_turn":
                    failures.append(str(result))
            except RpcError as exc:
                failures.append(str(exc))

        cpu_before, started = harness_cpu(cluster), time.monotonic()
        db_before = postgres_cpu(postmaster)
        async with trio.open_nursery() as nursery:
            for index in range(sessions):
                nursery.start_soon(prompt, index)
        wall, cpu = time.monotonic() - started, harness_cpu(cluster) - cpu_before
        db = postgres_cpu(postmaster) - db_before
    steps = 2 * sessions
    return {
        "sessions": sessions,
        "steps": steps,
        "wallS": wall,
        "stepsPerS": steps / wall,
        "harnessCpuMsPerStep": 1000 * cpu / steps,
        "postgresCpuMsPerStep": 1000 * db / steps,
        "processes": len(cluster.pids()),
        "failures": len(failures),
        "firstFailure": failures[0] if failures else None,
    }


async def failover(cluster: Cluster, dsn: str, sessions: int) -> dict[str, Any]:
    """Kill -9 one node mid-run; per session it held, the time to its next step/end."""
    async with AsyncExitStack() as stack:
        workload = Workload(cluster.url, cluster.token, sessions=sessions, subscriber_connections=1)
        await workload.connect(stack)
        await workload.create()
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(workload.run, stop, 1)
            await trio.sleep(FAILOVER_WARMUP_SECONDS)
            victim = cluster.nodes["n1"]
            killed_at = time.time()
            victim.kill()
            await trio.sleep(FAILOVER_AFTER_SECONDS)
            stop.set()
    journal = await trio.to_thread.run_sync(read_journal, cluster.journal)
    log = await trio.to_thread.run_sync(logcheck.read_log, dsn)
    held = [sid for sid, pid in owners_at(journal, killed_at).items() if pid == victim.pid]
    recovery = []
    for sid in held:
        at = logcheck.first_step_end_after(log[sid], int(killed_at * 1000))
        recovery.append(math.inf if at is None else at / 1000 - killed_at)
    finite = sorted(r for r in recovery if math.isfinite(r))
    return {
        "sessions": sessions,
        "heldByKilledNode": len(held),
        "recovered": len(finite),
        "recoveryP50S": statistics.median(finite) if finite else None,
        "recoveryMaxS": finite[-1] if finite else None,
        "failedPrompts": len(workload.failed_prompts()),
    }


async def run_launcher(
    name: str, server: PostgresServer, simulator_url: str, args: argparse.Namespace
) -> dict[str, Any]:
    """Both figures for one launcher, each on a fresh schema and fresh processes."""
    row: dict[str, Any] = {"launcher": name}
    env = {SIM_KEY_ENV: API_KEY}
    with tempfile.TemporaryDirectory(prefix="harness-bench-cluster-") as scratch:
        root = Path(scratch)
        dsn = server.new_schema()
        async with LAUNCHERS[name](
            root / "throughput", dsn, bench_deployment(simulator_url), env
        ) as c:
            row["throughput"] = await throughput(c, args.sessions, server.process.pid)
        if name != "one-process" and args.failover_sessions:
            dsn = server.new_schema()
            async with LAUNCHERS[name](root / "failover", dsn, chaos_deployment(), {}) as cluster:
                row["failover"] = await failover(cluster, dsn, args.failover_sessions)
    return row


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The figures as a plain-text table."""

    def cell(value: Any, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    lines = [
        f"{'launcher':<12} {'sessions':>8} {'steps/s':>8} {'CPU ms/step':>11} "
        f"{'PG ms/step':>10} {'fail':>4} "
        f"{'killed held':>11} {'recov p50 s':>11} {'recov max s':>11}"
    ]
    for row in rows:
        t, f = row["throughput"], row.get("failover", {})
        lines.append(
            f"{row['launcher']:<12} {t['sessions']:>8} {t['stepsPerS']:>8.0f} "
            f"{t['harnessCpuMsPerStep']:>11.2f} {t['postgresCpuMsPerStep']:>10.2f} "
            f"{t['failures']:>4} "
            f"{cell(f.get('heldByKilledNode'), 'd'):>11} {cell(f.get('recoveryP50S'), '.1f'):>11} "
            f"{cell(f.get('recoveryMaxS'), '.1f'):>11}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the table; write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, default=300)
    parser.add_argument("--failover-sessions", type=int, default=300)
    parser.add_argument(
        "--launchers", nargs="+", default=list(LAUNCHERS), choices=sorted(LAUNCHERS)
    )
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--json", type=Path, default=RESULTS / "cluster.json")
    args = parser.parse_args(argv)

    server = PostgresServer.start(durable=True)
    try:
        with start_simulator_process(latency=0.05, reply_tokens=24) as simulator:
            rows = []
            for run in range(args.runs):
                for name in args.launchers:
                    row = trio.run(run_launcher, name, server, simulator.url, args)
                    row["run"] = run
                    rows.append(row)
                    print(format_table([row]).splitlines()[-1], flush=True)
    finally:
        server.stop()
    print(format_table(rows))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "command": " ".join(["benchmarks/cluster.py", *(argv or sys.argv[1:])]),
                "cpus": os.cpu_count(),
                "loadavg": os.getloadavg(),
                "rows": rows,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
