"""What every command shares: its one expected-failure exception, the store, the console."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn, TypeAlias

from rich.console import Console

from actors.session import SessionStore, SQLiteStore, event_to_json
from supervision.config import MAX_PORT, MEMORY_STORE, DeploymentConfig, load_config
from supervision.deployment import session_store

EXIT_OK = 0
EXIT_FAILED = 1
"""The operation failed (a failed turn, an unknown session, a busy port)."""
EXIT_USAGE = 2
"""The command line or the config is wrong."""


class Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line (and exit status 2)."""

    def error(self, message: str) -> NoReturn:
        """Print `message` on one line and exit with status 2."""
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


Commands: TypeAlias = "argparse._SubParsersAction[Parser]"
"""The `harness` subcommand table that each command group adds its parsers to."""


class CommandError(Exception):
    """An expected failure: printed as one line on stderr, the process exits with `code`.

    The message says what went wrong and, where it helps, what to do.
    """

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def add_config_options(
    parser: argparse.ArgumentParser, *, store: bool = True, required: bool = False
) -> None:
    """`--config FILE` (`required`: no built-in default) and (with `store`) `--store PATH`."""
    if required:
        parser.add_argument("--config", type=Path, required=True, help="deployment TOML file")
    else:
        parser.add_argument(
            "--config", type=Path, default=None, help="deployment TOML file (default: built-in)"
        )
    if store:
        parser.add_argument(
            "--store",
            default=None,
            help="SQLite session store (default: the config's [store] path)",
        )


def port_number(text: str) -> int:
    """An argparse `type=`: a TCP port, 0-65535 (0: any free one)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"port {port} is outside 0-{MAX_PORT} (0: any free one)")
    return port


def host_and_port(text: str) -> str:
    """An argparse `type=`: `HOST:PORT` with a port 0-65535 (kept as written)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host.strip("[]") or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} must be HOST:PORT (port 0: any free one)")
    port_number(port)
    return text


def websocket_url(text: str) -> str:
    """An argparse `type=`: a `ws://` or `wss://` URL with a host (kept as written)."""
    scheme, sep, rest = text.partition("://")
    if not sep or scheme.lower() not in ("ws", "wss") or not rest.split("/", 1)[0]:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a websocket URL: give ws://HOST:PORT/acp (or wss://)"
        )
    return text


def add_json_option(parser: argparse.ArgumentParser) -> None:
    """`--json`: print the data as JSON instead of a table."""
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def config_of(args: argparse.Namespace) -> DeploymentConfig:
    """The deployment `--config` names (the built-in one without it).

    Raises:
        ConfigError: the file is invalid.
    """
    path: Path | None = args.config
    return load_config(path)


def store_path_of(args: argparse.Namespace, config: DeploymentConfig) -> str:
    """`--store`, else the config's `[store] path`."""
    store: str | None = getattr(args, "store", None)
    return store or config.store.path


def existing_store(args: argparse.Namespace) -> SessionStore:
    """The store the command reads: `--store`, else the config's (a SQLite file is never
    created by reading).

    Raises:
        ConfigError: the config is invalid.
        CommandError: the store is "memory" or its file does not exist.
    """
    config = config_of(args)
    if getattr(args, "store", None) is None and config.store.url is not None:
        return session_store(config.store.path, config.store.url)
    path = store_path_of(args, config)
    if path == MEMORY_STORE:
        raise CommandError(
            "the store is 'memory': its sessions live only inside the process that ran them; "
            "pass --store PATH or use `harness watch` against a running `harness serve`",
            EXIT_USAGE,
        )
    if not Path(path).is_file():
        raise CommandError(
            f"no session store at {path!r}: nothing has run with it yet "
            "(`harness run PROMPT` creates it; --store PATH picks another)"
        )
    return SQLiteStore(Path(path))


async def load_session(store: SessionStore, session_id: str) -> list[dict[str, Any]]:
    """The session's log as JSON (`session.to_json()` form).

    Raises:
        CommandError: no such session (the message says how to list them).
    """
    if not await store.exists(session_id):
        raise CommandError(
            f"unknown session {session_id!r}; `harness sessions` lists the stored ones"
        )
    return [event_to_json(event) for event in await store.load(session_id)]


def console() -> Console:
    """A console on stdout that never cuts a line short (wide when not a terminal)."""
    if sys.stdout.isatty():
        return Console(highlight=False)
    width = int(os.environ.get("COLUMNS", "0") or 0) or 200
    return Console(highlight=False, width=width, no_color=True)


def print_json(value: Any) -> None:
    """Print `value` as one line of JSON on stdout."""
    sys.stdout.write(json.dumps(value, ensure_ascii=False) + "\n")
    sys.stdout.flush()
