"""Commands that read the session store: `sessions`, `show`, `replay`, `cache`.

They only read: the store may be in use by a running `harness serve` at the
same time (SQLite readers never block its writer).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import trio
from rich.markup import escape
from rich.table import Table

from actors.session import SessionError, rebuild_request
from supervision.cache_report import cache_report
from supervision.commands.common import (
    EXIT_OK,
    CommandError,
    Commands,
    add_config_options,
    add_json_option,
    console,
    existing_store,
    load_session,
    print_json,
)


def register(commands: Commands) -> None:
    """Add `sessions`, `show`, `replay` and `cache` to the `harness` parser."""
    sessions = commands.add_parser(
        "sessions", help="list the stored sessions with their turns, usage and cache hit ratio"
    )
    add_config_options(sessions)
    add_json_option(sessions)
    sessions.set_defaults(handler=sessions_command)

    show = commands.add_parser(
        "show", help="a session's conversation, turn by turn, with per-request cache figures"
    )
    show.add_argument("session", help="session id")
    add_config_options(show)
    add_json_option(show)
    show.set_defaults(handler=show_command)

    replay = commands.add_parser(
        "replay", help="the exact request of one step, rebuilt from the log, as JSON"
    )
    replay.add_argument("session", help="session id")
    replay.add_argument("--turn", type=int, required=True, help="turn number (from 0)")
    replay.add_argument("--step", type=int, required=True, help="step number within the turn")
    replay.add_argument(
        "--attempt", type=int, default=-1, help="attempt of the step (from 0; -1: the last)"
    )
    add_config_options(replay)
    replay.add_argument(
        "--json", action="store_true", help="print {request, sha256} as one compact line"
    )
    replay.set_defaults(handler=replay_command)

    cache = commands.add_parser(
        "cache",
        help="per request: prompt and cache-hit tokens, and where and in which lane its "
        "bytes first differ from the previous request's",
    )
    cache.add_argument("session", help="session id")
    add_config_options(cache)
    add_json_option(cache)
    cache.set_defaults(handler=cache_command)


# -- summaries --------------------------------------------------------------


def summarize(session_id: str, log: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A stored session at a glance: `{sessionId, status, turn, headSeq, createdAt, updatedAt,
    usage: {inputTokens, outputTokens, cacheReadTokens}, hitRatio, lastTurnEnd}`.

    `status` is "empty", "running" (a turn is open: running in another
    process, or cut off) or "idle"; `turn` the newest turn (None: none yet).
    """
    usage = {"inputTokens": 0, "outputTokens": 0, "cacheReadTokens": 0}
    turn: int | None = None
    open_turn = False
    last_end: str | None = None
    for event in log:
        data = event["data"]
        if event["type"] == "turn/start":
            turn, open_turn = data["turn"], True
        elif event["type"] == "turn/end":
            open_turn, last_end = False, data["reason"]["kind"]
        elif event["type"] == "assistant/message" and data.get("usage"):
            usage["inputTokens"] += data["usage"]["input_tokens"]
            usage["outputTokens"] += data["usage"]["output_tokens"]
            usage["cacheReadTokens"] += data["usage"]["cache_read_tokens"]
    status = "empty" if not log else ("running" if open_turn else "idle")
    prompt = usage["inputTokens"]
    return {
        "sessionId": session_id,
        "status": status,
        "turn": turn,
        "headSeq": len(log) - 1,
        "createdAt": log[0]["time"] if log else None,
        "updatedAt": log[-1]["time"] if log else None,
        "usage": usage,
        "hitRatio": usage["cacheReadTokens"] / prompt if prompt else None,
        "lastTurnEnd": last_end,
    }


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _time(epoch_ms: int | None) -> str:
    if epoch_ms is None:
        return "-"
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def sessions_command(args: argparse.Namespace) -> int:
    """`harness sessions`: every stored session, newest update first."""

    async def main() -> list[dict[str, Any]]:
        store = existing_store(args)
        out = []
        for session_id in await store.list_sessions():
            out.append(summarize(session_id, await load_session(store, session_id)))
        return out

    summaries = trio.run(main)
    summaries.sort(key=lambda s: s["updatedAt"] or 0, reverse=True)
    if args.json:
        print_json({"sessions": summaries})
        return EXIT_OK
    table = Table(
        "session", "status", "turns", "events", "updated (UTC)", "prompt", "cached", "hit"
    )
    for s in summaries:
        table.add_row(
            s["sessionId"],
            s["status"] + (f" ({s['lastTurnEnd']})" if s["lastTurnEnd"] else ""),
            "-" if s["turn"] is None else str(s["turn"] + 1),
            str(s["headSeq"] + 1),
            _time(s["updatedAt"]),
            str(s["usage"]["inputTokens"]),
            str(s["usage"]["cacheReadTokens"]),
            _ratio(s["hitRatio"]),
        )
    out = console()
    out.print(table)
    out.print(f"{len(summaries)} session(s)")
    return EXIT_OK


# -- show ---------------------------------------------------------------------


def _text_of(content: Sequence[Mapping[str, Any]]) -> str:
    return "".join(b["text"] for b in content if b.get("type") == "text")


def conversation(log: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The conversation turn by turn: `[{turn, reason, items: [...], requests: [...]}]`.

    Items are `{kind: "user" | "assistant" | "reasoning" | "tool_call" | "tool_result" |
    "context", ...}` in log order; requests carry each model request's
    usage as the provider reported it.
    """
    turns: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    pending: list[dict[str, Any]] = []  # input logged between turns (it opens the next)
    for event in log:
        kind, data = event["type"], event["data"]
        if kind == "turn/start":
            current = {"turn": data["turn"], "reason": None, "items": pending, "requests": []}
            pending = []
            turns.append(current)
            continue
        items = current["items"] if current is not None else pending
        if kind == "user/message":
            source = data["source"]
            if source["kind"] == "plugin":
                items.append(
                    {
                        "kind": "context",
                        "plugin": source["plugin"],
                        "text": _text_of(data["content"]),
                    }
                )
            else:
                items.append({"kind": "user", "text": _text_of(data["content"])})
        elif kind == "assistant/message":
            message = data["message"]
            for block in message["content"]:
                if block["type"] == "reasoning":
                    items.append({"kind": "reasoning", "text": block["text"]})
            text = _text_of(message["content"])
            if text:
                items.append({"kind": "assistant", "text": text})
            if current is not None:
                usage = data.get("usage")
                current["requests"].append(
                    {
                        "step": data["step"],
                        "promptTokens": usage["input_tokens"] if usage else None,
                        "cacheHitTokens": usage["cache_read_tokens"] if usage else None,
                        "outputTokens": usage["output_tokens"] if usage else None,
                    }
                )
        elif kind == "tool/call":
            items.append(
                {
                    "kind": "tool_call",
                    "callId": data["call_id"],
                    "name": data["name"],
                    "arguments": data["arguments"],
                }
            )
        elif kind == "tool/result":
            items.append(
                {
                    "kind": "tool_result",
                    "callId": data["call_id"],
                    "content": data["content"],
                    "isError": data["is_error"],
                }
            )
        elif kind == "turn/end" and current is not None:
            current["reason"] = data["reason"]
            current = None
    return turns


def _reason_text(reason: Mapping[str, Any] | None) -> str:
    if reason is None:
        return "open"
    if reason["kind"] == "error":
        return f"error: {reason['error']['message']}"
    if reason["kind"] == "aborted":
        return f"aborted ({reason['reason']['kind']})"
    return str(reason["kind"])


def show_command(args: argparse.Namespace) -> int:
    """`harness show SESSION`."""

    async def main() -> list[dict[str, Any]]:
        return await load_session(existing_store(args), args.session)

    log = trio.run(main)
    turns = conversation(log)
    if args.json:
        print_json({"sessionId": args.session, "turns": turns})
        return EXIT_OK
    out = console()
    out.print(f"session {args.session}: {len(turns)} turn(s)")
    for turn in turns:
        out.rule(f"turn {turn['turn']}: {escape(_reason_text(turn['reason']))}", align="left")
        for item in turn["items"]:
            kind = item["kind"]
            if kind == "user":
                out.print(f"[bold]user[/bold]: {escape(item['text'])}")
            elif kind == "context":
                out.print(f"[dim]context ({escape(item['plugin'])}): {escape(item['text'])}[/dim]")
            elif kind == "reasoning":
                out.print(f"[dim]reasoning: {escape(item['text'])}[/dim]")
            elif kind == "assistant":
                out.print(f"[bold]assistant[/bold]: {escape(item['text'])}")
            elif kind == "tool_call":
                out.print(f"  → {escape(item['name'])}({escape(item['arguments'])})")
            else:
                flag = " [red]error[/red]" if item["isError"] else ""
                out.print(f"  ← result{flag}: {escape(item['content'])}")
        for request in turn["requests"]:
            prompt, cached = request["promptTokens"], request["cacheHitTokens"]
            ratio = _ratio(cached / prompt if prompt else None) if prompt is not None else "-"
            out.print(
                f"[dim]  request step {request['step']}: prompt {prompt}, cached {cached} "
                f"({ratio}), output {request['outputTokens']}[/dim]"
            )
    return EXIT_OK


# -- replay -------------------------------------------------------------------


def rebuilt(log: Sequence[Mapping[str, Any]], turn: int, step: int, attempt: int) -> dict[str, Any]:
    """`{request, sha256}` exactly as `_harness/request/rebuild` answers.

    Raises:
        CommandError: the log has no such request.
    """
    try:
        request = rebuild_request(log, turn, step, attempt).to_json()
    except SessionError as exc:
        raise CommandError(f"{exc}; `harness cache SESSION` lists the requests sent") from None
    wire = json.dumps(request, separators=(",", ":"), ensure_ascii=False)
    return {"request": request, "sha256": hashlib.sha256(wire.encode()).hexdigest()}


def replay_command(args: argparse.Namespace) -> int:
    """`harness replay SESSION --turn T --step S [--attempt A]`."""

    async def main() -> list[dict[str, Any]]:
        return await load_session(existing_store(args), args.session)

    result = rebuilt(trio.run(main), args.turn, args.step, args.attempt)
    if args.json:
        print_json(result)
    else:
        print(json.dumps(result["request"], indent=2, ensure_ascii=False))
    return EXIT_OK


# -- cache --------------------------------------------------------------------


def cache_command(args: argparse.Namespace) -> int:
    """`harness cache SESSION`: the prefix-break report."""

    async def main() -> list[dict[str, Any]]:
        return await load_session(existing_store(args), args.session)

    try:
        report = cache_report(args.session, trio.run(main))
    except SessionError as exc:
        raise CommandError(f"session {args.session!r} cannot be replayed: {exc}") from None
    if args.json:
        print_json(report.to_json())
        return EXIT_OK
    table = Table(
        "turn/step",
        "attempt",
        "header",
        "prompt",
        "cached",
        "hit",
        "limit",
        "prefix vs previous request",
    )
    for row in report.requests:
        if row.prefix_break is not None:
            prefix = f"BREAK at {row.prefix_break.describe()}"
        elif row.common_prefix_bytes:
            prefix = f"appended ({row.common_prefix_bytes} bytes kept)"
        else:
            prefix = "first request"
        table.add_row(
            f"{row.turn}/{row.step}",
            str(row.attempt),
            row.header or "-",
            "-" if row.prompt_tokens is None else str(row.prompt_tokens),
            "-" if row.cache_hit_tokens is None else str(row.cache_hit_tokens),
            _ratio(row.hit_ratio),
            "-" if row.limit_tokens is None else str(row.limit_tokens),
            escape(prefix),
        )
    out = console()
    out.print(table)
    breaks = sum(1 for r in report.requests if r.prefix_break is not None)
    out.print(
        f"{len(report.requests)} request(s), {breaks} prefix break(s); overall hit ratio "
        f"{report.hit_ratio:.1%} (estimated physical limit {report.limit_ratio:.1%})"
    )
    return EXIT_OK
