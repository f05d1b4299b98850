"""`harness bench parallel`: the parallel-session load benchmark, level by level.

The simulator runs in a child process of its own (its CPU is not counted);
each level (N sessions) runs in a fresh child process too, so its RSS
starts clean, with a live progress bar on stderr. Between levels the
simulator's counters and prefix cache are reset, so each level's cache hit
ratio is its own. The same driver runs the peer frameworks
(`benchmarks/peers/`), whose scripts print the same JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from supervision.bench.harness_run import LevelSettings
from supervision.bench.report import PlotError, format_table, write_plot
from supervision.bench.simulator_process import SimulatorProcess, start_simulator_process

DEFAULT_SESSIONS = (100, 1000, 10000)
DEFAULT_POOLS = 256
"""The client's connection pools: about 4 connections each at the 1,000 requests in flight of
N = 1,000, since httpcore's scan of a pool, on every request start and end, walks each of its
connections (see benchmarks/README.md for the measurements)."""


class BenchError(RuntimeError):
    """A benchmark level failed; the message names the level and what it printed."""


def run_child(command: Sequence[str], sim: SimulatorProcess, what: str) -> dict[str, Any]:
    """Run one level in a child process; add the simulator's accounting and CPU time to its result.

    The child prints its result as the last line of stdout; its stderr
    (the progress bar) goes to this process's stderr.

    Raises:
        BenchError: the child failed or printed no JSON result.
    """
    sim.reset()
    sim_cpu = sim.cpu_seconds()
    done = subprocess.run(list(command), stdout=subprocess.PIPE, text=True, check=False)
    sim_cpu = sim.cpu_seconds() - sim_cpu
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise BenchError(f"{what} failed (exit {done.returncode}): {done.stdout[-2000:]!r}")
    try:
        result: dict[str, Any] = json.loads(lines[-1])
    except ValueError as exc:
        raise BenchError(f"{what} printed no JSON result: {lines[-1]!r}") from exc
    accounting = sim.accounting()
    result["simulator_cpu_s"] = sim_cpu
    result["cache"] = {
        **attrs.asdict(accounting),
        "hit_ratio": accounting.hit_ratio,
        "limit_ratio": accounting.limit_ratio,
        "of_limit": accounting.of_limit,
    }
    return result


def harness_command(url: str, settings: LevelSettings) -> list[str]:
    """The command that runs one harness level against `url`."""
    return [
        sys.executable,
        "-m",
        "supervision.bench.level_process",
        url,
        json.dumps(attrs.asdict(settings)),
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `harness bench parallel` (and `benchmarks/parallel_sessions.py`)."""
    parser.add_argument(
        "--sessions",
        type=int,
        nargs="+",
        default=list(DEFAULT_SESSIONS),
        help="session counts, one level each (default: 100 1000 10000)",
    )
    parser.add_argument(
        "--latency", type=float, default=0.05, help="simulated model latency per request, s"
    )
    parser.add_argument("--reply-tokens", type=int, default=24, help="final reply length, tokens")
    parser.add_argument("--store", choices=("memory", "sqlite"), default="memory")
    parser.add_argument(
        "--http",
        choices=("1.1", "2"),
        default="1.1",
        help="HTTP version to the simulator (2: multiplexed over one connection; see "
        "actors.providers.http_client for why it is not the default)",
    )
    parser.add_argument(
        "--pools",
        type=int,
        default=DEFAULT_POOLS,
        help=f"connection pools in the client (default {DEFAULT_POOLS})",
    )
    parser.add_argument(
        "--max-in-flight", type=int, default=None, help="requests in flight (default: min(N, 1000))"
    )
    parser.add_argument(
        "--sequential-turns", type=int, default=50, help="turns run one at a time per level"
    )
    parser.add_argument(
        "--no-hibernate",
        dest="hibernate",
        action="store_false",
        help="keep idle sessions' logs in memory (default: idle agents hibernate)",
    )
    parser.add_argument(
        "--max-awake",
        type=int,
        default=None,
        help="agents awake at once (default: as many as requests in flight; 0: no bound)",
    )
    parser.add_argument(
        "--no-trim",
        dest="trim_memory",
        action="store_false",
        help="do not give freed memory back after the burst (default: the runtime trims)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG plot here")


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Run every level of `args` and return their results (also printed and written).

    Raises:
        BenchError: a level failed.
        SimulatorProcessError: the simulator did not start.
    """
    rows: list[dict[str, Any]] = []
    with start_simulator_process(
        latency=args.latency, reply_tokens=args.reply_tokens, http2=args.http == "2"
    ) as sim:
        for sessions in args.sessions:
            settings = LevelSettings(
                sessions=sessions,
                store=args.store,
                http2=args.http == "2",
                pools=args.pools,
                max_in_flight=args.max_in_flight,
                sequential_turns=args.sequential_turns,
                hibernate=args.hibernate,
                max_awake=args.max_awake,
                trim_memory=args.trim_memory,
            )
            row = run_child(
                harness_command(sim.url, settings), sim, f"harness level {sessions} sessions"
            )
            row["latency_s"] = args.latency
            row["reply_tokens"] = args.reply_tokens
            rows.append(row)
    print(format_table(rows))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
        print(f"wrote {args.json}")
    if args.plot is not None:
        write_plot(rows, args.plot)
        print(f"wrote {args.plot}")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """`harness bench parallel` on its own: returns the exit status (see `run_parsed`)."""
    parser = argparse.ArgumentParser(prog="harness bench parallel", description=__doc__)
    add_arguments(parser)
    return run_parsed(parser.parse_args(argv))


def run_parsed(args: argparse.Namespace) -> int:
    """Run the benchmark for parsed `add_arguments` options; returns the exit status.

    1 when a level failed or a turn did not complete (the reason on
    stderr), else 0.
    """
    try:
        rows = run(args)
    except (BenchError, PlotError) as exc:
        print(f"harness bench parallel: {exc}", file=sys.stderr)
        return 1
    return 1 if any(row["failed_turns"] for row in rows) else 0
