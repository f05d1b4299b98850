"""`harness serve` and `harness acp` as subprocesses: start, serve, stop cleanly."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import trio

from actors.session import SQLiteStore, event_to_json
from actors.session.events import TurnEnd, TurnStart
from supervision.commands.serve import given_token, tokens_of
from supervision.config import default_config, parse_config, resolve_environment
from supervision.gateway.auth import SCOPES
from tests.gateway.helpers import open_client

HARNESS = [sys.executable, "-m", "supervision.cli"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DEEPSEEK_API_KEY", "HARNESS_TOKEN")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    return env


async def _read_lines(stream: trio.abc.ReceiveStream, count: int) -> list[str]:
    buffer = b""
    while buffer.count(b"\n") < count:
        chunk = await stream.receive_some()
        assert chunk, f"harness serve ended early; printed {buffer!r}"
        buffer += chunk
    return buffer.decode().splitlines()[:count]


async def test_harness_serve_prints_its_urls_serves_a_prompt_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    store = tmp_path / "sessions.sqlite"
    async with trio.open_nursery() as nursery:
        process = await nursery.start(
            functools.partial(
                trio.run_process,
                [*HARNESS, "serve", "--port", "0", "--store", str(store)],
                stdout=subprocess.PIPE,
                cwd=tmp_path,
                env=_env(),
                check=False,
            )
        )
        (tmp_path / "notes.txt").write_text("hello")
        with trio.fail_after(30):
            gateway_line, dashboard_line, token_line = await _read_lines(process.stdout, 3)
            assert gateway_line.startswith("gateway ws://127.0.0.1:")
            assert gateway_line.endswith("/acp")
            url = dashboard_line.removeprefix("dashboard ")
            assert dashboard_line.startswith("dashboard http://127.0.0.1:")
            token = token_line.removeprefix("token ")
            async with httpx.AsyncClient() as http:
                assert (await http.get(url + "healthz")).status_code == 200
                page = await http.get(url)
                assert page.status_code == 200 and '<script src="dashboard.js">' in page.text
            host, port = gateway_line.removeprefix("gateway ws://").removesuffix("/acp").split(":")
            async with open_client(
                host, int(port), headers=[("Authorization", f"Bearer {token}")]
            ) as client:
                sid = (await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []}))[
                    "sessionId"
                ]
                done = await client.call(
                    "session/prompt",
                    {
                        "sessionId": sid,
                        "prompt": [{"type": "text", "text": 'call list_files {"path": "."}'}],
                    },
                )
                assert done["stopReason"] == "end_turn"
                results = [
                    n["params"]["update"]
                    for n in client.notifications
                    if n["params"]["update"]["sessionUpdate"] == "tool_call_update"
                ]
                assert "notes.txt" in json.dumps(results)
                # Queued input when the signal comes (whether a turn is live then is up to the
                # machine: the next test makes one live for sure).
                for index in range(20):
                    await client.call(
                        "_harness/session/send",
                        {
                            "sessionId": sid,
                            "content": [{"type": "text", "text": f"more {index}"}],
                            "placement": "next_turn",
                        },
                    )
                process.send_signal(signal.SIGTERM)
                with trio.fail_after(20):
                    await process.wait()
                closed = client.ws.closed
                assert closed is None or closed.code in (1001, 1006)
    assert process.returncode == 0
    events = await SQLiteStore(store).load(sid)
    starts = [e.data.turn for e in events if isinstance(e.data, TurnStart)]
    ends = [e.data.turn for e in events if isinstance(e.data, TurnEnd)]
    assert starts == ends  # every live turn was closed in the log


SLOW_DEPLOYMENT = """
[providers.slow]
kind = "simulator"
token_rate = 4.0
reply_tokens = 400

[agents.default]
provider = "slow"
"""
"""A simulator that streams a reply for 100 s: a turn is surely live when the signal comes."""


async def test_harness_serve_on_sigterm_aborts_a_live_turn_and_closes_sockets_1001(
    tmp_path: Path,
) -> None:
    store = tmp_path / "sessions.sqlite"
    config = tmp_path / "slow.toml"
    config.write_text(SLOW_DEPLOYMENT)
    command = [*HARNESS, "serve", "--config", str(config), "--port", "0", "--store", str(store)]
    async with trio.open_nursery() as nursery:
        process = await nursery.start(
            functools.partial(
                trio.run_process,
                command,
                stdout=subprocess.PIPE,
                cwd=tmp_path,
                env=_env(),
                check=False,
            )
        )
        with trio.fail_after(60):
            gateway_line, _, token_line = await _read_lines(process.stdout, 3)
            host, port = gateway_line.removeprefix("gateway ws://").removesuffix("/acp").split(":")
            token = token_line.removeprefix("token ")
            async with open_client(
                host, int(port), headers=[("Authorization", f"Bearer {token}")]
            ) as client:
                sid = (await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []}))[
                    "sessionId"
                ]
                await client.send(
                    {
                        "jsonrpc": "2.0",
                        "id": "live",
                        "method": "session/prompt",
                        "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]},
                    }
                )
                # The reply is streaming: the turn is live.
                await client.wait_for(
                    lambda n: (
                        n["method"] == "session/update"
                        and n["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
                    )
                )
                state = await client.call("_harness/session/state", {"sessionId": sid})
                assert state["status"] == "running" and state["turn"] == 0
                process.send_signal(signal.SIGTERM)
                await process.wait()
                await client.wait_until(lambda: client.ws.closed is not None)
                assert client.ws.closed is not None and client.ws.closed.code == 1001
    assert process.returncode == 0
    events = await SQLiteStore(store).load(sid)
    ends = [e for e in events if isinstance(e.data, TurnEnd)]
    assert len(ends) == 1 and ends[0] is events[-1]
    assert event_to_json(ends[0])["data"] == {
        "turn": 0,
        "reason": {"kind": "aborted", "reason": {"kind": "disposed"}},
    }


async def test_harness_acp_speaks_json_rpc_on_stdio_and_stops_at_eof(tmp_path: Path) -> None:
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "session/new",
            "params": {"cwd": "/", "mcpServers": []},
        },
    ]
    stdin = "".join(json.dumps(r) + "\n" for r in requests).encode()
    with trio.fail_after(30):
        done = await trio.run_process(
            [*HARNESS, "acp", "--store", str(tmp_path / "s.sqlite")],
            stdin=stdin,
            capture_stdout=True,
            capture_stderr=True,
            cwd=tmp_path,
            env=_env(),
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode()
    answers = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert [a["id"] for a in answers] == [1, 2]
    assert answers[0]["result"]["protocolVersion"] == 1
    assert "sessionId" in answers[1]["result"]


def test_the_token_comes_from_the_flag_then_the_environment() -> None:
    assert given_token("flag", {"HARNESS_TOKEN": "env"}) == "flag"
    assert given_token(None, {"HARNESS_TOKEN": "env"}) == "env"
    assert given_token(None, {"HARNESS_TOKEN": ""}) is None
    assert given_token(None, {}) is None


def test_a_token_is_generated_only_without_a_given_one_and_without_config_tokens() -> None:
    plain = default_config({})
    tokens, generated = tokens_of(plain, resolve_environment(plain, {}), None)
    assert generated is not None and [t.secret for t in tokens] == [generated]
    assert tokens[0].scopes == frozenset(SCOPES) and tokens[0].sessions == "*"

    tokens, generated = tokens_of(plain, resolve_environment(plain, {}), "given")
    assert generated is None and [t.secret for t in tokens] == ["given"]
    assert tokens[0].scopes == frozenset(SCOPES) and tokens[0].sessions == "*"

    configured = parse_config(
        {
            "providers": {"default": {"kind": "simulator"}},
            "agents": {"default": {}},
            "gateway": {"tokens": [{"env": "DASHBOARD_TOKEN", "scopes": ["observe"]}]},
        },
        "<test>",
    )
    environment = resolve_environment(configured, {"DASHBOARD_TOKEN": "from-config"})
    tokens, generated = tokens_of(configured, environment, None)
    assert generated is None and [t.secret for t in tokens] == ["from-config"]
    assert tokens[0].scopes == frozenset({"observe"})
    tokens, generated = tokens_of(configured, environment, "given")
    assert generated is None and [t.secret for t in tokens] == ["given", "from-config"]


async def test_harness_serve_takes_its_token_from_the_flag_before_harness_token(
    tmp_path: Path,
) -> None:
    command = [*HARNESS, "serve", "--port", "0", "--store", str(tmp_path / "s.sqlite")]
    env = {**_env(), "HARNESS_TOKEN": "from-environment"}
    async with trio.open_nursery() as nursery:
        process = await nursery.start(
            functools.partial(
                trio.run_process,
                [*command, "--token", "from-flag"],
                stdout=subprocess.PIPE,
                cwd=tmp_path,
                env=env,
                check=False,
            )
        )
        with trio.fail_after(30):
            printed = b""
            while printed.count(b"\n") < 2:
                chunk = await process.stdout.receive_some()
                assert chunk, printed
                printed += chunk
            gateway_line = printed.decode().splitlines()[0]
            host, port = gateway_line.removeprefix("gateway ws://").removesuffix("/acp").split(":")
            async with open_client(
                host, int(port), headers=[("Authorization", "Bearer from-flag")]
            ) as client:
                assert (await client.call("_harness/stats", {}))["epoch"]
            async with httpx.AsyncClient() as http:
                refused = await http.get(
                    f"http://{host}:{port}/acp",
                    headers={
                        "Authorization": "Bearer from-environment",
                        "Connection": "Upgrade",
                        "Upgrade": "websocket",
                        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                        "Sec-WebSocket-Version": "13",
                    },
                )
                assert refused.status_code == 401
            process.send_signal(signal.SIGTERM)
            await process.wait()
            while chunk := await process.stdout.receive_some():
                printed += chunk
    assert process.returncode == 0
    # Nothing was generated, so no token line was printed.
    assert [line.split()[0] for line in printed.decode().splitlines()] == ["gateway", "dashboard"]
