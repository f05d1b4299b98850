"""The simulator on a loopback port, served by Hypercorn's Trio worker."""

from __future__ import annotations

import logging
import signal
from functools import partial
from typing import cast

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from hypercorn.typing import ASGIFramework

from actors.providers.simulator.asgi import SimulatorApp
from actors.providers.simulator.config import SimulatorConfig
from actors.providers.simulator.engine import SimulatorEngine

_log = logging.getLogger("actors.providers.simulator")


async def serve_simulator(
    engine: SimulatorEngine,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `engine` over HTTP/1.1 on `host:port` until cancelled.

    Args:
        engine: The engine answering requests.
        host: The address to bind (loopback by default).
        port: The port to bind; 0 picks a free one.
        task_status: Receives the base URL (`http://127.0.0.1:PORT`) once the
            socket is bound and accepting.

    Cancellation: cancelling stops accepting and closes open connections;
    streams in progress are recorded as disconnects.
    """
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = _log
    app = cast(ASGIFramework, SimulatorApp(engine))
    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(partial(serve, app, config))
        task_status.started(binds[0])


def run_simulator_cli(port: int, config: SimulatorConfig | None = None) -> None:
    """Run a simulator on `127.0.0.1:port` until SIGINT or SIGTERM (`harness simulator`).

    Prints the base URL and the API key once listening, and a last line when
    it stops.

    Args:
        port: The port to listen on; 0 picks a free one (the printed URL names it).
        config: The simulator's configuration; None: the defaults.
    """
    engine = SimulatorEngine(config)

    async def main() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                url = await nursery.start(serve_simulator, engine, "127.0.0.1", port)
                print(
                    f"simulator listening on {url} (api key: {engine.config.api_key})", flush=True
                )
                async for signum in signals:
                    print(f"simulator stopped ({signal.Signals(signum).name})", flush=True)
                    nursery.cancel_scope.cancel()
                    break

    trio.run(main)
