"""The benchmark's simulator, in its own process so its CPU is not the client's.

`python -m supervision.bench.simulator_process --latency 0.05 --reply-tokens 24`
serves a `BenchEngine` on a free loopback port and prints its base URL on
the first line of stdout: HTTP/1.1 from Uvicorn (its httptools parser, on
asyncio: a third of Hypercorn's CPU per request, see benchmarks/README.md),
or with `--http2` HTTP/1.1 and HTTP/2 with prior knowledge from Hypercorn's
Trio worker. The engine is the same either way (it waits through AnyIO).
`start_simulator_process` runs it as a child process and returns a handle
that reads its accounting over HTTP and stops it.

A `BenchEngine` is a `SimulatorEngine` (whose `latency` is the model's time
to first byte) that keeps two extra counters per run: prompt tokens, and the prompt tokens a perfect
client could have had from the cache (see `physical_hit_limit`). Routes on
top of the simulator's: `GET /_bench/stats` (the counters as JSON) and
`POST /_bench/reset` (zero the counters and empty the prefix cache).

The benchmark model has no token pacing (`token_rate` 0): a reply is ready
in full once its latency has passed, so the engine writes each reply's body
in one piece (`Fault.write_size`, `BODY_WRITE_BYTES`), as a server's
buffered writer would, instead of one socket write per event. Both the
simulator's CPU and the client's reads then scale with requests, not with
events; every framework measured meets the same server.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, cast

import attrs
import httpx
import hypercorn.trio
import trio
import uvicorn
from hypercorn.config import Config
from hypercorn.typing import ASGIFramework

from actors.providers.simulator import (
    RecordedRequest,
    SimRequest,
    SimResponse,
    SimulatorApp,
    SimulatorConfig,
    SimulatorEngine,
)
from actors.providers.simulator.answer import Answer
from actors.providers.simulator.faults import Fault
from actors.providers.simulator.tokens import render_message
from actors.providers.simulator.validation import Chat

STATS_PATH = "/_bench/stats"
RESET_PATH = "/_bench/reset"
_JSON = (("content-type", "application/json"),)


class SimulatorProcessError(RuntimeError):
    """The benchmark simulator did not start, or answered its accounting routes badly."""


def physical_hit_limit(body: Any, prompt_tokens: int, block_tokens: int) -> int:
    """The prompt tokens of `body` a perfect client could find in the prefix cache.

    Everything before the request's new input is cacheable: through the
    last assistant message when there is one (the previous step's prompt
    and reply), else the tool header and the leading system messages (the
    part every session of the workload shares). Counted in whole blocks,
    as the cache counts hits, from the prompt's size (`prompt_tokens`) less
    the tokens of the new input, so only the short new messages are
    tokenized. A body that is not a chat request counts 0.
    """
    if not isinstance(body, Mapping) or not isinstance(body.get("messages"), Sequence):
        return 0
    messages = [m for m in body["messages"] if isinstance(m, Mapping)]
    last_assistant = max(
        (index for index, m in enumerate(messages) if m.get("role") == "assistant"), default=-1
    )
    start = last_assistant + 1
    if last_assistant < 0:
        while start < len(messages) and messages[start].get("role") in ("system", "developer"):
            start += 1
    try:
        new_input = sum(len(render_message(m)) for m in messages[start:])
    except (KeyError, TypeError):
        return 0
    return max(0, prompt_tokens - new_input) // block_tokens * block_tokens


def final_reply_script(reply_tokens: int) -> dict[str, Any]:
    """The model script of the workload: after the tool result, a reply of `reply_tokens` tokens.

    The first step needs no rule: the user message's `call echo {...}` line
    makes the built-in model call the tool.
    """
    text = "Done:" + " word" * max(0, reply_tokens - 3) + "."
    return {"rules": [{"when": {"input": "tool"}, "reply": {"text": text}}]}


@attrs.frozen(kw_only=True)
class BenchAccounting:
    """What the simulator accounted over one run.

    Attributes:
        chat_requests: Chat requests answered with a stream or a JSON body.
        prompt_tokens: Prompt tokens, summed over those requests.
        hit_tokens: Prompt tokens the prefix cache served.
        limit_tokens: Prompt tokens a perfect client could have had served
            (`physical_hit_limit`; the run's first request counts 0).
    """

    chat_requests: int
    prompt_tokens: int
    hit_tokens: int
    limit_tokens: int

    @property
    def hit_ratio(self) -> float:
        """Served / prompt tokens (0 when nothing was sent)."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def limit_ratio(self) -> float:
        """The physical limit of `hit_ratio`."""
        return self.limit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def of_limit(self) -> float:
        """Served tokens as a fraction of the physical limit (1.0: nothing wasted)."""
        return self.hit_tokens / self.limit_tokens if self.limit_tokens else 0.0


BODY_WRITE_BYTES = 1 << 20
"""The size of the benchmark simulator's body writes: larger than any reply it gives."""


class BenchEngine(SimulatorEngine):
    """A simulator engine that also accounts hit ratios against their physical limit.

    Args:
        config: The simulator's configuration (its `latency` is the model's).
    """

    def __init__(self, config: SimulatorConfig) -> None:
        super().__init__(config)
        self._counts = {"chat_requests": 0, "prompt_tokens": 0, "hit_tokens": 0, "limit": 0}

    def accounting(self) -> BenchAccounting:
        """The counters since the last reset."""
        return BenchAccounting(
            chat_requests=self._counts["chat_requests"],
            prompt_tokens=self._counts["prompt_tokens"],
            hit_tokens=self._counts["hit_tokens"],
            limit_tokens=self._counts["limit"],
        )

    def reset(self) -> None:
        """Zero the counters and empty the prefix cache."""
        for key in self._counts:
            self._counts[key] = 0
        self.flush_cache()

    async def handle(self, request: SimRequest) -> SimResponse:
        """Answer the accounting routes, or the simulator's (chat requests are accounted
        as their answer is composed: `_answer`)."""
        if request.path == STATS_PATH:
            return SimResponse(
                status=200,
                headers=_JSON,
                body=json.dumps(attrs.asdict(self.accounting())).encode(),
            )
        if request.path == RESET_PATH:
            self.reset()
            return SimResponse(status=200, headers=_JSON, body=b"{}")
        return await super().handle(request)

    def _respond(self, record: RecordedRequest, chat: Chat, fault: Fault) -> SimResponse:
        """Stream the reply with its body written in `BODY_WRITE_BYTES` pieces.

        Only streamed replies are re-cut: a non-streamed body is one write
        already, and the simulator refuses stream-only faults on it.
        """
        if fault.write_size is None:
            fault = attrs.evolve(fault, write_size=BODY_WRITE_BYTES)
        return super()._respond(record, chat, fault)

    def _answer(self, record: RecordedRequest, chat: Chat, fault: Fault) -> Answer:
        """Compose the answer and account it (every answered request, however many are
        in flight: the count does not depend on `max_recorded`)."""
        answer = super()._answer(record, chat, fault)
        self._account(record)
        return answer

    def _account(self, record: RecordedRequest) -> None:
        if record.usage is None:
            return
        first = self._counts["chat_requests"] == 0
        prompt_tokens = int(record.usage["prompt_tokens"])
        self._counts["chat_requests"] += 1
        self._counts["prompt_tokens"] += prompt_tokens
        self._counts["hit_tokens"] += int(record.usage["prompt_cache_hit_tokens"])
        if not first:
            self._counts["limit"] += physical_hit_limit(
                record.body, prompt_tokens, self.config.cache_block_tokens
            )


@attrs.define(eq=False)
class SimulatorProcess:
    """A running benchmark simulator process; use as a context manager to stop it."""

    url: str
    process: subprocess.Popen[str]

    def accounting(self) -> BenchAccounting:
        """The simulator's counters since its last reset.

        Raises:
            SimulatorProcessError: the route did not answer as expected.
        """
        try:
            response = httpx.get(self.url + STATS_PATH, timeout=30.0)
            response.raise_for_status()
            return BenchAccounting(**response.json())
        except (httpx.HTTPError, TypeError, ValueError) as exc:
            raise SimulatorProcessError(f"simulator at {self.url}: stats failed: {exc}") from exc

    def reset(self) -> None:
        """Zero the counters and empty the prefix cache.

        Raises:
            SimulatorProcessError: the route did not answer as expected.
        """
        try:
            httpx.post(self.url + RESET_PATH, timeout=30.0).raise_for_status()
        except httpx.HTTPError as exc:
            raise SimulatorProcessError(f"simulator at {self.url}: reset failed: {exc}") from exc

    def cpu_seconds(self) -> float:
        """The CPU time the simulator process has used so far (Linux `/proc`)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        """Terminate the process and wait for it (killed after 10 s); close its stdout."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()

    def __enter__(self) -> SimulatorProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_simulator_process(
    *, latency: float, reply_tokens: int, http2: bool = False
) -> SimulatorProcess:
    """Start the benchmark simulator in a child process; returns once it listens.

    Args:
        latency: Seconds per request.
        reply_tokens: The final reply's length.
        http2: Serve HTTP/2 too (Hypercorn); else HTTP/1.1 only (Uvicorn).

    Raises:
        SimulatorProcessError: the process exited or printed no URL.
    """
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "supervision.bench.simulator_process",
            "--latency",
            str(latency),
            "--reply-tokens",
            str(reply_tokens),
            *(["--http2"] if http2 else []),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    if not url.startswith("http://"):
        process.kill()
        process.wait()
        raise SimulatorProcessError(f"the benchmark simulator did not start (printed {url!r})")
    return SimulatorProcess(url=url, process=process)


BACKLOG = 4096
"""The listening socket's backlog: a level opens up to 1,000 connections at once."""

GC_THRESHOLDS = (1_000_000, 10, 100)
"""The simulator process's `gc.set_threshold`: a level's requests allocate few cycles.

With the default (700, 10, 10), 1,000 requests in flight (each an 18 KB body
parsed into some hundreds of containers) set off a collection every few
requests, and a full one every few hundred, each walking every body still
in flight: more than half of the process's CPU at N=1000 went to the
collector. The first threshold counts containers allocated less those
freed, so at a million a collection comes when a million objects have
piled up (cycles, or more than 1,000 requests' bodies at once), not while
each request frees what it parsed. Replaying an N=1000 level's 2,106
requests in process: 87 ms of collections instead of 2.2 s, same peak RSS.
"""


def tune_gc() -> None:
    """Collect rarely (`GC_THRESHOLDS`), and never walk what is alive at startup (`gc.freeze`).

    Cyclic garbage is still collected, only in larger batches; reference
    counting frees everything else at once, as before.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def main(argv: Sequence[str] | None = None) -> None:
    """Serve a `BenchEngine` on a free loopback port until terminated (SIGTERM)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per request")
    parser.add_argument("--reply-tokens", type=int, default=24, help="final reply length")
    parser.add_argument(
        "--http2", action="store_true", help="serve HTTP/2 too (Hypercorn; default: Uvicorn)"
    )
    args = parser.parse_args(argv)
    engine = BenchEngine(
        SimulatorConfig(
            reply_tokens=args.reply_tokens,
            latency=args.latency,
            script=final_reply_script(args.reply_tokens),
            cache_max_blocks=1 << 22,
            max_recorded=64,
        )
    )
    app = SimulatorApp(engine)
    tune_gc()
    if args.http2:
        _serve_hypercorn(app)
    else:
        _serve_uvicorn(app)


def listening_socket() -> socket.socket:
    """A TCP socket listening on a free loopback port, whose connections send without delay.

    Made with `IPPROTO_TCP` named: asyncio turns Nagle's algorithm off
    (`TCP_NODELAY`) only on sockets whose protocol says TCP, and a socket
    made with protocol 0 does not, nor do the connections it accepts. With
    Nagle on, a response's second write (its body, after the headers) waited
    for the client's delayed ACK: 40 ms more per request.
    """
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(BACKLOG)
    return listener


def _serve_uvicorn(app: SimulatorApp) -> None:
    """HTTP/1.1 on asyncio; the socket is bound and listening before the URL is printed."""
    listener = listening_socket()
    host, port = listener.getsockname()
    config = uvicorn.Config(
        app,
        http="httptools",
        ws="none",
        loop="asyncio",
        lifespan="off",
        interface="asgi3",
        access_log=False,
        log_level="warning",
        server_header=False,
        # No proxy in front: X-Forwarded-* headers are not read (nor their middleware run).
        proxy_headers=False,
        backlog=BACKLOG,
    )
    print(f"http://{host}:{port}", flush=True)
    uvicorn.Server(config).run(sockets=[listener])


def _serve_hypercorn(app: SimulatorApp) -> None:
    """HTTP/1.1 and HTTP/2 (prior knowledge) on Trio."""
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = logging.getLogger("supervision.bench.simulator")
    config.backlog = BACKLOG
    # One HTTP/2 connection may carry every request of a run.
    config.h2_max_concurrent_streams = 100_000
    framework = cast(ASGIFramework, app)

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            binds: list[str] = await nursery.start(partial(hypercorn.trio.serve, framework, config))
            print(binds[0], flush=True)

    trio.run(serve)


if __name__ == "__main__":
    main()
