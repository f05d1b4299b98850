"""A harness cluster as real processes: N `harness node` processes and the cluster `harness serve`.

`open_cluster(root, dsn, nodes=3)` writes the deployment config (the
PostgreSQL store at `dsn`, `[cluster] nodes = "postgres"`, the bundled
simulator, one `default` profile with the `chaos_step` tool), starts the
nodes and the gateway as children of one `ProcessGroup` (each ready once
it printed its readiness line) and yields a `Cluster`; on the way out every
process is stopped by its PID. `add_node()` starts one more node (a join).
`open_cluster(..., nodes=0, single=True)` starts one plain `harness serve`
on the same store instead: the one-process baseline of the benchmark.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio

from tests.chaos.processes import Child, ProcessGroup, open_processes
from tests.chaos.tools import JOURNAL_ENV, SECONDS_ENV

REPO = Path(__file__).resolve().parents[2]
HARNESS = (sys.executable, "-m", "supervision.cli")
NODE_READY = r"harness node (\S+) listening on (ws://\S+)"
GATEWAY_READY = r"gateway (ws://\S+/acp)"


def chaos_deployment(reply_tokens: int = 4) -> str:
    """The providers and agents of the chaos test: the in-process simulator, `chaos_step`."""
    return "\n".join(
        [
            "[providers.sim]",
            'kind = "simulator"',
            f"reply_tokens = {reply_tokens}",
            "max_in_flight = 512",
            "",
            "[agents.default]",
            'provider = "sim"',
            'persona = "You are the chaos test\'s agent."',
            'tools = ["tests.chaos.tools:chaos_step"]',
            "max_steps = 8",
            "",
        ]
    )


def write_config(path: Path, dsn: str, *, cluster: bool, deployment: str) -> None:
    """A deployment config: the PostgreSQL store, the cluster table, then `deployment`."""
    lines = ["[store]", f"url = {json.dumps(dsn)}", ""]
    if cluster:
        lines += ["[cluster]", 'nodes = "postgres"', ""]
    path.write_text("\n".join([*lines, deployment]))


@attrs.define(eq=False)
class Cluster:
    """The running processes: `nodes` by node id, the `gateway`, its `url` and `token`."""

    group: ProcessGroup
    config: Path
    journal: Path
    token: str
    nodes: dict[str, Child] = attrs.field(factory=dict)
    gateway: Child | None = None
    url: str = ""

    async def add_node(self, node_id: str, timeout: float = 60.0) -> Child:
        """Start `harness node --node-id NODE_ID` and wait until it is registered and ready."""
        child = await self.group.start(
            f"node-{node_id}",
            [*HARNESS, "node", "--config", str(self.config), "--node-id", node_id,
             "--listen", "127.0.0.1:0"],
            ready=NODE_READY,
            timeout=timeout,
            cwd=self.journal.parent,
        )  # fmt: skip
        self.nodes[node_id] = child
        return child

    async def start_gateway(self, timeout: float = 60.0) -> Child:
        """Start `harness serve --config FILE --port 0` and wait for its `gateway ws://...` line."""
        child = await self.group.start(
            "gateway",
            [*HARNESS, "serve", "--config", str(self.config), "--port", "0"],
            ready=GATEWAY_READY,
            timeout=timeout,
            cwd=self.journal.parent,
        )
        assert child.ready_match is not None
        self.gateway = child
        self.url = child.ready_match.group(1)
        return child

    def pids(self) -> dict[str, int]:
        """Every process's PID, by name (`node-ID`, `gateway`)."""
        named = {f"node-{node_id}": child.pid for node_id, child in self.nodes.items()}
        if self.gateway is not None:
            named["gateway"] = self.gateway.pid
        return named

    def outputs(self) -> str:
        """Every process's last output lines, for a failure message."""
        return self.group.outputs()


def child_env(journal: Path, tool_seconds: float, token: str) -> Mapping[str, str]:
    """The environment of every harness child: this repo importable, the token, the journal."""
    env = {k: v for k, v in os.environ.items() if k not in ("DEEPSEEK_API_KEY",)}
    env["PYTHONPATH"] = str(REPO)
    env["HARNESS_TOKEN"] = token
    env["HARNESS_CLUSTER_TOKEN"] = f"cluster-{token}"  # what the gateway presents to the nodes
    env[JOURNAL_ENV] = str(journal)
    env[SECONDS_ENV] = str(tool_seconds)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@asynccontextmanager
async def open_cluster(
    root: Path,
    dsn: str,
    *,
    nodes: int = 3,
    single: bool = False,
    tool_seconds: float = 0.2,
    deployment: str | None = None,
    env: Mapping[str, str] | None = None,
) -> AsyncIterator[Cluster]:
    """Nodes `n1..nN` and the cluster gateway (or, `single`, one plain `harness serve`).

    `deployment` replaces the chaos test's providers and agents tables;
    `env` adds to the children's environment.
    """
    journal = root / "journal"
    journal.mkdir(parents=True, exist_ok=True)
    config = root / "harness.toml"
    write_config(
        config,
        dsn,
        cluster=not single,
        deployment=chaos_deployment() if deployment is None else deployment,
    )
    token = secrets.token_urlsafe(16)
    environment = {**child_env(journal, tool_seconds, token), **(env or {})}
    async with open_processes(root / "logs", environment) as group:
        cluster = Cluster(group=group, config=config, journal=journal, token=token)
        async with trio.open_nursery() as starting:  # the nodes start side by side
            for number in range(1, nodes + 1):
                starting.start_soon(cluster.add_node, f"n{number}")
        await cluster.start_gateway()
        yield cluster
