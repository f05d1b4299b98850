"""`harness demo` end to end against the in-process simulator."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import trio

from actors.providers.simulator import SimulatorEngine, serve_simulator
from actors.session import SQLiteStore
from supervision import demo
from supervision.cli import main
from supervision.demo import TURNS, run_demo


async def test_demo_hits_the_cache_after_the_first_request_and_rebuilds_every_request(
    tmp_path: Path,
) -> None:
    lines: list[str] = []
    store_path = tmp_path / "demo.sqlite"
    report = await run_demo(store_path=store_path, out=lines.append)
    assert report.requests == 2 * len(TURNS)
    assert report.rebuilt_all and report.ok and report.failure is None
    # One row per request, the last one included (the turn's final answer).
    assert [(row.turn, row.step) for row in report.rows] == [
        (turn, step) for turn in range(len(TURNS)) for step in range(2)
    ]
    assert sum(line.startswith(f"{len(TURNS) - 1:>5}/1 ") for line in lines) == 1
    assert report.rows[0].header == "initial"
    assert all(row.header == "-" for row in report.rows[1:])
    assert all(row.cached_tokens > 0 for row in report.rows[1:])
    assert 0.5 < report.hit_ratio <= report.physical_limit
    assert lines[-1] == "OK"
    assert await SQLiteStore(store_path).list_sessions()


def test_cli_demo_exits_zero_and_prints_the_summary(
    tmp_path: Path, capsys: object, monkeypatch: object
) -> None:
    monkeypatch.delenv("DEEPSEEK_API_KEY", raising=False)  # type: ignore[attr-defined]
    assert main(["demo", "--store", str(tmp_path / "cli.sqlite")]) == 0
    printed = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "overall cache hit ratio" in printed
    assert "byte for byte" in printed


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_demo_with_a_refused_key_fails_and_says_why(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    engine = SimulatorEngine()
    url = await nursery.start(serve_simulator, engine)
    lines: list[str] = []
    report = await run_demo(
        store_path=tmp_path / "demo.sqlite", api_key="sk-invalid", base_url=url, out=lines.append
    )
    assert not report.ok
    assert report.failure is not None
    assert "unauthorized" in report.failure and "HTTP 401" in report.failure
    assert "Authentication Fails" in report.failure
    assert report.rows == ()
    assert lines[-1].startswith("FAILED: turn 0 failed (unauthorized, HTTP 401)")
    assert engine.statistics().chat_requests == 1  # stopped at the first failed turn


def test_cli_demo_without_a_route_to_the_api_exits_non_zero_saying_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-whatever")
    monkeypatch.setattr(demo, "DEEPSEEK_BASE_URL", f"http://127.0.0.1:{_closed_port()}")
    assert main(["demo", "--store", str(tmp_path / "cli.sqlite")]) == 1
    captured = capsys.readouterr()
    assert "FAILED: turn 0 failed (connect_error)" in captured.out
    assert "OK" not in captured.out.splitlines()
    assert captured.err.startswith("harness demo: turn 0 failed (connect_error)")
