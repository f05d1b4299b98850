"""The workload on LangGraph: `create_react_agent` over `ChatOpenAI`, one thread per session.

The dynamic fact goes through the `prompt` callable (LangGraph's
dynamic-prompt hook), which rebuilds the system message with the time
appended on every model call. Sessions live in an `InMemorySaver`
checkpointer, keyed by thread id. Default step limit: recursion_limit 25.
"""

from __future__ import annotations

import warnings
from typing import Any

from common import Turn, main, time_fact
from langchain_core.messages import AIMessage, SystemMessage
from langchain_core.tools import StructuredTool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver

warnings.filterwarnings("ignore")
from langgraph.prebuilt import create_react_agent  # noqa: E402


async def build(workload: dict[str, Any], url: str, client: Any) -> Turn:
    async def echo(text: str, repeat: int | None = None) -> str:
        return text

    tools = [
        StructuredTool.from_function(
            coroutine=echo,
            name=t["name"],
            description=t["description"],
            args_schema=t["parameters"],
        )
        for t in workload["tools"]
    ]
    model = ChatOpenAI(
        model=workload["model"], base_url=url, api_key=workload["api_key"], http_async_client=client
    )

    def prompt(state: dict[str, Any]) -> list[Any]:
        return [SystemMessage(workload["system"] + "\n\n" + time_fact()), *state["messages"]]

    agent = create_react_agent(model, tools, prompt=prompt, checkpointer=InMemorySaver())

    async def turn(session: int, text: str) -> bool:
        config = {"configurable": {"thread_id": str(session)}}
        state = await agent.ainvoke({"messages": [("user", text)]}, config)
        last = state["messages"][-1]
        return isinstance(last, AIMessage) and not last.tool_calls and bool(last.content)

    return turn


if __name__ == "__main__":
    main("langgraph", build)
