"""The contrast the design exists for: volatile facts in a context keep the cache hitting;
the same fact in a section (the system text) makes the hit ratio collapse."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from actors.agent import AgentOptions, Tool, open_agent
from actors.prompt import PromptContext, PromptSection, SystemPrompt
from actors.providers.openai_compat import OpenAICompatProvider
from actors.providers.simulator import SimulatorEngine, simulator_transport
from actors.session.events import AssistantMessage

GUIDANCE = "Verify every change, keep answers short, and cite tool output exactly. " * 40


async def lookup(arguments: dict[str, Any] | str, call: object) -> str:
    return f"value for {arguments!r}"


LOOKUP = Tool(
    name="lookup",
    description="Look a key up.",
    parameters={"type": "object", "properties": {"key": {"type": "string"}}},
    execute=lookup,
)
TURNS = (
    "Hello there.",
    'Look this up.\ncall lookup {"key": "alpha"}',
    "Thanks, and now a plain question.",
    'One more lookup.\ncall lookup {"key": "beta"}',
    "That is all.",
)


async def run_workload(*, time_in_section: bool) -> list[tuple[int, int]]:
    """(prompt tokens, cached tokens) of every request, with the time placed as asked."""
    clock = {"tick": 0}

    def now(ctx: object) -> str:
        clock["tick"] += 1
        return f"Current time: 2026-11-30T10:{clock['tick']:02d}:00Z"

    prompt = SystemPrompt(persona="You are a helpful agent on {{model}}.")
    prompt.section(PromptSection(name="guidance", order=100, text=GUIDANCE))
    if time_in_section:
        prompt.section(PromptSection(name="time", order=-50, text=now))
    else:
        prompt.context(PromptContext(name="time", order=130, text=now))
    engine = SimulatorEngine()
    async with httpx.AsyncClient(transport=simulator_transport(engine)) as client:
        provider = OpenAICompatProvider(
            client, base_url="http://simulator", api_key=engine.config.api_key
        )
        async with open_agent(
            system_prompt=prompt,
            provider=provider,
            options=AgentOptions(model="deepseek-chat"),
            tools=[LOOKUP],
        ) as agent:
            for text in TURNS:
                agent.followup(text)
                await agent.when_idle()
    usages = [
        e.data.usage
        for e in agent.session.events
        if isinstance(e.data, AssistantMessage) and e.data.usage is not None
    ]
    return [(u.input_tokens, u.cache_read_tokens) for u in usages]


def hit_ratio(rows: list[tuple[int, int]]) -> float:
    return sum(cached for _, cached in rows) / sum(prompt for prompt, _ in rows)


async def test_runtime_context_keeps_every_request_after_the_first_hitting_the_cache() -> None:
    rows = await run_workload(time_in_section=False)
    assert len(rows) == len(TURNS) + 2  # two tool turns take two steps each
    assert rows[0][1] == 0
    assert all(cached > 0 for _, cached in rows[1:])
    assert hit_ratio(rows) > 0.7


async def test_timestamp_in_a_section_makes_the_hit_ratio_collapse() -> None:
    good = hit_ratio(await run_workload(time_in_section=False))
    bad_rows = await run_workload(time_in_section=True)
    bad = hit_ratio(bad_rows)
    assert bad < good / 4
    assert bad == pytest.approx(0, abs=0.15)


async def test_the_workload_is_deterministic() -> None:
    first = await run_workload(time_in_section=False)
    second = await run_workload(time_in_section=False)
    assert first == second
    await trio.lowlevel.checkpoint()
