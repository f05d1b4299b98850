"""`harness demo`: one agent, five turns with tool calls, and the cache figures that matter.

Against the bundled simulator (no API key needed) or, with `DEEPSEEK_API_KEY`
set, against DeepSeek itself. Prints one row per model request (turn/step,
whether a header was logged, prompt tokens, cache-hit tokens, hit ratio),
then a summary: the overall hit ratio against the physical limit (only
tokens appended since the previous request can miss) and a check that
`rebuild_request` reproduces every request byte for byte from the stored log.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from actors.agent import AgentOptions, Tool, open_agent
from actors.context import Policies, TimeContext
from actors.prompt import PromptSection, SystemPrompt
from actors.providers import Chunk, GenerateRequest, Provider
from actors.providers.actor import ProviderActor
from actors.providers.openai_compat import OpenAICompatProvider
from actors.providers.simulator import SimulatorEngine, serve_simulator, tokenize
from actors.session import Event, SQLiteStore, rebuild_request, request_attempts
from actors.session.events import (
    AssistantMessage,
    RequestHeaderLogged,
    StepStart,
    ToolResult,
    TurnEnd,
    UserMessage,
)

DEEPSEEK_BASE_URL = "https://api.deepseek.com"
DEMO_MODEL = "deepseek-chat"
DEFAULT_STORE = Path(".harness") / "demo.sqlite"

PERSONA = (
    "You are a careful assistant powered by {{model}}. Use the tools when a request names "
    "them, then answer in one short paragraph."
)
GUIDANCE = (
    "Tool habits: read_file returns the whole file, so read each file once; add returns the "
    "exact sum, so never do arithmetic yourself. Quote tool results exactly when citing them. "
) * 6

TURNS = (
    'Please read the project notes.\ncall read_file {"path": "notes.txt"}',
    'Add the two budget figures.\ncall add {"a": 1200, "b": 345}',
    'Read the changelog and the plan.\ncall read_file {"path": "CHANGELOG.md"}\n'
    'call read_file {"path": "PLAN.md"}',
    'The sandbox is now read-only. Sum the remaining items.\ncall add {"a": 7, "b": 35}',
    'Read the notes once more and summarise.\ncall read_file {"path": "notes.txt"}',
)

FILES = {
    "notes.txt": "The harness keeps the prompt prefix byte-stable across steps.",
    "CHANGELOG.md": "0.1.0: registry, session log, agent loop, providers.",
    "PLAN.md": "1. supervision trees  2. context plugins  3. gateway",
}


async def _read_file(arguments: dict[str, Any] | str, call: object) -> str:
    if not isinstance(arguments, dict) or not isinstance(arguments.get("path"), str):
        raise ValueError(f"read_file needs a string 'path', got {arguments!r}")
    path = arguments["path"]
    if path not in FILES:
        raise FileNotFoundError(f"no such file: {path}; files: {', '.join(FILES)}")
    return FILES[path]


async def _add(arguments: dict[str, Any] | str, call: object) -> str:
    if not isinstance(arguments, dict):
        raise ValueError(f"add needs an object with numbers a and b, got {arguments!r}")
    return str(arguments["a"] + arguments["b"])


DEMO_TOOLS = (
    Tool(
        name="read_file",
        description="Read a text file from the workspace and return its contents.",
        parameters={
            "type": "object",
            "properties": {"path": {"type": "string", "description": "Workspace path."}},
            "required": ["path"],
        },
        execute=_read_file,
    ),
    Tool(
        name="add",
        description="Add two numbers and return the exact sum.",
        parameters={
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
        execute=_add,
    ),
)


@attrs.define(eq=False)
class RecordingProvider:
    """Wraps a provider and keeps every request it was sent, in order."""

    inner: Provider
    requests: list[GenerateRequest] = attrs.field(factory=list)

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
        """Record `request`, then stream the inner provider's chunks (closing it on early exit)."""
        self.requests.append(request)
        async with aclosing(self.inner.stream(request)) as chunks:
            async for chunk in chunks:
                yield chunk


@attrs.frozen(kw_only=True)
class RequestRow:
    """One model request as the demo reports it."""

    turn: int
    step: int
    header: str
    prompt_tokens: int
    cached_tokens: int
    appended_tokens: int


@attrs.frozen(kw_only=True)
class DemoReport:
    """What the demo measured."""

    rows: tuple[RequestRow, ...]
    hit_ratio: float
    physical_limit: float
    rebuilt: int
    requests: int
    store_path: str
    failure: str | None = None
    """Why the demo failed (the first turn that did not complete), or None."""

    @property
    def rebuilt_all(self) -> bool:
        """True when every request was reproduced byte for byte."""
        return self.rebuilt == self.requests

    @property
    def ok(self) -> bool:
        """True when every turn completed and every request was rebuilt byte for byte."""
        return self.failure is None and self.rebuilt_all


def physical_limit(rows: tuple[RequestRow, ...]) -> float:
    """The best possible hit ratio: tokens appended since the previous request must miss.

    The first request is all new. `appended_tokens` counts only the text of
    the new messages (not their envelopes), so this is an upper bound.
    """
    total = sum(row.prompt_tokens for row in rows)
    if total == 0:
        return 0.0
    reusable = sum(max(0, row.prompt_tokens - row.appended_tokens) for row in rows[1:])
    return reusable / total


def turn_failure(events: Sequence[Event]) -> str | None:
    """Why the last turn of `events` failed (its `turn/end` reason), or None if it answered.

    A turn that ended `completed` or `max-tokens` answered; `error`,
    `blocked`, `aborted` and `interrupted` did not.
    """
    for event in reversed(events):
        data = event.data
        if isinstance(data, TurnEnd):
            turn, reason = data.turn, data.reason
            if reason.kind in ("completed", "max-tokens"):
                return None
            if reason.error is not None:
                error = reason.error
                status = f", HTTP {error.status}" if error.status is not None else ""
                return f"turn {turn} failed ({error.code}{status}): {error.message}"
            return f"turn {turn} ended {reason.kind}"
    return "no turn ended"


def _dump(request: GenerateRequest) -> str:
    return json.dumps(request.to_json(), separators=(",", ":"), ensure_ascii=False)


@attrs.define
class _RowReporter:
    """Turns logged events into request rows, printing each row as it is found."""

    out: Callable[[str], None]
    rows: list[RequestRow] = attrs.field(factory=list)
    seen: int = 0
    """How many events of the log were read so far."""
    _header_reason: str = "-"
    _appended: int = 0

    def heading(self) -> None:
        """Print the table's heading."""
        self.out(f"{'turn/step':>9}  {'header':<8} {'prompt':>7} {'cached':>7} {'hit':>6}")

    def feed(self, events: Sequence[Event]) -> None:
        """Read `events`, the log's next ones after `seen`; a row per model answer."""
        for event in events:
            data = event.data
            if isinstance(data, StepStart):
                self._header_reason = "-"
            elif isinstance(data, RequestHeaderLogged):
                self._header_reason = data.reason
            elif isinstance(data, UserMessage | ToolResult):
                self._appended += len(tokenize(data.to_message().text))
            elif isinstance(data, AssistantMessage) and data.usage is not None:
                usage = data.usage
                row = RequestRow(
                    turn=data.turn,
                    step=data.step,
                    header=self._header_reason,
                    prompt_tokens=usage.input_tokens,
                    cached_tokens=usage.cache_read_tokens,
                    appended_tokens=usage.input_tokens if not self.rows else self._appended,
                )
                self.rows.append(row)
                self._appended = 0
                ratio = row.cached_tokens / row.prompt_tokens if row.prompt_tokens else 0.0
                self.out(
                    f"{row.turn:>5}/{row.step:<3}  {row.header:<8} {row.prompt_tokens:>7} "
                    f"{row.cached_tokens:>7} {ratio:>6.1%}"
                )
            self.seen = event.seq + 1


async def run_demo(
    *,
    store_path: Path = DEFAULT_STORE,
    api_key: str | None = None,
    base_url: str | None = None,
    out: Callable[[str], None] = print,
    model: str = DEMO_MODEL,
    max_tokens: int | None = None,
    temperature: float | None = None,
) -> DemoReport:
    """Run the demo and return what it measured.

    With `base_url` the agent talks to that OpenAI-compatible server (with
    `api_key`, if any); else with `api_key` to DeepSeek; else to a simulator
    started in-process on an ephemeral loopback port. `model`, `max_tokens`
    and `temperature` go into every request. The session is stored in SQLite
    at `store_path` (a fresh session each run). The first turn that does not
    complete (a refused key, no route to the API, retries exhausted) stops
    the demo: the report's `failure` says why, and the summary ends with
    `FAILED` instead of `OK`.

    Cancellation: cancelling stops the agent (its live turn ends aborted)
    and the simulator; committed events stay in the store.
    """
    store_path.parent.mkdir(parents=True, exist_ok=True)
    async with trio.open_nursery() as nursery:
        if base_url is not None:
            url, key = base_url, api_key
            out(f"using the model server at {url}")
        elif api_key is None:
            engine = SimulatorEngine()
            url = await nursery.start(serve_simulator, engine)
            key = engine.config.api_key
            out(f"simulator listening on {url}")
        else:
            url, key = DEEPSEEK_BASE_URL, api_key
            out(f"using the DeepSeek API at {url}")
        recorder: list[RecordingProvider] = []

        def factory(client: httpx.AsyncClient) -> Provider:
            recorder.append(
                RecordingProvider(OpenAICompatProvider(client, base_url=url, api_key=key))
            )
            return recorder[-1]

        actor = ProviderActor(name="deepseek", factory=factory, max_in_flight=4)
        await nursery.start(actor.serve)
        store = SQLiteStore(store_path)
        await nursery.start(store.serve)

        prompt = SystemPrompt(persona=PERSONA)
        prompt.section(PromptSection(name="tool:guidance", order=100, text=GUIDANCE))
        policies = Policies()
        policies.install(prompt)
        reporter = _RowReporter(out)
        failure: str | None = None
        options = AgentOptions(
            model=model, provider_name="deepseek", max_tokens=max_tokens, temperature=temperature
        )
        async with open_agent(
            system_prompt=prompt, provider=actor, options=options, store=store, tools=DEMO_TOOLS
        ) as agent:
            TimeContext().install(agent)
            out(f"session {agent.session.id} stored in {store_path}")
            reporter.heading()
            for index, text in enumerate(TURNS):
                if index == 3:
                    policies.set_sandbox("read-only")
                agent.followup(text)
                await agent.when_idle()
                # Rows come from the log as it stands after each turn: every request the
                # turn made is in it (a live watch would see only what is durable yet).
                reporter.feed(agent.session.events_since(reporter.seen))
                failure = turn_failure(agent.session.events)
                if failure is not None:
                    out(f"{failure}; stopping")
                    break
            session_id = agent.session.id
        await store.flush()
        stored = await store.load(session_id)
        nursery.cancel_scope.cancel()

    sent = recorder[0].requests if recorder else []
    log = list(stored)
    rebuilt = 0
    for (turn, step, attempt), request in zip(request_attempts(log), sent, strict=False):
        if _dump(rebuild_request(log, turn, step, attempt)) == _dump(request):
            rebuilt += 1
    frozen_rows = tuple(reporter.rows)
    prompt_total = sum(row.prompt_tokens for row in frozen_rows)
    cached_total = sum(row.cached_tokens for row in frozen_rows)
    report = DemoReport(
        rows=frozen_rows,
        hit_ratio=cached_total / prompt_total if prompt_total else 0.0,
        physical_limit=physical_limit(frozen_rows),
        rebuilt=rebuilt,
        requests=len(sent),
        store_path=str(store_path),
        failure=failure,
    )
    out(
        f"overall cache hit ratio {report.hit_ratio:.1%} "
        f"(physical limit {report.physical_limit:.1%}: only newly appended tokens can miss)"
    )
    out(
        f"rebuild_request reproduced {report.rebuilt}/{report.requests} requests byte for byte "
        f"from the stored log: {'OK' if report.rebuilt_all else 'MISMATCH'}"
    )
    out("OK" if report.ok else f"FAILED: {report.failure or 'a request was not rebuilt'}")
    return report


def demo_api_key() -> str | None:
    """The DeepSeek key from the environment, if set and non-empty."""
    return os.environ.get("DEEPSEEK_API_KEY") or None
