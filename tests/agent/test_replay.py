"""Every request the provider received can be rebuilt, byte for byte, from the log alone."""

from __future__ import annotations

import json

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.agent import AgentOptions, RetryPolicy, Tool, open_agent
from actors.prompt import PromptContext, PromptSection, SystemPrompt
from actors.providers import GenerateRequest, Reply, ScriptedProvider, ToolCall
from actors.session import SessionError, rebuild_request, request_attempts
from tests.agent.helpers import FlushHookStore, compact_surface


async def noop(arguments: dict[str, object] | str, call: object) -> str:
    return f"ran with {arguments}"


TOOLS = [
    Tool(name=n, description=f"tool {n}", parameters={"type": "object"}, execute=noop)
    for n in ("alpha", "beta")
]


def dump(request: GenerateRequest) -> str:
    return json.dumps(request.to_json(), separators=(",", ":"))


def reply_strategy() -> st.SearchStrategy[list[Reply]]:
    text = st.text(min_size=1, max_size=12)
    call = st.builds(
        lambda i, n, a: ToolCall(id=f"c{i}", name=n, arguments=json.dumps({"v": a})),
        st.integers(0, 999),
        st.sampled_from(["alpha", "beta", "missing"]),
        st.integers(),
    )
    plain = text.map(Reply.text)
    tools = st.tuples(st.lists(call, min_size=1, max_size=3, unique_by=lambda c: c.id), text).map(
        lambda pair: [Reply.tool_calls(pair[0]), Reply.text(pair[1])]
    )
    failure_then_text = text.map(
        lambda t: [Reply.failure("overloaded", retryable=True), Reply.text(t)]
    )
    one_turn = st.one_of(plain.map(lambda r: [r]), tools, failure_then_text)
    return st.lists(one_turn, min_size=1, max_size=4).map(
        lambda turns: [r for t in turns for r in t]
    )


def attempts_by_step(events: list[dict[str, object]]) -> list[tuple[int, int, int]]:
    """(turn, step, attempt) for every request, in the order they were sent."""
    out: list[tuple[int, int, int]] = []
    current: tuple[int, int] | None = None
    attempt = 0
    for event in events:
        data = event["data"]
        assert isinstance(data, dict)
        if event["type"] == "step/start":
            current, attempt = (data["turn"], data["step"]), 0
            out.append((*current, attempt))
        elif event["type"] == "request/retry":
            assert current is not None
            attempt += 1
            out.append((*current, attempt))
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=reply_strategy(), changes=st.lists(st.booleans(), min_size=4, max_size=4))
def test_rebuild_request_equals_what_the_provider_received(
    script: list[Reply], changes: list[bool]
) -> None:
    async def main() -> None:
        prompt = SystemPrompt(persona="You are {{model}}.")
        policy = {"value": "read-only"}
        prompt.context(
            PromptContext(name="sandbox:policy", order=110, text=lambda ctx: policy["value"])
        )
        provider = ScriptedProvider(script)
        options = AgentOptions(model="m", retry=RetryPolicy(base_delay_ms=0, jitter=0))
        turns = sum(1 for r in script if r.kind != "failure" and r.kind != "tool-calls")
        async with open_agent(
            system_prompt=prompt, provider=provider, options=options, tools=TOOLS
        ) as agent:
            for index in range(turns):
                if changes[index % 4]:
                    policy["value"] = f"mode {index}"
                if index == 2:
                    prompt.section(PromptSection(name="late", order=50, text="Late rule."))
                agent.followup(f"turn {index}")
                await agent.when_idle()
        events = json.loads(json.dumps(agent.session.to_json()))
        sent = attempts_by_step(events)
        assert len(sent) == len(provider.requests)
        assert request_attempts(events) == sent
        for (turn, step, attempt), received in zip(sent, provider.requests, strict=True):
            assert dump(rebuild_request(events, turn, step, attempt)) == dump(received)
        last_turn, last_step, _ = sent[-1]
        assert dump(rebuild_request(events, last_turn, last_step)) == dump(provider.requests[-1])

    trio.run(main)


async def test_rebuild_refuses_a_step_whose_system_text_never_rendered() -> None:
    prompt = SystemPrompt(persona="{{missing}}")
    async with open_agent(
        system_prompt=prompt, provider=ScriptedProvider([Reply.text("x")])
    ) as agent:
        agent.followup("hi")
        await agent.when_idle()
    with pytest.raises(SessionError, match="failed to render"):
        rebuild_request(agent.session.to_json(), 0, 0)


async def test_rebuild_names_a_missing_step_or_attempt() -> None:
    async with open_agent(
        system_prompt=SystemPrompt(), provider=ScriptedProvider([Reply.text("x")])
    ) as agent:
        agent.followup("hi")
        await agent.when_idle()
    events = agent.session.to_json()
    with pytest.raises(SessionError, match="no step 3 in turn 0"):
        rebuild_request(events, 0, 3)
    with pytest.raises(SessionError, match="attempt 1 does not exist"):
        rebuild_request(events, 0, 0, 1)


async def test_rebuild_matches_every_step_through_aborts_compaction_and_tool_changes() -> None:
    async def forever(arguments: dict[str, object] | str, call: object) -> str:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    tools = [*TOOLS, Tool(name="wait", description="d", parameters={}, execute=forever)]
    prompt = SystemPrompt(persona="You are {{model}}.")
    policy = {"value": "read-only"}
    prompt.context(PromptContext(name="policy", order=110, text=lambda ctx: policy["value"]))
    provider = ScriptedProvider(
        [
            Reply.hang("partial"),
            Reply.tool_calls([ToolCall(id="w", name="wait"), ToolCall(id="a", name="alpha")]),
            Reply.max_tokens("cut o"),
            Reply.text("thought through", reasoning="thinking"),
            Reply.text("final"),
        ]
    )
    async with open_agent(system_prompt=prompt, provider=provider, tools=tools) as agent:
        for index in range(5):
            if index == 2:
                policy["value"] = ""
            if index == 3:
                await compact_surface(agent.session)
                policy["value"] = "workspace-write"
            if index == 4:
                agent.tools.add(Tool(name="late", description="d", parameters={}, execute=noop))
            agent.followup(f"turn {index}")
            if index < 2:
                await trio.testing.wait_all_tasks_blocked()
                agent.cancel()
            await agent.when_idle()
    events = json.loads(json.dumps(agent.session.to_json()))
    assert [e["data"]["reason"]["kind"] for e in events if e["type"] == "turn/end"] == [
        "aborted",
        "aborted",
        "max-tokens",
        "completed",
        "completed",
    ]
    sent = attempts_by_step(events)
    assert len(sent) == len(provider.requests) == 5
    for (turn, step, attempt), received in zip(sent, provider.requests, strict=True):
        assert dump(rebuild_request(events, turn, step, attempt)) == dump(received)


async def test_rebuild_accepts_event_objects_as_well_as_json() -> None:
    provider = ScriptedProvider([Reply.text("a")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("hi")
        await agent.when_idle()
    assert dump(rebuild_request(agent.session.events, 0, 0)) == dump(provider.requests[0])


async def test_request_json_omits_empty_system_and_tools() -> None:
    prompt = SystemPrompt(include_harness_identity=False)
    provider = ScriptedProvider([Reply.text("a")])
    async with open_agent(system_prompt=prompt, provider=provider) as agent:
        agent.followup("hi")
        await agent.when_idle()
    sent = provider.requests[0].to_json()
    assert list(sent) == ["config", "messages"]
    assert sent["config"] == {"provider": "default", "model": "m"}
    header = agent.session.to_json()[3]
    assert header["data"] == {
        "header": {"config": {"provider": "default", "model": "m"}},
        "reason": "initial",
    }
    assert rebuild_request(agent.session.to_json(), 0, 0).to_json() == sent


async def test_request_json_keys_come_in_the_documented_order() -> None:
    provider = ScriptedProvider([Reply.text("a")])
    options = AgentOptions(model="m", provider_name="p", max_tokens=5, temperature=0.5)
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, options=options, tools=TOOLS
    ) as agent:
        agent.followup("hi")
        await agent.when_idle()
    sent = provider.requests[0].to_json()
    assert list(sent) == ["config", "system", "tools", "messages"]
    assert list(sent["config"]) == ["provider", "model", "max_tokens", "temperature"]
    assert sent["tools"][0] == {
        "name": "alpha",
        "description": "tool alpha",
        "parameters": {"type": "object"},
    }


async def test_rebuild_of_a_retry_includes_history_appended_during_the_wait(
    autojump_clock: trio.abc.Clock,
) -> None:
    provider = ScriptedProvider([Reply.failure("overloaded", retryable=True), Reply.text("ok")])
    options = AgentOptions(model="m", retry=RetryPolicy(base_delay_ms=1_000, jitter=0))
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, options=options
    ) as agent:
        agent.followup("hi")
        await trio.sleep(0.5)
        await compact_surface(agent.session)
        await agent.when_idle()
    events = agent.session.to_json()
    assert dump(rebuild_request(events, 0, 0, 1)) == dump(provider.requests[1])


async def test_history_appended_during_the_flush_is_neither_sent_nor_rebuilt() -> None:
    store = FlushHookStore()
    provider = ScriptedProvider([Reply.text("ok")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider, store=store) as agent:
        store.before_flush = lambda: compact_surface(agent.session)
        agent.followup("hi")
        await agent.when_idle()
    assert [m.text for m in provider.requests[0].messages] == ["hi"]
    assert dump(rebuild_request(agent.session.to_json(), 0, 0)) == dump(provider.requests[0])
    assert agent.session.derive_messages()[0].text == "Summary of earlier work."


async def test_rebuild_refuses_an_attempt_cancelled_during_its_retry_wait(
    autojump_clock: trio.abc.Clock,
) -> None:
    provider = ScriptedProvider(
        [Reply.failure("rate_limited", retryable=True, retry_after_ms=10_000)]
    )
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("hi")
        await trio.sleep(1)
        agent.cancel()
        await agent.when_idle()
    assert len(provider.requests) == 1
    with pytest.raises(SessionError, match="attempt 1 does not exist"):
        rebuild_request(agent.session.to_json(), 0, 0, 1)


async def test_request_attempts_leave_out_a_step_whose_system_text_never_rendered() -> None:
    prompt = SystemPrompt(persona="{{missing}}")
    provider = ScriptedProvider([Reply.text("x")])
    async with open_agent(system_prompt=prompt, provider=provider) as agent:
        agent.followup("hi")
        await agent.when_idle()
    assert request_attempts(agent.session.to_json()) == []
    assert provider.requests == []
