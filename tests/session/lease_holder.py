"""A writer process for the two-process lease tests (run by `test_two_writers.py`).

Usage: python lease_holder.py STORE SESSION TTL

Opens an agent on SESSION in the SQLite store STORE (lease lifetime TTL
seconds), prints `ready PID`, then runs one turn per `turn` line on stdin and
prints `turn KIND`. When the agent fails it prints `refused TYPE: MESSAGE`
(the first error) and exits 3.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import trio

from actors.agent import open_agent
from actors.prompt import SystemPrompt
from actors.providers.scripted import Reply, ScriptedProvider
from actors.session import SessionError, SQLiteStore
from actors.session.events import TurnEnd


async def main(store_path: Path, session_id: str, ttl: float) -> int:
    store = SQLiteStore(store_path, lease_ttl=ttl)
    stdin = trio.wrap_file(sys.stdin)
    refused: BaseException | None = None
    try:
        async with open_agent(
            system_prompt=SystemPrompt(),
            provider=ScriptedProvider([Reply.text(f"reply {n}") for n in range(100)]),
            store=store,
            session_id=session_id,
        ) as agent:
            print(f"ready {os.getpid()}", flush=True)
            while await stdin.readline() == "turn\n":
                agent.followup("from the first writer")
                await agent.when_idle()
                end = agent.session.events[-1].data
                print(f"turn {end.reason.kind if isinstance(end, TurnEnd) else '-'}", flush=True)
    except* SessionError as group:
        refused = group.exceptions[0]
        while isinstance(refused, BaseExceptionGroup):
            refused = refused.exceptions[0]
    if refused is None:
        return 0
    print(f"refused {type(refused).__name__}: {refused}", flush=True)
    return 3


if __name__ == "__main__":
    sys.exit(trio.run(main, Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])))
