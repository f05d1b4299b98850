"""`harness watch`: a live terminal view of a running gateway, as a supervisor client.

It lists every session the token sees (status, agent, turn, usage, cache
hit ratio), follows the logs of the named sessions (or, without names, of
the `FOLLOW_NEWEST` most recently updated ones and of sessions added while
it runs), and shows the newest events. With `--json` it prints one JSON
object per line instead: `{"sessions": [...]}` first, then
`{"change": ...}` and `{"event": ..., "sessionId": ...}` as they arrive.
"""

from __future__ import annotations

import argparse
import os
import signal
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio
from rich.console import Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from supervision.commands.common import (
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
from supervision.commands.gateway_client import GatewayClient, open_gateway_client

FOLLOW_NEWEST = 8
"""Sessions followed when none is named."""
EVENT_LINES = 20
"""Events shown (the newest; the view says how many earlier ones it no longer shows)."""
REFRESH_SECONDS = 0.25
"""The fastest the view redraws."""
LIST_PAGE = 500


def register(commands: Commands) -> None:
    """Add `watch` to the `harness` parser."""
    watch = commands.add_parser(
        "watch", help="a live view of a running `harness serve`: sessions and the newest events"
    )
    watch.add_argument("sessions", nargs="*", metavar="SESSION", help="sessions to follow")
    watch.add_argument(
        "--url",
        type=websocket_url,
        default=None,
        help="gateway websocket (default: ws://HOST:PORT/acp of the config)",
    )
    watch.add_argument("--token", default=None, help="bearer token (default: $HARNESS_TOKEN)")
    add_config_options(watch, store=False)
    add_json_option(watch)
    watch.set_defaults(handler=watch_command)


@attrs.define(eq=False)
class _View:
    """What the view shows: the sessions and the newest events."""

    sessions: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    events: deque[tuple[str, dict[str, Any]]] = attrs.field(
        factory=lambda: deque(maxlen=EVENT_LINES)
    )
    seen: int = 0
    changed: trio.Event = attrs.field(factory=trio.Event)

    def touch(self) -> None:
        self.changed.set()

    def track(self, session_id: str, event: dict[str, Any]) -> None:
        self.seen += 1
        self.events.append((session_id, event))
        summary = self.sessions.setdefault(session_id, {"sessionId": session_id})
        summary["headSeq"] = event["seq"]
        if event["type"] == "turn/start":
            summary["turn"], summary["status"] = event["data"]["turn"], "running"
        elif event["type"] == "turn/end":
            summary["status"] = "idle"
        elif event["type"] == "assistant/message" and event["data"].get("usage"):
            u = event["data"]["usage"]
            usage = summary.setdefault(
                "usage", {"inputTokens": 0, "outputTokens": 0, "cacheReadTokens": 0}
            )
            usage["inputTokens"] += u["input_tokens"]
            usage["outputTokens"] += u["output_tokens"]
            usage["cacheReadTokens"] += u["cache_read_tokens"]
        self.touch()

    def render(self) -> Group:
        table = Table(
            "session",
            "agent",
            "status",
            "turn",
            "in",
            "out",
            "hit",
            "parent",
            title=f"{len(self.sessions)} session(s)",
            title_justify="left",
        )
        rows = sorted(self.sessions.values(), key=lambda s: s.get("updatedAt") or 0, reverse=True)
        for s in rows:
            usage = s.get("usage") or {}
            prompt = usage.get("inputTokens", 0)
            turn = s.get("turn")
            table.add_row(
                s["sessionId"],
                escape(str(s.get("agent") or "-")),
                escape(str(s.get("status") or "-")),
                "-" if turn is None or turn < 0 else str(turn),
                str(prompt),
                str(usage.get("outputTokens", 0)),
                f"{usage.get('cacheReadTokens', 0) / prompt:.1%}" if prompt else "-",
                s.get("parentSessionId") or "-",
            )
        earlier = self.seen - len(self.events)
        events = Table(
            "session",
            "seq",
            "type",
            "",
            title="newest events" + (f" ({earlier} earlier not shown)" if earlier else ""),
            title_justify="left",
        )
        for session_id, event in self.events:
            events.add_row(
                session_id[:8], str(event["seq"]), event["type"], escape(_describe(event))
            )
        return Group(table, events)


def _describe(event: dict[str, Any]) -> str:
    data = event["data"]
    kind = event["type"]
    if kind == "assistant/chunk":
        return str(data["chunk"].get("text", ""))
    if kind in ("user/message",):
        return "".join(b.get("text", "") for b in data["content"])
    if kind == "assistant/message":
        return "".join(b.get("text", "") for b in data["message"]["content"])
    if kind == "tool/call":
        return f"{data['name']}({data['arguments']})"
    if kind == "tool/result":
        return ("error: " if data["is_error"] else "") + str(data["content"])
    if kind == "turn/end":
        return str(data["reason"]["kind"])
    return ""


async def _list(client: GatewayClient) -> list[dict[str, Any]]:
    sessions: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": LIST_PAGE}
        if cursor:
            params["cursor"] = cursor
        page = await client.call("_harness/sessions/list", params)
        sessions.extend(page["sessions"])
        cursor = page.get("nextCursor")
        if not cursor:
            return sessions


async def follow(url: str, token: str, named: list[str], *, as_json: bool) -> bool:
    """Run the view until SIGINT/SIGTERM (returns True) or the gateway closes (returns False).

    The signals are caught from the start, so an interrupt while connecting
    also ends it cleanly.

    Raises:
        CommandError: the gateway is unreachable, refused the token, or does
            not know a named session.
    """
    stopped = False
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                nonlocal stopped
                async for _ in signals:
                    stopped = True
                    nursery.cancel_scope.cancel()

            nursery.start_soon(stop_on_signal)
            await _follow(url, token, named, as_json=as_json)
            nursery.cancel_scope.cancel()
    return stopped


async def _follow(url: str, token: str, named: list[str], *, as_json: bool) -> None:
    view = _View()
    async with open_gateway_client(url, token) as client:
        await client.call("_harness/sessions/watch", {})
        for summary in await _list(client):
            view.sessions[summary["sessionId"]] = summary
        for session_id in named:
            if session_id not in view.sessions:
                raise CommandError(
                    f"unknown session {session_id!r} at {url}; "
                    "`harness watch` without names lists the gateway's sessions"
                )
        newest = sorted(view.sessions.values(), key=lambda s: s.get("updatedAt") or 0)
        targets = named or [s["sessionId"] for s in newest[-FOLLOW_NEWEST:]]
        subscriptions: dict[str, str] = {}

        async def subscribe(session_id: str) -> None:
            head = view.sessions.get(session_id, {}).get("headSeq", -1)
            result = await client.call(
                "_harness/log/subscribe", {"sessionId": session_id, "fromSeq": max(0, head + 1)}
            )
            subscriptions[result["subscription"]] = session_id

        for session_id in targets:
            await subscribe(session_id)
        if as_json:
            print_json({"sessions": list(view.sessions.values())})
        async with trio.open_nursery() as nursery:
            if not as_json:
                nursery.start_soon(_draw, view)
            await _consume(client, view, named, subscriptions, subscribe, as_json=as_json)
            nursery.cancel_scope.cancel()


async def _consume(
    client: GatewayClient,
    view: _View,
    named: list[str],
    subscriptions: dict[str, str],
    subscribe: Callable[[str], Awaitable[None]],
    *,
    as_json: bool,
) -> None:
    """Apply notifications to the view until the connection ends."""
    async for message in client.notifications:
        method, params = message["method"], message.get("params", {})
        if method == "_harness/log/event" and params.get("subscription") in subscriptions:
            if as_json:
                print_json({"sessionId": params["sessionId"], "event": params["event"]})
            view.track(params["sessionId"], params["event"])
        elif method == "_harness/sessions/changed":
            session = params["session"]
            sid = session["sessionId"]
            if params["change"] == "removed":
                view.sessions.pop(sid, None)
            else:
                view.sessions[sid] = {**view.sessions.get(sid, {}), **session}
                if not named and sid not in subscriptions.values():
                    await subscribe(sid)
            if as_json:
                print_json({"change": params["change"], "session": session})
            view.touch()


async def _draw(view: _View) -> None:
    out = console()
    with Live(view.render(), console=out, auto_refresh=False, transient=False) as live:
        while True:
            await view.changed.wait()
            view.changed = trio.Event()
            live.update(view.render(), refresh=True)
            await trio.sleep(REFRESH_SECONDS)


def watch_command(args: argparse.Namespace) -> int:
    """`harness watch [--url ws://...] [SESSION...]`: runs until Ctrl-C (then exits 0)."""
    config = config_of(args)
    token = args.token or os.environ.get("HARNESS_TOKEN")
    if not token:
        raise CommandError(
            "no gateway token: pass --token or set HARNESS_TOKEN (`harness serve` prints one)",
            EXIT_USAGE,
        )
    url = args.url or f"ws://{config.gateway.host}:{config.gateway.port}/acp"
    if trio.run(lambda: follow(url, token, list(args.sessions), as_json=args.json)):
        return EXIT_OK
    raise CommandError(f"the gateway at {url} closed the connection")
