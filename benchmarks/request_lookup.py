"""The cost of a node's exactly-once lookup per prompt: a whole-log scan against the index.

Workload: one session on a `MemoryStore` with a zero-latency scripted
provider, every turn's user message carrying a request id (as prompts
through a cluster gateway do). At each log size the benchmark times one
lookup of a request id (the latest one, and one never sent) two ways: a
scan of every durable event (what a node did before the request index),
and `RequestIndex.find` after one more turn was appended (the index reads
only the new events). Reports µs per lookup (median of the measured turns).

Run: .venv/bin/python benchmarks/request_lookup.py [--turns 100 1000 4000] [--measure 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from actors.agent import AgentOptions, open_agent
from actors.messages import Message, TextBlock, UserSource
from actors.prompt import SystemPrompt
from actors.providers import Reply, ScriptedProvider, Usage
from actors.session import Event, MemoryStore
from actors.session.events import StepStart, TurnStart, UserMessage
from supervision.cluster.request_index import request_index

RESULTS = Path(__file__).parent / "results" / "request_lookup.json"


def scan(events: Sequence[Event], request_id: str) -> int | None:
    """The whole-log scan a lookup used to be: the latest turn carrying `request_id`."""
    found: int | None = None
    current: int | None = None
    for event in events:
        data = event.data
        if isinstance(data, TurnStart | StepStart):
            current = data.turn
        elif (
            isinstance(data, UserMessage)
            and isinstance(data.source, UserSource)
            and data.source.request_id == request_id
        ):
            found = current
    return found


def message(turn: int) -> Message:
    return Message(
        role="user",
        content=(TextBlock(text=f"item {turn}"),),
        source=UserSource(request_id=f"req-{turn}"),
    )


async def measure(turns: int, measured: int) -> dict[str, Any]:
    replies = [Reply.text("Done.", usage=Usage(input_tokens=100, output_tokens=2))] * (
        turns + measured
    )
    async with open_agent(
        system_prompt=SystemPrompt(),
        provider=ScriptedProvider(replies),
        options=AgentOptions(model="bench-model"),
        store=MemoryStore(),
    ) as agent:
        session = agent.session
        for turn in range(turns):
            agent.followup(message(turn))
            await agent.when_idle()
        await session.flush()
        index = request_index(session)
        index.find("warm-up")  # built once, as on a node's first prompt for the session
        scans: list[float] = []
        finds: list[float] = []
        for turn in range(turns, turns + measured):
            agent.followup(message(turn))
            await agent.when_idle()
            await session.flush()
            for request_id in (f"req-{turn}", "never-sent"):
                start = time.perf_counter()
                scanned = scan(session.durable_events(0), request_id)
                scans.append((time.perf_counter() - start) * 1e6)
                start = time.perf_counter()
                found = index.find(request_id)
                finds.append((time.perf_counter() - start) * 1e6)
                assert scanned == (found.turn if found is not None else None)
        return {
            "turns": turns,
            "events": len(session),
            "scan_us_median": statistics.median(scans),
            "index_us_median": statistics.median(finds),
        }


async def main(sizes: list[int], measured: int) -> list[dict[str, Any]]:
    return [await measure(turns, measured) for turns in sizes]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[100, 1000, 4000])
    parser.add_argument("--measure", type=int, default=20)
    args = parser.parse_args()
    rows = trio.run(main, args.turns, args.measure)
    print(f"{'turns':>6} {'events':>7} {'scan µs':>9} {'index µs':>9}")
    for row in rows:
        print(
            f"{row['turns']:>6} {row['events']:>7} "
            f"{row['scan_us_median']:>9.1f} {row['index_us_median']:>9.1f}"
        )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2))
