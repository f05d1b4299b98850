"""Commands that run an agent of the deployment in this process: `run`, `inspect`.

They start the deployment the config describes (its secrets are read first,
so a missing key fails before anything starts) over the store, then drive
one agent through the library.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import trio
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from actors.agent import Agent
from actors.providers.chunks import ReasoningDelta, TextDelta
from actors.session import Event, SessionBusyError, event_to_json
from actors.session.events import (
    AssistantChunk,
    AssistantMessage,
    ToolCallRequested,
    ToolResult,
    TurnEnd,
    TurnEndReason,
)
from supervision.commands.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    Commands,
    add_config_options,
    add_json_option,
    config_of,
    console,
    print_json,
    websocket_url,
)
from supervision.commands.gateway_client import open_gateway_client
from supervision.config import DEFAULT_AGENT
from supervision.deployment import Deployment, open_deployment
from supervision.gateway.harness_methods import inspection_json
from supervision.supervisor import ChildStartError


def register(commands: Commands) -> None:
    """Add `run` and `inspect` to the `harness` parser."""
    run = commands.add_parser(
        "run",
        help="run one turn: the reply streams as it arrives, tool calls show as they happen",
    )
    run.add_argument("prompt", help="the user message")
    run.add_argument("--agent", default=DEFAULT_AGENT, help="agent profile (default: default)")
    run.add_argument("--session", default=None, help="continue this stored session")
    add_config_options(run)
    add_json_option(run)
    run.set_defaults(handler=run_command)

    inspect = commands.add_parser(
        "inspect",
        help="what the session's next step would send (sections with their scope, tools, "
        "contexts), as a dry run",
    )
    inspect.add_argument("session", help="session id")
    inspect.add_argument(
        "--agent", default=DEFAULT_AGENT, help="the profile to open it with (default: default)"
    )
    inspect.add_argument(
        "--url",
        type=websocket_url,
        default=None,
        help="ask this running gateway (ws://HOST:PORT/acp) instead",
    )
    inspect.add_argument("--token", default=None, help="gateway token (default: $HARNESS_TOKEN)")
    add_config_options(inspect)
    add_json_option(inspect)
    inspect.set_defaults(handler=inspect_command)


async def start(
    deployment: Deployment, profile: str, session_id: str | None, *, must_exist: bool = False
) -> Agent:
    """Start an agent of `profile` (resuming `session_id`, which must exist).

    Raises:
        CommandError: the session does not exist or could not be opened.
    """
    store = deployment.runtime.store
    if (session_id is not None or must_exist) and not await store.exists(session_id or ""):
        raise CommandError(
            f"unknown session {session_id!r}; `harness sessions` lists the stored ones "
            "(omit --session to start a new one)"
        )
    try:
        child = await deployment.start_agent(profile, session_id=session_id)
    except ChildStartError as exc:
        cause = exc.__cause__ or exc
        hint = (
            "; while a `harness serve` runs it, talk to it through its gateway "
            "(the dashboard, `harness watch`, `harness inspect --url`)"
            if isinstance(cause, SessionBusyError)
            else ""
        )
        raise CommandError(
            f"cannot start an agent for session {session_id!r}: {cause}{hint}"
        ) from None
    return child.value


def reason_line(reason: TurnEndReason) -> str:
    """A turn end as one line: `error: <message>`, `aborted (user)`, `completed`."""
    if reason.error is not None:
        return f"error: {reason.error.message} (code {reason.error.code})"
    if reason.reason is not None:
        return f"aborted ({reason.reason.kind})"
    return reason.kind


class _Printer:
    """Renders a turn's events as they arrive: text deltas inline, tool calls on their own lines."""

    def __init__(self, out: Console) -> None:
        self.out = out
        self.mid_line = False
        self.names: dict[str, str] = {}

    def newline(self) -> None:
        if self.mid_line:
            sys.stdout.write("\n")
            sys.stdout.flush()
            self.mid_line = False

    def event(self, event: Event) -> None:
        data = event.data
        if isinstance(data, AssistantChunk):
            chunk = data.chunk
            if isinstance(chunk, TextDelta) and chunk.text:
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
                self.mid_line = True
            elif isinstance(chunk, ReasoningDelta) and chunk.text:
                sys.stderr.write(chunk.text)
                sys.stderr.flush()
        elif isinstance(data, ToolCallRequested):
            self.newline()
            self.names[data.call_id] = data.name
            self.out.print(f"[cyan]→ {escape(data.name)}[/cyan]({escape(data.arguments)})")
        elif isinstance(data, ToolResult):
            flag = "[red]error[/red] " if data.is_error else ""
            name = escape(self.names.get(data.call_id, data.call_id))
            self.out.print(f"[cyan]← {name}[/cyan] {flag}{escape(data.content)}")


async def run_turn(
    agent: Agent, prompt: str, *, stream: _Printer | None
) -> tuple[int, TurnEndReason, list[Event]]:
    """Send `prompt` as a follow-up and follow the log until that turn ends.

    Returns the turn number, its end reason and the events of the turn.
    """
    turn = agent.session.next_turn()
    events: list[Event] = []
    async with agent.session.watch() as watched:
        agent.followup(prompt)
        async for event in watched:
            events.append(event)
            if stream is not None:
                stream.event(event)
            data = event.data
            if isinstance(data, TurnEnd) and data.turn == turn:
                if stream is not None:
                    stream.newline()
                return turn, data.reason, events
    raise CommandError(f"session {agent.session.id!r}: the log ended before turn {turn} did")


def run_command(args: argparse.Namespace) -> int:
    """`harness run PROMPT [--agent NAME] [--session ID]`."""
    config = config_of(args)
    out = console()

    async def main() -> tuple[str, int, TurnEndReason, list[Event]]:
        async with open_deployment(config, store_path=args.store) as deployment:
            agent = await start(deployment, args.agent, args.session)
            if not args.json:
                out.print(f"[dim]session {agent.session.id} ({args.agent})[/dim]")
            printer = None if args.json else _Printer(out)
            turn, reason, events = await run_turn(agent, args.prompt, stream=printer)
            return agent.session.id, turn, reason, events

    session_id, turn, reason, events = trio.run(main)
    if args.json:
        print_json(turn_result(session_id, turn, reason, events))
    if reason.kind in ("completed", "max-tokens"):
        return EXIT_OK
    print(
        f"harness: turn {turn} of session {session_id} ended {reason_line(reason)}", file=sys.stderr
    )
    return EXIT_FAILED


def inspect_command(args: argparse.Namespace) -> int:
    """`harness inspect SESSION`: dry-runs the next step of the session.

    Without `--url` it opens the session from the store with its profile (so
    it must not be held by a running `harness serve`); with `--url` it asks
    that gateway (`session/resume`, then `_harness/prompt/inspect`).
    """
    config = config_of(args)

    async def local() -> dict[str, Any]:
        async with open_deployment(config, store_path=args.store) as deployment:
            agent = await start(deployment, args.agent, args.session, must_exist=True)
            return inspection_json(await agent.inspect_next_step())

    async def remote(url: str, token: str) -> dict[str, Any]:
        async with open_gateway_client(url, token) as client:
            await client.call("session/resume", {"sessionId": args.session, "cwd": "/"})
            result: dict[str, Any] = await client.call(
                "_harness/prompt/inspect", {"sessionId": args.session}
            )
            return result

    if args.url is None:
        result = trio.run(local)
    else:
        token = args.token or os.environ.get("HARNESS_TOKEN")
        if not token:
            raise CommandError("no gateway token: pass --token or set HARNESS_TOKEN", EXIT_USAGE)
        result = trio.run(remote, args.url, token)
    if args.json:
        print_json(result)
        return EXIT_OK
    render_inspection(args.session, result)
    return EXIT_OK


def render_inspection(session_id: str, result: dict[str, Any]) -> None:
    """Print an inspection (the `_harness/prompt/inspect` shape) as tables."""
    out = console()
    changed = "a new request/header" if result["headerChanged"] else "the logged header"
    out.print(f"next step of session {session_id} sends {changed}")
    table = Table("order", "section", "scope", "shadows", "bytes", "sha256")
    for section in result["sections"]:
        order = section.get("order")
        table.add_row(
            "-" if order is None else f"{order:g}",
            escape(section["name"]) + (" (complete)" if section.get("complete") else ""),
            escape(section["scope"]),
            escape(", ".join(section.get("shadows", []))) or "-",
            str(section["bytes"]),
            section["sha256"][:12],
        )
    out.print(table)
    tools = Table("#", "tool", "scope")
    for index, tool in enumerate(result["tools"]):
        tools.add_row(str(index), escape(tool["name"]), escape(tool["scope"]))
    out.print(tools)
    for context in result["contexts"]:
        out.print(f"[bold]context {escape(context['name'])}[/bold] ({escape(context['scope'])})")
        out.print(escape(context["text"]))
    variables = ", ".join(f"{k}={v!r}" for k, v in result.get("variables", {}).items())
    out.print(f"variables: {escape(variables)}")


def turn_result(
    session_id: str, turn: int, reason: TurnEndReason, events: list[Event]
) -> dict[str, Any]:
    """`{sessionId, turn, reason, text, usage, events}` of a finished turn."""
    text = ""
    usage = {"inputTokens": 0, "outputTokens": 0, "cacheReadTokens": 0}
    for event in events:
        data = event.data
        if isinstance(data, AssistantMessage):
            if data.message.text:
                text = data.message.text
            if data.usage is not None:
                usage["inputTokens"] += data.usage.input_tokens
                usage["outputTokens"] += data.usage.output_tokens
                usage["cacheReadTokens"] += data.usage.cache_read_tokens
    end = event_to_json(events[-1])["data"]["reason"]
    return {
        "sessionId": session_id,
        "turn": turn,
        "reason": end,
        "text": text,
        "usage": usage,
        "events": [event_to_json(e) for e in events],
    }
