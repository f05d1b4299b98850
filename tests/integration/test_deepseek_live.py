"""Against the real DeepSeek API (skipped unless DEEPSEEK_API_KEY is set).

A long system prompt, a two-step tool turn and a later turn: every request
after the first must report provider cache-read tokens.
"""

from __future__ import annotations

import os
from typing import Any

import httpx
import pytest

from actors.agent import AgentOptions, Tool, open_agent
from actors.prompt import PromptSection, SystemPrompt
from actors.providers.openai_compat import OpenAICompatProvider
from actors.session.events import AssistantMessage

API_KEY = os.environ.get("DEEPSEEK_API_KEY")
pytestmark = pytest.mark.skipif(not API_KEY, reason="DEEPSEEK_API_KEY is not set")

LONG_GUIDANCE = (
    "You are a meticulous assistant. Follow the user's instructions exactly, use the tools "
    "when asked to, never invent tool results, and keep every answer to one sentence. "
) * 60


async def get_weather(arguments: dict[str, Any] | str, call: object) -> str:
    return "It is 18 degrees and sunny."


WEATHER = Tool(
    name="get_weather",
    description="Get the current weather for a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    execute=get_weather,
)


async def test_every_request_after_the_first_reads_from_the_provider_cache() -> None:
    assert API_KEY is not None
    prompt = SystemPrompt(persona="You are powered by {{model}}.")
    prompt.section(PromptSection(name="guidance", order=100, text=LONG_GUIDANCE))
    timeout = httpx.Timeout(120.0, connect=15.0)
    async with httpx.AsyncClient(timeout=timeout) as client:
        provider = OpenAICompatProvider(
            client, base_url="https://api.deepseek.com", api_key=API_KEY
        )
        async with open_agent(
            system_prompt=prompt,
            provider=provider,
            options=AgentOptions(model="deepseek-chat", provider_name="deepseek"),
            tools=[WEATHER],
        ) as agent:
            agent.followup("Call get_weather for Paris, then tell me the weather.")
            await agent.when_idle()
            agent.followup("Thanks. Now say goodbye in one word.")
            await agent.when_idle()
    usages = [
        e.data.usage
        for e in agent.session.events
        if isinstance(e.data, AssistantMessage) and e.data.usage is not None
    ]
    assert len(usages) >= 3, "expected a two-step tool turn and a later turn"
    for usage in usages[1:]:
        assert usage.cache_read_tokens > 0
