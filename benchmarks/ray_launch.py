"""RayLauncher on a two-node loopback Ray cluster: start-up times, memory, restart after a kill.

Each run starts a Ray head on 127.0.0.2 and a worker node on 127.0.0.3
(`ray start`, token auth, no dashboard; `tests/ray_cluster.py`) and a
throwaway PostgreSQL on loopback (`tests/postgres.py`), launches one harness
node per Ray node with `RayLauncher`, SIGKILLs the worker node's actor
process and times until Ray's restart of it listens again, then stops the
nodes and kills every Ray process by PID. Reports, per run:

- `ray start` of the head and of the worker node (s);
- `RayLauncher.start()`: actor creation to every node listening (s);
- per Ray node: its processes and their summed RSS, without and with the
  node actor, and the node actor's own RSS (MiB), with both nodes idle;
- restart: from the SIGKILL to the restarted node answering (s);
- `RayLauncher.stop()` (s);
- for comparison, the RSS of a plain `harness node` process, idle (MiB).

Needs the ray extra (`make test-ray` installs it into the venv).

Run: .venv/bin/python benchmarks/ray_launch.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from supervision.cluster.ray_launcher import RayLauncher
from tests.postgres import PostgresServer
from tests.ray_cluster import HEAD_IP, RayCluster, deployment, restarted, rss_kib

RESULTS = Path(__file__).parent / "results" / "ray_launch.json"


def plain_node_rss_mib(config: Path, secret: str) -> float:
    """Start `harness node` on 127.0.0.1, read its RSS once it has idled 2 s, SIGTERM it."""
    harness = Path(sys.executable).with_name("harness")
    node = subprocess.Popen(
        [str(harness), "node", "--config", str(config), "--listen", "127.0.0.1:0"],
        env={**os.environ, "HARNESS_CLUSTER_TOKEN": secret},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert node.stdout is not None
        line = node.stdout.readline()
        if "listening on" not in line:
            raise RuntimeError(f"harness node did not start: {line!r}")
        time.sleep(2)
        return rss_kib(node.pid) / 1024
    finally:
        node.send_signal(signal.SIGTERM)
        node.wait(30)


def one_run(server: PostgresServer, workdir: Path, token: str) -> dict[str, Any]:
    config = workdir / "deploy.toml"
    config.write_text(deployment(server.new_schema()))
    secret = secrets.token_hex(16)
    cluster = RayCluster.start(token)  # one token for all runs: `ray` keeps the first it saw
    result: dict[str, Any] = {
        "ray_start_head_s": cluster.head_seconds,
        "ray_start_worker_s": cluster.worker_seconds,
    }
    try:
        os.environ.update(cluster.driver_environment())
        system = {
            node: (len(cluster.pids(node)), cluster.rss_mib(node)) for node in ("head", "worker")
        }
        launcher = RayLauncher(
            config,
            address=cluster.address,
            node_ip_address=HEAD_IP,
            env={"HARNESS_CLUSTER_TOKEN": secret},
        )
        started = time.monotonic()
        nodes = launcher.start()
        result["launch_s"] = time.monotonic() - started
        try:
            time.sleep(2)  # let the nodes settle (first heartbeats, idle)
            for node in nodes:
                name = "head" if node.ray_node_ip == HEAD_IP else "worker"
                result[f"{name}_processes_before_actor"] = system[name][0]
                result[f"{name}_rss_before_actor_mib"] = system[name][1]
                result[f"{name}_processes"] = len(cluster.pids(name))
                result[f"{name}_rss_mib"] = cluster.rss_mib(name)
                result[f"{name}_actor_rss_mib"] = rss_kib(node.pid) / 1024
            victim = next(node for node in nodes if node.ray_node_ip != HEAD_IP)
            killed = time.monotonic()
            os.kill(victim.pid, signal.SIGKILL)
            restarted(launcher, victim, deadline_seconds=120)
            result["restart_s"] = time.monotonic() - killed
        finally:
            stopping = time.monotonic()
            launcher.stop()
            result["stop_s"] = time.monotonic() - stopping
    finally:
        cluster.stop()
    result["plain_harness_node_rss_mib"] = plain_node_rss_mib(config, secret)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    server = PostgresServer.start()
    token = secrets.token_hex(32)
    runs: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="harness-ray-bench-") as workdir:
            for _ in range(args.runs):
                runs.append(one_run(server, Path(workdir), token))
    finally:
        server.stop()
    print(f"{args.runs} runs; min / median / max")
    for key in runs[0]:
        values = [run[key] for run in runs]
        print(f"{key:32} {min(values):9.2f} {statistics.median(values):9.2f} {max(values):9.2f}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"args": vars(args), "runs": runs}, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
