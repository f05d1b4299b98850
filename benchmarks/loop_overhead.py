"""Harness CPU time per model step, with a zero-latency scripted provider.

Workload: a 12-paragraph system prompt, 40 tools with small JSON-schema
parameters, a time context that changes every step, and turns of two steps
(one tool call, then text). Reports CPU µs per step for fresh sessions and
around turn 50 of one long session, and log bytes per step against logging
the full header on every step.

Run: .venv/bin/python benchmarks/loop_overhead.py [--turns 60] [--fresh 100]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import trio

from actors.agent import AgentOptions, Tool, open_agent
from actors.prompt import PromptContext, PromptSection, SystemPrompt
from actors.providers import Reply, ScriptedProvider, ToolCall, Usage
from actors.session import MemoryStore

RESULTS = Path(__file__).parent / "results" / "loop_overhead.json"
PARAGRAPH = (
    "Work carefully and verify every change you make. Prefer small, reviewable edits; "
    "explain what you changed and why. When a command fails, read its output before retrying. "
)


async def _noop(arguments: dict[str, Any] | str, call: object) -> str:
    return "ok"


def build_prompt(clock: dict[str, int]) -> SystemPrompt:
    prompt = SystemPrompt(persona="You are a coding agent powered by {{model}}.")
    for index in range(12):
        prompt.section(PromptSection(name=f"guide:{index}", order=100 + index, text=PARAGRAPH * 3))
    prompt.context(
        PromptContext(name="time", order=130, text=lambda ctx: f"Current time: {clock['now']}")
    )
    return prompt


TOOLS = [
    Tool(
        name=f"tool_{index:02d}",
        description=f"Tool number {index}: does one small thing well.",
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "A workspace path."},
                "count": {"type": "integer", "minimum": 0},
            },
            "required": ["path"],
        },
        execute=_noop,
    )
    for index in range(40)
]


def script_for(turns: int) -> list[Reply]:
    replies: list[Reply] = []
    for turn in range(turns):
        replies.append(
            Reply.tool_calls(
                [ToolCall(id=f"call-{turn}", name="tool_07", arguments='{"path":"a.py"}')],
                usage=Usage(input_tokens=1000, output_tokens=20),
            )
        )
        replies.append(Reply.text("Done.", usage=Usage(input_tokens=1100, output_tokens=5)))
    return replies


async def run_session(turns: int, measure: range) -> tuple[list[float], list[dict[str, Any]]]:
    """Run `turns` two-step turns; return CPU µs per step for turns in `measure`, and the log."""
    clock = {"now": 0}
    prompt = build_prompt(clock)
    provider = ScriptedProvider(script_for(turns))
    per_step: list[float] = []
    async with open_agent(
        system_prompt=prompt,
        provider=provider,
        options=AgentOptions(model="bench-model"),
        store=MemoryStore(),
        tools=TOOLS,
    ) as agent:
        for turn in range(turns):
            clock["now"] += 1
            start = time.process_time()
            agent.followup(f"Please handle item {turn}.")
            await agent.when_idle()
            elapsed = time.process_time() - start
            if turn in measure:
                per_step.append(elapsed / 2 * 1e6)
        log = agent.session.to_json()
    return per_step, log


def log_bytes(log: list[dict[str, Any]]) -> tuple[int, int, int]:
    """(total bytes, header bytes, steps) of a log in compact JSON."""
    total = header = steps = 0
    for event in log:
        size = len(json.dumps(event, separators=(",", ":")))
        total += size
        if event["type"] == "request/header":
            header = size
        if event["type"] == "step/start":
            steps += 1
    return total, header, steps


async def main(turns: int, fresh: int) -> dict[str, Any]:
    fresh_steps: list[float] = []
    for _ in range(fresh):
        steps, _ = await run_session(1, range(1))
        fresh_steps.extend(steps)
    long_steps, log = await run_session(turns, range(45, 56))
    early_steps, _ = await run_session(6, range(1, 6))
    total, header, steps = log_bytes(log)
    with_headers = total + header * (steps - 1)
    return {
        "fresh_session_us_per_step_median": statistics.median(fresh_steps),
        "early_turns_us_per_step_median": statistics.median(early_steps),
        "turn_50_us_per_step_median": statistics.median(long_steps),
        "log_bytes_per_step": total / steps,
        "log_bytes_per_step_full_header_every_step": with_headers / steps,
        "header_bytes": header,
        "steps": steps,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--fresh", type=int, default=100)
    args = parser.parse_args()
    result = trio.run(main, args.turns, args.fresh)
    rows = [
        (
            "CPU µs/step, fresh sessions (median)",
            f"{result['fresh_session_us_per_step_median']:.0f}",
        ),
        ("CPU µs/step, turns 1-5 (median)", f"{result['early_turns_us_per_step_median']:.0f}"),
        ("CPU µs/step, turns 45-55 (median)", f"{result['turn_50_us_per_step_median']:.0f}"),
        ("log bytes/step (header only on change)", f"{result['log_bytes_per_step']:.0f}"),
        (
            "log bytes/step (full header every step)",
            f"{result['log_bytes_per_step_full_header_every_step']:.0f}",
        ),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value:>10}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")
