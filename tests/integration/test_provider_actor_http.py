"""The provider actor over the real adapter and a real loopback simulator."""

from __future__ import annotations

import httpx
import trio

from actors.agent import AgentOptions, open_agent
from actors.prompt import SystemPrompt
from actors.providers.actor import ProviderActor
from actors.providers.openai_compat import OpenAICompatProvider
from actors.providers.simulator import Fault, SimulatorConfig, SimulatorEngine, serve_simulator
from actors.session.events import AssistantMessage


def actor_for(engine: SimulatorEngine, url: str, max_in_flight: int = 4) -> ProviderActor:
    def factory(client: httpx.AsyncClient) -> OpenAICompatProvider:
        return OpenAICompatProvider(client, base_url=url, api_key=engine.config.api_key)

    return ProviderActor(name="sim", factory=factory, max_in_flight=max_in_flight)


async def test_cancelled_turn_closes_the_http_stream_and_the_simulator_sees_the_disconnect() -> (
    None
):
    engine = SimulatorEngine(SimulatorConfig(reply_tokens=400, token_rate=20.0))
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_simulator, engine)
        actor = actor_for(engine, url)
        await nursery.start(actor.serve)
        async with open_agent(
            system_prompt=SystemPrompt(),
            provider=actor,
            options=AgentOptions(model="deepseek-chat"),
        ) as agent:
            async with agent.session.watch() as events:
                agent.followup("tell me a long story")
                with trio.fail_after(10):
                    async for event in events:
                        if event.type == "assistant/chunk":
                            break
            agent.cancel()
            await agent.when_idle()
            with trio.fail_after(10):
                outcome = await engine.requests[0].wait_settled()
        assert outcome == "disconnected"
        assert engine.statistics().disconnects == 1
        assert actor.statistics().in_flight == 0
        nursery.cancel_scope.cancel()
    interrupted = [e.data for e in agent.session.events if isinstance(e.data, AssistantMessage)]
    assert interrupted and interrupted[0].interrupted is True


async def test_retryable_http_failure_is_retried_by_the_loop_over_real_sockets() -> None:
    engine = SimulatorEngine()
    engine.faults.at(0, Fault(status=503, retry_after="0"))
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_simulator, engine)
        actor = actor_for(engine, url)
        await nursery.start(actor.serve)
        async with open_agent(
            system_prompt=SystemPrompt(),
            provider=actor,
            options=AgentOptions(model="deepseek-chat"),
        ) as agent:
            agent.followup("hello")
            with trio.fail_after(10):
                await agent.when_idle()
        nursery.cancel_scope.cancel()
    types = [e.type for e in agent.session.events]
    assert types.count("request/retry") == 1
    assert agent.session.events[-1].data.reason.kind == "completed"  # type: ignore[union-attr]
