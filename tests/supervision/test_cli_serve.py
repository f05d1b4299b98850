"""`harness serve` and `harness watch` end to end as subprocesses, over a real socket."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from supervision.commands.gateway_client import open_gateway_client

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "serve-test-token"


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "supervision.cli", *args]


class Lines:
    """Reads a subprocess's stdout line by line."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def next(self) -> str:
        while b"\n" not in self.buffer:
            data = await self.stream.receive_some()
            if not data:
                raise EOFError(self.buffer.decode())
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DEEPSEEK_API_KEY", "HARNESS_TOKEN")}
    return {**env, "PYTHONPATH": str(ROOT)}


@asynccontextmanager
async def serving(cwd: Path, *extra: str) -> AsyncIterator[tuple[str, str, trio.Process]]:
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            partial(
                trio.run_process,
                command("serve", "--port", "0", "--store", str(cwd / "s.sqlite"), *extra),
                cwd=cwd,
                env=environment(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                check=False,
            )
        )
        assert process.stdout is not None
        lines = Lines(process.stdout)
        with trio.fail_after(30):
            ws = (await lines.next()).split(" ", 1)
            http = (await lines.next()).split(" ", 1)
        assert ws[0] == "gateway" and http[0] == "dashboard"
        try:
            yield ws[1], http[1], process
        finally:
            process.send_signal(signal.SIGINT)
            with trio.fail_after(30):
                await process.wait()


async def test_serve_prints_its_urls_serves_the_dashboard_and_stops_cleanly(tmp_path: Path) -> None:
    async with serving(tmp_path, "--token", TOKEN) as (ws, http, process):
        assert ws.startswith("ws://127.0.0.1:") and ws.endswith("/acp")
        async with httpx.AsyncClient() as client:
            assert (await client.get(http + "healthz")).status_code == 200
            page = await client.get(http)
            assert page.status_code == 200 and "dashboard.js" in page.text
            assert (await client.get(http + "dashboard.js")).status_code == 200
        async with open_gateway_client(ws, TOKEN) as gateway:
            new = await gateway.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
            reply = await gateway.call(
                "session/prompt",
                {"sessionId": new["sessionId"], "prompt": [{"type": "text", "text": "hi"}]},
            )
            assert reply["stopReason"] == "end_turn"
    assert process.returncode == 0
    listed = await trio.run_process(
        command("sessions", "--store", str(tmp_path / "s.sqlite"), "--json"),
        cwd=tmp_path,
        env=environment(),
        capture_stdout=True,
    )
    sessions = json.loads(listed.stdout)["sessions"]
    assert [s["sessionId"] for s in sessions] == [new["sessionId"]]


async def test_serve_without_a_token_generates_one(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            partial(
                trio.run_process,
                command("serve", "--port", "0", "--store", "memory"),
                cwd=tmp_path,
                env=environment(),
                stdout=subprocess.PIPE,
                check=False,
            )
        )
        assert process.stdout is not None
        lines = Lines(process.stdout)
        with trio.fail_after(30):
            ws = (await lines.next()).split(" ", 1)[1]
            await lines.next()
            kind, token = (await lines.next()).split(" ", 1)
        assert kind == "token" and len(token) >= 20
        async with open_gateway_client(ws, token) as gateway:
            assert gateway.initialize["protocolVersion"] == 1
        process.send_signal(signal.SIGINT)
        await process.wait()
    assert process.returncode == 0


async def test_a_busy_port_is_one_line_and_exit_1(tmp_path: Path) -> None:
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = await trio.run_process(
            command("serve", "--port", str(port), "--token", TOKEN, "--store", "memory"),
            cwd=tmp_path,
            env=environment(),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 1
    err = result.stderr.decode().strip().splitlines()
    assert len(err) == 1 and "Traceback" not in result.stderr.decode()
    assert f"127.0.0.1:{port}" in err[0] and "--port" in err[0]


async def test_watch_follows_the_gateway_live(tmp_path: Path) -> None:
    async with (
        serving(tmp_path, "--token", TOKEN) as (ws, _, _),
        open_gateway_client(ws, TOKEN) as gateway,
    ):
        first = await gateway.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
        async with trio.open_nursery() as nursery:
            watch: trio.Process = await nursery.start(
                partial(
                    trio.run_process,
                    command("watch", "--url", ws, "--token", TOKEN, "--json"),
                    cwd=tmp_path,
                    env=environment(),
                    stdout=subprocess.PIPE,
                    check=False,
                )
            )
            assert watch.stdout is not None
            lines = Lines(watch.stdout)
            with trio.fail_after(30):
                snapshot = json.loads(await lines.next())
            assert [s["sessionId"] for s in snapshot["sessions"]] == [first["sessionId"]]
            await gateway.call(
                "session/prompt",
                {"sessionId": first["sessionId"], "prompt": [{"type": "text", "text": "hi"}]},
            )
            seen: list[dict[str, Any]] = []
            with trio.fail_after(30):
                while not any(e.get("event", {}).get("type") == "turn/end" for e in seen):
                    seen.append(json.loads(await lines.next()))
            events = [e["event"] for e in seen if "event" in e]
            assert [e["seq"] for e in events] == list(range(len(events)))
            assert events[0]["type"] == "turn/start"
            watch.send_signal(signal.SIGINT)
            await watch.wait()
        assert watch.returncode == 0


async def test_watch_with_a_wrong_token_is_one_line(tmp_path: Path) -> None:
    async with serving(tmp_path, "--token", TOKEN) as (ws, _, _):
        result = await trio.run_process(
            command("watch", "--url", ws, "--token", "wrong"),
            cwd=tmp_path,
            env=environment(),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 1
    assert "refused the token (HTTP 401)" in result.stderr.decode()
    assert len(result.stderr.decode().strip().splitlines()) == 1


@pytest.mark.parametrize("command_name", ["serve", "watch"])
def test_help(command_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    from supervision.cli import main

    with pytest.raises(SystemExit) as info:
        main([command_name, "--help"])
    assert info.value.code == 0
    assert f"usage: harness {command_name}" in capsys.readouterr().out


async def test_inspect_asks_a_running_gateway(tmp_path: Path) -> None:
    async with serving(tmp_path, "--token", TOKEN) as (ws, _, _):
        async with open_gateway_client(ws, TOKEN) as gateway:
            new = await gateway.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
        result = await trio.run_process(
            command("inspect", new["sessionId"], "--url", ws, "--token", TOKEN, "--json"),
            cwd=tmp_path,
            env=environment(),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        out = json.loads(result.stdout)
        names = [s["name"] for s in out["sections"]]
        assert names[:2] == ["harness:identity", "deployment:persona"]
        assert [t["name"] for t in out["tools"]] == ["list_files", "read_file"]
        text = await trio.run_process(
            command("inspect", new["sessionId"], "--url", ws, "--token", TOKEN),
            cwd=tmp_path,
            env=environment(),
            capture_stdout=True,
        )
        assert b"deployment:persona" in text.stdout


async def test_watch_draws_a_live_table(tmp_path: Path) -> None:
    async with serving(tmp_path, "--token", TOKEN) as (ws, _, _):
        async with open_gateway_client(ws, TOKEN) as gateway:
            new = await gateway.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
            await gateway.call(
                "session/prompt",
                {"sessionId": new["sessionId"], "prompt": [{"type": "text", "text": "hi"}]},
            )
        async with trio.open_nursery() as nursery:
            watch: trio.Process = await nursery.start(
                partial(
                    trio.run_process,
                    command("watch", "--url", ws, "--token", TOKEN),
                    cwd=tmp_path,
                    env={**environment(), "COLUMNS": "160"},
                    stdout=subprocess.PIPE,
                    check=False,
                )
            )
            assert watch.stdout is not None
            lines = Lines(watch.stdout)
            # A terminal redraws in place; a pipe gets the view when it stops. Stop it once
            # it follows the session (the gateway counts its log subscription).
            async with open_gateway_client(ws, TOKEN) as gateway:
                for _ in range(300):
                    stats = await gateway.call("_harness/stats", {})
                    if stats["gateway"]["subscriptions"] >= 1:
                        break
                    await trio.sleep(0.1)
            watch.send_signal(signal.SIGINT)
            rest = []
            with trio.fail_after(30):
                try:
                    while True:
                        rest.append(await lines.next())
                except EOFError:
                    pass
            await watch.wait()
        shown = "\n".join(rest)
        assert new["sessionId"] in shown and "idle" in shown and "newest events" in shown
        assert watch.returncode == 0


async def test_a_session_held_by_a_running_serve_is_one_line_with_what_to_do(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path, "--token", TOKEN) as (ws, _, _):
        async with open_gateway_client(ws, TOKEN) as gateway:
            new = await gateway.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
        result = await trio.run_process(
            command("run", "hi", "--session", new["sessionId"], "--store", "s.sqlite"),
            cwd=tmp_path,
            env=environment(),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 1
    err = result.stderr.decode().strip().splitlines()
    assert len(err) == 1 and "is busy" in err[0] and "harness inspect --url" in err[0]


async def test_serve_announces_status_changes_with_the_summary(tmp_path: Path) -> None:
    async with (
        serving(tmp_path, "--token", TOKEN) as (ws, _, _),
        open_gateway_client(ws, TOKEN) as watcher,
        open_gateway_client(ws, TOKEN) as driver,
    ):
        await watcher.call("_harness/sessions/watch", {})
        new = await driver.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
        await driver.call(
            "session/prompt",
            {"sessionId": new["sessionId"], "prompt": [{"type": "text", "text": "hi"}]},
        )
        changes: list[dict[str, Any]] = []
        with trio.fail_after(30):
            async for message in watcher.notifications:
                if message["method"] == "_harness/sessions/changed":
                    changes.append(message["params"])
                    if [c["change"] for c in changes] == ["added", "status", "status"]:
                        break
        running, ended = changes[1]["session"], changes[2]["session"]
        assert running["sessionId"] == new["sessionId"] and running["turn"] == 0
        assert running["status"] == "running"
        assert ended["usage"]["inputTokens"] > 0 and ended["headSeq"] > running["headSeq"]
        assert ended["status"] == "idle"
