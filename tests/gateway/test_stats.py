"""`_harness/stats` reports what the provider actor and store measure: latency, failures."""

from __future__ import annotations

from pathlib import Path

import trio

from actors.agent import AgentOptions
from actors.prompt import SystemPrompt
from actors.providers.actor import ProviderActor
from actors.providers.simulator import Fault
from actors.session import SQLiteStore
from supervision.gateway import AgentProfile, open_gateway
from supervision.runtime import open_runtime
from tests.gateway.helpers import ALL, LIST_FILES, connect, simulator_provider


async def test_stats_report_provider_latency_failures_by_code_and_commit_p99(
    tmp_path: Path,
) -> None:
    # A real clock: the SQLite writer commits in worker threads.
    async with (
        simulator_provider() as (provider, engine),
        open_runtime(
            system_prompt=SystemPrompt(persona="test"),
            store=SQLiteStore(tmp_path / "sessions.db"),
            providers={"default": ProviderActor(name="default", factory=lambda _: provider)},
        ) as runtime,
        open_gateway(
            runtime,
            tokens=[ALL],
            profiles={
                "default": AgentProfile(
                    options=AgentOptions(model="deepseek-chat"), tools=(LIST_FILES,)
                )
            },
        ) as gateway,
        connect(gateway) as client,
    ):
        with trio.fail_after(20):
            before = await client.call("_harness/stats", {})
            sid = (await client.call("session/new", {"cwd": "/", "mcpServers": []}))["sessionId"]
            prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": "hello"}]}
            assert (await client.call("session/prompt", prompt))["stopReason"] == "end_turn"
            engine.faults.queue(Fault(status=400))
            failed = await client.request("session/prompt", prompt)
            after = await client.call("_harness/stats", {})
    assert before["providers"][0]["latencyMs"] == {"p50": None, "p99": None}
    assert before["store"]["commitP99Ms"] is None
    (default,) = after["providers"]
    latency = default["latencyMs"]
    assert 0 < latency["p50"] <= latency["p99"]
    assert failed["error"]["data"]["turnEnd"]["error"]["code"] == "bad_request"
    assert default["failuresByCode"] == {"bad_request": 1}
    assert after["store"]["commits"] > 0 and after["store"]["commitP99Ms"] > 0
