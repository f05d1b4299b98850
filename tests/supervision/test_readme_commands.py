"""The README's `harness serve` and terminal-command snippets, executed as written."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Running a deployment"


def snippets() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


def environment(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DEEPSEEK_API_KEY", "HARNESS_TOKEN")}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    launcher = bin_dir / "harness"
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m supervision.cli "$@"\n')
    launcher.chmod(0o755)
    # The snippets name the checkout's `.venv/bin/harness`; the tests run them in `tmp_path`.
    (tmp_path / ".venv").mkdir(exist_ok=True)
    (tmp_path / ".venv" / "bin").unlink(missing_ok=True)
    (tmp_path / ".venv" / "bin").symlink_to(bin_dir)
    return {**env, "PATH": f"{bin_dir}:{env['PATH']}", "PYTHONPATH": str(ROOT)}


def test_the_terminal_commands_snippet_runs(tmp_path: Path) -> None:
    (script,) = [s for s in snippets() if "harness run" in s]
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=tmp_path,
        env=environment(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "→ list_files({})" in result.stdout
    assert "1 session(s)" in result.stdout
    assert "turn 0: completed" in result.stdout
    assert "overall hit ratio" in result.stdout
    assert '"messages": [' in result.stdout
    assert "deployment:persona" in result.stdout


def test_the_serve_snippet_starts_the_example_deployment(tmp_path: Path) -> None:
    (script,) = [s for s in snippets() if "harness serve" in s]
    command = script.strip().replace(".venv/bin/harness", "harness")
    process = subprocess.Popen(
        ["bash", "-c", f"cd {ROOT} && exec {command} --store {tmp_path / 's.sqlite'}"],
        env=environment(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline() for _ in range(3)]
        assert lines[0].startswith("gateway ws://127.0.0.1:")
        assert lines[1].startswith("dashboard http://127.0.0.1:")
        assert lines[2].startswith("token ")
    finally:
        process.send_signal(signal.SIGINT)
        _, errors = process.communicate(timeout=30)
    assert process.returncode == 0, errors
