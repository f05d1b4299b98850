"""The `harness` command: run, watch and look into agent sessions.

Each command lives in a module of `supervision.commands` that adds its
parser with `register(commands)` and sets `handler`; `main` parses, calls
the handler and turns expected failures into one line on stderr and an
exit status: 2 for a usage or config error, 1 for a failed operation, 0 for
success. Only bugs print a traceback.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import trio

from actors.prompt import PromptError
from actors.providers import ProviderError
from actors.providers.simulator import ModelScript, ScriptError, SimulatorConfig, run_simulator_cli
from actors.session import SessionError
from supervision.bench.parallel import add_arguments as add_bench_arguments
from supervision.bench.parallel import run_parsed as run_bench_parallel
from supervision.commands import acp as acp_commands
from supervision.commands import agent as agent_commands
from supervision.commands import log as log_commands
from supervision.commands import node as node_commands
from supervision.commands import serve as serve_commands
from supervision.commands import watch as watch_commands
from supervision.commands.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    Commands,
    Parser,
)
from supervision.config import ConfigError
from supervision.demo import DEFAULT_STORE, demo_api_key, run_demo
from supervision.gateway import GatewayError
from supervision.local_model import LocalModelError, run_local_demo
from supervision.supervisor import SupervisionError

Register = Callable[[Commands], None]

COMMAND_GROUPS: tuple[Register, ...] = (
    serve_commands.register,
    node_commands.register,
    acp_commands.register,
    agent_commands.register,
    log_commands.register,
    watch_commands.register,
)
"""Each group adds its commands to the parser; a new group is one entry here."""


def _demo(args: argparse.Namespace) -> int:
    if args.local_model:
        report = trio.run(lambda: run_local_demo(store_path=args.store))
    else:
        report = trio.run(lambda: run_demo(store_path=args.store, api_key=demo_api_key()))
    if not report.ok:
        print(f"harness demo: {report.failure or 'a request was not rebuilt'}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _simulator(args: argparse.Namespace) -> int:
    config = SimulatorConfig(
        script=ModelScript.load(args.script) if args.script else None,
        latency=args.latency,
        reply_tokens=args.reply_tokens,
        token_rate=args.token_rate,
    )
    run_simulator_cli(args.port, config)
    return EXIT_OK


def _builtin(commands: Commands) -> None:
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
    demo.set_defaults(handler=_demo)
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
    simulator.set_defaults(handler=_simulator)
    bench = commands.add_parser("bench", help="load benchmarks").add_subparsers(
        dest="bench", required=True, metavar="BENCHMARK"
    )
    parallel = bench.add_parser(
        "parallel",
        help="parallel sessions through the runtime against the simulator in its own "
        "process, with a live progress bar; prints a table, writes JSON",
    )
    add_bench_arguments(parallel)
    parallel.set_defaults(handler=run_bench_parallel)


def parser() -> Parser:
    """The `harness` argument parser with every command."""
    root = Parser(prog="harness", description="Run, watch and look into agent sessions.")
    commands = root.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in COMMAND_GROUPS:
        register(commands)
    _builtin(commands)
    return root


def _reachable(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, the members of groups, and the causes of both, depth first."""
    seen: set[int] = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if current.__cause__ is not None:
            stack.append(current.__cause__)
        if isinstance(current, BaseExceptionGroup):
            stack.extend(reversed(current.exceptions))


def expected_failure(exc: BaseException) -> tuple[str, int] | None:
    """(one-line message, exit status) for an error the user can act on; None for a bug.

    The most specific error wins: a domain error that wraps a busy port or a
    config mistake is reported as that.
    """
    found = list(_reachable(exc))
    for error in found:
        if isinstance(error, CommandError):
            return str(error), error.code
        if isinstance(error, ConfigError | ScriptError):
            return str(error), EXIT_USAGE
    for error in found:
        if isinstance(error, GatewayError):
            return str(error), EXIT_FAILED
        if isinstance(error, OSError) and error.errno == errno.EADDRINUSE:
            return (
                f"address already in use ({error.strerror}): another process listens on "
                "that port; pick another with --port (0: any free port)",
                EXIT_FAILED,
            )
        if isinstance(error, LocalModelError):
            return str(error), EXIT_FAILED
    for error in found:
        if isinstance(error, SessionError | ProviderError | PromptError | SupervisionError):
            return str(error), EXIT_FAILED
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `harness` command; returns the process exit status."""
    args = parser().parse_args(argv)
    try:
        status: int = args.handler(args)
    except BrokenPipeError:
        # The reader went away (`harness show S | head`): stop writing, quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("harness: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        found = expected_failure(exc)
        if found is None:
            raise
        message, status = found
        print(f"harness: {' '.join(message.split())}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
