"""The simulator's fast paths answer byte for byte what the general ones do.

- the prompt memo: an engine whose memo keeps (almost) nothing answers
  every request of a conversation exactly as one whose memo keeps it all,
  and a reply's call ids come from the digest of the whole rendered prompt;
- token events rendered from a per-reply template equal the chunk the
  general event builder dumps, for any token text;
- an unbroken stream written in one pass gives the same writes, and calls
  `on_complete` at the same point, as the frame-by-frame writer.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from actors.providers.simulator import ConnectionReset, Fault, SimulatorConfig, SimulatorEngine
from actors.providers.simulator.model import SimReply, SimToolCall, call_id
from actors.providers.simulator.streaming import Frame, Frames, write_events
from actors.providers.simulator.tokens import render_prompt
from tests.providers.simulator_helpers import chat_body, events_of, post, read_body

TOOLS = [
    {"type": "function", "function": {"name": f"tool_{n}", "parameters": {"type": "object"}}}
    for n in range(6)
]
SYSTEM = {"role": "system", "content": "Be brief and exact. " * 40}


def _engine(memo_segments: int, memo_chars: int) -> SimulatorEngine:
    config = SimulatorConfig(prompt_memo_segments=memo_segments, prompt_memo_chars=memo_chars)
    return SimulatorEngine(config, wall_clock=lambda: 7.0)


async def _turns(engine: SimulatorEngine, sessions: int, **fields: Any) -> list[bytes]:
    """Two-step turns of `sessions` sessions sharing the system prompt and tools; every body."""
    bodies: list[bytes] = []
    histories: list[list[dict[str, Any]]] = [
        [SYSTEM, {"role": "user", "content": f'session {n}\ncall tool_1 {{"n": {n}}}'}]
        for n in range(sessions)
    ]
    for _ in range(2):
        for history in histories:
            response = await post(engine, chat_body(history, tools=TOOLS, **fields))
            body = await read_body(response)
            bodies.append(body)
            events = [e for e in events_of(body) if isinstance(e, dict) and e["choices"]]
            deltas = [e["choices"][0]["delta"] for e in events]
            calls: dict[int, dict[str, Any]] = {}
            for delta in deltas:
                for piece in delta.get("tool_calls", ()):
                    call = calls.setdefault(piece["index"], {"arguments": ""})
                    call.update({k: v for k, v in piece.items() if k in ("id", "type")})
                    call["name"] = piece["function"].get("name", call.get("name"))
                    call["arguments"] += piece["function"]["arguments"]
            reply: dict[str, Any] = {
                "role": "assistant",
                "content": "".join(d.get("content") or "" for d in deltas),
            }
            reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
            if calls:
                reply["tool_calls"] = [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": c["arguments"]},
                    }
                    for c in calls.values()
                ]
                if reasoning:
                    reply["reasoning_content"] = reasoning
            history.append(reply)
            for c in calls.values():
                history.append({"role": "tool", "tool_call_id": c["id"], "content": "ok"})
            if not calls:
                history.append({"role": "user", "content": "and again"})
    return bodies


async def test_a_memo_that_keeps_nothing_answers_as_one_that_keeps_everything() -> None:
    for fields in ({}, {"thinking": {"type": "enabled"}}):
        kept = await _turns(_engine(8192, 1 << 24), 3, **fields)
        evicted = await _turns(_engine(1, 1), 3, **fields)
        assert kept == evicted
        # The shared prefix really was served from the prefix cache.
        usages = [
            e["usage"] for b in kept for e in events_of(b) if isinstance(e, dict) and "usage" in e
        ]
        assert usages[1]["prompt_cache_hit_tokens"] > 0


async def test_call_ids_come_from_the_digest_of_the_whole_rendered_prompt() -> None:
    engine = SimulatorEngine(wall_clock=lambda: 7.0)
    messages = [SYSTEM, {"role": "user", "content": 'call tool_2 {"a": 1}'}]
    body = await read_body(await post(engine, chat_body(messages, tools=TOOLS)))
    ids = [
        piece["id"]
        for event in events_of(body)
        if isinstance(event, dict) and event["choices"]
        for piece in event["choices"][0]["delta"].get("tool_calls", ())
        if "id" in piece
    ]
    seed = hashlib.sha256("".join(render_prompt(TOOLS, messages)).encode()).digest()
    assert ids == [call_id(seed, 0)]


def _frames(token_delay: float = 0.0) -> Frames:
    return Frames(
        model='deepseek-"chat"é', number=3, created=11, fault=Fault(), token_delay=token_delay
    )


@given(token=st.text(), field=st.sampled_from(["content", "reasoning_content"]))
def test_a_token_event_from_the_template_is_the_dumped_chunk(token: str, field: str) -> None:
    frames = _frames(token_delay=0.5)
    fast = frames._text(frames._delta_head(), field, token)
    general = frames._event({"delta": {field: token}})
    assert fast.text == general.text and fast.event and fast.delay == 0.5
    data = json.loads(fast.text.removeprefix("data: "))
    assert data["choices"][0]["delta"] == {field: token}


@given(arguments=st.text(max_size=30))
def test_tool_call_events_from_the_template_are_the_dumped_chunks(arguments: str) -> None:
    frames = _frames()
    reply = SimReply(tool_calls=(SimToolCall(name="f", arguments=arguments, id="call_1"),))
    built = frames.build(reply, [], [], "tool_calls", {"prompt_tokens": 1})
    pieces = frames._call_pieces(reply)
    general = [frames._event({"delta": {"tool_calls": [piece]}}).text for piece in pieces]
    assert [frame.text for frame in built[1 : 1 + len(pieces)]] == general


async def _written(frames: list[Frame], fault: Fault) -> list[object]:
    """The writes of `frames`, with a marker where `on_complete` was called."""
    out: list[object] = []

    def reset(sent: int) -> ConnectionReset:
        raise AssertionError("no reset expected")

    body = write_events(frames, fault, on_complete=lambda: out.append("complete"), on_reset=reset)
    async for piece in body:
        out.append(piece)
    return out


@given(
    texts=st.lists(st.text(alphabet="ab\né", min_size=1, max_size=12), min_size=1, max_size=8),
    size=st.integers(1, 40),
    crlf=st.booleans(),
)
def test_an_unbroken_stream_written_in_one_pass_is_written_as_frame_by_frame(
    texts: list[str], size: int, crlf: bool
) -> None:
    fault = Fault(write_size=size, crlf=crlf)
    plain = [Frame(text=text, event=True) for text in texts]
    # Any delay takes the frame-by-frame path (the autojump clock skips it).
    paced = [Frame(text=text, event=True, delay=1e-9) for text in texts]

    async def both() -> tuple[list[object], list[object]]:
        return await _written(plain, fault), await _written(paced, fault)

    fast, general = trio.run(both, clock=trio.testing.MockClock(autojump_threshold=0))
    assert fast == general
