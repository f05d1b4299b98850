"""Python heap kept per idle session, measured with tracemalloc (no burst high-water, no RSS noise).

Workload: the parallel-sessions benchmark's agents (12-paragraph system
prompt, 40 tools, the time context, `AgentOptions(hibernate=True)` unless
`--no-hibernate`) under `open_runtime`, each running one turn of two steps
(a tool call to `echo`, then a 24-word text) against an in-process
`ScriptedProvider`, one session at a time. The heap allocated between
before the agents started and after their turns ended (with a garbage
collection first) is divided by the number of sessions; the largest
sources are listed by file.

Run: .venv/bin/python benchmarks/idle_memory.py [--sessions 300] [--store memory|sqlite]
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

import trio

from actors.agent import Agent, AgentOptions
from actors.context import TimeContext
from actors.providers import Reply, ScriptedProvider, ToolCall
from actors.session import MemoryStore, SessionStore, SQLiteStore
from supervision.bench.harness_run import _one_turn, _prompt, _tools
from supervision.bench.workload import MODEL, user_message
from supervision.runtime import open_runtime

RESULTS = Path(__file__).parent / "results" / "idle_memory.json"


def _script(turns: int) -> list[Reply]:
    replies: list[Reply] = []
    for turn in range(turns):
        call = ToolCall(id=f"call-{turn}", name="echo", arguments='{"text":"hi"}')
        replies += [Reply.tool_calls([call]), Reply.text("done " * 24)]
    return replies


async def measure(sessions: int, store: SessionStore, hibernate: bool) -> dict[str, Any]:
    provider = ScriptedProvider(_script(sessions + 1))
    time_context = TimeContext(timezone="UTC")
    options = AgentOptions(model=MODEL, provider_name="sim", hibernate=hibernate)
    async with open_runtime(
        system_prompt=_prompt(), store=store, providers={"sim": provider}
    ) as runtime:
        tools = _tools()

        async def start() -> Agent:
            child = await runtime.start_agent(
                options=options, tools=tools, setup=time_context.install
            )
            return child.value

        await _one_turn(await start(), user_message(-1))  # warm caches and code paths
        gc.collect()
        tracemalloc.start(1)
        before = tracemalloc.take_snapshot()
        agents = [await start() for _ in range(sessions)]
        for index, agent in enumerate(agents):
            await _one_turn(agent, user_message(index))
        await runtime.store.flush()
        provider.requests.clear()  # the scripted provider's record of every request
        gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        by_file = after.compare_to(before, "filename")
        total = sum(stat.size_diff for stat in by_file)
        top = [
            (stat.traceback[0].filename.split("site-packages/")[-1], stat.size_diff / sessions)
            for stat in by_file[:12]
        ]
    return {"sessions": sessions, "bytes_per_session": total / sessions, "top": top}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=300)
    parser.add_argument("--store", choices=("memory", "sqlite"), default="memory")
    parser.add_argument("--no-hibernate", dest="hibernate", action="store_false")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        store: SessionStore = (
            MemoryStore() if args.store == "memory" else SQLiteStore(Path(directory) / "m.sqlite")
        )
        result = trio.run(measure, args.sessions, store, args.hibernate)
    result.update(store=args.store, hibernate=args.hibernate)
    print(f"heap per idle session: {result['bytes_per_session'] / 1024:.1f} KB")
    for name, size in result["top"]:
        print(f"{size:10.0f} B  {name}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
