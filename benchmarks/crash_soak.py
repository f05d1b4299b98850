"""Crash soak: SIGKILL an agent process at random points of tool turns, resume, check the log.

A child process runs an agent on `SQLiteStore` against the simulator over
loopback (the parent serves it), turn after turn of two parallel tool calls.
Whenever the child has made sure of durability (`await session.flush()`,
inside each tool and after each turn) it prints the newest durable seq and a
digest of the log up to it. The parent kills it with SIGKILL at a random
point: after a random number of output lines, at a random delay, inside a
tool call, or the child kills itself inside a tool after flushing (the
original bug report). After every kill the next child resumes the session
(waiting out the dead one's lease) and must complete its first turn; the
parent checks the stored log each time: seqs contiguous and checksums good
(the store's load), every event the child had seen durable present and
unchanged. At the end every tool call must have exactly one result and
every turn an end.

Reported: kills, lost durable events (must be 0), changed durable prefixes
(must be 0), bricked sessions (a resumed turn that did not complete, must
be 0), mid-tool kills repaired with an `Interrupted` result.

Run: .venv/bin/python benchmarks/crash_soak.py [--kills 100] [--seed 1]
(the test suite runs the same soak with 21 kills: tests/session/test_crash_soak.py)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from actors.agent import AgentOptions, Tool, open_agent
from actors.prompt import SystemPrompt
from actors.providers.actor import ProviderActor
from actors.providers.openai_compat import OpenAICompatProvider
from actors.providers.simulator import SimulatorConfig, SimulatorEngine, serve_simulator
from actors.session import Event, SessionBusyError, SQLiteStore, event_to_json
from actors.session.events import ToolCallRequested, ToolResult, TurnEnd, TurnStart

RESULTS = Path(__file__).parent / "results" / "crash_soak.json"
SESSION = "soak"
API_KEY = "sk-simulator"
LEASE_TTL = 0.4
"""The children's lease lifetime: a resumed child waits this long for a killed one's lease."""


def digest_of(events: list[Event]) -> str:
    """A digest of events' JSON, the same in the child and the parent."""
    hasher = hashlib.sha256()
    for event in events:
        hasher.update(json.dumps(event_to_json(event), sort_keys=True).encode())
    return hasher.hexdigest()[:16]


# The child: an agent that reports what it knows is durable.


async def child(store_path: Path, url: str, suicide_at: int, turns: int) -> None:
    store = SQLiteStore(store_path, lease_ttl=LEASE_TTL)

    def factory(client: httpx.AsyncClient) -> OpenAICompatProvider:
        return OpenAICompatProvider(client, base_url=url, api_key=API_KEY)

    actor = ProviderActor(name="sim", factory=factory, max_in_flight=4)
    calls = 0
    holder: dict[str, Any] = {}
    hasher = hashlib.sha256()
    hashed = 0

    def report_durable() -> None:
        nonlocal hashed
        events = holder["agent"].session.events
        for event in events[hashed:]:
            hasher.update(json.dumps(event_to_json(event), sort_keys=True).encode())
        hashed = len(events)
        print(f"durable {hashed - 1} {hasher.hexdigest()[:16]}", flush=True)

    async def work(arguments: dict[str, Any] | str, call: ToolCallRequested) -> str:
        nonlocal calls
        calls += 1
        number = calls
        await holder["agent"].session.flush()
        report_durable()
        print("tool", flush=True)
        if number == suicide_at:
            os.kill(os.getpid(), signal.SIGKILL)
        await trio.sleep(random.uniform(0, 0.02))
        return f"worked on {arguments}"

    async with trio.open_nursery() as nursery:
        await nursery.start(actor.serve)
        for _ in range(400):  # a killed child's lease expires after LEASE_TTL
            try:
                async with open_agent(
                    system_prompt=SystemPrompt(persona="You are a soak-test agent."),
                    provider=actor,
                    options=AgentOptions(model="deepseek-chat"),
                    store=store,
                    session_id=SESSION,
                    tools=[Tool("work", "Do a unit of work.", {"type": "object"}, work)],
                ) as agent:
                    holder["agent"] = agent
                    print(f"open {len(agent.session)}", flush=True)
                    report_durable()
                    for _ in range(turns):
                        turn = agent.session.next_turn()
                        agent.followup(f'call work {{"t": {turn}, "i": 0}}\ncall work {{"i": 1}}')
                        await agent.when_idle()
                        end = agent.session.events[-1].data
                        kind = end.reason.kind if isinstance(end, TurnEnd) else "unended"
                        print(f"turn {turn} {kind}", flush=True)
                        await agent.session.flush()
                        report_durable()
                break
            except SessionBusyError:
                await trio.sleep(0.025)
        else:
            print("busy", flush=True)
        nursery.cancel_scope.cancel()


# The parent: serve the simulator, kill children, check the log.


@attrs.define
class SoakResult:
    """What a soak run found."""

    kills: int = 0
    kills_mid_tool: int = 0
    lost_events: int = 0
    changed_prefixes: int = 0
    bricked: int = 0
    repaired_calls: int = 0
    turns_completed: int = 0
    events: int = 0
    problems: list[str] = attrs.field(factory=list)
    seconds: float = 0.0


@attrs.define
class _Lines:
    stream: trio.abc.ReceiveStream
    buffer: bytes = b""

    async def next(self) -> str | None:
        while b"\n" not in self.buffer:
            data = await self.stream.receive_some(4096)
            if not data:
                return None
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()


async def run_round(
    url: str, store_path: Path, rng: random.Random, result: SoakResult, *, final: bool, log: Path
) -> tuple[int, str]:
    """One child's life; returns the newest (seq, digest) it reported durable."""
    mode = "none" if final else rng.choice(["lines", "delay", "tool", "suicide"])
    suicide_at = rng.randint(3, 6) if mode == "suicide" else 0
    command = [
        sys.executable,
        __file__,
        "child",
        str(store_path),
        url,
        str(suicide_at),
        "2" if final else "60",
    ]
    durable = (-1, "")
    with log.open("ab") as stderr:
        process = await trio.lowlevel.open_process(command, stdout=subprocess.PIPE, stderr=stderr)
    assert process.stdout is not None
    lines = _Lines(process.stdout)
    first_turn_done = False
    countdown = rng.randint(1, 16) if mode == "lines" else rng.randint(1, 3)
    deadline = float("inf")
    killed = False
    try:
        while True:
            with trio.move_on_at(deadline):
                line = await lines.next()
            if line is None:
                break
            if trio.current_time() >= deadline:
                killed = True
                break
            kind, _, rest = line.partition(" ")
            if kind == "durable":
                seq, digest = rest.split()
                durable = (int(seq), digest)
            elif kind == "busy":
                result.problems.append("a resumed child never got the lease")
            elif kind == "turn":
                turn, end = rest.split()
                if end != "completed":
                    result.problems.append(f"turn {turn} ended {end}")
                    if not first_turn_done:
                        result.bricked += 1
                result.turns_completed += end == "completed"
                if not first_turn_done:
                    first_turn_done = True
                    if mode == "delay":
                        deadline = trio.current_time() + rng.uniform(0.0, 0.3)
                    continue
            if not first_turn_done or mode in ("none", "suicide", "delay"):
                continue
            if mode == "lines" or (mode == "tool" and kind == "tool"):
                countdown -= 1
                if countdown == 0:
                    killed = True
                    result.kills_mid_tool += kind == "tool"
                    break
    finally:
        if (killed or mode != "none") and process.returncode is None:
            process.send_signal(signal.SIGKILL)
        await process.wait()
    if mode != "none":
        if process.returncode != -signal.SIGKILL:
            result.problems.append(f"child ({mode}) exited {process.returncode}, not killed")
        result.kills += 1
        result.kills_mid_tool += mode == "suicide"
    elif process.returncode != 0:
        result.problems.append(f"final child exited {process.returncode}")
    return durable


async def check_log(store_path: Path, durable: tuple[int, str], result: SoakResult) -> None:
    """The stored log holds, unchanged, everything the child had seen durable."""
    events = await SQLiteStore(store_path).load(SESSION)  # checksums and contiguous seqs
    seq, digest = durable
    if seq < 0:
        return
    if len(events) <= seq:
        result.lost_events += seq + 1 - len(events)
        result.problems.append(f"durable seq {seq} missing: only {len(events)} events")
    elif digest_of(events[: seq + 1]) != digest:
        result.changed_prefixes += 1
        result.problems.append(f"the log up to durable seq {seq} changed")


async def run_soak(kills: int, seed: int, workdir: Path) -> SoakResult:
    """Kill `kills` children at random points, then let one more finish; check after each."""
    started = time.monotonic()
    result = SoakResult()
    rng = random.Random(seed)
    store_path = workdir / "sessions.db"
    log = workdir / "children.log"
    engine = SimulatorEngine(SimulatorConfig(reply_tokens=24, token_rate=400.0, api_key=API_KEY))
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_simulator, engine)
        for round_number in range(kills + 1):
            durable = await run_round(
                url, store_path, rng, result, final=round_number == kills, log=log
            )
            await check_log(store_path, durable, result)
        nursery.cancel_scope.cancel()
    events = await SQLiteStore(store_path).load(SESSION)
    result.events = len(events)
    calls = [e.data.call_id for e in events if isinstance(e.data, ToolCallRequested)]
    results = [e.data for e in events if isinstance(e.data, ToolResult)]
    if sorted(calls) != sorted(r.call_id for r in results) or len(set(calls)) != len(calls):
        result.problems.append("tool calls and results do not pair one to one")
    starts = sum(isinstance(e.data, TurnStart) for e in events)
    ends = sum(isinstance(e.data, TurnEnd) for e in events)
    if starts != ends:
        result.problems.append(f"{starts} turns started, {ends} ended")
    result.repaired_calls = sum(
        r.error is not None and r.error.code == "interrupted" for r in results
    )
    result.seconds = round(time.monotonic() - started, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="crash-soak-") as workdir:
        result = trio.run(run_soak, args.kills, args.seed, Path(workdir))
    row = attrs.asdict(result)
    for key, value in row.items():
        if key != "problems":
            print(f"{key:>18}  {value}")
    for problem in result.problems:
        print(f"problem: {problem}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps({"kills_requested": args.kills, "seed": args.seed, **row}, indent=2)
    )
    sys.exit(1 if result.problems else 0)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        _, _, store_arg, url_arg, suicide_arg, turns_arg = sys.argv
        trio.run(child, Path(store_arg), url_arg, int(suicide_arg), int(turns_arg))
    else:
        main()
