"""The `harness` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import trio

from actors.providers.simulator import run_simulator_cli
from supervision.demo import DEFAULT_STORE, demo_api_key, run_demo
from supervision.gateway.serve import DEFAULT_PORT, run_acp, run_serve


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
    serve = commands.add_parser(
        "serve", help="run the runtime with its websocket gateway and dashboard on one port"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (0: any)")
    serve.add_argument("--store", type=Path, default=None, help="SQLite session store")
    serve.add_argument("--token", default=None, help="bearer token (default: $HARNESS_TOKEN)")
    acp = commands.add_parser("acp", help="serve one ACP client over stdin/stdout")
    acp.add_argument("--store", type=Path, default=None, help="SQLite session store")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `harness` command; returns the process exit code."""
    args = _parser().parse_args(argv)
    if args.command == "simulator":
        run_simulator_cli(args.port)
        return 0
    if args.command == "serve":
        return run_serve(host=args.host, port=args.port, store=args.store, token=args.token)
    if args.command == "acp":
        return run_acp(store=args.store)
    report = trio.run(lambda: run_demo(store_path=args.store, api_key=demo_api_key()))
    return 0 if report.rebuilt_all else 1


if __name__ == "__main__":
    sys.exit(main())
