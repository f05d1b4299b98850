"""The `harness` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import trio

from actors.providers.simulator import run_simulator_cli
from supervision.demo import DEFAULT_STORE, demo_api_key, run_demo


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="harness", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo",
        help="run one agent for five turns against the local simulator "
        "(or DeepSeek when DEEPSEEK_API_KEY is set) and report cache hits",
    )
    demo.add_argument("--store", type=Path, default=DEFAULT_STORE, help="SQLite session store")
    simulator = commands.add_parser(
        "simulator", help="serve the DeepSeek-compatible simulator on 127.0.0.1"
    )
    simulator.add_argument("--port", type=int, default=8765, help="port to listen on (0: any)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `harness` command; returns the process exit code."""
    args = _parser().parse_args(argv)
    if args.command == "simulator":
        run_simulator_cli(args.port)
        return 0
    report = trio.run(lambda: run_demo(store_path=args.store, api_key=demo_api_key()))
    if not report.ok:
        print(f"harness demo: {report.failure or 'a request was not rebuilt'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
