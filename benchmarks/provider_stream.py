"""Client CPU per chunk and per request, streaming from the simulator over loopback.

The simulator runs in a separate process (so its CPU is not counted); this
process streams requests through a `ProviderActor` and the OpenAI-compatible
adapter with 1, 100 and 1,000 concurrent streams, and reports client CPU µs
per chunk and per request (`time.process_time`), plus wall time.

Run: .venv/bin/python benchmarks/provider_stream.py [--reply-tokens 64] [--requests 1000]
     [--levels 1 100 1000] [--http 1.1|2] [--pools K]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx
import trio

from actors.messages import Message
from actors.providers import FinishChunk, GenerateRequest
from actors.providers.actor import ProviderActor
from actors.providers.openai_compat import OpenAICompatProvider

RESULTS = Path(__file__).parent / "results" / "provider_stream.json"
API_KEY = "sk-simulator"
SERVER = """
import sys, trio
from actors.providers.simulator import SimulatorConfig, SimulatorEngine, serve_simulator
engine = SimulatorEngine(SimulatorConfig(reply_tokens={reply_tokens}, cache_max_blocks=1 << 20))
async def main():
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_simulator, engine)
        print(url, flush=True)
        await trio.sleep_forever()
trio.run(main)
"""


def request_for(index: int) -> GenerateRequest:
    return GenerateRequest(
        config={"provider": "sim", "model": "deepseek-chat"},
        system="You are a benchmark agent. Answer briefly.",
        messages=[Message.user(f"Request number {index}: say something.")],
    )


async def run_level(
    url: str, concurrency: int, total: int, http2: bool, pools: int
) -> dict[str, Any]:
    def factory(client: httpx.AsyncClient) -> OpenAICompatProvider:
        return OpenAICompatProvider(client, base_url=url, api_key=API_KEY)

    actor = ProviderActor(
        name="sim",
        factory=factory,
        max_in_flight=concurrency,
        timeout=httpx.Timeout(120.0, connect=30.0),
        limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
        http2=http2,
        pools=pools,
    )
    counts = {"chunks": 0, "requests": 0, "failures": 0}
    failure_codes: dict[str, int] = {}

    async def one(index: int) -> None:
        async with aclosing(actor.stream(request_for(index))) as chunks:
            async for chunk in chunks:
                counts["chunks"] += 1
                if isinstance(chunk, FinishChunk):
                    counts["requests"] += 1
                    if chunk.failure is not None:
                        counts["failures"] += 1
                        code = chunk.failure.code
                        failure_codes[code] = failure_codes.get(code, 0) + 1

    async with trio.open_nursery() as nursery:
        await nursery.start(actor.serve)
        cpu, wall = time.process_time(), time.perf_counter()
        sent = 0
        while sent < total:
            batch = min(concurrency, total - sent)
            async with trio.open_nursery() as streams:
                for index in range(sent, sent + batch):
                    streams.start_soon(one, index)
            sent += batch
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        nursery.cancel_scope.cancel()
    return {
        "http": "2" if http2 else "1.1",
        "pools": pools,
        "concurrency": concurrency,
        "requests": counts["requests"],
        "failures": counts["failures"],
        "failure_codes": failure_codes,
        "chunks": counts["chunks"],
        "cpu_us_per_chunk": cpu / counts["chunks"] * 1e6,
        "cpu_us_per_request": cpu / counts["requests"] * 1e6,
        "wall_seconds": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reply-tokens", type=int, default=64)
    parser.add_argument("--requests", type=int, default=1000, help="requests per level")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 100, 1000])
    parser.add_argument("--http", choices=("1.1", "2"), default="1.1", help="HTTP version")
    parser.add_argument("--pools", type=int, default=1, help="connection pools in the client")
    args = parser.parse_args()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER.format(reply_tokens=args.reply_tokens)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        if not url.startswith("http://127.0.0.1:"):
            raise SystemExit(f"simulator did not start: {url!r}")
        rows = [
            trio.run(run_level, url, level, args.requests, args.http == "2", args.pools)
            for level in args.levels
        ]
    finally:
        server.terminate()
        server.wait(timeout=10)
    print(
        f"{'streams':>8} {'requests':>9} {'chunks':>8} {'µs/chunk':>9} "
        f"{'µs/request':>11} {'wall s':>7}"
    )
    for row in rows:
        print(
            f"{row['concurrency']:>8} {row['requests']:>9} {row['chunks']:>8} "
            f"{row['cpu_us_per_chunk']:>9.1f} {row['cpu_us_per_request']:>11.0f} "
            f"{row['wall_seconds']:>7.2f}"
        )
    for row in rows:
        if row["failures"]:
            print(f"{row['concurrency']} streams: failures {row['failure_codes']}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
