"""What every peer script shares: arguments, the HTTP client, the measurements, the JSON.

Runs inside each peer's own virtualenv, so it imports nothing from harness.
A peer script calls `main(framework, build)` where `build(workload, url,
http_client)` returns `turn(session, text)`, an async function running one
turn of that session (keeping the session's state for later turns) and
returning True when the turn ended with the model's final text.

The HTTP client is an `httpx.AsyncClient` with the OpenAI client's own
default limits (1,000 connections, 100 kept alive), passed to each
framework's OpenAI client; its transport only records how long each
request took until its body was read, per session (a context variable set
by the session's task), so a turn's time outside the model is measured the
same way as harness's.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import json
import random
import resource
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

try:  # The OpenAI SDK 3.x builds on httpx2, the successor of httpx, with the same API.
    import httpx2 as httpx
except ImportError:
    import httpx  # type: ignore[no-redef]

SESSION: contextvars.ContextVar[str] = contextvars.ContextVar("bench_session", default="")
Turn = Callable[[int, str], Awaitable[bool]]
Build = Callable[[dict[str, Any], str, Any], Awaitable[Turn]]

_waited: dict[str, float] = {}


class _TimedStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, key: str, started: float) -> None:
        self._inner = inner
        self._key = key
        self._started = started

    async def __aiter__(self):  # type: ignore[override]
        async for part in self._inner:
            yield part

    async def aclose(self) -> None:
        await self._inner.aclose()
        _waited[self._key] = _waited.get(self._key, 0.0) + time.perf_counter() - self._started


class TimedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport, timing each request from send to body closed, per session."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        started = time.perf_counter()
        response = await super().handle_async_request(request)
        response.stream = _TimedStream(response.stream, SESSION.get(), started)  # type: ignore[arg-type]
        return response


def http_client() -> httpx.AsyncClient:
    """The client every framework's OpenAI client is given (the OpenAI SDK's default limits)."""
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    return httpx.AsyncClient(
        transport=TimedTransport(limits=limits), timeout=httpx.Timeout(600.0, connect=60.0)
    )


def user_message(workload: dict[str, Any], session: int) -> str:
    return workload["user_message_template"].replace("<N>", str(session))


def time_fact() -> str:
    """The dynamic fact every framework adds to every request, to the second."""
    return "Current time: " + time.strftime("%Y-%m-%dT%H:%M:%S+00:00 (%A, UTC).", time.gmtime())


def rss_kb() -> int:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() // 1024


def _percentile(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[max(0, round(q * 100) - 1)]


async def _timed_turn(turn: Turn, session: int, text: str) -> tuple[str, float, bool]:
    SESSION.set(text)
    started = time.perf_counter()
    ok = await turn(session, text)
    return text, time.perf_counter() - started, ok


async def run_level(
    framework: str, build: Build, workload: dict[str, Any], url: str, settings: dict[str, Any]
) -> dict[str, Any]:
    sessions = settings["sessions"]
    client = http_client()
    turn = await build(workload, url, client)
    # Warm up; the second turn of the warm-up session is the single-session latency.
    await asyncio.create_task(_timed_turn(turn, -1, user_message(workload, -1)))
    _, single, _ = await asyncio.create_task(_timed_turn(turn, -2, user_message(workload, -2)))
    gc.collect()
    rss_before = rss_kb()
    _waited.clear()
    cpu, wall = time.process_time(), time.perf_counter()
    results = await asyncio.gather(
        *(
            asyncio.create_task(_timed_turn(turn, n, user_message(workload, n)))
            for n in range(sessions)
        )
    )
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    steps = 2 * sessions
    overheads = sorted(
        max(0.0, (elapsed - _waited.get(text, 0.0)) / 2) for text, elapsed, _ in results
    )
    gc.collect()
    await asyncio.sleep(0.2)
    rss_after = rss_kb()
    probe = random.Random(12).randrange(sessions)
    _, idle_turn, _ = await asyncio.create_task(
        _timed_turn(turn, probe, user_message(workload, sessions + probe))
    )
    sequential = 0.0
    if settings["sequential_turns"]:
        seq_cpu = time.process_time()
        for index in range(settings["sequential_turns"]):
            session = index % sessions
            await asyncio.create_task(
                _timed_turn(turn, session, user_message(workload, 2 * sessions + index))
            )
        sequential = (time.process_time() - seq_cpu) / (2 * settings["sequential_turns"]) * 1e3
    await client.aclose()
    return {
        "framework": framework,
        "sessions": sessions,
        "steps": steps,
        "failed_turns": sum(not ok for _, _, ok in results),
        "wall_s": wall,
        "cpu_ms_per_step": cpu / steps * 1e3,
        "steps_per_s": steps / wall,
        "overhead_ms_p50": _percentile(overheads, 0.5) * 1e3,
        "overhead_ms_p99": _percentile(overheads, 0.99) * 1e3,
        "rss_kb_per_idle_session": (rss_after - rss_before) / sessions,
        "rss_mb_total": rss_after / 1024,
        "sequential_cpu_ms_per_step": sequential,
        "single_turn_s": single,
        "idle_session_turn_s": idle_turn,
        "settings": settings,
    }


def main(framework: str, build: Build) -> None:
    """`python PEER.py URL SETTINGS_JSON WORKLOAD_FILE`: one level, its result as a JSON line."""
    url, raw_settings, workload_path = sys.argv[1:4]
    workload = json.loads(Path(workload_path).read_text())
    result = asyncio.run(run_level(framework, build, workload, url, json.loads(raw_settings)))
    print(json.dumps(result), flush=True)
