"""The `harness` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import trio

from actors.providers.simulator import ModelScript, SimulatorConfig, run_simulator_cli
from supervision.demo import DEFAULT_STORE, demo_api_key, run_demo
from supervision.local_model import LocalModelError, run_local_demo


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="harness", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo",
        help="run one agent for five turns against the local simulator "
        "(or DeepSeek when DEEPSEEK_API_KEY is set) and report cache hits",
    )
    demo.add_argument("--store", type=Path, default=DEFAULT_STORE, help="SQLite session store")
    demo.add_argument(
        "--local-model",
        action="store_true",
        help="talk to SmolLM2-135M on a local llama.cpp server (build it: make llama-server)",
    )
    simulator = commands.add_parser(
        "simulator", help="serve the DeepSeek-compatible simulator on 127.0.0.1"
    )
    simulator.add_argument("--port", type=int, default=8765, help="port to listen on (0: any)")
    simulator.add_argument(
        "--script", type=Path, help="JSON model script: reply rules (docs/simulator.md)"
    )
    simulator.add_argument(
        "--latency", type=float, default=0.0, help="seconds before every chat response's headers"
    )
    simulator.add_argument(
        "--reply-tokens", type=int, default=24, help="length of the filler reply, in tokens"
    )
    simulator.add_argument(
        "--token-rate", type=float, default=0.0, help="tokens per second (0: as fast as possible)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `harness` command; returns the process exit code."""
    args = _parser().parse_args(argv)
    if args.command == "simulator":
        try:
            config = SimulatorConfig(
                script=ModelScript.load(args.script) if args.script else None,
                latency=args.latency,
                reply_tokens=args.reply_tokens,
                token_rate=args.token_rate,
            )
        except ValueError as exc:  # ScriptError included
            print(f"harness simulator: {exc}", file=sys.stderr)
            return 2
        run_simulator_cli(args.port, config)
        return 0
    if args.local_model:
        try:
            report = trio.run(lambda: run_local_demo(store_path=args.store))
        except LocalModelError as exc:
            print(f"harness demo --local-model: {exc}", file=sys.stderr)
            return 2
    else:
        report = trio.run(lambda: run_demo(store_path=args.store, api_key=demo_api_key()))
    return 0 if report.rebuilt_all else 1


if __name__ == "__main__":
    sys.exit(main())
