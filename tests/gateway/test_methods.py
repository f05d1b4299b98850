"""§9's method behaviour over a live connection: stop reasons, updates, errors, state, paging."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from actors.agent import Agent, AgentOptions, Tool
from actors.agent.agent import INBOX_CAPACITY
from actors.agent.decisions import PreStepNext, Reject, StepDecision, StepProposal
from actors.messages import TextBlock, UserSource
from actors.prompt import AssembleContext, PromptAssembly, PromptError, PromptSection
from actors.prompt.types import NextListener
from actors.providers.chunks import TextDelta
from actors.providers.simulator import SimulatorConfig
from actors.session import Event, event_to_json, rebuild_request
from actors.session.events import (
    AssistantChunk,
    StepStart,
    TurnEnd,
    TurnEndReason,
    TurnStart,
    UserMessage,
    type_of,
)
from supervision.cluster.node_methods import NODE_METHODS
from supervision.gateway import AgentProfile, Gateway
from supervision.gateway.cursors import PromptCursor
from supervision.gateway.methods import MethodTable
from supervision.gateway.stdio import LINE_FRAMING
from tests.gateway.helpers import LIST_FILES, RpcClient, connect, running_gateway


def _text(value: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": value}]


SCRIPT = {
    "rules": [
        {"when": {"input": "tool"}, "reply": {"text": "done"}},
        {
            "when": {"input": "user", "contains": "cut me"},
            "reply": {"text": "a reply cut short", "finish_reason": "length"},
        },
        {
            "when": {"input": "user", "contains": "object args"},
            "reply": {"tool_calls": [{"name": "list_files", "arguments": {"path": "."}}]},
        },
        {
            "when": {"input": "user", "contains": "raw args"},
            "reply": {"tool_calls": [{"name": "list_files", "arguments": "[1, 2]"}]},
        },
        {
            "when": {"input": "user", "contains": "break it"},
            "reply": {"tool_calls": [{"name": "broken", "arguments": {}}]},
        },
    ]
}


async def _broken(arguments: dict[str, Any] | str, call: object) -> str:
    raise RuntimeError("the disk is on fire")


BROKEN = Tool(
    name="broken",
    description="Always fails.",
    parameters={"type": "object", "properties": {}},
    execute=_broken,
)


async def _refuse(proposal: StepProposal, next: PreStepNext) -> StepDecision:
    return Reject(reason="not today")


def _extra_profiles(gateway: Gateway) -> None:
    options = AgentOptions(model="deepseek-chat")
    profiles = gateway.directory.profiles
    profiles["broken"] = AgentProfile(options=options, tools=(LIST_FILES, BROKEN))

    def refusing(agent: Agent) -> None:
        agent.on_pre_step(_refuse)

    profiles["refusing"] = AgentProfile(options=options, setup=refusing)

    def bad_section(agent: Agent) -> None:
        gateway.runtime.system_prompt.section(
            PromptSection(name="greeting", order=50, text="Hello {{no_such_variable}}"),
            scope=agent.scope,
        )

    profiles["bad-section"] = AgentProfile(options=options, setup=bad_section)

    def failing_assembly(agent: Agent) -> None:
        scope = agent.scope

        async def listener(
            assembly: PromptAssembly, ctx: AssembleContext, next: NextListener
        ) -> PromptAssembly:
            if ctx.scope is scope:
                raise PromptError("tool registry 'flaky' is unavailable")
            return await next()

        gateway.runtime.system_prompt.on_assemble(listener, scope=scope)

    profiles["failing-assembly"] = AgentProfile(options=options, setup=failing_assembly)


@asynccontextmanager
async def _gateway(**kwargs: Any) -> AsyncIterator[tuple[Gateway, RpcClient]]:
    async with running_gateway(**kwargs) as gateway, connect(gateway) as client:
        _extra_profiles(gateway)
        with trio.fail_after(60):
            yield gateway, client


async def _new(client: RpcClient, profile: str | None = None) -> str:
    params: dict[str, Any] = {"cwd": "/", "mcpServers": []}
    if profile is not None:
        params["_meta"] = {"harness": {"agent": profile}}
    result: str = (await client.call("session/new", params))["sessionId"]
    return result


def _updates(client: RpcClient, kind: str) -> list[dict[str, Any]]:
    return [
        n["params"]["update"]
        for n in client.notifications
        if n["method"] == "session/update" and n["params"]["update"]["sessionUpdate"] == kind
    ]


async def _events(gateway: Gateway, sid: str) -> list[Event]:
    return list(await gateway.directory.events(sid))


def _position(events: list[Event], text: str) -> tuple[int, int]:
    """(turn, step) of the user message holding `text`."""
    turn = step = -1
    for event in events:
        data = event.data
        if isinstance(data, TurnStart):
            turn = data.turn
        elif isinstance(data, StepStart):
            step = data.step
        elif isinstance(data, UserMessage) and any(
            isinstance(b, TextBlock) and b.text == text for b in data.content
        ):
            return turn, step
    raise AssertionError(f"no user message {text!r}")


# -- session/prompt: stop reasons and updates ---------------------------------------


async def test_a_reply_cut_at_the_token_limit_answers_max_tokens() -> None:
    async with _gateway(config=SimulatorConfig(script=SCRIPT)) as (_, client):
        sid = await _new(client)
        done = await client.call("session/prompt", {"sessionId": sid, "prompt": _text("cut me")})
        assert done["stopReason"] == "max_tokens"


async def test_a_step_refused_by_a_pre_step_listener_answers_refusal() -> None:
    async with _gateway() as (gateway, client):
        sid = await _new(client, "refusing")
        done = await client.call("session/prompt", {"sessionId": sid, "prompt": _text("hi")})
        assert done["stopReason"] == "refusal"
        (end,) = [e for e in await _events(gateway, sid) if isinstance(e.data, TurnEnd)]
        assert event_to_json(end)["data"]["reason"] == {"kind": "blocked"}


async def test_a_failed_turn_answers_an_internal_error_with_its_turn_end() -> None:
    async with _gateway() as (_, client):
        # The step opens (the prompt is logged), then its prompt fails to render.
        rendered = await _new(client, "bad-section")
        # The prompt is never logged: its first step's assembly fails before it opens.
        assembled = await _new(client, "failing-assembly")
        for sid, code, words in (
            (rendered, "render_failed", "no_such_variable"),
            (assembled, "prompt_error", "'flaky' is unavailable"),
        ):
            answer = await client.request(
                "session/prompt", {"sessionId": sid, "prompt": _text("hi")}
            )
            error = answer["error"]
            assert error["code"] == -32603 and f"session {sid!r} turn 0" in error["message"]
            turn_end = error["data"]["turnEnd"]
            assert turn_end["kind"] == "error" and turn_end["error"]["code"] == code
            assert words in turn_end["error"]["message"]


async def test_a_prompt_whose_input_is_dropped_before_its_turn_answers_cancelled() -> None:
    async with _gateway(config=SLOW) as (_, client):
        sid = await _new(client)
        await _running(client, sid)
        await client.send(
            {
                "jsonrpc": "2.0",
                "id": "queued",
                "method": "session/prompt",
                "params": {"sessionId": sid, "prompt": _text("behind the live turn")},
            }
        )
        state: dict[str, Any] = {}
        while state.get("inbox", {}).get("nextTurn") != 1:  # the prompt is queued
            state = await client.call("_harness/session/state", {"sessionId": sid})
        await client.call("_harness/session/cancel", {"sessionId": sid, "keepInbox": False})
        answer = await client.answer("queued")
        assert answer["result"]["stopReason"] == "cancelled"


async def test_a_prompt_to_a_full_inbox_is_answered_overloaded_and_queues_nothing() -> None:
    async with _gateway() as (gateway, client):
        sid = await _new(client)
        agent = gateway.directory.live_agent(sid)
        assert agent is not None
        for index in range(INBOX_CAPACITY):
            agent.inject(f"parked {index}")  # never wakes the agent
        answer = await client.request("session/prompt", {"sessionId": sid, "prompt": _text("hi")})
        assert answer["error"]["code"] == -33003
        assert answer["error"]["data"] == {"reason": "overloaded", "retryAfterMs": 1000}
        assert "inbox" in answer["error"]["message"]
        assert len(agent.inbox) == INBOX_CAPACITY
        # The connection may prompt the session again: the refused prompt left nothing behind.
        again = await client.request("session/prompt", {"sessionId": sid, "prompt": _text("hi")})
        assert again["error"]["code"] == -33003


async def test_raw_input_is_the_parsed_arguments_when_an_object_else_the_raw_string() -> None:
    async with _gateway(config=SimulatorConfig(script=SCRIPT)) as (_, client):
        sid = await _new(client)
        await client.call("session/prompt", {"sessionId": sid, "prompt": _text("object args")})
        await client.call("session/prompt", {"sessionId": sid, "prompt": _text("raw args")})
        calls = _updates(client, "tool_call")
        assert [c["rawInput"] for c in calls] == [{"path": "."}, "[1, 2]"]
        assert all(c["status"] == "in_progress" and c["title"] == "list_files" for c in calls)
        results = _updates(client, "tool_call_update")
        # The array is no valid argument object: its call fails validation.
        assert [r["status"] for r in results] == ["completed", "failed"]
        assert [r["toolCallId"] for r in results] == [c["toolCallId"] for c in calls]


async def test_a_tool_that_raises_is_a_failed_tool_call_update_with_its_error() -> None:
    async with _gateway(config=SimulatorConfig(script=SCRIPT)) as (_, client):
        sid = await _new(client, "broken")
        done = await client.call("session/prompt", {"sessionId": sid, "prompt": _text("break it")})
        assert done["stopReason"] == "end_turn"
        (result,) = _updates(client, "tool_call_update")
        assert result["status"] == "failed"
        assert "the disk is on fire" in json.dumps(result["content"])


async def test_a_turn_goes_on_when_its_client_disconnects() -> None:
    config = SimulatorConfig(reply_tokens=100, token_rate=200.0)  # a turn of half a second
    async with running_gateway(config=config) as gateway:
        with trio.fail_after(30):
            async with connect(gateway) as client:
                sid = await _new(client)
                await client.send(
                    {
                        "jsonrpc": "2.0",
                        "id": "p",
                        "method": "session/prompt",
                        "params": {"sessionId": sid, "prompt": _text("hi")},
                    }
                )
                await client.wait_for(lambda n: n["method"] == "session/update")
            agent = gateway.directory.live_agent(sid)
            assert agent is not None and agent.status == "running"  # the client is gone
            await agent.when_idle()
            (end,) = [e for e in await _events(gateway, sid) if isinstance(e.data, TurnEnd)]
            assert event_to_json(end)["data"]["reason"] == {"kind": "completed"}


# -- errors ---------------------------------------------------------------------------


async def test_a_frame_that_is_not_json_is_a_parse_error_and_the_connection_stays() -> None:
    async with _gateway() as (_, client):
        await client.send('{"jsonrpc": "2.0", "id": 1, "method": ')
        answer = await client.answer(None)  # a parse error cannot name the id
        assert answer["error"]["code"] == -32700
        assert "not valid JSON" in answer["error"]["message"]
        assert (await client.call("_harness/stats", {}))["epoch"]


async def test_inspect_whose_assembly_fails_is_assembly_failed_naming_the_variable() -> None:
    async with _gateway() as (_, client):
        sid = await _new(client, "bad-section")
        answer = await client.request("_harness/prompt/inspect", {"sessionId": sid})
        error = answer["error"]
        assert error["code"] == -33005 and error["data"]["reason"] == "assembly_failed"
        assert "no_such_variable" in error["message"] and "greeting" in error["message"]


async def test_inspect_of_a_stopped_session_is_refused_and_does_not_start_it() -> None:
    async with _gateway() as (_, client):
        sid = await _new(client)
        await client.call("session/close", {"sessionId": sid})
        answer = await client.request("_harness/prompt/inspect", {"sessionId": sid})
        assert answer["error"]["code"] == -33005
        assert answer["error"]["data"]["reason"] == "not_running"
        assert "session/resume" in answer["error"]["message"]
        state = await client.call("_harness/session/state", {"sessionId": sid})
        assert state["status"] == "stopped"  # an observe method started nothing
        await client.call("session/resume", {"sessionId": sid})
        inspected = await client.call("_harness/prompt/inspect", {"sessionId": sid})
        assert inspected["sections"]


async def test_rebuild_returns_the_logged_request_and_its_sha256_or_rebuild_failed() -> None:
    async with _gateway(config=SimulatorConfig(script=SCRIPT)) as (gateway, client):
        sid = await _new(client)
        await client.call("session/prompt", {"sessionId": sid, "prompt": _text("object args")})
        events = await _events(gateway, sid)
        for step, attempt in ((0, -1), (1, -1), (1, 0)):
            params = {"sessionId": sid, "turn": 0, "step": step}
            if attempt != -1:
                params["attempt"] = attempt
            rebuilt = await client.call("_harness/request/rebuild", params)
            request = rebuild_request(events, 0, step, attempt).to_json()
            assert rebuilt["request"] == request
            text = json.dumps(request, separators=(",", ":"), ensure_ascii=False)
            assert rebuilt["sha256"] == hashlib.sha256(text.encode("utf-8")).hexdigest()
        missing = await client.request(
            "_harness/request/rebuild", {"sessionId": sid, "turn": 0, "step": 7}
        )
        error = missing["error"]
        assert error["code"] == -33006 and error["data"]["reason"] == "rebuild_failed"
        assert "turn 0 step 7" in error["message"]


# -- state, send, cancel ------------------------------------------------------------------


SLOW = SimulatorConfig(reply_tokens=400, token_rate=200.0)
"""A step streams for two seconds: it is live while a test looks at it."""


async def _running(client: RpcClient, sid: str) -> None:
    """Start a turn on `sid` through a live subscription and return once its reply streams."""
    sub = await client.call("_harness/log/subscribe", {"sessionId": sid})
    await client.call(
        "_harness/session/send",
        {"sessionId": sid, "content": _text("go"), "placement": "next_turn"},
    )
    await client.wait_for(
        lambda n: (
            n["method"] == "_harness/log/event"
            and n["params"]["subscription"] == sub["subscription"]
            and n["params"]["event"]["type"] == "assistant/chunk"
        )
    )


async def test_session_state_has_the_open_turn_and_step_the_inbox_and_the_supervisor() -> None:
    async with _gateway(config=SLOW) as (gateway, client):
        sid = await _new(client)
        idle = await client.call("_harness/session/state", {"sessionId": sid})
        path = f"{gateway.runtime.name}/agent:{sid}"
        assert idle == {
            "status": "idle",
            "inbox": {"nextTurn": 0, "nextStep": 0},
            "supervisor": {"path": path, "incarnation": 0},
        }
        await _running(client, sid)
        for placement in ("next_turn", "next_turn"):
            await client.call(
                "_harness/session/send",
                {"sessionId": sid, "content": _text("later"), "placement": placement},
            )
        running = await client.call("_harness/session/state", {"sessionId": sid})
        assert running == {
            "status": "running",
            "turn": 0,
            "step": 0,
            "inbox": {"nextTurn": 2, "nextStep": 0},
            "supervisor": {"path": path, "incarnation": 0},
        }
        await client.call("_harness/session/cancel", {"sessionId": sid, "keepInbox": False})


async def test_send_next_turn_gets_a_turn_next_step_joins_the_live_turn_inject_waits() -> None:
    async with _gateway(config=SLOW) as (gateway, client):
        sid = await _new(client)
        agent = gateway.directory.live_agent(sid)
        assert agent is not None
        # inject: no wake; it joins the next step, which the next turn's first one is.
        answer = await client.call(
            "_harness/session/send",
            {"sessionId": sid, "content": _text("injected"), "placement": "inject"},
        )
        assert answer == {"accepted": True, "placement": "inject"}
        await trio.sleep(0.1)
        state = await client.call("_harness/session/state", {"sessionId": sid})
        assert state["status"] == "idle" and state["inbox"] == {"nextTurn": 0, "nextStep": 1}
        await _running(client, sid)  # a next_turn send
        # next_step: steers the live turn (a second step of turn 0).
        await client.call(
            "_harness/session/send",
            {"sessionId": sid, "content": _text("steered"), "placement": "next_step"},
        )
        await client.call(
            "_harness/session/send",
            {"sessionId": sid, "content": _text("followed up"), "placement": "next_turn"},
        )
        await agent.when_idle()
        events = await _events(gateway, sid)
        assert _position(events, "injected") == (0, 0)
        assert _position(events, "go") == (0, 0)
        assert _position(events, "steered") == (0, 1)
        assert _position(events, "followed up") == (1, 0)


async def test_harness_cancel_says_whether_a_turn_was_cancelled_and_may_drop_the_inbox() -> None:
    async with _gateway(config=SLOW) as (gateway, client):
        sid = await _new(client)
        agent = gateway.directory.live_agent(sid)
        assert agent is not None
        idle = await client.call("_harness/session/cancel", {"sessionId": sid})
        assert idle == {"cancelled": False}
        # keepInbox (default true): queued input stays parked for the next wake.
        await _running(client, sid)
        await client.call(
            "_harness/session/send",
            {"sessionId": sid, "content": _text("kept"), "placement": "next_turn"},
        )
        assert await client.call("_harness/session/cancel", {"sessionId": sid}) == {
            "cancelled": True
        }
        await agent.when_idle()
        state = await client.call("_harness/session/state", {"sessionId": sid})
        assert state["inbox"] == {"nextTurn": 1, "nextStep": 0}
        # keepInbox false: the queued input is dropped with the turn.
        await _running(client, sid)
        await client.call(
            "_harness/session/send",
            {"sessionId": sid, "content": _text("dropped"), "placement": "next_turn"},
        )
        cancelled = await client.call(
            "_harness/session/cancel", {"sessionId": sid, "keepInbox": False}
        )
        assert cancelled == {"cancelled": True}
        await agent.when_idle()
        state = await client.call("_harness/session/state", {"sessionId": sid})
        assert state["inbox"] == {"nextTurn": 0, "nextStep": 0}
        events = await _events(gateway, sid)
        reasons = [event_to_json(e)["data"]["reason"] for e in events if e.type == "turn/end"]
        assert reasons == [{"kind": "aborted", "reason": {"kind": "user"}}] * 2
        texts = json.dumps([event_to_json(e) for e in events])
        assert "kept" in texts and "dropped" not in texts


async def test_unsubscribing_twice_answers_not_found_the_second_time() -> None:
    async with _gateway() as (_, client):
        sid = await _new(client)
        subscribed = await client.call("_harness/log/subscribe", {"sessionId": sid})
        name = subscribed["subscription"]
        assert await client.call("_harness/log/unsubscribe", {"subscription": name}) == {}
        missing = await client.request("_harness/log/unsubscribe", {"subscription": name})
        # As the cluster gateway answers it (tests/cluster/test_router.py).
        assert missing["error"]["code"] == -32002
        assert missing["error"]["data"] == {"reason": "not_found"}
        assert name in missing["error"]["message"]


# -- paging ---------------------------------------------------------------------------


async def test_log_read_pages_by_next_seq_up_to_head_seq() -> None:
    async with _gateway() as (gateway, client):
        sid = await _new(client)
        await client.call("session/prompt", {"sessionId": sid, "prompt": _text("hi")})
        events = [event_to_json(e) for e in await _events(gateway, sid)]
        head = len(events) - 1
        pages, seq = [], 0
        while seq <= head:
            page = await client.call(
                "_harness/log/read", {"sessionId": sid, "fromSeq": seq, "limit": 4}
            )
            assert page["headSeq"] == head and page["nextSeq"] == min(seq + 4, head + 1)
            pages.extend(page["events"])
            seq = page["nextSeq"]
        assert pages == events
        at_head = await client.call("_harness/log/read", {"sessionId": sid, "fromSeq": head + 1})
        assert at_head == {"events": [], "nextSeq": head + 1, "headSeq": head}
        everything = await client.call(
            "_harness/log/read", {"sessionId": sid, "fromSeq": 0, "limit": 1000}
        )
        assert everything["events"] == events
        for limit in (0, 1001):
            refused = await client.request(
                "_harness/log/read", {"sessionId": sid, "fromSeq": 0, "limit": limit}
            )
            assert refused["error"]["code"] == -32602
            assert refused["error"]["data"]["path"] == "/limit"
        beyond = await client.request("_harness/log/read", {"sessionId": sid, "fromSeq": head + 2})
        assert beyond["error"]["data"]["reason"] == "seq_out_of_range"


async def test_session_lists_page_by_next_cursor_and_filter() -> None:
    async with _gateway() as (gateway, client):
        directory = gateway.directory
        ids = [
            (await directory.create(profile="default", owner=None)).session.id for _ in range(101)
        ]
        other = await _new(client, "broken")
        child = await directory.create(profile="default", owner=None, parent=ids[0])
        everyone = [*ids, other, child.session.id]

        acp_rows: list[str] = []
        cursor: str | None = None
        while True:
            page = await client.call("session/list", {} if cursor is None else {"cursor": cursor})
            acp_rows.extend(row["sessionId"] for row in page["sessions"])
            cursor = page.get("nextCursor")
            if cursor is None:
                break
            assert len(page["sessions"]) == 100
        assert acp_rows == everyone
        elsewhere = await client.call("session/list", {"cwd": "/somewhere/else"})
        assert elsewhere["sessions"] == []
        here = await client.call("session/list", {"cwd": gateway.cwd})
        assert len(here["sessions"]) == 100

        harness_rows: list[str] = []
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": 40}
            if cursor is not None:
                params["cursor"] = cursor
            page = await client.call("_harness/sessions/list", params)
            harness_rows.extend(s["sessionId"] for s in page["sessions"])
            cursor = page.get("nextCursor")
            if cursor is None:
                break
        assert harness_rows == everyone
        refused = await client.request("_harness/sessions/list", {"limit": 501})
        assert refused["error"]["data"]["path"] == "/limit"

        async def listed(filter: dict[str, str]) -> list[str]:
            page = await client.call("_harness/sessions/list", {"filter": filter})
            return [s["sessionId"] for s in page["sessions"]]

        assert await listed({"agent": "broken"}) == [other]
        assert await listed({"parentSessionId": ids[0]}) == [child.session.id]
        await client.call("session/close", {"sessionId": ids[1]})
        assert await listed({"status": "stopped"}) == [ids[1]]
        assert len(await listed({"status": "idle"})) == len(everyone) - 1


async def test_session_new_starts_the_named_profile_and_refuses_an_unknown_one() -> None:
    async with _gateway() as (gateway, client):
        sid = await _new(client, "broken")
        agent = gateway.directory.live_agent(sid)
        assert agent is not None and agent.tools.get("broken") is not None
        (summary,) = (await client.call("_harness/sessions/list", {}))["sessions"]
        assert summary["agent"] == "broken"
        answer = await client.request(
            "session/new", {"cwd": "/", "mcpServers": [], "_meta": {"harness": {"agent": "nope"}}}
        )
        error = answer["error"]
        assert error["code"] == -32602 and error["data"]["path"] == "/_meta/harness/agent"
        assert "'nope'" in error["message"] and "'default'" in error["message"]


def _numbered(data: list[Any]) -> list[Event]:
    """`data` as a log's events, numbered from seq 0."""
    return [Event(type=type_of(d), seq=seq, time=0, data=d) for seq, d in enumerate(data)]


def test_a_turn_adopted_before_the_cursor_read_it_streams_only_that_turns_updates() -> None:
    """The agent may report the prompt's turn (`Agent.run`) before the prompt's cursor has read
    the log that far: the turns before it (other prompts') stream nothing to this prompt."""
    claimed: list[int] = []
    cursor = PromptCursor(
        request_id=7,
        session_id="s",
        next_seq=0,
        texts=("mine",),
        claim=lambda turn: claimed.append(turn) is None,
        on_done=lambda: None,
    )
    data = [
        TurnStart(turn=0),
        StepStart(turn=0, step=0),
        UserMessage(content=[TextBlock(text="another prompt")], source=UserSource()),
        AssistantChunk(turn=0, step=0, chunk=TextDelta(text="not for you")),
        TurnEnd(turn=0, reason=TurnEndReason.completed()),
        TurnStart(turn=1),
        StepStart(turn=1, step=0),
        UserMessage(content=[TextBlock(text="mine")], source=UserSource()),
        AssistantChunk(turn=1, step=0, chunk=TextDelta(text="yours")),
        TurnEnd(turn=1, reason=TurnEndReason.completed()),
    ]
    events = _numbered(data)
    assert cursor.adopt(1, LINE_FRAMING) == [] and claimed == [1]
    frames = [json.loads(f) for f in cursor.take(events, len(events) - 1, LINE_FRAMING)]
    assert [f["params"]["update"]["content"]["text"] for f in frames[:-1]] == ["yours"]
    assert frames[-1] == {
        "jsonrpc": "2.0",
        "id": 7,
        "result": {"stopReason": "end_turn", "_meta": {"harness": {"turn": 1}}},
    }


def test_a_cursor_given_a_request_id_takes_the_turn_whose_message_carries_it() -> None:
    """A cluster node's prompt is found by its request id: another prompt with the same text
    that started earlier is not its turn."""
    claimed: list[int] = []
    cursor = PromptCursor(
        request_id=8,
        session_id="s",
        next_seq=0,
        texts=("same",),
        claim=lambda turn: claimed.append(turn) is None,
        on_done=lambda: None,
        message_request_id="req-b",
    )
    data = [
        TurnStart(turn=0),
        StepStart(turn=0, step=0),
        UserMessage(content=[TextBlock(text="same")], source=UserSource(request_id="req-a")),
        AssistantChunk(turn=0, step=0, chunk=TextDelta(text="for a")),
        TurnEnd(turn=0, reason=TurnEndReason.completed()),
        TurnStart(turn=1),
        StepStart(turn=1, step=0),
        UserMessage(content=[TextBlock(text="same")], source=UserSource(request_id="req-b")),
        AssistantChunk(turn=1, step=0, chunk=TextDelta(text="for b")),
        TurnEnd(turn=1, reason=TurnEndReason.completed()),
    ]
    events = _numbered(data)
    frames = [json.loads(f) for f in cursor.take(events, len(events) - 1, LINE_FRAMING)]
    assert claimed == [1]
    assert [f["params"]["update"]["content"]["text"] for f in frames[:-1]] == ["for b"]
    assert frames[-1]["result"]["_meta"] == {"harness": {"turn": 1}}


@pytest.mark.parametrize("node", [False, True], ids=["gateway", "cluster-node"])
async def test_a_send_to_a_full_inbox_is_answered_overloaded_and_the_connection_stays(
    node: bool,
) -> None:
    async with _gateway() as (gateway, client):
        if node:  # a cluster node's send: with a request id, logged once
            gateway.methods = MethodTable(methods=NODE_METHODS)
        sid = await _new(client)
        agent = gateway.directory.live_agent(sid)
        assert agent is not None
        for index in range(INBOX_CAPACITY):
            agent.inject(f"parked {index}")
        send: dict[str, Any] = {
            "sessionId": sid,
            "content": _text("one more"),
            "placement": "inject",
        }
        if node:
            send["_meta"] = {"harness": {"requestId": "send-1"}}
        answer = await client.request("_harness/session/send", send)
        assert answer["error"]["code"] == -33003
        assert answer["error"]["data"] == {"reason": "overloaded", "retryAfterMs": 1000}
        assert "result" in await client.request("_harness/stats")


async def test_two_prompts_racing_a_stopped_sessions_start_leave_one_waiting() -> None:
    async with _gateway() as (gateway, client):
        sid = await _new(client)
        await client.call("session/close", {"sessionId": sid})
        assert gateway.directory.live_agent(sid) is None
        params = {"sessionId": sid, "prompt": _text("hi")}
        # Both arrive while the session's agent is still starting for the first.
        for rpc_id in ("p1", "p2"):
            request = {"jsonrpc": "2.0", "id": rpc_id, "method": "session/prompt"}
            await client.send({**request, "params": params})
        first, second = await client.answer("p1"), await client.answer("p2")
        answers = sorted([first, second], key=lambda a: "error" in a)
        assert answers[0]["result"]["stopReason"] == "end_turn"
        assert answers[1]["error"]["code"] == -33002
        assert gateway._claims.get(sid, set()) == set()  # no turn left claimed
