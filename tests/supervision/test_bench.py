"""The parallel-session benchmark: its simulator accounting, one level end to end, the CLI."""

from __future__ import annotations

import argparse
import asyncio
import gc
import io
import json
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio
from rich.console import Console
from rich.progress import Progress

from actors.providers.simulator import SimRequest, SimulatorConfig, serve_simulator
from actors.providers.simulator.tokens import render_message
from supervision.bench.harness_run import LevelSettings, run_level
from supervision.bench.level_process import StepProgress
from supervision.bench.parallel import DEFAULT_POOLS, add_arguments
from supervision.bench.report import format_table, write_plot
from supervision.bench.simulator_process import (
    GC_THRESHOLDS,
    BenchEngine,
    listening_socket,
    physical_hit_limit,
    start_simulator_process,
    tune_gc,
)
from supervision.bench.workload import (
    SESSION_MARK,
    tool_definitions,
    user_message,
    workload_json,
)

SYSTEM = {"role": "system", "content": "s " * 200}
USER = {"role": "user", "content": "hello there"}


def test_the_simulator_process_collects_rarely_and_skips_what_lives_from_startup() -> None:
    thresholds = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() > 0
        assert gc.isenabled()
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def test_the_limit_of_a_first_step_is_the_shared_tools_and_system_prefix() -> None:
    body = {"tools": [], "messages": [SYSTEM, USER]}
    prompt = 500
    expected = (prompt - len(render_message(USER))) // 64 * 64
    assert physical_hit_limit(body, prompt, 64) == expected


def test_the_limit_of_a_later_step_reaches_through_the_last_assistant_message() -> None:
    assistant = {"role": "assistant", "content": "ok"}
    result = {"role": "tool", "tool_call_id": "c1", "content": "session 1"}
    body = {"messages": [SYSTEM, USER, assistant, result]}
    assert physical_hit_limit(body, 1000, 64) == (1000 - len(render_message(result))) // 64 * 64


def test_a_body_that_is_not_a_chat_has_no_limit() -> None:
    assert physical_hit_limit(["not", "a", "chat"], 100, 64) == 0
    assert physical_hit_limit({"messages": [{"role": "tool"}]}, 100, 64) == 0


def test_the_workload_has_40_two_parameter_tools_and_a_session_template() -> None:
    tools = tool_definitions()
    assert len(tools) == 40 and tools[0]["name"] == "echo"
    assert {len(t["parameters"]["properties"]) for t in tools} == {2}
    template = workload_json()["user_message_template"]
    assert template.replace(SESSION_MARK, "7") == user_message(7)


async def test_one_level_runs_every_turn_and_the_engine_accounts_its_cache() -> None:
    engine = BenchEngine(SimulatorConfig())
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_simulator, engine)
        steps: list[int] = []
        result = await run_level(
            url, LevelSettings(sessions=4, sequential_turns=2, http2=True), on_step=steps.append
        )
        nursery.cancel_scope.cancel()
    assert (result.sessions, result.steps, result.failed_turns) == (4, 8, 0)
    # Two warm-up turns, the concurrent ones, the idle-session probe and the sequential ones.
    assert len(steps) == 2 * (2 + 4 + 1 + 2)
    accounting = engine.accounting()
    assert accounting.chat_requests == len(steps)
    assert 0 < accounting.hit_tokens <= accounting.limit_tokens < accounting.prompt_tokens
    # Harness keeps the prefix byte-stable: it reaches the physical limit.
    assert accounting.of_limit == 1.0


async def test_the_bench_routes_report_and_reset_the_counters() -> None:
    engine = BenchEngine(SimulatorConfig())
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_simulator, engine)
        async with httpx.AsyncClient() as client:
            await client.post(
                url + "/chat/completions",
                headers={"authorization": "Bearer sk-simulator"},
                json={"model": "deepseek-chat", "messages": [USER], "stream": True},
            )
            stats = (await client.get(url + "/_bench/stats")).json()
            assert stats["chat_requests"] == 1 and stats["prompt_tokens"] > 0
            await client.post(url + "/_bench/reset")
            stats = (await client.get(url + "/_bench/stats")).json()
        nursery.cancel_scope.cancel()
    assert stats == {"chat_requests": 0, "prompt_tokens": 0, "hit_tokens": 0, "limit_tokens": 0}


async def test_the_bench_engine_answers_streamed_and_non_streamed_requests() -> None:
    # The peers' clients send `stream: false`; only a stream's body is re-cut into large
    # writes, since the simulator refuses stream-only faults on a whole body.
    engine = BenchEngine(SimulatorConfig())
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_simulator, engine)
        async with httpx.AsyncClient() as client:
            for stream in (False, True):
                reply = await client.post(
                    url + "/chat/completions",
                    headers={"authorization": "Bearer sk-simulator"},
                    json={"model": "deepseek-chat", "messages": [USER], "stream": stream},
                )
                assert reply.status_code == 200, reply.text
            stats = (await client.get(url + "/_bench/stats")).json()
        nursery.cancel_scope.cancel()
    assert stats["chat_requests"] == 2


def _row(framework: str, sessions: int) -> dict[str, object]:
    return {
        "framework": framework,
        "sessions": sessions,
        "wall_s": 1.5,
        "cpu_ms_per_step": 2.0,
        "rss_kb_per_idle_session": 30.0,
        "failed_turns": 0,
        "cache": {"hit_ratio": 0.9, "limit_ratio": 0.95},
    }


def test_the_table_shows_each_row_and_its_cache_ratio_against_the_limit() -> None:
    table = format_table([_row("harness", 1000), _row("langgraph", 100)])
    lines = table.splitlines()
    assert len(lines) == 3 and "1,000" in lines[1] and "90.0% / 95.0%" in lines[1]
    assert "langgraph" in lines[2]


def test_the_plot_is_written_as_a_png(tmp_path: Path) -> None:
    path = tmp_path / "plot.png"
    write_plot([_row("harness", 100), _row("harness", 1000), _row("peer", 100)], path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_harness_bench_parallel_runs_levels_in_child_processes(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "supervision.cli",
            "bench",
            "parallel",
            "--sessions",
            "3",
            "--latency",
            "0",
            "--sequential-turns",
            "1",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "harness, 3 sessions" in done.stderr  # the progress bar
    (row,) = json.loads(out.read_text())
    assert (row["framework"], row["sessions"], row["failed_turns"]) == ("harness", 3, 0)
    assert row["cache"]["of_limit"] == 1.0
    # Every request was accounted: 2 warm-up turns, 3 sessions, the idle probe, 1 sequential.
    assert row["cache"]["chat_requests"] == 2 * (2 + 3 + 1 + 1)
    assert "harness" in done.stdout.splitlines()[1]


async def test_every_answered_request_is_accounted_however_many_are_in_flight() -> None:
    # More requests wait on the model at once than the engine records.
    engine = BenchEngine(SimulatorConfig(latency=1.0, max_recorded=2))
    body = json.dumps({"model": "deepseek-chat", "messages": [SYSTEM, USER], "stream": True})
    request = SimRequest(
        method="POST",
        path="/chat/completions",
        headers={"authorization": "Bearer sk-simulator"},
        body=body.encode(),
    )

    async def one() -> None:
        response = await engine.handle(request)
        assert response.status == 200

    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(one)
    accounting = engine.accounting()
    assert accounting.chat_requests == 10
    assert accounting.prompt_tokens == 10 * len(render_message(SYSTEM) + render_message(USER))


@pytest.mark.parametrize("http2", [False, True])
def test_the_simulator_process_serves_chat_and_its_routes(http2: bool) -> None:
    # Uvicorn (HTTP/1.1) by default; Hypercorn (HTTP/1.1 and HTTP/2) with http2.
    with start_simulator_process(latency=0.0, reply_tokens=5, http2=http2) as sim:
        with httpx.Client(http1=not http2, http2=http2) as client:
            response = client.post(
                sim.url + "/chat/completions",
                headers={"authorization": "Bearer sk-simulator"},
                json={"model": "deepseek-chat", "messages": [USER]},
            )
        assert response.status_code == 200 and response.http_version == (
            "HTTP/2" if http2 else "HTTP/1.1"
        )
        assert response.json()["object"] == "chat.completion"
        accounting = sim.accounting()
        assert accounting.chat_requests == 1 and accounting.prompt_tokens > 0
        sim.reset()
        assert sim.accounting().chat_requests == 0
        assert sim.cpu_seconds() > 0
    assert sim.process.poll() is not None


def test_the_simulator_process_accepts_connections_that_send_without_nagles_delay() -> None:
    # What Uvicorn does with the listener: asyncio accepts on it and wraps each connection.
    async def accepted_nodelay() -> int:
        listener = listening_socket()
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = transport.get_extra_info("socket")
                accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
        _, writer = await asyncio.open_connection(*listener.getsockname())
        try:
            return await asyncio.wait_for(accepted, 10)
        finally:
            writer.close()
            server.close()
            await server.wait_closed()

    assert asyncio.run(accepted_nodelay()) != 0


def test_the_parallel_benchmark_spreads_its_connections_over_256_pools_by_default() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args([]).pools == DEFAULT_POOLS == 256
    assert parser.parse_args(["--pools", "8"]).pools == 8


def test_the_progress_bar_keeps_no_record_per_step_and_shows_the_rate() -> None:
    clock = [0.0]
    progress = Progress(
        console=Console(file=io.StringIO()), get_time=lambda: clock[0], speed_estimate_period=1.0
    )
    steps = StepProgress(progress, total=5000, interval=0.1)
    for _ in range(5000):  # 1,000 steps per second
        clock[0] += 0.001
        steps.on_step(1)
    steps.show()
    (task,) = progress.tasks
    assert (steps.done, task.completed) == (5000, 5000)
    # Rich keeps one rate sample per redraw, for one second: not one per step.
    assert len(task._progress) <= 11
    assert task.fields["rate"] == pytest.approx(1000, rel=0.02)
