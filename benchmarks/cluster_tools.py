"""The 40 tools of the parallel-session workload, as module attributes a deployment config names.

`benchmarks/cluster.py` runs that workload through `harness serve` and
`harness node` processes, which take their tools from the config by import
path (`benchmarks.cluster_tools:echo`, `benchmarks.cluster_tools:tool_01`,
...). `echo` returns its `text`; the others are never called.
"""

from __future__ import annotations

from typing import Any

from actors.agent import Tool
from supervision.bench.workload import echo as echo_text
from supervision.bench.workload import tool_definitions


async def _echo(arguments: dict[str, Any] | str, call: object) -> str:
    if not isinstance(arguments, dict):
        raise ValueError(f"echo needs a JSON object, got {arguments!r}")
    return echo_text(str(arguments.get("text", "")))


async def _unused(arguments: dict[str, Any] | str, call: object) -> str:
    raise ValueError("this benchmark only calls echo")


def _tool(definition: dict[str, Any]) -> Tool:
    return Tool(
        name=definition["name"],
        description=definition["description"],
        parameters=definition["parameters"],
        execute=_echo if definition["name"] == "echo" else _unused,
    )


TOOLS = {definition["name"]: _tool(definition) for definition in tool_definitions()}
"""Every tool by name, in the workload's order (`echo` first)."""
globals().update(TOOLS)


def import_paths() -> list[str]:
    """The config's `tools` entries for all 40 tools."""
    return [f"benchmarks.cluster_tools:{name}" for name in TOOLS]
