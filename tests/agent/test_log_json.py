"""`session.to_json()` spells every event exactly as DESIGN §8 does."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from actors.agent import AgentOptions, Reject, RetryPolicy, StepProposal, Tool, open_agent
from actors.agent.decisions import PreStepNext, StepDecision
from actors.agent.projection import TOMBSTONE_TEXT
from actors.prompt import PromptContext, SystemPrompt
from actors.providers import Reply, ScriptedProvider, ToolCall, Usage
from actors.session import MemoryStore, Session
from actors.session.events import StepStart, TurnStart

CONFIG = {"provider": "default", "model": "m"}


def without_time(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    assert all(isinstance(e["time"], int) for e in events)
    return [{k: v for k, v in e.items() if k != "time"} for e in events]


async def test_a_tool_step_and_its_answer_are_written_exactly() -> None:
    async def explode(arguments: dict[str, object] | str, call: object) -> str:
        raise ValueError("bad path")

    tool = Tool(name="read", description="Read.", parameters={"type": "object"}, execute=explode)
    provider = ScriptedProvider(
        [
            Reply.tool_calls(
                [ToolCall(id="c1", name="read", arguments='{"p": "x"}')],
                text="t",
                usage=Usage(input_tokens=3, output_tokens=1, cache_read_tokens=2),
            ),
            Reply.text("done"),
        ]
    )
    prompt = SystemPrompt(include_harness_identity=False, persona="P")
    async with open_agent(system_prompt=prompt, provider=provider, tools=[tool]) as agent:
        agent.followup("hi")
        await agent.when_idle()
    usage = {"input_tokens": 3, "output_tokens": 1, "cache_read_tokens": 2}
    call = {"type": "tool-call", "id": "c1", "name": "read", "arguments": '{"p": "x"}'}
    assert without_time(agent.session.to_json()) == [
        {"type": "turn/start", "seq": 0, "data": {"turn": 0}},
        {"type": "step/start", "seq": 1, "data": {"turn": 0, "step": 0}},
        {
            "type": "user/message",
            "seq": 2,
            "data": {"content": [{"type": "text", "text": "hi"}], "source": {"kind": "user"}},
        },
        {
            "type": "request/header",
            "seq": 3,
            "data": {
                "header": {
                    "config": CONFIG,
                    "system": "P",
                    "tools": [
                        {"name": "read", "description": "Read.", "parameters": {"type": "object"}}
                    ],
                },
                "reason": "initial",
            },
        },
        {
            "type": "assistant/chunk",
            "seq": 4,
            "data": {"turn": 0, "step": 0, "chunk": {"type": "text", "text": "t"}},
        },
        {
            "type": "assistant/chunk",
            "seq": 5,
            "data": {
                "turn": 0,
                "step": 0,
                "chunk": {
                    "type": "tool-call-delta",
                    "index": 0,
                    "id": "c1",
                    "name": "read",
                    "arguments": '{"p": "x"}',
                },
            },
        },
        {
            "type": "assistant/chunk",
            "seq": 6,
            "data": {"turn": 0, "step": 0, "chunk": {"type": "usage", "usage": usage}},
        },
        {
            "type": "assistant/chunk",
            "seq": 7,
            "data": {"turn": 0, "step": 0, "chunk": {"type": "finish", "reason": "tool-calls"}},
        },
        {
            "type": "assistant/message",
            "seq": 8,
            "data": {
                "turn": 0,
                "step": 0,
                "message": {"role": "assistant", "content": [{"type": "text", "text": "t"}, call]},
                "usage": usage,
            },
        },
        {
            "type": "tool/call",
            "seq": 9,
            "data": {
                "turn": 0,
                "step": 0,
                "call_id": "c1",
                "name": "read",
                "arguments": '{"p": "x"}',
            },
        },
        {
            "type": "tool/result",
            "seq": 10,
            "data": {
                "turn": 0,
                "step": 0,
                "call_id": "c1",
                "content": "bad path",
                "is_error": True,
                "error": {"name": "ValueError", "code": "tool_error"},
            },
        },
        {"type": "step/end", "seq": 11, "data": {"turn": 0, "step": 0}},
        {"type": "step/start", "seq": 12, "data": {"turn": 0, "step": 1}},
        {
            "type": "assistant/chunk",
            "seq": 13,
            "data": {"turn": 0, "step": 1, "chunk": {"type": "text", "text": "done"}},
        },
        {
            "type": "assistant/chunk",
            "seq": 14,
            "data": {"turn": 0, "step": 1, "chunk": {"type": "finish", "reason": "completed"}},
        },
        {
            "type": "assistant/message",
            "seq": 15,
            "data": {
                "turn": 0,
                "step": 1,
                "message": {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
            },
        },
        {"type": "step/end", "seq": 16, "data": {"turn": 0, "step": 1}},
        {"type": "turn/end", "seq": 17, "data": {"turn": 0, "reason": {"kind": "completed"}}},
    ]


async def test_a_successful_tool_result_has_no_error_field() -> None:
    async def ok(arguments: dict[str, object] | str, call: object) -> str:
        return "fine"

    tool = Tool(name="ok", description="d", parameters={}, execute=ok)
    provider = ScriptedProvider([Reply.tool_calls([ToolCall(id="1", name="ok")]), Reply.text("x")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider, tools=[tool]) as agent:
        agent.followup("go")
        await agent.when_idle()
    (result,) = [e["data"] for e in agent.session.to_json() if e["type"] == "tool/result"]
    assert result == {"turn": 0, "step": 0, "call_id": "1", "content": "fine", "is_error": False}


async def test_request_retry_is_written_with_its_failure(autojump_clock: trio.abc.Clock) -> None:
    provider = ScriptedProvider(
        [
            Reply.failure("rate_limited", "slow", retryable=True, status=429, retry_after_ms=100),
            Reply.text("ok"),
        ]
    )
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("hi")
        await agent.when_idle()
    (retry,) = [e["data"] for e in agent.session.to_json() if e["type"] == "request/retry"]
    assert {k: v for k, v in retry.items() if k != "failure"} == {
        "turn": 0,
        "step": 0,
        "attempt": 0,
        "delay_ms": 100,
    }
    assert retry["failure"] == {
        "code": "rate_limited",
        "message": "slow",
        "status": 429,
        "retry_after_ms": 100,
        "retryable": True,
    }


async def test_runtime_context_snapshot_and_tombstone_sources_are_written_exactly() -> None:
    prompt = SystemPrompt()
    registration = prompt.context(PromptContext(name="sandbox:policy", order=110, text="ro"))
    provider = ScriptedProvider([Reply.text("a"), Reply.text("b")])
    async with open_agent(system_prompt=prompt, provider=provider) as agent:
        agent.followup("one")
        await agent.when_idle()
        registration.dispose()
        agent.followup("two")
        await agent.when_idle()
    plugin = [
        e["data"]
        for e in agent.session.to_json()
        if e["type"] == "user/message" and e["data"]["source"]["kind"] == "plugin"
    ]
    assert plugin[0]["source"] == {
        "kind": "plugin",
        "plugin": "runtime-context",
        "form": "snapshot",
        "sections": ["sandbox:policy"],
    }
    assert plugin[1] == {
        "content": [{"type": "text", "text": TOMBSTONE_TEXT}],
        "source": {"kind": "plugin", "plugin": "runtime-context"},
    }


async def test_an_interrupted_answer_is_written_with_interrupted_true() -> None:
    provider = ScriptedProvider([Reply.hang("half")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("hi")
        await trio.testing.wait_all_tasks_blocked()
        agent.cancel()
        await agent.when_idle()
    (message,) = [e["data"] for e in agent.session.to_json() if e["type"] == "assistant/message"]
    assert message == {
        "turn": 0,
        "step": 0,
        "message": {"role": "assistant", "content": [{"type": "text", "text": "half"}]},
        "interrupted": True,
    }


async def test_a_reasoning_block_is_written_before_the_text() -> None:
    provider = ScriptedProvider([Reply.text("answer", reasoning="thinking")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("hi")
        await agent.when_idle()
    (message,) = [e["data"] for e in agent.session.to_json() if e["type"] == "assistant/message"]
    assert message["message"]["content"] == [
        {"type": "reasoning", "text": "thinking"},
        {"type": "text", "text": "answer"},
    ]


async def _reject(proposal: StepProposal, next: PreStepNext) -> StepDecision:
    return Reject()


async def _end_reason(scenario: str) -> dict[str, Any]:
    store = MemoryStore()
    replies = {
        "completed": [Reply.text("a")],
        "blocked": [Reply.text("never")],
        "max-tokens": [Reply.max_tokens("cut")],
        "error": [
            Reply.failure("rate_limited", "slow down", retryable=True, status=429, retry_after_ms=5)
        ],
        "aborted-user": [Reply.hang()],
        "aborted-disposed": [Reply.hang()],
    }
    if scenario == "interrupted":
        crashed = await Session.create(store, "s")
        await crashed.append(TurnStart(turn=0))
        await crashed.append(StepStart(turn=0, step=0))
        loaded = await Session.load(store, "s")
        return loaded.to_json()[-1]["data"]["reason"]
    options = AgentOptions(model="m", retry=RetryPolicy(max_retries=0))
    async with open_agent(
        system_prompt=SystemPrompt(), provider=ScriptedProvider(replies[scenario]), options=options
    ) as agent:
        if scenario == "blocked":
            agent.on_pre_step(_reject)
        agent.followup("hi")
        await trio.testing.wait_all_tasks_blocked()
        if scenario == "aborted-user":
            agent.cancel()
        if scenario != "aborted-disposed":
            await agent.when_idle()
    return agent.session.to_json()[-1]["data"]["reason"]


@pytest.mark.parametrize(
    ("scenario", "expected"),
    [
        ("completed", {"kind": "completed"}),
        ("blocked", {"kind": "blocked"}),
        ("max-tokens", {"kind": "max-tokens"}),
        ("interrupted", {"kind": "interrupted"}),
        ("aborted-user", {"kind": "aborted", "reason": {"kind": "user"}}),
        ("aborted-disposed", {"kind": "aborted", "reason": {"kind": "disposed"}}),
        (
            "error",
            {
                "kind": "error",
                "error": {
                    "message": "slow down",
                    "code": "rate_limited",
                    "status": 429,
                    "retry_after_ms": 5,
                },
            },
        ),
    ],
)
async def test_turn_end_reason_is_written_exactly(scenario: str, expected: dict[str, Any]) -> None:
    assert await _end_reason(scenario) == expected
