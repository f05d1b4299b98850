"""`harness serve` and `harness acp`: the runtime with its gateway, over a port or over stdio.

Both run with nothing configured: one agent profile `default` on the
bundled simulator (started in process on a loopback port), or on DeepSeek
when `DEEPSEEK_API_KEY` is set; the SQLite store at
`.harness/sessions.sqlite`; the tools `list_files` and `read_file`,
read-only and confined to the directory the command started in.

`serve` prints `gateway ws://HOST:PORT/acp` and `dashboard http://HOST:PORT/`
(flushed at once; with `--port 0` the bound port), and `token <value>` when
it made one up. SIGINT/SIGTERM stop it cleanly: sockets close with 1001,
live turns end aborted (disposed), the store is flushed, exit status 0.
`acp` speaks newline-delimited JSON-RPC on stdin/stdout (logs on stderr)
for one client, with every scope; EOF on stdin stops it the same way.
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import trio

from actors.agent import AgentOptions
from actors.prompt import SystemPrompt
from actors.providers import Provider
from actors.providers.actor import ProviderActor
from actors.providers.openai_compat import OpenAICompatProvider
from actors.providers.simulator import SimulatorEngine, serve_simulator
from actors.session import SessionError, SQLiteStore
from supervision.gateway.auth import Principal, Token
from supervision.gateway.server import Gateway, GatewayError, open_gateway
from supervision.gateway.sessions import AgentProfile, SessionDirectory
from supervision.gateway.stdio import StdioTransport
from supervision.gateway.workspace import workspace_tools
from supervision.runtime import Runtime, open_runtime

DEFAULT_STORE = Path(".harness") / "sessions.sqlite"
DEFAULT_PORT = 8700
DEEPSEEK_BASE_URL = "https://api.deepseek.com"
MODEL = "deepseek-chat"
PERSONA = "You are a careful assistant powered by {{model}}. You can read the workspace."
STATIC_DIR = Path(__file__).with_name("static")


@asynccontextmanager
async def open_default_runtime(store_path: Path, workspace: Path) -> AsyncIterator[Runtime]:
    """The runtime `serve` and `acp` share: provider, SQLite store, `default` profile tools."""
    api_key = os.environ.get("DEEPSEEK_API_KEY") or None
    async with trio.open_nursery() as nursery:
        if api_key is None:
            engine = SimulatorEngine()
            base_url: str = await nursery.start(serve_simulator, engine)
            key = engine.config.api_key
        else:
            base_url, key = DEEPSEEK_BASE_URL, api_key

        def factory(client: httpx.AsyncClient) -> Provider:
            return OpenAICompatProvider(client, base_url=base_url, api_key=key)

        actor = ProviderActor(name="default", factory=factory)
        async with open_runtime(
            system_prompt=SystemPrompt(persona=PERSONA),
            store=SQLiteStore(store_path),
            providers={"default": actor},
            name="harness",
        ) as runtime:
            yield runtime
        nursery.cancel_scope.cancel()


def default_profiles(workspace: Path) -> dict[str, AgentProfile]:
    """The `default` profile: the model, the two read-only workspace tools."""
    return {
        "default": AgentProfile(
            options=AgentOptions(model=MODEL, provider_name="default"),
            tools=workspace_tools(workspace),
        )
    }


async def serve(
    *,
    host: str,
    port: int,
    store_path: Path,
    token: str | None,
    out: Callable[[str], None],
) -> None:
    """Run `harness serve` until SIGINT/SIGTERM (see the module docstring).

    Raises:
        GatewayError: the port cannot be bound.
        SessionError: the store cannot be opened or written.
    """
    secret = token or os.environ.get("HARNESS_TOKEN") or None
    made_up = secret is None
    secret = secret or secrets.token_urlsafe(24)
    workspace = Path.cwd()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with (
            open_default_runtime(store_path, workspace) as runtime,
            open_gateway(
                runtime,
                host=host,
                port=port,
                tokens=[Token(secret=secret, name="serve")],
                profiles=default_profiles(workspace),
                static_dir=STATIC_DIR if STATIC_DIR.is_dir() else None,
            ) as gateway,
        ):
            out(f"gateway {gateway.url}")
            out(f"dashboard {gateway.http_url}")
            if made_up:
                out(f"token {secret}")
            async for _ in signals:
                break


async def serve_stdio(
    *, store_path: Path, stdin: trio.abc.ReceiveStream, stdout: trio.abc.SendStream
) -> None:
    """Run `harness acp`: one connection over newline-delimited JSON-RPC until EOF.

    Raises:
        SessionError: the store cannot be opened or written.
    """
    workspace = Path.cwd()
    async with open_default_runtime(store_path, workspace) as runtime:
        gateway = Gateway(
            runtime=runtime,
            directory=SessionDirectory(runtime=runtime, profiles=default_profiles(workspace)),
            tokens=(),
            origins=(),
            host="stdio",
            port=0,
        )
        principal = Principal(token=Token(secret=secrets.token_urlsafe(24), name="stdio"))
        await gateway.run_connection(
            StdioTransport(stdin=stdin, stdout=stdout), principal, answer_after_eof=True
        )


def _say(line: str) -> None:
    print(line, flush=True)


def run_serve(*, host: str, port: int, store: Path | None, token: str | None) -> int:
    """The `harness serve` command: 0 after a clean stop, 1 (one line on stderr) on failure."""
    try:
        trio.run(
            lambda: serve(
                host=host, port=port, store_path=store or DEFAULT_STORE, token=token, out=_say
            )
        )
    except (GatewayError, SessionError) as exc:
        print(f"harness serve: {exc}", file=sys.stderr)
        return 1
    return 0


def run_acp(*, store: Path | None) -> int:
    """The `harness acp` command: 0 after EOF on stdin, 1 (one line on stderr) on failure."""

    async def main() -> None:
        stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
        stdout = trio.lowlevel.FdStream(os.dup(sys.stdout.fileno()))
        async with stdin, stdout:
            await serve_stdio(store_path=store or DEFAULT_STORE, stdin=stdin, stdout=stdout)

    try:
        trio.run(main)
    except SessionError as exc:
        print(f"harness acp: {exc}", file=sys.stderr)
        return 1
    return 0
