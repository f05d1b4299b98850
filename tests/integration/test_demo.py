"""`harness demo` end to end against the in-process simulator."""

from __future__ import annotations

from pathlib import Path

from actors.session import SQLiteStore
from supervision.cli import main
from supervision.demo import TURNS, run_demo


async def test_demo_hits_the_cache_after_the_first_request_and_rebuilds_every_request(
    tmp_path: Path,
) -> None:
    lines: list[str] = []
    store_path = tmp_path / "demo.sqlite"
    report = await run_demo(store_path=store_path, out=lines.append)
    assert report.requests == 2 * len(TURNS)
    assert report.rebuilt_all
    assert report.rows[0].header == "initial"
    assert all(row.header == "-" for row in report.rows[1:])
    assert all(row.cached_tokens > 0 for row in report.rows[1:])
    assert 0.5 < report.hit_ratio <= report.physical_limit
    assert any("OK" in line for line in lines)
    assert await SQLiteStore(store_path).list_sessions()


def test_cli_demo_exits_zero_and_prints_the_summary(
    tmp_path: Path, capsys: object, monkeypatch: object
) -> None:
    monkeypatch.delenv("DEEPSEEK_API_KEY", raising=False)  # type: ignore[attr-defined]
    assert main(["demo", "--store", str(tmp_path / "cli.sqlite")]) == 0
    printed = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "overall cache hit ratio" in printed
    assert "byte for byte" in printed
