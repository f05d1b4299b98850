"""10,000 generated frames against a live gateway: no crash; answered, or closed as stated."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import trio
import trio_websocket
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervision.gateway.methods import METHODS
from tests.gateway.helpers import connect, running_gateway

FRAMES = 10_000
MAX_FRAME = 1024 * 1024
CHUNK = 250
CLOSE_EVERY = 500
OVERSIZED = "x" * (MAX_FRAME + 1)

_leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
_keys = st.sampled_from(["sessionId", "fromSeq", "cwd", "prompt", "limit", "types", "x"])
_json = st.recursive(
    _leaf,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(_keys | st.text(max_size=4), c, max_size=3),
    max_leaves=5,
)
_ids = st.one_of(
    st.integers(),
    st.integers(min_value=10**20, max_value=10**60),
    st.text(max_size=12),
    st.text(min_size=257, max_size=260),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False),
)
_methods = st.sampled_from([*METHODS, "nope", "session/unknown", "_harness/x"]) | st.text(
    max_size=10
)


@st.composite
def _message(draw: st.DrawFn) -> dict[str, Any]:
    message: dict[str, Any] = {}
    if draw(st.booleans()) or draw(st.booleans()):
        message["jsonrpc"] = draw(st.sampled_from(["2.0", "2.0", "1.0", 2]))
    if draw(st.booleans()):
        message["id"] = draw(_ids)
    if draw(st.integers(0, 9)):
        message["method"] = draw(_methods)
    if draw(st.booleans()):
        message["params"] = draw(_json)
    return message


def _nest(depth: int) -> str:
    return "[" * depth + "]" * depth


_frame = st.one_of(
    _message().map(json.dumps),
    _message().map(json.dumps),
    st.lists(_message(), max_size=40).map(json.dumps),
    _json.map(json.dumps),
    st.text(max_size=16),
    st.integers(100, 20_000).map(_nest),
    st.integers(100, 5_000).map(lambda n: '{"a":' * n),
)
VARIANTS = 10
DRAWS = FRAMES // VARIANTS
_REAL_METHODS = list(METHODS)


def _variants(frame: str, seed: int) -> list[str]:
    """Ten frames from one drawn frame: it, cut, with junk, batched, re-identified, re-addressed."""
    try:
        value = json.loads(frame)
    except (ValueError, RecursionError):
        value = frame
    if len(frame) > 10_000:
        value = frame[:100]  # keep the batched variants small: big frames are tested as drawn
    try:
        return _wrapped(frame, value, seed)
    except RecursionError:  # nested near the limit: wrapping it goes past; deep frames go as drawn
        return _wrapped(frame, frame[:100], seed)


def _wrapped(frame: str, value: Any, seed: int) -> list[str]:
    method = _REAL_METHODS[seed % len(_REAL_METHODS)]
    call = {"jsonrpc": "2.0", "id": f"v{seed}", "method": method, "params": value}
    variants = [
        frame,
        frame[: len(frame) // 2],
        frame + "}",
        "[" + frame,
        json.dumps([value, value, {"jsonrpc": "2.0", "id": 7, "method": "x"}]),
        json.dumps(call),
        json.dumps({**call, "id": 10**40 + seed}),
        json.dumps({**call, "jsonrpc": "1.0"}),
        json.dumps({k: v for k, v in call.items() if k != "id"}),
        json.dumps([call] * 33),
    ]
    assert len(variants) == VARIANTS
    return variants


def _generate() -> list[str]:
    drawn: list[str] = []

    @settings(
        max_examples=DRAWS // 40,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(_frame, min_size=40, max_size=40))
    def collect(batch: list[str]) -> None:
        drawn.extend(batch)

    collect()
    return [variant for seed, frame in enumerate(drawn) for variant in _variants(frame, seed)]


def _expected_ids(frame: str) -> list[Any]:
    """The ids that must be answered: valid requests in the frame, null for unparseable JSON."""
    try:
        value = json.loads(frame)
    except (ValueError, RecursionError):
        return [None]
    members = value if isinstance(value, list) and 0 < len(value) <= 32 else [value]
    ids = []
    for member in members:
        if not isinstance(member, dict) or member.get("jsonrpc") != "2.0":
            continue
        if not isinstance(member.get("method"), str) or "id" not in member:
            continue
        raw = member["id"]
        valid = (isinstance(raw, int) and not isinstance(raw, bool)) or (
            isinstance(raw, str) and len(raw) <= 256
        )
        if valid:
            ids.append(raw)
    return ids


async def test_ten_thousand_fuzzed_frames_never_take_the_gateway_down() -> None:
    frames = _generate()
    assert len(frames) >= FRAMES
    async with running_gateway() as gateway, connect(gateway) as bystander:
        sid = (await bystander.call("session/new", {"cwd": "/", "mcpServers": []}))["sessionId"]
        await bystander.call("_harness/log/subscribe", {"sessionId": sid})
        closes: Counter[int] = Counter()
        index = 0
        sentinel = 0
        with trio.fail_after(120):
            while index < len(frames):
                async with connect(gateway) as client:
                    expected: Counter[Any] = Counter()
                    while index < len(frames):
                        frame: str | bytes = frames[index]
                        index += 1
                        if index % CLOSE_EVERY == 0:  # a binary or an oversized frame
                            frame = b"\x00binary" if index % (2 * CLOSE_EVERY) else OVERSIZED
                        closing = isinstance(frame, bytes) or len(frame) > MAX_FRAME
                        if closing:
                            # Everything sent so far is answered before the closing frame.
                            await _all_answered(client, expected)
                        if closing:
                            code = 1003 if isinstance(frame, bytes) else 1009
                            try:
                                # The close may come while the frame is still being sent.
                                await client.ws.send_message(frame)
                                await client.answer("never")
                            except trio_websocket.ConnectionClosed as closed:
                                assert closed.reason.code == code
                            closes[code] += 1
                            break
                        await client.ws.send_message(frame)
                        expected.update(_expected_ids(frame))

                        if index % CHUNK == 0 or index == len(frames):
                            sentinel += 1
                            mark = f"sentinel-{sentinel}"
                            await client.send(
                                {"jsonrpc": "2.0", "id": mark, "method": "fuzz/sentinel"}
                            )
                            assert (await client.answer(mark))["error"]["code"] == -32601
                    await _all_answered(client, expected)
        assert closes[1003] > 0 and closes[1009] > 0
        # The bystander was never disturbed: its subscription still follows the log.
        agent = gateway.directory.live_agent(sid)
        assert agent is not None
        agent.followup("still there?")
        with trio.fail_after(10):
            await bystander.wait_for(lambda n: n["method"] == "_harness/log/event")
            assert (await bystander.call("_harness/stats", {}))["epoch"] == gateway.epoch
        async with connect(gateway) as late:
            await late.call("_harness/sessions/list", {})


async def _all_answered(client: Any, expected: Counter[Any]) -> None:
    """Every expected id was answered at least as often as it was sent (null for parse errors)."""
    while True:
        got: Counter[Any] = Counter()
        for frame in client.frames:
            for message in frame if isinstance(frame, list) else [frame]:
                if "method" not in message:
                    got[_key(message.get("id"))] += 1
        missing = {k: n for k, n in expected.items() if got[_key(k)] < n}
        if not missing:
            return
        await client._arrived.wait()


def _key(value: Any) -> Any:
    return json.dumps(value)
