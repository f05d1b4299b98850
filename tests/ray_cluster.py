"""A throwaway two-node Ray cluster on loopback for tests and benchmarks, stopped by PID.

`RayCluster.start()` runs `ray start --head` on 127.0.0.2 and a second
`ray start` on 127.0.0.3 (Ray rewrites 127.0.0.1 to the machine's routable
address, but keeps any other loopback address), each with its own temp dir
under one fresh directory, `HOME` pointed there, token auth (Ray 2.60's
default) with a fresh token in `RAY_AUTH_TOKEN`, and no usage stats. Every process Ray starts
inherits a marker variable naming the cluster and the node, so `pids()`
finds exactly this cluster's processes in `/proc` and `stop()` kills them
by PID: never `ray stop`, never a match on a process name.

The driver (the calling process) must run with `driver_environment()` set
(`RAY_AUTH_MODE`, `RAY_AUTH_TOKEN`, `HOME`) to join. `deployment()` and
`restarted()` are what the Ray test and `benchmarks/ray_launch.py` share.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import attrs

from supervision.cluster.ray_launcher import RayLauncher, RayLauncherError, RayNode

HEAD_IP = "127.0.0.2"
WORKER_IP = "127.0.0.3"
_MARKER = "HARNESS_TEST_RAY_CLUSTER"
_STOP_TIMEOUT_SECONDS = 20.0


def deployment(dsn: str) -> str:
    """A cluster deployment on `dsn`: the `[cluster]` table and the bundled simulator."""
    return f"""
[store]
url = "{dsn}"

[cluster]
nodes = "postgres"

[providers.local]
kind = "simulator"

[agents.default]
provider = "local"
model = "deepseek-chat"
"""


def restarted(launcher: RayLauncher, dead: RayNode, deadline_seconds: float = 60.0) -> RayNode:
    """The node that replaced `dead` once Ray restarted its actor (asked until it answers).

    Raises:
        RuntimeError: no restarted node answered within `deadline_seconds`.
    """
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        try:
            now = {node.node_id: node for node in launcher.nodes()}
        except RayLauncherError:  # the actor is restarting: Ray's calls fail meanwhile
            now = {}
        if dead.node_id in now and now[dead.node_id].pid != dead.pid:
            return now[dead.node_id]
        time.sleep(0.05)
    raise RuntimeError(f"{dead.node_id} was not restarted within {deadline_seconds} s")


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _environ_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or not ours to read
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}


def rss_kib(pid: int) -> int:
    """The resident set size of `pid` in KiB (0 when it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@attrs.define(eq=False)
class RayCluster:
    """A running loopback cluster: a head on 127.0.0.2 and a worker node on 127.0.0.3."""

    root: Path
    port: int
    head_seconds: float
    worker_seconds: float
    token: str

    @property
    def address(self) -> str:
        """The head's `HOST:PORT`, for `ray.init(address=...)` and `RayLauncher`."""
        return f"{HEAD_IP}:{self.port}"

    @classmethod
    def start(cls, token: str | None = None) -> RayCluster:
        """Start the head, then the worker node; each `ray start` returns once its node is up.

        `token` is the cluster's auth token (a fresh one when None). A process
        that imported `ray` keeps the token it saw then, so a driver joining
        several clusters in turn must start them all with one token.

        Raises:
            RuntimeError: a `ray start` failed (the message holds its output);
                whatever had started is stopped again.
        """
        root = Path(tempfile.mkdtemp(prefix="harness-ray-"))
        (root / "home").mkdir()
        cluster = cls(
            root=root,
            port=_free_port(HEAD_IP),
            head_seconds=0.0,
            worker_seconds=0.0,
            token=token or secrets.token_hex(32),
        )
        try:
            common = ["--num-cpus=1", "--object-store-memory=100000000", "--disable-usage-stats"]
            cluster.head_seconds = cluster._ray_start(
                "head",
                ["--head", f"--node-ip-address={HEAD_IP}", f"--port={cluster.port}",
                 "--include-dashboard=false", *common],
            )  # fmt: skip
            cluster.worker_seconds = cluster._ray_start(
                "worker",
                [f"--address={cluster.address}", f"--node-ip-address={WORKER_IP}", *common],
            )
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def driver_environment(self) -> dict[str, str]:
        """What the driver process's environment needs to join this cluster."""
        return {
            "HOME": str(self.root / "home"),
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.token,
            "RAY_USAGE_STATS_ENABLED": "0",
        }

    def pids(self, node: str | None = None) -> list[int]:
        """This cluster's processes (of the `"head"` or `"worker"` node, or both), by PID."""
        found: list[int] = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            mark = _environ_of(int(entry.name)).get(_MARKER, "")
            if mark.startswith(f"{self.root}:") and (node is None or mark == f"{self.root}:{node}"):
                found.append(int(entry.name))
        return sorted(found)

    def rss_mib(self, node: str) -> float:
        """The summed RSS of one node's processes, in MiB."""
        return sum(rss_kib(pid) for pid in self.pids(node)) / 1024

    def stop(self) -> None:
        """SIGKILL every process of this cluster by PID until none is left; remove the dir.

        Raises:
            RuntimeError: some process outlived the stop timeout (named by PID).
        """
        deadline = time.monotonic() + _STOP_TIMEOUT_SECONDS
        try:
            while pids := self.pids():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Ray processes still running after SIGKILL: {pids}")
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.1)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def _ray_start(self, node: str, arguments: list[str]) -> float:
        environment: Mapping[str, str] = {
            **os.environ,
            **self.driver_environment(),
            _MARKER: f"{self.root}:{node}",
        }
        ray = Path(sys.executable).with_name("ray")
        started = time.monotonic()
        result = subprocess.run(
            [str(ray), "start", f"--temp-dir={self.root / node}", *arguments],
            env=environment, capture_output=True, check=False, timeout=120,
        )  # fmt: skip
        if result.returncode != 0:
            output = (result.stdout + result.stderr).decode(errors="replace")
            raise RuntimeError(f"ray start ({node}) failed: {output}")
        return time.monotonic() - started
