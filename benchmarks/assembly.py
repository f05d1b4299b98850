"""Benchmark: one prompt assembly plus rendering, for a realistic prompt and larger ones.

Each measured run is `await prompt.assemble(ctx)` + `render_prompt(assembly)` +
`render_context_sections(assembly)` for an agent three scopes deep. Size 1 is
a realistic prompt: identity, persona, 12 guidance sections, 40 tools with
JSON-schema parameters, 4 contexts, 6 variables, a 3-deep scope chain with
shadowing and 2 waterfall listeners. Size k multiplies the sections, tools,
contexts and variables by k (chain depth and listeners stay fixed).

Prints a table of µs per assembly (median and p90 of many runs, plus the
median of the first assembly after a registration change, which rebuilds the
cached plan) and writes JSON to benchmarks/results/assembly.json.

    .venv/bin/python benchmarks/assembly.py [--runs N] [--sizes 1 10] [--output PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import trio

from actors.prompt import (
    PERSONA_SECTION,
    TOOL_ORDER_REST,
    AssembleContext,
    NextListener,
    PromptAssembly,
    PromptContext,
    PromptSection,
    SystemPrompt,
    ToolProviderResult,
    ToolSchema,
    render_context_sections,
    render_prompt,
)
from actors.scope import Scope

T = TypeVar("T")

GUIDANCE_SECTIONS = 12
TOOLS = 40
TOOL_PROVIDERS = 4
CONTEXTS = 4
VARIABLES = 6

PERSONA = (
    "You are a careful software engineer working for {{user}} on {{project}}. "
    "Prefer small, reviewable changes; explain trade-offs briefly."
)
GUIDANCE = (
    "When you use {name}, read the relevant files first, keep edits minimal and "
    "re-run the checks afterwards. Paths are relative to {{{{cwd}}}}. Never touch "
    "files outside the workspace; ask when a change is destructive or ambiguous."
)


def tool_schema(index: int) -> ToolSchema:
    return ToolSchema(
        name=f"tool_{index:03d}",
        description=f"Tool number {index}: does one well-defined thing and reports the result.",
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Workspace-relative path."},
                "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
                "mode": {"type": "string", "enum": ["fast", "thorough", "dry-run"]},
                "options": {
                    "type": "object",
                    "properties": {"recursive": {"type": "boolean"}},
                    "additionalProperties": False,
                },
            },
            "required": ["path"],
            "additionalProperties": False,
        },
    )


def returning(value: T) -> Callable[[AssembleContext], T]:
    """A provider that returns `value` at every assembly."""

    def provider(ctx: AssembleContext) -> T:
        return value

    return provider


def build(size: int) -> tuple[SystemPrompt, AssembleContext]:
    """A registry at `size` times the realistic prompt, and the context to assemble with."""
    tools = [tool_schema(i) for i in range(TOOLS * size)]
    listed = [tools[3].name, tools[1].name, TOOL_ORDER_REST, tools[0].name]
    prompt = SystemPrompt(persona=PERSONA, tool_order=listed)
    root = Scope("runtime")
    agent = Scope("agent", parent=root)
    child = Scope("subagent", parent=agent)

    for i in range(GUIDANCE_SECTIONS * size):
        name = f"tool:{tools[i % len(tools)].name}:{i}"
        text = GUIDANCE.format(name=name)
        if i % 3 == 0:
            prompt.section(PromptSection(name=name, order=100 + i, text=returning(text)))
        else:
            prompt.section(PromptSection(name=name, order=100 + i, text=text))
    # Shadowing along the chain: the subagent has its own persona and guidance.
    prompt.section(
        PromptSection(
            name=PERSONA_SECTION, order=0, text="You are a focused subagent of {{user}}."
        ),
        scope=child,
    )
    prompt.section(
        PromptSection(name=f"tool:{tools[1].name}:1", order=101, text="Use it sparingly."),
        scope=agent,
    )

    per_provider = len(tools) // TOOL_PROVIDERS
    for p in range(TOOL_PROVIDERS):
        batch = tools[p * per_provider : (p + 1) * per_provider]
        result = ToolProviderResult(schemas=batch)
        prompt.tools(returning(result), scope=None if p < TOOL_PROVIDERS - 1 else agent)

    for i in range(CONTEXTS * size):
        text = f"Sandbox policy {i}: workspace-write in {{{{cwd}}}}, network off."
        layer = None if i % 2 == 0 else agent
        prompt.context(
            PromptContext(name=f"policy:{i}", order=110 + i, text=returning(text)),
            scope=layer,
        )

    values = {"model": "deepseek-chat", "provider": "deepseek", "cwd": "/work/repo"}
    values |= {"user": "ada", "project": "harness", "mode": "default"}
    for i in range(VARIABLES * size):
        name = list(values)[i] if i < len(values) else f"extra_{i}"
        value = values.get(name, name)
        layer = (None, root, agent)[i % 3]
        prompt.variable(name, returning(value), scope=layer)
    prompt.variable("user", lambda ctx: "ada (subagent)", scope=child)

    async def hide_one_tool(
        assembly: PromptAssembly, ctx: AssembleContext, next: NextListener
    ) -> PromptAssembly:
        assembly.tools = [t for t in assembly.tools if t.name != tools[2].name]
        return await next()

    async def stamp_variable(
        assembly: PromptAssembly, ctx: AssembleContext, next: NextListener
    ) -> PromptAssembly:
        assembly.variables["stamp"] = "step"
        return await next()

    prompt.on_assemble(hide_one_tool)
    prompt.on_assemble(stamp_variable, scope=agent)
    return prompt, AssembleContext(scope=child)


async def measure(size: int, runs: int) -> dict[str, Any]:
    prompt, ctx = build(size)
    assembly = await prompt.assemble(ctx)
    system = render_prompt(assembly)
    contexts = render_context_sections(assembly)
    for _ in range(min(runs, 200)):
        await prompt.assemble(ctx)
    samples: list[float] = []
    clock = time.perf_counter_ns
    for _ in range(runs):
        start = clock()
        assembly = await prompt.assemble(ctx)
        render_prompt(assembly)
        render_context_sections(assembly)
        samples.append((clock() - start) / 1000)
    samples.sort()
    # The first assembly after a registration change rebuilds the scope's plan.
    after_change: list[float] = []
    for _ in range(max(runs // 10, 1)):
        prompt.variable("bench_toggle", lambda ctx: "x").dispose()
        start = clock()
        assembly = await prompt.assemble(ctx)
        render_prompt(assembly)
        render_context_sections(assembly)
        after_change.append((clock() - start) / 1000)
    return {
        "size": size,
        "sections": len(assembly.sections),
        "tools": len(assembly.tools),
        "contexts": len(contexts),
        "variables": len(assembly.variables),
        "system_chars": len(system),
        "runs": runs,
        "median_us": statistics.median(samples),
        "p90_us": samples[int(len(samples) * 0.9)],
        "min_us": samples[0],
        "after_change_median_us": statistics.median(after_change),
    }


async def checkpoint_cost(runs: int) -> float:
    """Median µs of one bare `trio.lowlevel.checkpoint()`, the floor of any assembly."""
    samples: list[float] = []
    clock = time.perf_counter_ns
    for _ in range(runs):
        start = clock()
        await trio.lowlevel.checkpoint()
        samples.append((clock() - start) / 1000)
    return statistics.median(samples)


async def run(sizes: list[int], runs: int) -> dict[str, Any]:
    results = [await measure(size, runs) for size in sizes]
    return {
        "benchmark": "prompt assembly: assemble() + render_prompt() + render_context_sections()",
        "python": sys.version.split()[0],
        "trio": trio.__version__,
        "machine": platform.platform(),
        "checkpoint_us": await checkpoint_cost(runs),
        "results": results,
    }


def print_table(report: dict[str, Any]) -> None:
    base = report["results"][0]["median_us"]
    print(
        f"{'size':>5} {'sections':>8} {'tools':>6} {'ctx':>4} {'vars':>5} "
        f"{'median µs':>10} {'p90 µs':>8} {'vs size 1':>9} {'after change µs':>16}"
    )
    for row in report["results"]:
        print(
            f"{row['size']:>5} {row['sections']:>8} {row['tools']:>6} {row['contexts']:>4} "
            f"{row['variables']:>5} {row['median_us']:>10.1f} {row['p90_us']:>8.1f} "
            f"{row['median_us'] / base:>9.2f} {row['after_change_median_us']:>16.1f}"
        )
    print(f"(one bare trio checkpoint: {report['checkpoint_us']:.2f} µs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 3, 10])
    parser.add_argument(
        "--output",
        type=Path,
        default=Path(__file__).resolve().parent / "results" / "assembly.json",
    )
    args = parser.parse_args()
    report = trio.run(run, args.sizes, args.runs)
    print_table(report)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
