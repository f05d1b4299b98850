"""The gateway's delivery path alone: CPU per delivered event of one fan-out round's hand-out.

No agents and no sockets, so the machine's load moves it much less than
`benchmarks/gateway.py`: M sessions each get a batch of E consecutive events
(the events of a real simulator turn, renumbered) handed to N connections'
live subscriptions exactly as the fan-out does (`EventBatch`, then each
subscriber's `deliver`, the gateway's own `_LiveLog`), then every connection's
outbox is taken and joined as its writer does (only the system call is left
out). `time.process_time` measures:

- encoding: each event's JSON, once per event (µs per event);
- delivery: µs per delivered event (one event to one subscriber), encoding
  included, for plain (`_harness/log/event`), batched (`_harness/log/events`)
  and merged (`_harness/log/merged`) subscriptions.

It measures the tree on `PYTHONPATH` (or the installed package), so a "before"
tree from `git archive` runs with this same script; a tree without merged
subscriptions reports that mode as n/a.

    .venv/bin/python benchmarks/gateway_delivery.py --sessions 1000 --supervisors 10
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import httpx
import trio

from actors.agent import AgentOptions
from actors.prompt import SystemPrompt
from actors.providers.openai_compat import OpenAICompatProvider
from actors.providers.simulator import SimulatorEngine, simulator_transport
from actors.session import Event, MemoryStore
from supervision.gateway.connection import _LiveLog
from supervision.gateway.cursors import EventBatch, EventTexts, LogCursor
from supervision.gateway.outbox import Outbox
from supervision.gateway.transport import WEBSOCKET_FRAMING
from supervision.runtime import open_runtime

RESULTS = Path(__file__).with_name("results")
MODES = {"plain": {}, "batched": {"batch": True}, "merged": {"batch": True, "merge": True}}


async def _turn_events() -> list[Event]:
    """The durable events of one simulator turn (24-token reply: mostly `assistant/chunk`)."""
    engine = SimulatorEngine()
    async with (
        httpx.AsyncClient(transport=simulator_transport(engine)) as client,
        open_runtime(
            system_prompt=SystemPrompt(persona="bench"),
            store=MemoryStore(),
            providers={
                "default": OpenAICompatProvider(
                    client, base_url="http://simulator.test", api_key=engine.config.api_key
                )
            },
        ) as runtime,
    ):
        agent = (await runtime.start_agent(options=AgentOptions(model="deepseek-chat"))).value
        agent.followup("say something")
        await agent.when_idle()
        await agent.session.flush()
        return list(agent.session.durable_events(0))


def _subscribers(mode: str, sessions: int, connections: int) -> tuple[list[Any], list[Outbox]]:
    """Per session, one live subscription on each connection (the gateway's own `_LiveLog`)."""
    outboxes = [Outbox() for _ in range(connections)]
    fakes = [
        SimpleNamespace(
            outbox=outbox, direct=None, transport=SimpleNamespace(framing=WEBSOCKET_FRAMING)
        )
        for outbox in outboxes
    ]
    per_session = [
        [
            _LiveLog(
                connection=fake,  # type: ignore[arg-type]
                cursor=LogCursor(
                    subscription=f"sub-{index}-{c}",
                    session_id=f"s-{index:06d}-bench",
                    next_seq=0,
                    texts=EventTexts(),
                    caught_up=True,
                    **MODES[mode],
                ),
            )
            for c, fake in enumerate(fakes)
        ]
        for index in range(sessions)
    ]
    return per_session, outboxes


def _rounds(
    mode: str, events: list[Event], sessions: int, connections: int, rounds: int, size: int
) -> float:
    """CPU seconds of `rounds` hand-outs of `size` events per session, and the writers' joins."""
    per_session, outboxes = _subscribers(mode, sessions, connections)
    batches = [
        [attrs.evolve(events[(r * size + i) % len(events)], seq=r * size + i) for i in range(size)]
        for r in range(rounds)
    ]
    gc.collect()
    cpu = time.process_time()
    for r in range(rounds):
        head = (r + 1) * size - 1
        for subscribers in per_session:
            batch = EventBatch(batches[r], head)
            [s for s in subscribers if s.deliver(batch)]
        for outbox in outboxes:
            b"".join(outbox.take())
    return time.process_time() - cpu


def _encoding(events: list[Event], sessions: int, rounds: int, size: int) -> float:
    """CPU seconds of encoding `rounds * sessions * size` events once each (`EventBatch.texts`)."""
    batches = [
        [attrs.evolve(events[(r * size + i) % len(events)], seq=r * size + i) for i in range(size)]
        for r in range(rounds)
    ]
    gc.collect()
    cpu = time.process_time()
    for r in range(rounds):
        for _ in range(sessions):
            EventBatch(batches[r], 0).texts  # noqa: B018 - the encoding is the point
    return time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--supervisors", type=int, default=10, help="connections")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--events", type=int, nargs="+", default=[2, 24], help="events per session per round"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs of each; medians reported")
    args = parser.parse_args()
    events = trio.run(_turn_events)
    merged = hasattr(LogCursor, "whole")
    result: dict[str, Any] = {"sessions": args.sessions, "supervisors": args.supervisors}
    rows = []
    for size in args.events:
        count = args.rounds * args.sessions * size
        encode = statistics.median(
            _encoding(events, args.sessions, args.rounds, size) for _ in range(args.repeat)
        )
        row: dict[str, Any] = {
            "events_per_round": size,
            "encode_us_per_event": 1e6 * encode / count,
        }
        for mode in MODES:
            if mode == "merged" and not merged:
                row[f"{mode}_us_per_delivery"] = None
                continue
            cpu = statistics.median(
                _rounds(mode, events, args.sessions, args.supervisors, args.rounds, size)
                for _ in range(args.repeat)
            )
            row[f"{mode}_us_per_delivery"] = 1e6 * cpu / (count * args.supervisors)
        rows.append(row)
    result["rows"] = rows
    print(
        f"{args.sessions} sessions x {args.supervisors} connections, {args.rounds} rounds, "
        f"median of {args.repeat}"
    )
    print(f"{'events/round':>12}  {'encode/event':>12}  " + "  ".join(f"{m:>9}" for m in MODES))
    for row in rows:
        cells = [
            "n/a" if row[f"{m}_us_per_delivery"] is None else f"{row[f'{m}_us_per_delivery']:.2f}µs"
            for m in MODES
        ]
        print(
            f"{row['events_per_round']:>12}  {row['encode_us_per_event']:>10.2f}µs  "
            + "  ".join(f"{c:>9}" for c in cells)
        )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "gateway-delivery.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
