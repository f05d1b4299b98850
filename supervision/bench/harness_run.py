"""One level of the parallel-session benchmark, run by harness in this process.

`run_level` opens a runtime (`open_runtime`) with one `ProviderActor` over
real HTTP to the benchmark simulator, starts N agents, runs one two-step
turn on every one of them at once, and measures: wall time, this process's
CPU per step, each turn's time outside the provider call (the harness's
overhead: assembly, logging, the tool run, scheduling), RSS per idle
session once every turn has ended, and one more turn on an idle session
against a single session's turn. A sequential pass (one turn at a time)
gives the CPU per step without concurrency.
"""

from __future__ import annotations

import gc
import random
import resource
import statistics
import tempfile
import time
from array import array
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from pathlib import Path
from typing import Any, Literal

import attrs
import httpx
import trio

from actors.agent import Agent, AgentOptions, Tool
from actors.context import TimeContext
from actors.messages import TextBlock
from actors.prompt import PromptSection, SystemPrompt
from actors.providers import Chunk, FinishChunk, GenerateRequest
from actors.providers.actor import ProviderActor
from actors.providers.base import ChunkBatch, unbatched
from actors.providers.openai_compat import OpenAICompatProvider, StreamTimeouts
from actors.session import MemoryStore, SessionStore, SQLiteStore
from actors.session.events import TurnEnd
from supervision.awake import TRIM_QUIET_SECONDS
from supervision.bench.workload import (
    API_KEY,
    MODEL,
    echo,
    system_paragraphs,
    tool_definitions,
    user_message,
)
from supervision.runtime import Runtime, open_runtime

StoreKind = Literal["memory", "sqlite"]
_TIMEOUTS = StreamTimeouts(connect=120.0, read_idle=120.0, deadline=600.0)
"""Generous clocks: a burst of N requests queues at the one-process simulator, and on a
loaded machine a timeout (then a retry) would measure the clock, not the runtime."""
_FAILURE_SAMPLES = 5
"""How many failed attempts' messages a level keeps (to say why, not just how many)."""
ProgressHook = Callable[[int], None]
"""Called with the number of steps just completed (1 each time)."""


@attrs.frozen(kw_only=True)
class LevelSettings:
    """How one level runs.

    Attributes:
        sessions: How many sessions run their turn at once.
        store: Where the logs go: `memory` (MemoryStore) or `sqlite` (a
            temporary SQLiteStore file).
        http2: Talk HTTP/2 to the simulator.
        pools: Connection pools in the provider actor's client.
        max_in_flight: The provider actor's cap on requests in flight
            (None: one per session, at most 1,000).
        sequential_turns: Turns run one at a time after the concurrent pass.
        hibernate: Agents hibernate when idle (`AgentOptions.hibernate`).
        max_awake: The runtime's bound on agents awake at once
            (`open_runtime(max_awake=...)`; None: as many as requests in
            flight; 0: no bound).
        trim_memory: The runtime gives freed memory back after the burst
            (`open_runtime(trim_memory=...)`).
    """

    sessions: int
    store: StoreKind = "memory"
    http2: bool = False
    pools: int = 1
    max_in_flight: int | None = None
    sequential_turns: int = 50
    hibernate: bool = True
    max_awake: int | None = None
    trim_memory: bool = True


@attrs.frozen(kw_only=True)
class LevelResult:
    """What one level measured (times in seconds unless named otherwise).

    `request_failures` counts failed provider attempts by failure code
    (each was retried by the agent's retry policy, or failed its turn);
    `failure_samples` holds the messages of the first few of them.
    """

    framework: str
    sessions: int
    steps: int
    failed_turns: int
    wall_s: float
    cpu_ms_per_step: float
    steps_per_s: float
    overhead_ms_p50: float
    overhead_ms_p99: float
    rss_kb_per_idle_session: float
    rss_mb_total: float
    sequential_cpu_ms_per_step: float
    single_turn_s: float
    idle_session_turn_s: float
    request_failures: dict[str, int]
    failure_samples: list[str]
    settings: dict[str, Any]
    allocator_trims: int = 0
    """How many times the runtime gave freed memory back before RSS was read."""


def _tools() -> list[Tool]:
    async def run_echo(arguments: dict[str, Any] | str, call: object) -> str:
        if not isinstance(arguments, dict):
            raise ValueError(f"echo needs a JSON object, got {arguments!r}")
        return echo(str(arguments.get("text", "")))

    async def unused(arguments: dict[str, Any] | str, call: object) -> str:
        raise ValueError("this benchmark only calls echo")

    return [
        Tool(
            name=tool["name"],
            description=tool["description"],
            parameters=tool["parameters"],
            execute=run_echo if tool["name"] == "echo" else unused,
        )
        for tool in tool_definitions()
    ]


def _prompt() -> SystemPrompt:
    prompt = SystemPrompt(include_harness_identity=False)
    for index, paragraph in enumerate(system_paragraphs()):
        prompt.section(PromptSection(name=f"guide:{index}", order=100 + index, text=paragraph))
    return prompt


def rss_kb() -> int:
    """This process's resident set size now, in KB (Linux `/proc/self/statm`)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() // 1024


class _TimedProvider:
    """The provider actor, with the time each session spent inside provider calls.

    Requests are attributed to a session by their first user message (each
    session's is distinct): the sessions of `expect` into a preallocated
    array, any other into `waited`.
    """

    def __init__(self, actor: ProviderActor, on_step: ProgressHook | None) -> None:
        self.actor = actor
        self.waited: dict[str, float] = {}
        self.expected_waits: array[float] = array("d")
        self._expected: dict[str, int] = {}
        self.failures: dict[str, int] = {}
        self.samples: list[str] = []
        self._on_step = on_step

    def expect(self, texts: Sequence[str]) -> None:
        """Time the requests of the sessions whose first user messages are `texts`, from zero.

        Session `i`'s time goes to `expected_waits[i]`, allocated here, so
        timing a burst allocates nothing that outlives it (the benchmark
        reads RSS after the burst: its own records must not be in it).
        """
        self._expected = {text: index for index, text in enumerate(texts)}
        self.expected_waits = array("d", bytes(8 * len(texts)))

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve the wrapped actor."""
        await self.actor.serve(task_status=task_status)

    def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
        """The actor's stream, timed from the call to its finish chunk."""
        return unbatched(self.stream_batches(request))

    async def stream_batches(self, request: GenerateRequest) -> AsyncGenerator[ChunkBatch, None]:
        """The actor's batches, timed from the call to the batch with the finish chunk."""
        key = _first_user_text(request)
        started = trio.current_time()
        async with aclosing(self.actor.stream_batches(request)) as batches:
            async for batch in batches:
                finish = batch[-1]
                if isinstance(finish, FinishChunk):
                    if finish.failure is not None:
                        code = finish.failure.code
                        self.failures[code] = self.failures.get(code, 0) + 1
                        if len(self.samples) < _FAILURE_SAMPLES:
                            self.samples.append(f"{code}: {finish.failure.message}")
                    elapsed = trio.current_time() - started
                    slot = self._expected.get(key)
                    if slot is None:
                        self.waited[key] = self.waited.get(key, 0.0) + elapsed
                    else:
                        self.expected_waits[slot] += elapsed
                    if self._on_step is not None:
                        self._on_step(1)
                yield batch


def _first_user_text(request: GenerateRequest) -> str:
    for message in request.messages:
        if message.role == "user":
            for block in message.content:
                if isinstance(block, TextBlock):
                    return block.text
    return ""


async def _turns_failed(agent: Agent) -> int:
    """How many of the agent's turns did not complete (its session woken to read them)."""
    await agent.session.wake()
    ends = [e.data for e in agent.session.events if isinstance(e.data, TurnEnd)]
    return sum(end.reason.kind != "completed" for end in ends)


async def _one_turn(agent: Agent, text: str) -> float:
    started = trio.current_time()
    agent.followup(text)
    await agent.when_idle()
    return trio.current_time() - started


async def run_level(
    url: str, settings: LevelSettings, *, on_step: ProgressHook | None = None
) -> LevelResult:
    """Run one level against the simulator at `url` and measure it.

    Cancellation: cancelling stops the runtime (every live turn aborts).

    Raises:
        RuntimeError: a session did not complete its turn.
    """
    sessions = settings.sessions
    in_flight = settings.max_in_flight or min(sessions, 1000)
    actor = ProviderActor(
        name="sim",
        factory=lambda client: OpenAICompatProvider(
            client, base_url=url, api_key=API_KEY, timeouts=_TIMEOUTS
        ),
        timeout=httpx.Timeout(120.0, connect=60.0),
        limits=httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight),
        http2=settings.http2,
        pools=settings.pools,
        max_in_flight=in_flight,
    )
    provider = _TimedProvider(actor, on_step)
    tools = _tools()
    options = AgentOptions(model=MODEL, provider_name="sim", hibernate=settings.hibernate)
    time_context = TimeContext(timezone="UTC")
    with tempfile.TemporaryDirectory() as directory:
        store: SessionStore = (
            MemoryStore()
            if settings.store == "memory"
            else SQLiteStore(Path(directory) / "bench.sqlite")
        )
        max_awake = in_flight if settings.max_awake is None else settings.max_awake
        async with open_runtime(
            system_prompt=_prompt(),
            store=store,
            providers={"sim": provider},
            max_awake=max_awake or None,
            trim_memory=settings.trim_memory,
        ) as runtime:

            async def start() -> Agent:
                child = await runtime.start_agent(
                    options=options, tools=tools, setup=lambda agent: _install(time_context, agent)
                )
                return child.value

            # Warm up (connections, caches, code paths); its turn is the single-session latency.
            warm = await start()
            await _one_turn(warm, user_message(-1))
            single = await _one_turn(warm, user_message(-2))
            result = await _measure(runtime, provider, start, settings, single)
    return result


def _install(time_context: TimeContext, agent: Agent) -> None:
    time_context.install(agent)


async def _measure(
    runtime: Runtime,
    provider: _TimedProvider,
    start: Callable[[], Any],
    settings: LevelSettings,
    single: float,
) -> LevelResult:
    sessions = settings.sessions
    provider.failures.clear()
    provider.samples.clear()
    # The benchmark's own records of the burst exist before it (and before RSS is first
    # read): the user messages, and preallocated arrays of each session's times.
    texts = [user_message(index) for index in range(sessions)]
    turn_times = array("d", bytes(8 * sessions))
    provider.expect(texts)
    gc.collect()
    rss_before = rss_kb()
    agents: list[Agent] = [await start() for _ in range(sessions)]

    async def turn(index: int) -> None:
        turn_times[index] = await _one_turn(agents[index], texts[index])

    cpu, wall = time.process_time(), time.perf_counter()
    async with trio.open_nursery() as nursery:
        for index in range(sessions):
            nursery.start_soon(turn, index)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    steps = 2 * sessions
    gc.collect()
    # Idle sessions are measured idle: after the runtime's trim of what the burst freed.
    await trio.sleep(TRIM_QUIET_SECONDS + 1.0)
    rss_after = rss_kb()
    # Computed after RSS is read: these floats are the benchmark's, not the sessions'.
    overheads = sorted(
        max(0.0, (elapsed - waited) / 2)
        for elapsed, waited in zip(turn_times, provider.expected_waits, strict=True)
    )
    trims = runtime.statistics().awake.trims
    # A turn on an idle session among all the others.
    probe = random.Random(12).randrange(sessions)
    idle_turn = await _one_turn(agents[probe], user_message(sessions + probe))
    sequential = await _sequential(agents, settings.sequential_turns, sessions)
    failed = 0
    for agent in agents:
        failed += await _turns_failed(agent)
    await runtime.store.flush()
    return LevelResult(
        framework="harness",
        sessions=sessions,
        steps=steps,
        failed_turns=failed,
        wall_s=wall,
        cpu_ms_per_step=cpu / steps * 1e3,
        steps_per_s=steps / wall,
        overhead_ms_p50=_percentile(overheads, 0.50) * 1e3,
        overhead_ms_p99=_percentile(overheads, 0.99) * 1e3,
        rss_kb_per_idle_session=(rss_after - rss_before) / sessions,
        rss_mb_total=rss_after / 1024,
        sequential_cpu_ms_per_step=sequential,
        single_turn_s=single,
        idle_session_turn_s=idle_turn,
        request_failures=dict(provider.failures),
        failure_samples=list(provider.samples),
        settings=attrs.asdict(settings),
        allocator_trims=trims,
    )


async def _sequential(agents: list[Agent], turns: int, offset: int) -> float:
    """CPU ms per step of `turns` turns run one at a time (0 when `turns` is 0)."""
    if turns < 1:
        return 0.0
    cpu = time.process_time()
    for index in range(turns):
        agent = agents[index % len(agents)]
        await _one_turn(agent, user_message(2 * offset + index))
    return (time.process_time() - cpu) / (2 * turns) * 1e3


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[max(0, round(q * 100) - 1)]
