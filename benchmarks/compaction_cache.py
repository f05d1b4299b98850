"""Cache hit ratio of a long session with and without compaction, on the simulator.

Workload: a 40-turn session (every third turn calls a tool) against the
bundled DeepSeek-compatible simulator (64-token cache blocks) through the
real OpenAI-compatible adapter, with a ~1,100-token system prompt, two
function tools and a sandbox-policy runtime context that changes at turn 20.
With compaction on (a low threshold so it triggers several times), it
prints the hit ratio of the request before each compaction, of the summary
request, of the first request after it ("at") and of the next one
("after"), and the session's overall hit ratio against the run without
compaction.

Run: .venv/bin/python benchmarks/compaction_cache.py [--turns 40] [--threshold 2500] [--keep 2]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncGenerator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from actors.agent import AgentOptions, function_tool, open_agent
from actors.context import COMPACTION_PLUGIN, Compaction
from actors.messages import PluginSource
from actors.prompt import PromptContext, PromptSection, SystemPrompt
from actors.providers import Chunk, GenerateRequest, Provider
from actors.providers.openai_compat import OpenAICompatProvider
from actors.providers.simulator import SimulatorEngine, simulator_transport
from actors.session.events import AssistantMessage, CompactionEnded, CompactionRequested

RESULTS = Path(__file__).parent / "results" / "compaction_cache.json"
GUIDANCE = (
    "Work carefully: read before you write, verify every change, and quote tool output "
    "exactly when you cite it. Keep answers short and concrete. "
) * 40


@function_tool
async def add(a: int, b: int) -> int:
    """Add two integers exactly.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


@function_tool
async def read_note(name: str) -> str:
    """Read a note by name.

    Args:
        name: The note's name.
    """
    return f"Note {name}: the harness keeps the prompt prefix byte-stable across steps."


def turn_text(turn: int) -> str:
    """The user's message of turn `turn`: every third turn asks for a tool."""
    if turn % 3 == 1:
        return f'Please add these.\ncall add {{"a": {turn}, "b": {turn * 7}}}'
    if turn % 3 == 2:
        return f'Read a note.\ncall read_note {{"name": "n{turn}"}}'
    return f"Turn {turn}: tell me briefly how the work is going and what comes next."


def policy_text(turn: int) -> str:
    """The sandbox policy in force at `turn` (it changes once, at turn 20)."""
    return "Sandbox: workspace-write." if turn < 20 else "Sandbox: read-only."


@attrs.define(eq=False)
class Recorder:
    """Wraps a provider and keeps every request it was sent, in order."""

    inner: Provider
    requests: list[GenerateRequest] = attrs.field(factory=list)

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
        """Record `request`, then stream the inner provider's chunks."""
        self.requests.append(request)
        async with aclosing(self.inner.stream(request)) as chunks:
            async for chunk in chunks:
                yield chunk


def is_summary_request(request: GenerateRequest) -> bool:
    """True for a compaction's summary request (it ends with the compaction instruction)."""
    source = request.messages[-1].source if request.messages else None
    return isinstance(source, PluginSource) and source.plugin == COMPACTION_PLUGIN


@attrs.frozen(kw_only=True)
class Row:
    """One request as the log reports it: what it was and its cache figures."""

    kind: str  # "step" or "summary"
    turn: int
    prompt: int
    cached: int

    @property
    def ratio(self) -> float:
        return self.cached / self.prompt if self.prompt else 0.0


@attrs.frozen(kw_only=True)
class Workload:
    """One run: the stored log, the requests sent, the per-request rows."""

    log: list[dict[str, Any]]
    sent: list[GenerateRequest]
    rows: list[Row]
    policies: dict[int, str]

    @property
    def hit_ratio(self) -> float:
        prompt = sum(row.prompt for row in self.rows)
        return sum(row.cached for row in self.rows) / prompt if prompt else 0.0


async def run_workload(
    *, turns: int = 40, compaction: Compaction | None = None, keep: int = 2
) -> Workload:
    """Run the session and return what it logged and sent."""
    engine = SimulatorEngine()
    state = {"turn": 0}
    prompt = SystemPrompt(persona="You are a careful assistant powered by {{model}}.")
    prompt.section(PromptSection(name="tool:guidance", order=100, text=GUIDANCE))
    prompt.context(
        PromptContext(name="sandbox:policy", order=110, text=lambda ctx: policy_text(state["turn"]))
    )
    policies: dict[int, str] = {}
    async with httpx.AsyncClient(transport=simulator_transport(engine)) as client:
        recorder = Recorder(
            OpenAICompatProvider(client, base_url="http://simulator", api_key=engine.config.api_key)
        )
        async with open_agent(
            system_prompt=prompt,
            provider=recorder,
            tools=[add, read_note],
            options=AgentOptions(model="deepseek-chat"),
        ) as agent:
            if compaction is not None:
                compaction.install(agent)
            for turn in range(turns):
                state["turn"] = turn
                policies[turn] = policy_text(turn)
                await agent.run(turn_text(turn))
        log = agent.session.to_json()
    rows: list[Row] = []
    for event in agent.session.events:
        data = event.data
        if isinstance(data, AssistantMessage) and data.usage is not None:
            rows.append(
                Row(
                    kind="step",
                    turn=data.turn,
                    prompt=data.usage.input_tokens,
                    cached=data.usage.cache_read_tokens,
                )
            )
        elif isinstance(data, CompactionRequested):
            turn_of_compaction = data.turn
        elif isinstance(data, CompactionEnded) and data.usage is not None:
            rows.append(
                Row(
                    kind="summary",
                    turn=turn_of_compaction,
                    prompt=data.usage.input_tokens,
                    cached=data.usage.cache_read_tokens,
                )
            )
    return Workload(log=log, sent=list(recorder.requests), rows=rows, policies=policies)


def around_compactions(rows: list[Row]) -> list[dict[str, Any]]:
    """Per compaction: hit ratios of the step before, the summary, the step at and the one after."""
    out = []
    for index, row in enumerate(rows):
        if row.kind != "summary" or index == 0 or index + 2 >= len(rows):
            continue
        before, at, after = rows[index - 1], rows[index + 1], rows[index + 2]
        out.append(
            {
                "turn": row.turn,
                "before": before.ratio,
                "summary": row.ratio,
                "at": at.ratio,
                "after": after.ratio,
                "prompt_before": before.prompt,
                "prompt_at": at.prompt,
            }
        )
    return out


async def main(turns: int, threshold: int, keep: int) -> None:
    plain = await run_workload(turns=turns)
    compacted = await run_workload(
        turns=turns, compaction=Compaction(threshold_tokens=threshold, keep_turns=keep)
    )
    table = around_compactions(compacted.rows)
    print(f"{'turn':>4}  {'before':>7} {'summary':>8} {'at':>7} {'after':>7}  prompt before→at")
    for entry in table:
        print(
            f"{entry['turn']:>4}  {entry['before']:>7.1%} {entry['summary']:>8.1%} "
            f"{entry['at']:>7.1%} {entry['after']:>7.1%}  "
            f"{entry['prompt_before']:>5} → {entry['prompt_at']}"
        )
    prompt_plain = sum(row.prompt for row in plain.rows)
    prompt_compacted = sum(row.prompt for row in compacted.rows)
    print(
        f"overall hit ratio: no compaction {plain.hit_ratio:.1%} ({prompt_plain} prompt tokens), "
        f"compaction {compacted.hit_ratio:.1%} ({prompt_compacted} prompt tokens, "
        f"{len(table)} compactions)"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "turns": turns,
                "threshold": threshold,
                "keep_turns": keep,
                "compactions": table,
                "hit_ratio_plain": plain.hit_ratio,
                "hit_ratio_compacted": compacted.hit_ratio,
                "prompt_tokens_plain": prompt_plain,
                "prompt_tokens_compacted": prompt_compacted,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--threshold", type=int, default=2500)
    parser.add_argument("--keep", type=int, default=2)
    args = parser.parse_args()
    trio.run(main, args.turns, args.threshold, args.keep)
