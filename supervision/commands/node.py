"""`harness node`: one node process of a cluster (sessions over the shared PostgreSQL log).

It prints one line, flushed, once it listens and is registered:
`harness node NODE_ID listening on ws://HOST:PORT`. SIGINT or SIGTERM stop
it cleanly (it leaves the membership table, every live turn ends in the
log, the store is flushed) with exit status 0.
"""

from __future__ import annotations

import argparse
import signal

import trio

from supervision.cluster.node import default_node_id, run_node
from supervision.commands.common import EXIT_OK, Commands, add_config_options, config_of
from supervision.config import ConfigError


def register(commands: Commands) -> None:
    """Add `node` to the `harness` parser."""
    node = commands.add_parser(
        "node", help="host sessions for a cluster: [store] url and [cluster] in the config"
    )
    add_config_options(node, store=False)
    node.add_argument("--node-id", default=None, help="this node's id (default: HOSTNAME-RANDOM)")
    node.add_argument(
        "--listen", default="127.0.0.1:0", help="HOST:PORT for gateways' node streams (0: any)"
    )
    node.set_defaults(handler=node_command)


async def serve_node(args: argparse.Namespace) -> None:
    """Run the node until SIGINT/SIGTERM.

    Raises:
        ConfigError: the config names no cluster, or the cluster secret is unset.
        NodeError: the address cannot be bound.
    """
    config = config_of(args)
    if config.cluster is None:
        raise ConfigError(
            f'{config.source}: harness node needs [cluster] nodes = "postgres" '
            'and [store] url = "postgresql://..."'
        )
    node_id = args.node_id or default_node_id()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            endpoint = await nursery.start(
                lambda task_status: run_node(
                    config, node_id=node_id, listen=args.listen, task_status=task_status
                )
            )
            print(f"harness node {node_id} listening on {endpoint}", flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


def node_command(args: argparse.Namespace) -> int:
    """`harness node --config FILE [--node-id ID] [--listen HOST:PORT]`."""
    trio.run(serve_node, args)
    return EXIT_OK
