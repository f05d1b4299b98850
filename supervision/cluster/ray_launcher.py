"""`RayLauncher`: node processes as long-lived Ray actors, one per Ray node (`harness[ray]`).

Ray is used here as a *launcher* only: it places one node process on each
machine of a Ray cluster and restarts it when the process dies. Each actor
runs `supervision.cluster.node.run_node`, exactly what `harness node` runs:
the node registers in the PostgreSQL `harness_nodes` table and serves
gateways on its own websocket endpoint, so sessions are reached over that
endpoint and never through a Ray call (a Ray call per step costs about 2 ms
of CPU, seven times a direct stream). The launcher talks to an actor only to
start it, to ask where it listens, and to stop it.

Needs the optional `ray` extra (`pip install 'harness[ray]'`); `ray` is
imported when a launcher starts, never with this module, and `actors`
never imports it. Ray's driver API blocks, so so does this one: from Trio,
call it through `trio.to_thread.run_sync`.

Inside an actor, Trio runs in one thread of its own beside Ray's threads
(Ray owns the actor's main thread); the node's lifetime is the actor
process's: when a serving node ends or crashes, the process exits, so Ray
restarts it. A node that cannot start at all (a missing secret, a database
that cannot be reached) is reported by `start()` instead of restarted.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import threading
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from actors.boundary import one_exception
from supervision.cluster.node import run_node
from supervision.config import load_config, parse_config
from supervision.supervisor import SupervisionError

DEFAULT_READY_TIMEOUT_SECONDS = 60.0
"""How long a node actor may take from creation (or restart) to listening."""

DEFAULT_STOP_GRACE_SECONDS = 10.0
"""How long a node actor may take to close its live turns when stopped."""


class RayLauncherError(SupervisionError):
    """Ray is missing, the cluster cannot be reached, or a node actor failed; names which."""


@attrs.frozen(kw_only=True)
class RayNode:
    """One running node actor, as it reported itself.

    Attributes:
        node_id: the harness node id (its `harness_nodes` row), stable
            across restarts of the actor on the same Ray node.
        endpoint: where the node serves gateways, `ws://HOST:PORT`; a
            restarted actor listens on a new port.
        ray_node_id: the Ray node (machine) the actor runs on.
        ray_node_ip: that Ray node's address; the endpoint listens on it.
        pid: the actor's process id on that machine (changes on restart).
    """

    node_id: str
    endpoint: str
    ray_node_id: str
    ray_node_ip: str
    pid: int


@attrs.define(eq=False)
class RayLauncher:
    """Start one harness node actor on every live node of a Ray cluster, and stop them.

    `start()` connects to the cluster (unless this process already did),
    validates the deployment file, creates one actor per live Ray node,
    pinned to it (hard node affinity), and returns once every node listens.
    Each actor is restarted by Ray when its process dies, up to
    `max_restarts` times (-1: always), on the same Ray node and with the
    same node id; a restarted node takes its sessions back over by the
    usual lease rules. Ray never retries a call into an actor (retries
    belong to the gateway, which holds the request ids). `nodes()` reports
    where each actor runs and listens now; `stop()` closes every node
    gracefully, then removes its actor for good.

    The actors live as long as this launcher's process (the Ray driver):
    when it exits, Ray ends them too.

    Args:
        config_path: the deployment's TOML file (with `[store] url` on the
            shared PostgreSQL); its text is shipped to every actor, so the
            Ray nodes need not have the file. Environment variables it names
            (the `[cluster]` token, provider keys) are read in each actor:
            from `env`, else from the Ray node's own environment.
        address: the Ray cluster's address (`HOST:PORT` of its head).
        node_ip_address: this process's own address in the cluster, for
            a driver on a machine with several (a loopback test cluster:
            `127.0.0.2`); None lets Ray choose.
        env: environment variables set in every actor (Ray's `runtime_env`);
            Ray keeps them in its cluster state, readable by whoever can
            reach the Ray cluster.
        max_restarts: restarts Ray makes of each actor (-1: unlimited).
        node_id_prefix: node ids are `<prefix>-<first 12 hex digits of the Ray node id>`.
        ready_timeout: seconds an actor may take to listen, from creation or restart.
        stop_grace: seconds an actor may take to close its live turns at `stop()`.
    """

    config_path: Path = attrs.field(converter=Path)
    address: str
    node_ip_address: str | None = None
    env: Mapping[str, str] = attrs.field(factory=dict)
    max_restarts: int = attrs.field(default=-1, validator=attrs.validators.ge(-1))
    node_id_prefix: str = "ray"
    ready_timeout: float = attrs.field(
        default=DEFAULT_READY_TIMEOUT_SECONDS, validator=attrs.validators.gt(0)
    )
    stop_grace: float = attrs.field(
        default=DEFAULT_STOP_GRACE_SECONDS, validator=attrs.validators.gt(0)
    )
    _ray: Any = attrs.field(default=None, init=False)
    _actors: dict[str, Any] = attrs.field(factory=dict, init=False)
    _connected_here: bool = attrs.field(default=False, init=False)

    def start(self) -> list[RayNode]:
        """Start a node actor on every live Ray node; return them once all listen.

        Blocks until every node listens, at most `ready_timeout` seconds.

        Raises:
            ConfigError: the deployment file is missing or invalid (nothing started).
            RayLauncherError: the launcher already started, Ray is not
                installed, the cluster cannot be reached or has no live
                node, or a node failed to start (the message carries its
                error) or missed `ready_timeout`; the actors already
                started are stopped again.
        """
        if self._actors:
            raise RayLauncherError(f"{self._label}: already started; stop() it first")
        load_config(self.config_path)  # fail before starting anything
        text = self.config_path.read_text(encoding="utf-8")
        ray = self._connect()
        scheduling = importlib.import_module("ray.util.scheduling_strategies")
        node_actor = ray.remote(max_restarts=self.max_restarts, max_task_retries=0, num_cpus=0)(
            NodeActor
        )
        live = [node for node in ray.nodes() if node.get("Alive")]
        if not live:
            raise RayLauncherError(f"{self._label}: the Ray cluster has no live node")
        for ray_node in live:
            ray_node_id = str(ray_node["NodeID"])
            node_id = f"{self.node_id_prefix}-{ray_node_id[:12]}"
            strategy = scheduling.NodeAffinitySchedulingStrategy(node_id=ray_node_id, soft=False)
            self._actors[node_id] = node_actor.options(
                scheduling_strategy=strategy, runtime_env={"env_vars": dict(self.env)}
            ).remote(text, str(self.config_path), node_id)
        try:
            return self.nodes()
        except RayLauncherError:
            # The start failure is the error to report; a node that did not
            # start cannot stop cleanly either, and is removed all the same.
            with contextlib.suppress(RayLauncherError):
                self.stop()
            raise

    def nodes(self) -> list[RayNode]:
        """Every node actor as it reports itself now (a restarting one once it listens again).

        Blocks until each answers, at most `ready_timeout` seconds.

        Raises:
            RayLauncherError: a node actor is dead (restarts used up), failed
                to start, or missed `ready_timeout`; the message names it.
        """
        ray = self._connected()
        names = list(self._actors)
        calls = [self._actors[name].describe.remote(self.ready_timeout) for name in names]
        reports: list[RayNode] = []
        for name, call in zip(names, calls, strict=True):
            try:
                report = ray.get(call, timeout=self.ready_timeout + 5)
            except Exception as exc:  # Ray's own errors: actor died, timed out, failed
                # A failure inside the actor arrives wrapped; `cause` is the actor's own error.
                reason = getattr(exc, "cause", None) or exc
                raise RayLauncherError(
                    f"{self._label}: node {name!r} did not report: {reason}"
                ) from exc
            reports.append(RayNode(**report))
        return reports

    def stop(self) -> None:
        """Stop every node actor: close its node (live turns closed in the log), then remove it.

        Each node gets `stop_grace` seconds to close; one that does not (or
        is already dead) is killed all the same, and Ray does not restart
        it. Disconnects from the cluster when `start()` connected. Safe to
        call more than once.

        Raises:
            RayLauncherError: some node did not close cleanly (every actor
                is removed regardless); the message names them and why.
        """
        if self._ray is None:
            return
        ray = self._ray
        failures: list[str] = []
        actors, self._actors = self._actors, {}
        calls = {name: actor.shutdown.remote(self.stop_grace) for name, actor in actors.items()}
        for name, call in calls.items():
            try:
                closed = ray.get(call, timeout=self.stop_grace + 5)
            except Exception as exc:  # dead, or stuck past the grace: killed below anyway
                failures.append(f"{name!r}: {exc}")
            else:
                if not closed:
                    failures.append(f"{name!r}: did not close within {self.stop_grace} s")
        for actor in actors.values():
            ray.kill(actor, no_restart=True)
        if self._connected_here:
            ray.shutdown()
            self._connected_here = False
        self._ray = None
        if failures:
            raise RayLauncherError(
                f"{self._label}: {len(failures)} node(s) did not stop cleanly: "
                + "; ".join(failures)
            )

    @property
    def _label(self) -> str:
        return f"Ray launcher for {str(self.config_path)!r} on {self.address}"

    def _connect(self) -> Any:
        try:
            ray = importlib.import_module("ray")
        except ImportError as exc:
            raise RayLauncherError(
                f"{self._label}: Ray is not installed; "
                "install the extra: pip install 'harness[ray]'"
            ) from exc
        if not ray.is_initialized():
            try:
                ray.init(
                    address=self.address,
                    _node_ip_address=self.node_ip_address,
                    log_to_driver=False,
                    logging_level="warning",
                )
            except Exception as exc:  # Ray's ConnectionError and friends
                raise RayLauncherError(f"{self._label}: cannot join the cluster: {exc}") from exc
            self._connected_here = True
        self._ray = ray
        return ray

    def _connected(self) -> Any:
        if self._ray is None:
            raise RayLauncherError(f"{self._label}: not started; call start() first")
        return self._ray


class NodeActor:
    """The body of one node actor (`ray.remote` wraps it): `run_node` in a Trio thread.

    Created by Ray in the actor's process; Ray calls `describe` and
    `shutdown` from its own threads. No method is `async` (an `async def`
    would make Ray run the class as an asyncio actor).

    Args:
        config_text: the deployment's TOML text.
        source: where that text came from (named in config errors).
        node_id: the harness node id this actor serves as.
    """

    def __init__(self, config_text: str, source: str, node_id: str) -> None:
        ray = importlib.import_module("ray")
        self._node_id = node_id
        self._ray_node_id = str(ray.get_runtime_context().get_node_id())
        self._ray_node_ip = str(ray.util.get_node_ip_address())
        self._config = parse_config(tomllib.loads(config_text), source)
        self._ready = threading.Event()
        self._endpoint: str | None = None
        self._failure: str | None = None
        self._stopping = False
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._thread = threading.Thread(target=self._run, name=f"harness node {node_id}")
        self._thread.start()

    def describe(self, timeout: float) -> dict[str, Any]:
        """Where this node runs and listens, once it listens (waits at most `timeout` s).

        Raises:
            RuntimeError: the node failed to start, or is not listening after `timeout`.
        """
        if not self._ready.wait(timeout):
            raise RuntimeError(f"node {self._node_id!r} is not listening after {timeout} s")
        if self._failure is not None:
            raise RuntimeError(f"node {self._node_id!r} failed: {self._failure}")
        return {
            "node_id": self._node_id,
            "endpoint": self._endpoint,
            "ray_node_id": self._ray_node_id,
            "ray_node_ip": self._ray_node_ip,
            "pid": os.getpid(),
        }

    def shutdown(self, grace: float) -> bool:
        """Cancel the node (it closes its live turns and leaves `harness_nodes`).

        Returns whether it finished within `grace` seconds; the process
        stays up either way (the launcher then removes the actor).
        """
        self._stopping = True
        token, scope = self._token, self._scope
        if token is not None and scope is not None:
            with contextlib.suppress(trio.RunFinishedError):  # it already ended
                token.run_sync_soon(scope.cancel)
        self._thread.join(grace)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            with one_exception():  # the node's own error, not the nursery's group
                trio.run(self._serve)
        except Exception as exc:  # report how the node failed, then end the process
            self._failure = f"{type(exc).__name__}: {exc}"
        finally:
            self._ready.set()
            if not self._stopping and self._endpoint is not None:
                # A node that was serving ended on its own (or crashed): end
                # the process, so that Ray restarts the actor with a fresh
                # node. One that never started stays, failed, so `describe`
                # reports why (restarting would fail the same way).
                os._exit(1)

    async def _serve(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        with trio.CancelScope() as scope:
            self._scope = scope
            if self._stopping:
                return
            async with trio.open_nursery() as nursery:
                self._endpoint = await nursery.start(
                    functools.partial(
                        run_node,
                        self._config,
                        node_id=self._node_id,
                        listen=f"{self._ray_node_ip}:0",
                    )
                )
                self._ready.set()
