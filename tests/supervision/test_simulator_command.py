"""`harness simulator` with a model script and latency, as a separate process."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio

from supervision.cli import main

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = {"rules": [{"when": {"contains": "ping"}, "reply": {"text": "pong"}}]}


async def test_the_command_serves_the_script_with_its_latency(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    command = [
        sys.executable,
        "-m",
        "supervision.cli",
        "simulator",
        "--port",
        "0",
        "--script",
        str(script),
        "--latency",
        "0.2",
    ]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            process: trio.Process = await nursery.start(
                partial(trio.run_process, command, cwd=ROOT, stdout=subprocess.PIPE, check=False)
            )
            assert process.stdout is not None
            output = b""
            while b"\n" not in output:
                piece = await process.stdout.receive_some()
                assert piece, output
                output += piece
            match = re.search(rb"listening on (http://127\.0\.0\.1:\d+) \(api key: (\S+)\)", output)
            assert match, output
            url, key = (group.decode() for group in match.groups())
            async with httpx.AsyncClient(base_url=url) as client:
                start = trio.current_time()
                reply = await client.post(
                    "/chat/completions",
                    headers={"authorization": f"Bearer {key}"},
                    json={
                        "model": "deepseek-chat",
                        "messages": [{"role": "user", "content": "ping"}],
                    },
                )
                elapsed = trio.current_time() - start
            assert reply.json()["choices"][0]["message"]["content"] == "pong"
            assert elapsed >= 0.2
            process.send_signal(signal.SIGINT)
            assert await process.wait() == 0


def test_a_bad_script_exits_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"rules": [{"reply": {"text": 3}}]}))
    assert main(["simulator", "--script", str(script)]) == 2
    assert "rules[0].reply.text must be a string" in capsys.readouterr().err
