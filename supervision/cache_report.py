"""The prefix-break report behind `harness cache`: why a request's cache hit ratio fell.

Provider prefix caches reuse the longest prefix a request shares with
earlier ones. For every request the log says was sent, this module rebuilds
it from the log (`rebuild_request`), serialises it as the canonical compact
JSON (`json.dumps(request.to_json(), separators=(",", ":"),
ensure_ascii=False)`, UTF-8: the same bytes `_harness/request/rebuild`
hashes) and compares it with the previous request's bytes. When the
previous request, less its closing `]}`, is a prefix of this one, the
request only appended messages; otherwise the report names the first byte
that differs and the lane that broke the prefix: the call `config`, the
`system` text, a `tool` (by name) or a `message` (by index, with its source).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeAlias

import attrs

from actors.session import Event, event_from_json, rebuild_request, request_attempts
from actors.session.events import AssistantMessage, RequestHeaderLogged, RequestRetry, StepStart

Lane: TypeAlias = Literal["config", "system", "tool", "message"]
_LANE_RANK: Mapping[str, int] = {"config": 0, "system": 1, "tool": 2, "message": 3, "end": 4}


@attrs.frozen(kw_only=True)
class Span:
    """Bytes `[start, end)` of a request's JSON that belong to one lane entry."""

    start: int
    end: int
    lane: Lane | Literal["end"]
    index: int | None = None
    """The tool's or message's index; None for config, system and the closing bytes."""
    label: str | None = None
    """The tool's name, or the message's role and source."""


@attrs.frozen(kw_only=True)
class PrefixBreak:
    """Where a request's bytes first differ from the previous request's, and which lane."""

    offset: int
    """Byte offset of the first differing byte (in both requests' JSON)."""
    lane: Lane
    tool: str | None = None
    """The tool whose schema (or presence) differs, for lane `tool`."""
    message_index: int | None = None
    """The index of the first differing message, for lane `message`."""
    message_source: str | None = None
    """That message's role and source, e.g. `user (plugin runtime-context snapshot)`."""

    def describe(self) -> str:
        """One line: the offset and the lane."""
        if self.lane == "tool":
            return f"byte {self.offset}: tool {self.tool!r}"
        if self.lane == "message":
            return f"byte {self.offset}: message {self.message_index} ({self.message_source})"
        return f"byte {self.offset}: {'system text' if self.lane == 'system' else 'config'}"

    def to_json(self) -> dict[str, Any]:
        """`{offset, lane, tool?, messageIndex?, messageSource?}`."""
        out: dict[str, Any] = {"offset": self.offset, "lane": self.lane}
        if self.tool is not None:
            out["tool"] = self.tool
        if self.message_index is not None:
            out["messageIndex"] = self.message_index
            out["messageSource"] = self.message_source
        return out


@attrs.frozen(kw_only=True)
class RequestCache:
    """One sent request: its cache figures and how its prefix relates to the previous one."""

    turn: int
    step: int
    attempt: int
    header: str | None
    """The reason of a `request/header` logged for this request (`initial`, `change`,
    `resume`), or None when the previous header still applied."""
    prompt_tokens: int | None
    """Prompt tokens as the provider reported them (None: the attempt failed)."""
    cache_hit_tokens: int | None
    output_tokens: int | None
    request_bytes: int
    common_prefix_bytes: int
    """Bytes shared with the previous request's start (0 for the first request)."""
    limit_tokens: int | None
    """An estimate of the most prompt tokens a prefix cache could have served: the
    previous request's prompt (and reply, when this request extends it), cut at the
    break in proportion to the bytes kept."""
    prefix_break: PrefixBreak | None
    """None when the request only appended to the previous one (or is the first)."""

    @property
    def hit_ratio(self) -> float | None:
        """Cache-hit tokens over prompt tokens, when both are known."""
        if not self.prompt_tokens or self.cache_hit_tokens is None:
            return None
        return self.cache_hit_tokens / self.prompt_tokens

    def to_json(self) -> dict[str, Any]:
        """The row as the `--json` output and the dashboard show it (camelCase)."""
        return {
            "turn": self.turn,
            "step": self.step,
            "attempt": self.attempt,
            "header": self.header,
            "promptTokens": self.prompt_tokens,
            "cacheHitTokens": self.cache_hit_tokens,
            "outputTokens": self.output_tokens,
            "hitRatio": self.hit_ratio,
            "requestBytes": self.request_bytes,
            "commonPrefixBytes": self.common_prefix_bytes,
            "limitTokens": self.limit_tokens,
            "prefixBreak": None if self.prefix_break is None else self.prefix_break.to_json(),
        }


@attrs.frozen(kw_only=True)
class CacheReport:
    """Every sent request of a session, in sending order, and the totals."""

    session_id: str
    requests: tuple[RequestCache, ...]

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens over the requests that reported usage."""
        return sum(r.prompt_tokens or 0 for r in self.requests)

    @property
    def cache_hit_tokens(self) -> int:
        """Cache-hit tokens over the requests that reported usage."""
        return sum(r.cache_hit_tokens or 0 for r in self.requests)

    @property
    def hit_ratio(self) -> float:
        """Overall cache-hit ratio (0 when no usage was reported)."""
        return self.cache_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def limit_ratio(self) -> float:
        """The estimated physical limit of the overall ratio."""
        limit = sum(r.limit_tokens or 0 for r in self.requests if r.prompt_tokens)
        return limit / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_json(self) -> dict[str, Any]:
        """`{sessionId, requests: [...], promptTokens, cacheHitTokens, hitRatio, limitRatio,
        breaks}`."""
        return {
            "sessionId": self.session_id,
            "requests": [r.to_json() for r in self.requests],
            "promptTokens": self.prompt_tokens,
            "cacheHitTokens": self.cache_hit_tokens,
            "hitRatio": self.hit_ratio,
            "limitRatio": self.limit_ratio,
            "breaks": sum(1 for r in self.requests if r.prefix_break is not None),
        }


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _source(message: Mapping[str, Any]) -> str:
    role = str(message.get("role"))
    source = message.get("source")
    if not isinstance(source, Mapping):
        return role
    kind = source.get("kind")
    if kind == "tool":
        return f"{role} (tool result {source.get('call_id')})"
    if kind == "plugin":
        form = f" {source['form']}" if source.get("form") else ""
        return f"{role} (plugin {source.get('plugin')}{form})"
    return f"{role} ({kind})"


def request_spans(request: Mapping[str, Any]) -> tuple[bytes, list[Span]]:
    """The canonical JSON bytes of a request (`GenerateRequest.to_json()`) and its lane spans.

    A key and its separators belong to the lane that follows them, so each
    byte of the JSON is in exactly one span.
    """
    parts: list[tuple[bytes, Span | None]] = []
    offset = 0

    def add(text: str, lane: Lane | Literal["end"], index: int | None, label: str | None) -> None:
        nonlocal offset
        data = text.encode("utf-8")
        parts.append(
            (data, Span(start=offset, end=offset + len(data), lane=lane, index=index, label=label))
        )
        offset += len(data)

    add('{"config":' + _dumps(request["config"]), "config", None, None)
    if "system" in request:
        add(',"system":' + _dumps(request["system"]), "system", None, None)
    tools = request.get("tools")
    if tools is not None:
        for index, tool in enumerate(tools):
            lead = ',"tools":[' if index == 0 else ","
            add(lead + _dumps(tool), "tool", index, str(tool.get("name")))
        add("]", "tool", len(tools) - 1, str(tools[-1].get("name")) if tools else None)
    messages = request["messages"]
    add(',"messages":[', "message", 0, _source(messages[0]) if messages else None)
    for index, message in enumerate(messages):
        add(("," if index else "") + _dumps(message), "message", index, _source(message))
    add("]}", "end", None, None)
    data = b"".join(chunk for chunk, _ in parts)
    return data, [span for _, span in parts if span is not None]


def _span_at(spans: Sequence[Span], offset: int) -> Span:
    for span in spans:
        if span.start <= offset < span.end:
            return span
    return spans[-1]


def _common_prefix(a: bytes, b: bytes) -> int:
    limit = min(len(a), len(b))
    low, high = 0, limit
    # Binary search on prefix equality: bytes comparison runs in C.
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def find_break(
    previous: Mapping[str, Any], current: Mapping[str, Any]
) -> tuple[int, PrefixBreak | None]:
    """(bytes shared, the break) between two consecutive requests' JSON.

    The break is None when `current` only appends to `previous` (the
    previous bytes less the closing `]}` are a prefix of the current ones).
    """
    before, before_spans = request_spans(previous)
    after, after_spans = request_spans(current)
    open_before = before[:-2]
    common = _common_prefix(before, after)
    if after.startswith(open_before):
        return len(open_before), None
    first = _span_at(before_spans, common)
    second = _span_at(after_spans, common)
    span = min(second, first, key=lambda s: _LANE_RANK[s.lane])  # ties: the current request
    lane: Lane = "message" if span.lane == "end" else span.lane
    if lane == "message":
        candidates = [s for s in (second, first) if s.lane == "message"]
        message = candidates[0] if candidates else span
        return common, PrefixBreak(
            offset=common,
            lane="message",
            message_index=message.index,
            message_source=message.label,
        )
    if lane == "tool":
        return common, PrefixBreak(offset=common, lane="tool", tool=span.label)
    return common, PrefixBreak(offset=common, lane=lane)


def _limit(
    prompt: int | None,
    common: int,
    size: int,
    previous: RequestCache | None,
    broken: PrefixBreak | None,
) -> int | None:
    """The most prompt tokens a prefix cache could serve for this request (an estimate).

    Only what an earlier request sent can be cached: the previous prompt
    (and its reply, when this request extends it), cut at the break in
    proportion to the bytes kept.
    """
    if prompt is None:
        return None
    if previous is None:
        return 0
    if previous.prompt_tokens is None:
        return (prompt * common) // size
    kept = (previous.prompt_tokens * common) // previous.request_bytes
    reply = (previous.output_tokens or 0) if broken is None else 0
    return min(prompt, kept + reply)


def cache_report(session_id: str, events: Sequence[Mapping[str, Any] | Event]) -> CacheReport:
    """The prefix-break report of a session's log (its `session.to_json()` or `Event`s).

    Raises:
        SessionError: the log cannot be replayed (see `rebuild_request`).
    """
    log = [e if isinstance(e, Event) else event_from_json(e) for e in events]
    usage: dict[tuple[int, int], AssistantMessage] = {}
    headers: dict[tuple[int, int, int], str] = {}
    attempt_key: tuple[int, int, int] | None = None
    for event in log:
        data = event.data
        if isinstance(data, StepStart):
            attempt_key = (data.turn, data.step, 0)
        elif isinstance(data, RequestRetry) and attempt_key is not None:
            attempt_key = (data.turn, data.step, data.attempt + 1)
        elif isinstance(data, RequestHeaderLogged) and attempt_key is not None:
            headers.setdefault(attempt_key, data.reason)
        elif isinstance(data, AssistantMessage):
            usage[(data.turn, data.step)] = data
    attempts = request_attempts(log)
    last_attempt = {(t, s): a for t, s, a in attempts}
    rows: list[RequestCache] = []
    previous: dict[str, Any] | None = None
    for turn, step, attempt in attempts:
        request = rebuild_request(log, turn, step, attempt).to_json()
        size = len(request_spans(request)[0])
        if previous is None:
            common, broken = 0, None
        else:
            common, broken = find_break(previous, request)
        message = usage.get((turn, step)) if last_attempt[(turn, step)] == attempt else None
        figures = message.usage if message is not None else None
        prompt = figures.input_tokens if figures is not None else None
        rows.append(
            RequestCache(
                turn=turn,
                step=step,
                attempt=attempt,
                header=headers.get((turn, step, attempt)),
                prompt_tokens=prompt,
                cache_hit_tokens=figures.cache_read_tokens if figures is not None else None,
                output_tokens=figures.output_tokens if figures is not None else None,
                request_bytes=size,
                common_prefix_bytes=common,
                limit_tokens=_limit(prompt, common, size, rows[-1] if rows else None, broken),
                prefix_break=broken,
            )
        )
        previous = request
    return CacheReport(session_id=session_id, requests=tuple(rows))
