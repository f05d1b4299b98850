"""`harness serve`: a deployment behind the gateway and the dashboard, on one port.

The deployment's agent profiles become the gateway's `session/new`
profiles (with their subagent tools); subagents the agents start are
announced to the gateway with their parent, so supervisors see the tree.
Its first stdout lines, each flushed at once: `gateway ws://HOST:PORT/acp`,
`dashboard http://HOST:PORT/` and, when the token was generated, `token
VALUE`. SIGINT or SIGTERM stops it cleanly (live turns end aborted, the
store is flushed) with exit status 0. `harness acp`
(`supervision.commands.acp`) serves the same deployment over stdio.
"""

from __future__ import annotations

import argparse
import errno
import os
import secrets
import signal
from collections.abc import Mapping
from importlib.resources import files
from pathlib import Path

import trio

from actors.agent import Agent
from supervision.commands.common import (
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    Commands,
    add_config_options,
    config_of,
    port_number,
)
from supervision.config import DeploymentConfig, Environment, resolve_environment
from supervision.deployment import Deployment, open_deployment
from supervision.gateway import AgentProfile, Gateway, GatewayError, Token, serve_gateway

STATIC_DIR = Path(str(files("supervision.gateway") / "static"))
"""The dashboard's files, served at `/`."""


def register(commands: Commands) -> None:
    """Add `serve` to the `harness` parser."""
    serve = commands.add_parser(
        "serve", help="run the deployment with the gateway (ws://HOST:PORT/acp) and the dashboard"
    )
    add_config_options(serve)
    serve.add_argument("--host", default=None, help="address to listen on (default: config)")
    serve.add_argument("--port", type=port_number, default=None, help="port (0: any free one)")
    serve.add_argument(
        "--token", default=None, help="bearer token with every scope (default: $HARNESS_TOKEN)"
    )
    serve.set_defaults(handler=serve_command)


TOKEN_ENV = "HARNESS_TOKEN"
"""The environment variable holding the gateway's token when `--token` is not given."""


def given_token(flag: str | None, environ: Mapping[str, str]) -> str | None:
    """The token `harness serve` was given: `--token`, else `HARNESS_TOKEN` (an empty value
    counts as unset), else None."""
    return flag or environ.get(TOKEN_ENV) or None


def tokens_of(
    config: DeploymentConfig, environment: Environment, given: str | None
) -> tuple[list[Token], str | None]:
    """The gateway's tokens, and the generated one to print (None when none was generated).

    `given` (`given_token`: `--token`, else `HARNESS_TOKEN`) has every scope
    on every session; the config's `[[gateway.tokens]]` come next; with
    neither, a random token is generated.
    """
    tokens = [
        Token(secret=t.value, scopes=frozenset(t.scopes), sessions=t.sessions, name=f"config:{i}")
        for i, t in enumerate(environment.tokens)
    ]
    generated = None
    if given:
        tokens.insert(0, Token(secret=given, name="command-line"))
    elif not tokens:
        generated = secrets.token_urlsafe(24)
        tokens.append(Token(secret=generated, name="generated"))
    return tokens, generated


def listen_failure(exc: GatewayError) -> CommandError:
    """The one-line error for a gateway that cannot start, with the hint its cause calls for.

    A busy or forbidden port: pick another port; an address that does not
    resolve or is not this machine's: pick another host.
    """
    cause = exc.__cause__
    if not isinstance(cause, OSError):
        return CommandError(str(exc))
    if cause.errno in (errno.EADDRINUSE, errno.EACCES):
        return CommandError(f"{exc}; pick another with --port (0: any free one)")
    return CommandError(f"{exc}; pick another with --host (an address of this machine)")


def profiles_of(deployment: Deployment) -> dict[str, AgentProfile]:
    """The gateway profiles of the deployment's agent profiles."""
    profiles = {}
    for name in deployment.config.agents:
        spec = deployment.spec(name)
        profiles[name] = AgentProfile(
            options=spec.options,
            tools=spec.tools,
            setup=spec.setup,
            subagents=spec.subagents,
            child_setup=spec.child_setup,
        )
    return profiles


async def serve(args: argparse.Namespace, config: DeploymentConfig) -> None:
    """Run until SIGINT/SIGTERM.

    Raises:
        ConfigError: a secret the config names is not set.
        GatewayError: the address cannot be bound.
    """
    host = args.host or config.gateway.host
    port = config.gateway.port if args.port is None else args.port
    if config.cluster is not None:
        if args.store is not None:
            raise CommandError(
                f"--store {args.store!r}: a cluster gateway ({config.source} has [cluster]) "
                "hosts no sessions; its nodes keep them in [store] url",
                EXIT_USAGE,
            )
        await serve_cluster(args, config, host, port)
        return
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_deployment(config, store_path=args.store) as deployment:
            tokens, generated = tokens_of(
                config, deployment.environment, given_token(args.token, os.environ)
            )
            async with trio.open_nursery() as nursery:
                try:
                    gateway: Gateway = await nursery.start(
                        lambda task_status: serve_gateway(
                            deployment.runtime,
                            host=host,
                            port=port,
                            tokens=tokens,
                            profiles=profiles_of(deployment),
                            origins=config.gateway.origins,
                            static_dir=STATIC_DIR,
                            task_status=task_status,
                        )
                    )
                except GatewayError as exc:
                    raise listen_failure(exc) from exc
                directory = gateway.directory

                def adopt(child: Agent, parent: str, profile: str) -> None:
                    directory.adopt(child, agent=profile, parent=parent)

                deployment.on_child(adopt)
                print(f"gateway {gateway.url}", flush=True)
                print(f"dashboard http://{gateway.host}:{gateway.port}/", flush=True)
                if generated is not None:
                    print(f"token {generated}", flush=True)
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break


async def serve_cluster(
    args: argparse.Namespace, config: DeploymentConfig, host: str, port: int
) -> None:
    """The cluster mode (`[cluster]` in the config): route to the nodes, host no sessions.

    Raises:
        ConfigError: a secret the config names is not set.
        CommandError: the address cannot be bound.
    """
    from supervision.cluster.router_serve import serve_cluster_gateway

    environment = resolve_environment(config)
    tokens, generated = tokens_of(config, environment, given_token(args.token, os.environ))
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            try:
                gateway: Gateway = await nursery.start(
                    lambda task_status: serve_cluster_gateway(
                        config,
                        host=host,
                        port=port,
                        tokens=tokens,
                        static_dir=STATIC_DIR,
                        task_status=task_status,
                    )
                )
            except GatewayError as exc:
                raise listen_failure(exc) from exc
            print(f"gateway {gateway.url}", flush=True)
            print(f"dashboard http://{gateway.host}:{gateway.port}/", flush=True)
            if generated is not None:
                print(f"token {generated}", flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


def serve_command(args: argparse.Namespace) -> int:
    """`harness serve [--config FILE] [--host H] [--port P] [--store PATH] [--token T]`."""
    config = config_of(args)
    trio.run(serve, args, config)
    return EXIT_OK
