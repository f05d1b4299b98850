"""Group commit and resume on the two durable stores: SQLiteStore and PostgresStore.

Workload: N sessions append one 1-event step each and wait for it to be
durable (`flush(session_id)`), all at once, for M rounds (a closed loop,
like agents logging steps). Reports events/s, the ack latency (append to
durable) p50/p99, events per commit, and the harness process's CPU per
event; then the time to load one 1,000-event session (resume). PostgreSQL
runs with its durable defaults (fsync on) in a throwaway server on
loopback, started and stopped by this script (Debian's binaries), unless
`--dsn` names one.

Run: .venv/bin/python benchmarks/store_commit.py [--sessions 100] [--rounds 50] [--dsn DSN]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.messages import UserSource
from actors.session import Event, PostgresStore, SQLiteStore
from actors.session.events import UserMessage
from tests.postgres import PostgresServer

RESULTS = Path(__file__).parent / "results" / "store_commit.json"
TEXT = "a step of an agent session, about as long as a short tool result " * 2


def event(seq: int) -> Event:
    return Event(
        type="user/message", seq=seq, time=0, data=UserMessage(content=TEXT, source=UserSource())
    )


async def closed_loop(
    store: SQLiteStore | PostgresStore, sessions: int, rounds: int
) -> dict[str, Any]:
    acks: list[float] = []
    ids = [f"w{index}" for index in range(sessions)]

    async def run(session_id: str) -> None:
        for seq in range(rounds):
            started = time.perf_counter()
            await store.append(session_id, [event(seq)])
            await store.flush(session_id)
            acks.append(time.perf_counter() - started)

    async with trio.open_nursery() as nursery:
        await nursery.start(store.serve)
        for session_id in ids:
            await store.create(session_id)
        cpu, wall = time.process_time(), time.perf_counter()
        async with trio.open_nursery() as writers:
            for session_id in ids:
                writers.start_soon(run, session_id)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        stats = store.statistics()
        await store.create("long")
        for start in range(0, 1000, 100):
            await store.append("long", [event(seq) for seq in range(start, start + 100)])
        await store.flush("long")
        nursery.cancel_scope.cancel()
    loads = []
    for _ in range(5):
        began = time.perf_counter()
        loaded = await store.load("long")
        loads.append(time.perf_counter() - began)
    assert len(loaded) == 1000
    acks.sort()
    total = sessions * rounds
    return {
        "events_per_s": total / wall,
        "ack_p50_ms": 1000 * acks[len(acks) // 2],
        "ack_p99_ms": 1000 * acks[int(len(acks) * 0.99)],
        "events_per_commit": stats.events_written / stats.commits,
        "cpu_us_per_event": 1e6 * cpu / total,
        "load_1000_ms": 1000 * statistics.median(loads),
    }


async def main(args: argparse.Namespace) -> None:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        results["SQLite (WAL, synchronous=FULL)"] = await closed_loop(
            SQLiteStore(Path(folder) / "bench.db"), args.sessions, args.rounds
        )
    if args.dsn:
        results["PostgreSQL"] = await closed_loop(
            PostgresStore(args.dsn), args.sessions, args.rounds
        )
    else:
        server = PostgresServer.start(durable=True)
        try:
            dsn = server.new_schema()
            results["PostgreSQL 15 (fsync on, loopback)"] = await closed_loop(
                PostgresStore(dsn), args.sessions, args.rounds
            )
        finally:
            server.stop()
    print(f"{args.sessions} sessions x {args.rounds} rounds, one event per append, flush each")
    print(
        f"{'store':<36} {'events/s':>9} {'ack p50':>8} {'ack p99':>8} "
        f"{'ev/commit':>9} {'CPU µs/ev':>9} {'load 1k':>8}"
    )
    for name, row in results.items():
        print(
            f"{name:<36} {row['events_per_s']:>9.0f} {row['ack_p50_ms']:>6.2f}ms "
            f"{row['ack_p99_ms']:>6.2f}ms {row['events_per_commit']:>9.1f} "
            f"{row['cpu_us_per_event']:>9.0f} {row['load_1000_ms']:>6.1f}ms"
        )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"args": vars(args), "results": results}, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--dsn", default=None)
    trio.run(main, parser.parse_args())
