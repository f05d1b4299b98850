"""The `harness` command end to end, as a subprocess: output, `--json` shapes, exit statuses."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from supervision.cli import main

SIM_CONFIG = """
[store]
path = "sessions.sqlite"

[providers.local]
kind = "simulator"

[agents.default]
provider = "local"
persona = "You are a test agent on {{model}}."
tools = ["supervision.workspace_tools:list_files", "supervision.workspace_tools:read_file"]
"""


def harness(
    cwd: Path, *args: str, env: Mapping[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "DEEPSEEK_API_KEY"}
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "supervision.cli", *args],
        cwd=cwd,
        env={**environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("harness")
    return lines[0]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli")
    (root / "harness.toml").write_text(SIM_CONFIG)
    (root / "notes.txt").write_text("the notes")
    return root


@pytest.fixture(scope="module")
def ran(workspace: Path) -> dict[str, Any]:
    result = harness(
        workspace,
        "run",
        'read it\ncall read_file {"path": "notes.txt"}',
        "--config",
        "harness.toml",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    out: dict[str, Any] = json.loads(result.stdout)
    return out


def test_run_streams_the_reply_and_shows_tool_calls(workspace: Path) -> None:
    result = harness(workspace, "run", "look\ncall list_files {}", "--config", "harness.toml")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("session ")
    assert "→ list_files({})" in lines
    listing = result.stdout.split("← list_files ", 1)[1]
    assert "notes.txt" in listing.split("→")[0]
    assert "Tool results:" in lines[-1]


def test_run_json_shape(ran: dict[str, Any]) -> None:
    assert set(ran) == {"sessionId", "turn", "reason", "text", "usage", "events"}
    assert ran["turn"] == 0 and ran["reason"] == {"kind": "completed"}
    assert "the notes" in ran["text"]
    assert set(ran["usage"]) == {"inputTokens", "outputTokens", "cacheReadTokens"}
    assert ran["events"][-1]["type"] == "turn/end"


def test_run_continues_a_session(workspace: Path, ran: dict[str, Any]) -> None:
    result = harness(
        workspace,
        "run",
        "again",
        "--session",
        ran["sessionId"],
        "--config",
        "harness.toml",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["turn"] == 1


def test_run_exits_1_with_the_reason_when_the_turn_fails(workspace: Path) -> None:
    (workspace / "broken.toml").write_text(SIM_CONFIG.replace("{{model}}", "{{modle}}"))
    result = harness(workspace, "run", "hi", "--config", "broken.toml")
    assert result.returncode == 1
    line = one_line_error(result)
    assert "ended error" in line and "modle" in line


def test_sessions_lists_them(workspace: Path, ran: dict[str, Any]) -> None:
    result = harness(workspace, "sessions", "--config", "harness.toml", "--json")
    assert result.returncode == 0, result.stderr
    sessions = json.loads(result.stdout)["sessions"]
    mine = next(s for s in sessions if s["sessionId"] == ran["sessionId"])
    assert set(mine) == {
        "sessionId",
        "status",
        "turn",
        "headSeq",
        "createdAt",
        "updatedAt",
        "usage",
        "hitRatio",
        "lastTurnEnd",
    }
    assert mine["status"] == "idle"
    text = harness(workspace, "sessions", "--config", "harness.toml")
    assert ran["sessionId"] in text.stdout and text.returncode == 0


def test_show_prints_the_conversation_turn_by_turn(workspace: Path, ran: dict[str, Any]) -> None:
    result = harness(workspace, "show", ran["sessionId"], "--config", "harness.toml")
    assert result.returncode == 0, result.stderr
    assert "turn 0: completed" in result.stdout
    assert "user: read it" in result.stdout
    assert '→ read_file({"path": "notes.txt"})' in result.stdout
    assert "← result: the notes" in result.stdout
    assert "request step 1: prompt" in result.stdout
    shown = json.loads(
        harness(workspace, "show", ran["sessionId"], "--config", "harness.toml", "--json").stdout
    )
    turn = shown["turns"][0]
    assert [i["kind"] for i in turn["items"]][:3] == ["user", "tool_call", "tool_result"]
    assert turn["requests"][1]["cacheHitTokens"] > 0


def test_replay_prints_the_rebuilt_request_and_its_hash(
    workspace: Path, ran: dict[str, Any]
) -> None:
    args = ("replay", ran["sessionId"], "--turn", "0", "--step", "1", "--config", "harness.toml")
    result = harness(workspace, *args, "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    wire = json.dumps(out["request"], separators=(",", ":"), ensure_ascii=False)
    assert out["sha256"] == hashlib.sha256(wire.encode()).hexdigest()
    assert out["request"]["messages"][-1]["source"] == {"kind": "tool", "call_id": ANY_ID}
    pretty = harness(workspace, *args)
    assert json.loads(pretty.stdout) == out["request"]


class _AnyId:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and bool(other)


ANY_ID: Any = _AnyId()


def test_replay_of_a_missing_step_is_one_line(workspace: Path, ran: dict[str, Any]) -> None:
    result = harness(
        workspace,
        "replay",
        ran["sessionId"],
        "--turn",
        "9",
        "--step",
        "0",
        "--config",
        "harness.toml",
    )
    assert result.returncode == 1
    assert "no step 0 in turn 9" in one_line_error(result)


def test_cache_reports_every_request(workspace: Path, ran: dict[str, Any]) -> None:
    result = harness(workspace, "cache", ran["sessionId"], "--config", "harness.toml", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["sessionId"] == ran["sessionId"]
    assert [r["turn"] for r in report["requests"]][:2] == [0, 0]
    assert report["requests"][0]["header"] == "initial"
    assert report["requests"][1]["prefixBreak"] is None
    text = harness(workspace, "cache", ran["sessionId"], "--config", "harness.toml")
    assert "appended" in text.stdout and "overall hit ratio" in text.stdout


@pytest.mark.parametrize("command", ["show", "cache", "replay"])
def test_unknown_session_is_one_line_exit_1(workspace: Path, command: str) -> None:
    extra = ("--turn", "0", "--step", "0") if command == "replay" else ()
    result = harness(workspace, command, "nosuch", *extra, "--config", "harness.toml")
    assert result.returncode == 1
    assert "unknown session 'nosuch'" in one_line_error(result)


def test_missing_store_is_one_line(tmp_path: Path) -> None:
    result = harness(tmp_path, "sessions")
    assert result.returncode == 1
    assert "no session store at '.harness/sessions.sqlite'" in one_line_error(result)


def test_usage_error_is_one_line_exit_2(tmp_path: Path) -> None:
    result = harness(tmp_path, "replay", "s")
    assert result.returncode == 2
    assert "the following arguments are required: --turn, --step" in one_line_error(result)


@pytest.mark.parametrize(
    ("mistake", "expected"),
    [
        ('modle = "x"', "unknown key 'modle' in [agents.default]"),
        (
            'max_steps = "ten"',
            "agents.default.max_steps (in [agents.default]): expected an integer",
        ),
        ('tools = ["nosuch.mod:tool"]', "cannot import module 'nosuch.mod'"),
        ('tool_order = ["read_file"]', "agents.default.tool_order (in [agents.default])"),
    ],
)
def test_config_mistakes_exit_2_naming_key_and_file(
    tmp_path: Path,
    mistake: str,
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = SIM_CONFIG if mistake.startswith("tool_order") else SIM_CONFIG.split("tools =")[0]
    (tmp_path / "bad.toml").write_text(text + mistake + "\n")
    monkeypatch.chdir(tmp_path)
    assert main(["sessions", "--config", "bad.toml"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("harness: bad.toml: ")
    assert expected in err


def test_missing_environment_variable_exits_2_before_anything_starts(tmp_path: Path) -> None:
    (tmp_path / "remote.toml").write_text(
        '[providers.remote]\nkind = "openai-compatible"\nbase_url = "http://127.0.0.1:9"\n'
        'api_key_env = "HARNESS_TEST_MISSING_KEY"\n[agents.default]\nprovider = "remote"\n'
    )
    result = harness(tmp_path, "run", "hi", "--config", "remote.toml")
    assert result.returncode == 2
    line = one_line_error(result)
    assert "providers.remote.api_key_env" in line and "HARNESS_TEST_MISSING_KEY" in line
    assert "remote.toml" in line
    assert not (tmp_path / ".harness").exists()


def test_unknown_profile_exits_2(workspace: Path) -> None:
    result = harness(workspace, "run", "hi", "--agent", "nobody", "--config", "harness.toml")
    assert result.returncode == 2
    assert "unknown agent profile 'nobody'" in one_line_error(result)


def test_a_config_mistake_exits_2_from_the_installed_command(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text(SIM_CONFIG + 'modle = "x"\n')
    result = harness(tmp_path, "show", "s", "--config", "bad.toml")
    assert result.returncode == 2
    line = one_line_error(result)
    assert "unknown key 'modle' in [agents.default]" in line and "bad.toml" in line


@pytest.mark.parametrize(
    "command", ["run", "sessions", "show", "replay", "cache", "inspect", "demo"]
)
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    assert f"usage: harness {command}" in capsys.readouterr().out


def test_inspect_shows_sections_with_their_scope_and_the_tools(
    workspace: Path, ran: dict[str, Any]
) -> None:
    result = harness(workspace, "inspect", ran["sessionId"], "--config", "harness.toml", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert set(out) == {"header", "headerChanged", "sections", "tools", "contexts", "variables"}
    sections = {s["name"]: s for s in out["sections"]}
    assert sections["harness:identity"]["scope"] == "global"
    persona = sections["deployment:persona"]
    assert persona["scope"] == f"agent:{ran['sessionId']}" and persona["shadows"] == ["global"]
    assert [t["name"] for t in out["tools"]] == ["list_files", "read_file"]
    assert "You are a test agent on deepseek-chat." in out["header"]["system"]
    text = harness(workspace, "inspect", ran["sessionId"], "--config", "harness.toml")
    assert "deployment:persona" in text.stdout and "read_file" in text.stdout


def test_inspect_of_an_unknown_session_is_one_line(workspace: Path) -> None:
    result = harness(workspace, "inspect", "nosuch", "--config", "harness.toml")
    assert result.returncode == 1
    assert "unknown session 'nosuch'" in one_line_error(result)
