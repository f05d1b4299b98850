"""The workload on AutoGen AgentChat: an `AssistantAgent` per session, `OpenAIChatCompletionClient`.

AutoGen has no dynamic-instruction hook on the system message; the
dynamic fact goes through the agent's `model_context` (a
`ChatCompletionContext` whose `get_messages` appends the time as a
system message after the history, AutoGen's way to shape what each model
call sees). Tools are `FunctionTool`s built from a Python function, so
AutoGen derives their schemas from its signature (the names and
descriptions are the workload's; the parameter schema is AutoGen's own).
`reflect_on_tool_use=True` makes the second model call (by default AutoGen
ends the turn with the raw tool result). Default step limit:
`max_tool_iterations=1`.
"""

from __future__ import annotations

from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_core.model_context import UnboundedChatCompletionContext
from autogen_core.models import LLMMessage, SystemMessage
from autogen_core.tools import FunctionTool
from autogen_ext.models.openai import OpenAIChatCompletionClient
from common import Turn, main, time_fact


class TimedContext(UnboundedChatCompletionContext):
    async def get_messages(self) -> list[LLMMessage]:
        return [*(await super().get_messages()), SystemMessage(content=time_fact())]


async def build(workload: dict[str, Any], url: str, client: Any) -> Turn:
    async def echo(text: str, repeat: int | None = None) -> str:
        return text

    tools = [
        FunctionTool(echo, description=t["description"], name=t["name"]) for t in workload["tools"]
    ]
    model_client = OpenAIChatCompletionClient(
        model=workload["model"],
        base_url=url,
        api_key=workload["api_key"],
        http_client=client,
        model_info={
            "vision": False,
            "function_calling": True,
            "json_output": True,
            "structured_output": True,
            "family": "unknown",
            "multiple_system_messages": True,
        },
    )
    agents: dict[int, AssistantAgent] = {}

    async def turn(session: int, text: str) -> bool:
        agent = agents.get(session)
        if agent is None:
            agent = agents[session] = AssistantAgent(
                name=f"s{session}".replace("-", "m"),
                model_client=model_client,
                tools=tools,
                system_message=workload["system"],
                model_context=TimedContext(),
                reflect_on_tool_use=True,
            )
        result = await agent.run(task=text)
        last = result.messages[-1]
        return last.type == "TextMessage" and bool(last.content)

    return turn


if __name__ == "__main__":
    main("autogen", build)
