"""The cluster mode of `harness serve`: the gateway and dashboard in front of node processes.

`serve_cluster_gateway(config)` listens like the single-process gateway
(the websocket at `/acp`, the dashboard at `/`, `/healthz`; the same
handshake authentication, framing, limits and connection actor) but hosts
no sessions: its method table (`supervision.cluster.router_methods`)
routes every call to the nodes of the membership view kept from `[store]
url`. The `Gateway` object it runs on holds an empty runtime (no store on
disk, no providers, no agents), present only because the connection actor
is shared with the single-process gateway.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import trio

from actors.prompt import SystemPrompt
from actors.session import MemoryStore
from supervision.cluster.membership import Membership, MembershipView
from supervision.cluster.node import cluster_secret
from supervision.cluster.router import Router
from supervision.cluster.router_methods import ClusterMethodTable
from supervision.config import DeploymentConfig
from supervision.gateway import Gateway, Token
from supervision.gateway.http import HttpFront
from supervision.gateway.server import bind
from supervision.gateway.sessions import SessionDirectory
from supervision.runtime import open_runtime

log = logging.getLogger(__name__)


async def serve_cluster_gateway(
    config: DeploymentConfig,
    *,
    host: str,
    port: int,
    tokens: Iterable[Token],
    static_dir: Path | None = None,
    retry_deadline: float | None = None,
    view: MembershipView | None = None,
    task_status: trio.TaskStatus[Gateway] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the cluster gateway until cancelled; `task_status.started(gateway)` once it listens.

    `view` replaces the membership view read from the database (a fixed
    view: for tests of gateways that disagree); `retry_deadline` bounds
    each call's retries (default `RETRY_DEADLINE_SECONDS`).

    Cancellation closes every client connection with 1001, then the node links.

    Raises:
        ConfigError: no `[cluster]` / `[store] url`, or the cluster secret is unset.
        GatewayError: the address cannot be bound.
        MembershipError: the database cannot be reached.
    """
    secret = cluster_secret(config)
    assert config.store.url is not None
    token_list, listeners, bound = await bind(tokens, host, port)
    async with (
        open_runtime(
            system_prompt=SystemPrompt(), store=MemoryStore(), providers={}, name="gateway"
        ) as runtime,
        trio.open_nursery() as nursery,
    ):
        if view is None:
            view = await nursery.start(Membership(config.store.url).serve_view)
        cluster = config.cluster
        assert cluster is not None  # cluster_secret checked it
        router = Router(
            view=view,
            secret=secret,
            nursery=nursery,
            ping_interval=cluster.node_ping_interval,
            ping_timeout=cluster.node_ping_timeout,
        )
        if retry_deadline is not None:
            router.retry_deadline = retry_deadline
        nursery.start_soon(router.watch_view)
        gateway = Gateway(
            runtime=runtime,
            directory=SessionDirectory(runtime=runtime, profiles={}),
            tokens=token_list,
            origins=tuple(config.gateway.origins)
            if config.gateway.origins is not None
            else (f"http://{host}:{bound}",),
            host=host,
            port=bound,
            static_dir=static_dir,
            methods=ClusterMethodTable(router=router),
        )
        await nursery.start(gateway.fanout.run)
        front = HttpFront(
            websocket=gateway.handle_websocket, ws_url=gateway.url, static_dir=static_dir
        )

        async def handle(stream: trio.SocketStream) -> None:
            try:
                await front.handle(stream)
            except Exception:
                # One connection's failure never reaches the listener.
                log.exception("cluster gateway connection failed")

        try:
            await nursery.start(trio.serve_listeners, handle, listeners)
            task_status.started(gateway)
            await trio.sleep_forever()
        finally:
            gateway.shut_down_connections()
