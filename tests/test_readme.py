"""Every Python snippet in README.md runs, and prints what the README says it prints."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from actors.providers.simulator import SimulatorEngine, serve_simulator

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def blocks(language: str) -> list[str]:
    """The README's fenced blocks of `language`, in order."""
    return [body for lang, body in FENCE.findall(README.read_text()) if lang == language]


def run_snippet(code: str, namespace: dict[str, Any]) -> str:
    """Execute a snippet (it calls `trio.run` itself) and return what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(README), "exec"), namespace)
    return out.getvalue()


def snippet(marker: str) -> str:
    (found,) = [code for code in blocks("python") if marker in code]
    return found


def test_the_readme_has_the_snippets_this_file_runs() -> None:
    python = blocks("python")
    assert len(python) == 3
    assert {snippet("SimulatorEngine()"), snippet("DEEPSEEK_API_KEY"), snippet("ScriptedProvider")}
    assert "../shared" not in README.read_text()


def test_no_user_document_points_outside_the_repository() -> None:
    docs = sorted((README.parent / "docs").glob("**/*.md"))
    assert docs
    for path in [README, *docs]:
        assert "../shared" not in path.read_text(), path


def test_quickstart_prints_what_the_readme_shows() -> None:
    printed = run_snippet(snippet("SimulatorEngine()"), {"__name__": "__readme__"})
    shown = next(b for b in blocks("text") if "from the cache" in b)
    assert printed == shown


def test_deepseek_snippet_runs_against_a_deepseek_compatible_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    namespace: dict[str, Any] = {"__name__": "__readme__"}
    run_snippet(snippet("SimulatorEngine()"), namespace)  # defines `add`, as the README says
    printed: list[str] = []

    async def serve_and_run() -> None:
        async with trio.open_nursery() as nursery:
            engine = SimulatorEngine()
            url = await nursery.start(serve_simulator, engine)
            monkeypatch.setenv("DEEPSEEK_BASE_URL", url)
            monkeypatch.setenv("DEEPSEEK_API_KEY", engine.config.api_key or "")
            # The snippet runs its own trio.run, so it gets a thread of its own.
            printed.append(
                await trio.to_thread.run_sync(run_snippet, snippet("DEEPSEEK_API_KEY"), namespace)
            )
            nursery.cancel_scope.cancel()

    trio.run(serve_and_run)
    lines = printed[0].splitlines()
    assert len(lines) >= 2
    assert re.fullmatch(r"\d+ prompt tokens, \d+ from the cache", lines[-1])


@pytest.mark.skipif(not os.environ.get("DEEPSEEK_API_KEY"), reason="needs DEEPSEEK_API_KEY")
def test_deepseek_snippet_against_deepseek(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEEPSEEK_BASE_URL", raising=False)
    namespace: dict[str, Any] = {"__name__": "__readme__"}
    run_snippet(snippet("SimulatorEngine()"), namespace)
    printed = run_snippet(snippet("DEEPSEEK_API_KEY"), namespace)
    assert "6912" in printed.replace(",", "")


def test_using_it_from_code_snippet_runs() -> None:
    run_snippet(snippet("ScriptedProvider"), {"__name__": "__readme__"})


def test_the_simulator_command_serves_what_the_readme_says() -> None:
    (command,) = [
        line for b in blocks("sh") for line in b.splitlines() if "harness simulator" in line
    ]
    argv = command.split("#")[0].split()
    assert argv[:2] == [".venv/bin/harness", "simulator"]
    argv = [str(Path(sys.executable).parent / "harness"), "simulator", "--port", "0"]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None
            first = process.stdout.readline()
            match = re.fullmatch(r"simulator listening on (\S+) \(api key: sk-simulator\)\n", first)
            assert match, first
            models = httpx.get(
                f"{match.group(1)}/models",
                headers={"authorization": "Bearer sk-simulator"},
                timeout=10,
            )
            assert models.status_code == 200
        finally:
            process.terminate()
            process.wait(timeout=10)
