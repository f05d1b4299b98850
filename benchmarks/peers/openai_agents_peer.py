"""The workload on the OpenAI Agents SDK: `Runner.run` over `OpenAIChatCompletionsModel`.

The dynamic fact goes through `instructions` given as a function (the
SDK's dynamic-instructions hook), which becomes the system message of
every request. Each session keeps its own `to_input_list()` history.
Tracing is disabled (it would upload spans). Tools are `FunctionTool`s
with `strict_json_schema=False`, so their schemas are sent as given.
Default step limit: `max_turns=10`.
"""

from __future__ import annotations

from typing import Any

from agents import (
    Agent,
    FunctionTool,
    OpenAIChatCompletionsModel,
    Runner,
    set_tracing_disabled,
)
from common import Turn, main, time_fact
from openai import AsyncOpenAI


async def build(workload: dict[str, Any], url: str, client: Any) -> Turn:
    set_tracing_disabled(True)

    async def echo(context: Any, arguments: str) -> str:
        import json

        return str(json.loads(arguments).get("text", ""))

    tools = [
        FunctionTool(
            name=t["name"],
            description=t["description"],
            params_json_schema=t["parameters"],
            on_invoke_tool=echo,
            strict_json_schema=False,
        )
        for t in workload["tools"]
    ]
    openai_client = AsyncOpenAI(base_url=url, api_key=workload["api_key"], http_client=client)
    model = OpenAIChatCompletionsModel(model=workload["model"], openai_client=openai_client)

    def instructions(context: Any, agent: Agent[Any]) -> str:
        return workload["system"] + "\n\n" + time_fact()

    agent = Agent(name="bench", instructions=instructions, tools=tools, model=model)
    histories: dict[int, list[Any]] = {}

    async def turn(session: int, text: str) -> bool:
        history = histories.get(session, [])
        result = await Runner.run(agent, [*history, {"role": "user", "content": text}])
        histories[session] = result.to_input_list()
        return bool(result.final_output)

    return turn


if __name__ == "__main__":
    main("openai-agents", build)
