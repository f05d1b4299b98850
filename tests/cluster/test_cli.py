"""`harness serve` in cluster mode and `harness node`, as the subprocesses users run."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import trio

from actors.session.events import TurnEnd
from tests.cluster.helpers import CLUSTER_SECRET, node_processes, serve_process, write_config
from tests.cluster.test_failover import stored_events
from tests.gateway.helpers import open_client

TOKEN = "serve-token"


@pytest.fixture(autouse=True)
def _secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_CLUSTER_TOKEN", CLUSTER_SECRET)


async def test_cluster_serve_routes_to_node_processes_and_both_stop_cleanly(
    postgres_dsn: str, tmp_path: Path
) -> None:
    path = write_config(tmp_path / "cluster.toml", postgres_dsn, token_rate=40, reply_tokens=80)
    with (
        node_processes(path, ("n1",)) as nodes,
        serve_process(path, TOKEN) as serve,
    ):
        try:
            assert serve.stdout is not None
            gateway_line = serve.stdout.readline().decode().strip()
            dashboard_line = serve.stdout.readline().decode().strip()
            assert gateway_line.startswith("gateway ws://127.0.0.1:"), gateway_line
            assert gateway_line.endswith("/acp")
            assert dashboard_line.startswith("dashboard http://127.0.0.1:"), dashboard_line
            port = int(gateway_line.rpartition(":")[2].removesuffix("/acp"))
            async with open_client(
                "127.0.0.1", port, headers=[("Authorization", f"Bearer {TOKEN}")]
            ) as client:
                with trio.fail_after(20):
                    while True:  # the gateway's view fills as it starts
                        stats = await client.call("_harness/stats", {})
                        if stats["nodes"]:
                            break
                        await trio.sleep(0.1)
                sid = (await client.call("session/new", {"cwd": "/", "mcpServers": []}))[
                    "sessionId"
                ]
                await client.send(
                    {
                        "jsonrpc": "2.0",
                        "id": "p",
                        "method": "session/prompt",
                        "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]},
                    }
                )
                with trio.fail_after(20):
                    await client.wait_for(lambda m: m.get("method") == "session/update")
                # The node stops mid-turn: the turn is closed in the log, and it exits 0.
                nodes["n1"].process.send_signal(signal.SIGTERM)
                assert nodes["n1"].process.wait(timeout=30) == 0
            serve.send_signal(signal.SIGTERM)
            assert serve.wait(timeout=30) == 0
        finally:
            if serve.poll() is None:
                serve.kill()
    events = await stored_events(postgres_dsn, sid)
    ends = [e.data.reason.kind for e in events if isinstance(e.data, TurnEnd)]
    assert ends == ["aborted"], [e.type for e in events]
