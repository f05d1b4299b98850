"""`harness acp`: the deployment's agents for one ACP client over stdio (how editors launch agents).

Newline-delimited JSON-RPC on stdin/stdout, logs on stderr only, one
client with every scope and no token (the process boundary is the trust
boundary), the same ACP and `_harness/*` methods and the same defaults as
`harness serve`. Requests already running when stdin ends are answered;
then it stops cleanly (live turns end aborted, the store is flushed) with
exit status 0.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys

import trio

from supervision.commands.common import EXIT_OK, Commands, add_config_options, config_of
from supervision.commands.serve import profiles_of
from supervision.config import DeploymentConfig
from supervision.deployment import open_deployment
from supervision.gateway import Gateway, Token
from supervision.gateway.auth import Principal
from supervision.gateway.sessions import SessionDirectory
from supervision.gateway.stdio import StdioTransport


def register(commands: Commands) -> None:
    """Add `acp` to the `harness` parser."""
    acp = commands.add_parser("acp", help="serve one ACP client over stdin/stdout (for editors)")
    add_config_options(acp)
    acp.set_defaults(handler=acp_command)


async def serve_stdio(
    config: DeploymentConfig,
    *,
    store_path: str | None,
    stdin: trio.abc.ReceiveStream,
    stdout: trio.abc.SendStream,
) -> None:
    """Run one connection over `stdin`/`stdout` until the input ends.

    Raises:
        ConfigError: a secret the config names is not set.
    """
    async with open_deployment(config, store_path=store_path) as deployment:
        directory = SessionDirectory(runtime=deployment.runtime, profiles=profiles_of(deployment))
        deployment.on_child(
            lambda child, parent, profile: directory.adopt(child, agent=profile, parent=parent)
        )
        gateway = Gateway(
            runtime=deployment.runtime,
            directory=directory,
            tokens=(),
            origins=(),
            host="stdio",
            port=0,
        )
        principal = Principal(token=Token(secret=secrets.token_urlsafe(24), name="stdio"))
        async with gateway.running():
            await gateway.run_connection(
                StdioTransport(stdin=stdin, stdout=stdout), principal, answer_after_eof=True
            )


def acp_command(args: argparse.Namespace) -> int:
    """`harness acp [--config FILE] [--store PATH]`."""
    config = config_of(args)

    async def main() -> None:
        stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
        stdout = trio.lowlevel.FdStream(os.dup(sys.stdout.fileno()))
        async with stdin, stdout:
            await serve_stdio(config, store_path=args.store, stdin=stdin, stdout=stdout)

    trio.run(main)
    return EXIT_OK
