"""Harness against LangGraph, pydantic-ai, the OpenAI Agents SDK and AutoGen, in one invocation.

Every framework runs the same workload (`supervision.bench.workload`)
against the same simulator process, each peer in its own virtualenv with
pinned versions (`requirements.py`, created on first use), through its
normal OpenAI chat-completions client. Runs are interleaved per level:
harness, each peer, harness again, so harness's figure is a range taken
around the peers'. Prints each run and the ratios of each peer to harness
(the mean of harness's two runs at that level), writes
benchmarks/results/peers.json and benchmarks/peers/peers.png.

Run: make bench-peers   (or .venv/bin/python benchmarks/peers/run.py
     [--sessions 100 1000] [--latency 0.05] [--peers langgraph autogen ...] [--http 2|1.1])
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from requirements import PEERS, ensure_venv

from supervision.bench.harness_run import LevelSettings
from supervision.bench.parallel import DEFAULT_POOLS, harness_command, run_child
from supervision.bench.report import format_table, write_plot
from supervision.bench.simulator_process import start_simulator_process
from supervision.bench.workload import workload_json

HERE = Path(__file__).parent
RESULTS = HERE.parent / "results"
RATIOS = ("wall_s", "cpu_ms_per_step", "rss_kb_per_idle_session")


def ratio_table(rows: list[dict[str, Any]]) -> str:
    """Each peer's figures divided by harness's mean at the same level."""
    lines = [f"{'framework':>14} {'N':>6} " + " ".join(f"{k + ' ratio':>26}" for k in RATIOS)]
    for row in rows:
        if row["framework"] == "harness":
            continue
        mine = [r for r in rows if r["framework"] == "harness" and r["sessions"] == row["sessions"]]
        cells = []
        for key in RATIOS:
            base = statistics.mean(r[key] for r in mine) if mine else 0.0
            cells.append(f"{row[key] / base:>26.1f}" if base > 0 else f"{'-':>26}")
        lines.append(f"{row['framework']:>14} {row['sessions']:>6} " + " ".join(cells))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--reply-tokens", type=int, default=24)
    parser.add_argument("--sequential-turns", type=int, default=20)
    parser.add_argument("--peers", nargs="+", default=list(PEERS), choices=list(PEERS))
    parser.add_argument("--http", choices=("1.1", "2"), default="1.1", help="harness's HTTP")
    parser.add_argument(
        "--pools", type=int, default=DEFAULT_POOLS, help="harness's connection pools"
    )
    args = parser.parse_args()
    pythons = {peer: ensure_venv(peer) for peer in args.peers}
    rows: list[dict[str, Any]] = []
    with (
        tempfile.NamedTemporaryFile("w", suffix=".json") as workload,
        start_simulator_process(
            latency=args.latency, reply_tokens=args.reply_tokens, http2=args.http == "2"
        ) as sim,
    ):
        workload.write(json.dumps(workload_json()))
        workload.flush()
        for sessions in args.sessions:
            settings = LevelSettings(
                sessions=sessions,
                http2=args.http == "2",
                pools=args.pools,
                sequential_turns=args.sequential_turns,
            )
            peer_settings = json.dumps(
                {"sessions": sessions, "sequential_turns": args.sequential_turns}
            )
            order = ["harness", *args.peers, "harness"]
            for framework in order:
                if framework == "harness":
                    command = harness_command(sim.url, settings)
                else:
                    script = HERE / f"{framework.replace('-', '_')}_peer.py"
                    command = [
                        str(pythons[framework]),
                        str(script),
                        sim.url,
                        peer_settings,
                        workload.name,
                    ]
                print(f"{framework}, {sessions:,} sessions ...", file=sys.stderr, flush=True)
                row = run_child(command, sim, f"{framework} at {sessions} sessions")
                rows.append(row)
                print(format_table([row]).splitlines()[1], file=sys.stderr, flush=True)
    print(format_table(rows))
    print()
    print("ratios to harness (mean of its two runs at that N; > 1: the peer costs more)")
    print(ratio_table(rows))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "peers.json").write_text(json.dumps(rows, indent=2) + "\n")
    write_plot(rows, HERE / "peers.png")
    print(f"wrote {RESULTS / 'peers.json'} and {HERE / 'peers.png'}")
    return 1 if any(row["failed_turns"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
