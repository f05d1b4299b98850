"""RayLauncher on a real two-node Ray cluster on loopback (opt-in: `make test-ray`).

A head on 127.0.0.2 and a worker node on 127.0.0.3 (`tests/ray_cluster.py`),
PostgreSQL from Debian's binaries (`tests/postgres.py`): the launcher puts
one harness node on each Ray node, a prompt runs through one node's own
endpoint, a node actor's process is killed and Ray restarts it, and every
Ray process is stopped by PID at the end, whatever happened.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from trio_websocket import open_websocket_url

if importlib.util.find_spec("ray") is None:  # found, not imported: Ray reads its env at import
    pytest.skip(
        "needs the ray extra: `make test-ray` installs it (pip install -e '.[dev,ray]')",
        allow_module_level=True,
    )

from supervision.cluster.ray_launcher import RayLauncher, RayLauncherError
from supervision.cluster.wire import parse, to_node
from supervision.commands.gateway_client import open_gateway_client
from tests.postgres import PostgresServer, running_postgres
from tests.ray_cluster import HEAD_IP, WORKER_IP, RayCluster, deployment, restarted

TAKEOVER_DEADLINE_SECONDS = 60.0
SECRET = "cluster-secret-for-the-ray-test"
GATEWAY_TOKEN = "supervisor-token-for-the-ray-test"


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    """The two-node loopback cluster, this process set up as its driver; stopped by PID.

    One for the module: `ray`, once imported, keeps the auth token it saw.
    """
    running = RayCluster.start()
    try:
        with pytest.MonkeyPatch.context() as patch:
            for name, value in running.driver_environment().items():
                patch.setenv(name, value)
            yield running
    finally:
        running.stop()
        assert running.pids() == []


@pytest.fixture(scope="module")
def server() -> Iterator[PostgresServer]:
    with running_postgres() as started:
        yield started


@pytest.fixture
def dsn(server: PostgresServer) -> str:
    return server.new_schema()


async def prompt_on(endpoint: str, text: str, session_id: str | None = None) -> str:
    """Run one turn through a node's own endpoint (a node stream, as a gateway opens one).

    A session still leased to a killed node is refused until its lease
    expires; the prompt is retried until then. Returns the session id (a
    new session unless `session_id` is given).
    """
    replies: dict[int, dict[str, Any]] = {}
    headers = [(b"authorization", f"Bearer {SECRET}".encode())]
    async with open_websocket_url(endpoint, extra_headers=headers) as socket:
        calls = itertools.count(1)

        async def call(method: str, params: dict[str, Any]) -> dict[str, Any]:
            number = next(calls)
            request = {"jsonrpc": "2.0", "id": number, "method": method, "params": params}
            await socket.send_message(to_node("client", json.dumps(request)))
            while number not in replies:
                for frame_text in parse(await socket.get_message()).texts:
                    frame = json.loads(frame_text)
                    if "id" in frame and "method" not in frame:
                        replies[frame["id"]] = frame
            return replies.pop(number)

        await call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        if session_id is None:
            created = await call("session/new", {"cwd": "/", "mcpServers": []})
            session_id = str(created["result"]["sessionId"])
        prompt = {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}
        with trio.fail_after(TAKEOVER_DEADLINE_SECONDS):
            answer = await call("session/prompt", prompt)
            while "error" in answer:  # held by the killed node until its lease expires
                await trio.sleep(0.5)
                answer = await call("session/prompt", prompt)
        assert answer["result"]["stopReason"] == "end_turn"
    return session_id


def completed_turns(dsn: str, session_id: str) -> int:
    with psycopg.connect(dsn) as connection:
        rows = connection.execute(
            "SELECT event FROM harness_events WHERE session_id = %s ORDER BY seq", (session_id,)
        ).fetchall()
    ends = [json.loads(text) for (text,) in rows]
    return sum(
        1 for e in ends if e["type"] == "turn/end" and e["data"]["reason"]["kind"] == "completed"
    )


def test_nodes_run_on_each_ray_node_survive_a_kill_and_stop_by_pid(
    cluster: RayCluster, dsn: str, tmp_path: Path
) -> None:
    config = tmp_path / "deploy.toml"
    config.write_text(deployment(dsn))
    launcher = RayLauncher(
        config,
        address=cluster.address,
        node_ip_address=HEAD_IP,
        env={"HARNESS_CLUSTER_TOKEN": SECRET},
    )
    try:
        nodes = launcher.start()
        assert sorted(node.ray_node_ip for node in nodes) == [HEAD_IP, WORKER_IP]
        for node in nodes:
            assert node.endpoint.startswith(f"ws://{node.ray_node_ip}:")
            assert node.pid in cluster.pids("head" if node.ray_node_ip == HEAD_IP else "worker")
        victim = next(node for node in nodes if node.ray_node_ip == WORKER_IP)

        # A prompt through the worker node's own endpoint: no Ray call on the way.
        session_id = trio.run(prompt_on, victim.endpoint, "hello")
        assert completed_turns(dsn, session_id) == 1

        os.kill(victim.pid, signal.SIGKILL)
        replacement = restarted(launcher, victim)
        assert replacement.ray_node_id == victim.ray_node_id
        assert replacement.pid != victim.pid and replacement.pid in cluster.pids("worker")

        # The restarted node takes the session over (its lease expired with the killed one).
        trio.run(prompt_on, replacement.endpoint, "again", session_id)
        assert completed_turns(dsn, session_id) == 2
    finally:
        launcher.stop()
    assert [pid for pid in cluster.pids() if pid in {n.pid for n in nodes}] == []


def test_a_node_that_cannot_start_is_reported_not_restarted(
    cluster: RayCluster, dsn: str, tmp_path: Path
) -> None:
    config = tmp_path / "deploy.toml"
    config.write_text(deployment(dsn))
    launcher = RayLauncher(config, address=cluster.address, node_ip_address=HEAD_IP)  # no secret
    with pytest.raises(RayLauncherError, match=r"failed: ConfigError: .*HARNESS_CLUSTER_TOKEN"):
        launcher.start()
    with pytest.raises(RayLauncherError, match=r"not started"):
        launcher.nodes()  # the failed start removed its actors again


def lease_holders(dsn: str, session_ids: list[str]) -> set[int]:
    """The PIDs of the processes holding these sessions' leases (`pid N on host ...`)."""
    with psycopg.connect(dsn) as connection:
        rows = connection.execute(
            "SELECT owner FROM harness_leases WHERE session_id = ANY(%s)", (session_ids,)
        ).fetchall()
    return {int(str(owner).split()[1]) for (owner,) in rows}


async def prompts_through(gateway: str, sessions: int) -> list[str]:
    async with open_gateway_client(gateway, GATEWAY_TOKEN) as client:
        ids: list[str] = []
        for _ in range(sessions):
            created = await client.call("session/new", {"cwd": "/", "mcpServers": []})
            ids.append(str(created["sessionId"]))
        for session_id in ids:
            prompt = [{"type": "text", "text": "hello"}]
            answer = await client.call(
                "session/prompt", {"sessionId": session_id, "prompt": prompt}
            )
            assert answer["stopReason"] == "end_turn"
    return ids


def test_a_cluster_gateway_routes_sessions_to_the_ray_launched_nodes(
    cluster: RayCluster, dsn: str, tmp_path: Path
) -> None:
    config = tmp_path / "deploy.toml"
    config.write_text(deployment(dsn))
    launcher = RayLauncher(
        config,
        address=cluster.address,
        node_ip_address=HEAD_IP,
        env={"HARNESS_CLUSTER_TOKEN": SECRET},
    )
    try:
        nodes = launcher.start()
        harness = Path(sys.executable).with_name("harness")
        with subprocess.Popen(
            [str(harness), "serve", "--config", str(config), "--port", "0"],
            env={**os.environ, "HARNESS_TOKEN": GATEWAY_TOKEN, "HARNESS_CLUSTER_TOKEN": SECRET},
            stdout=subprocess.PIPE,
            text=True,
        ) as gateway:
            try:
                assert gateway.stdout is not None
                kind, url = gateway.stdout.readline().split()
                assert kind == "gateway"
                session_ids = trio.run(prompts_through, url, 16)
            finally:
                gateway.send_signal(signal.SIGTERM)
                assert gateway.wait(30) == 0
        # Placement spread the sessions over both nodes (all 16 on one: odds 1 in 32,768).
        assert lease_holders(dsn, session_ids) == {node.pid for node in nodes}
        assert all(completed_turns(dsn, session_id) == 1 for session_id in session_ids)
    finally:
        launcher.stop()
