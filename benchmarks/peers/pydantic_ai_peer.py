"""The workload on pydantic-ai: one `Agent` over `OpenAIChatModel`, a message history per session.

The dynamic fact is a dynamic `@agent.instructions` function (pydantic-ai's
hook), which pydantic-ai joins into the system instructions of every
request. Each session keeps its own `all_messages()` list. Default step
limit: `UsageLimits(request_limit=50)`.
"""

from __future__ import annotations

from typing import Any

from common import Turn, main, time_fact
from pydantic_ai import Agent, Tool
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider


async def build(workload: dict[str, Any], url: str, client: Any) -> Turn:
    async def echo(text: str, repeat: int | None = None) -> str:
        return text

    tools = [
        Tool.from_schema(
            echo, name=t["name"], description=t["description"], json_schema=t["parameters"]
        )
        for t in workload["tools"]
    ]
    model = OpenAIChatModel(
        workload["model"],
        provider=OpenAIProvider(base_url=url, api_key=workload["api_key"], http_client=client),
    )
    agent = Agent(model, instructions=workload["system"], tools=tools)

    @agent.instructions
    def current_time() -> str:
        return time_fact()

    histories: dict[int, list[Any]] = {}

    async def turn(session: int, text: str) -> bool:
        result = await agent.run(text, message_history=histories.get(session))
        histories[session] = result.all_messages()
        return bool(result.output)

    return turn


if __name__ == "__main__":
    main("pydantic-ai", build)
