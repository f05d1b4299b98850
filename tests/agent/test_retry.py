"""The retry policy and request-error listeners."""

from __future__ import annotations

import random
from collections.abc import AsyncGenerator
from contextlib import aclosing

import pytest
import trio

import actors.agent.loop as loop_module
from actors.agent import AgentOptions, Retry, RetryPolicy, open_agent
from actors.prompt import PromptAssembly, PromptSection, SystemPrompt, render_prompt
from actors.providers import (
    Chunk,
    Failure,
    FinishChunk,
    GenerateRequest,
    Reply,
    ScriptedProvider,
    TextDelta,
)
from tests.agent.helpers import compact_surface, data_of, request_texts, turn_end_kinds, types

RETRYABLE = Failure(code="overloaded", retryable=True)


def test_non_retryable_failures_are_not_retried() -> None:
    policy = RetryPolicy()
    assert policy.delay_ms(Failure(code="bad_request"), 0, random.Random(1)) is None


def test_max_retries_bounds_the_attempts() -> None:
    policy = RetryPolicy(max_retries=2)
    rng = random.Random(1)
    assert policy.delay_ms(RETRYABLE, 1, rng) is not None
    assert policy.delay_ms(RETRYABLE, 2, rng) is None


@pytest.mark.parametrize("attempt", range(8))
def test_backoff_is_exponential_capped_and_jittered_within_bounds(attempt: int) -> None:
    policy = RetryPolicy(max_retries=10, base_delay_ms=100, max_delay_ms=2_000, jitter=0.2)
    nominal = min(2_000, 100 * 2**attempt)
    for seed in range(50):
        delay = policy.delay_ms(RETRYABLE, attempt, random.Random(seed))
        assert delay is not None
        assert nominal * 0.8 - 1 <= delay <= nominal * 1.2 + 1


def test_retry_after_is_honoured_up_to_its_cap() -> None:
    policy = RetryPolicy(max_retry_after_ms=5_000)
    rng = random.Random(0)
    hinted = Failure(code="rate_limited", retryable=True, retry_after_ms=1_234)
    assert policy.delay_ms(hinted, 0, rng) == 1_234
    huge = Failure(code="rate_limited", retryable=True, retry_after_ms=90_000)
    assert policy.delay_ms(huge, 0, rng) == 5_000


async def test_retries_wait_the_policy_delay_and_are_logged(autojump_clock: trio.abc.Clock) -> None:
    provider = ScriptedProvider(
        [
            Reply.failure("rate_limited", "slow down", retryable=True, retry_after_ms=2_000),
            Reply.failure("overloaded", retryable=True),
            Reply.text("finally"),
        ]
    )
    options = AgentOptions(
        model="m", retry=RetryPolicy(max_retries=2, base_delay_ms=1_000, jitter=0)
    )
    start = trio.current_time()
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, options=options
    ) as agent:
        agent.followup("hi")
        await agent.when_idle()
    retries = data_of(agent.session, "request/retry")
    assert [(r.attempt, r.delay_ms) for r in retries] == [(0, 2_000), (1, 2_000)]
    assert trio.current_time() - start == pytest.approx(4.0)
    assert turn_end_kinds(agent.session) == ["completed"]
    assert len(data_of(agent.session, "assistant/message")) == 1


async def test_giving_up_after_max_retries_ends_the_turn_with_the_last_failure(
    autojump_clock: trio.abc.Clock,
) -> None:
    provider = ScriptedProvider([Reply.failure("overloaded", "busy", retryable=True)] * 3)
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("hi")
        await agent.when_idle()
    assert len(provider.requests) == 3
    assert len(data_of(agent.session, "request/retry")) == 2
    assert data_of(agent.session, "turn/end")[0].reason.error.code == "overloaded"


async def test_cancel_during_a_retry_wait_aborts_promptly(autojump_clock: trio.abc.Clock) -> None:
    provider = ScriptedProvider(
        [Reply.failure("rate_limited", retryable=True, retry_after_ms=50_000), Reply.text("x")]
    )
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("hi")
        await trio.testing.wait_all_tasks_blocked()
        start = trio.current_time()
        agent.cancel()
        await agent.when_idle()
        assert trio.current_time() - start < 1
    assert turn_end_kinds(agent.session) == ["aborted"]
    assert len(provider.requests) == 1


async def test_request_error_listener_is_consulted_before_the_policy(
    autojump_clock: trio.abc.Clock,
) -> None:
    seen: list[tuple[str, int]] = []

    async def retry_once_more(failure: Failure, attempt: int) -> Retry | None:
        seen.append((failure.code, attempt))
        return Retry(delay_ms=10) if attempt == 0 else None

    provider = ScriptedProvider([Reply.failure("bad_request", status=400), Reply.text("ok")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.on_request_error(retry_once_more)
        agent.followup("hi")
        await agent.when_idle()
    assert seen == [("bad_request", 0)]
    assert data_of(agent.session, "request/retry")[0].delay_ms == 10
    assert turn_end_kinds(agent.session) == ["completed"]


async def test_failed_attempt_keeps_its_chunks_but_gets_no_assistant_message() -> None:
    provider = ScriptedProvider([Reply.failure("overloaded", retryable=True), Reply.text("ok")])
    options = AgentOptions(model="m", retry=RetryPolicy(base_delay_ms=0))
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, options=options
    ) as agent:
        agent.followup("hi")
        await agent.when_idle()
    chunks = data_of(agent.session, "assistant/chunk")
    assert chunks[0].chunk.reason == "error"
    assert len(data_of(agent.session, "assistant/message")) == 1


def test_jitter_spreads_the_backoff_delay() -> None:
    policy = RetryPolicy(base_delay_ms=1_000, jitter=0.2)
    delays = {policy.delay_ms(RETRYABLE, 0, random.Random(seed)) for seed in range(20)}
    assert len(delays) > 10


def test_zero_jitter_gives_the_nominal_backoff() -> None:
    policy = RetryPolicy(max_retries=5, base_delay_ms=100, max_delay_ms=1_000, jitter=0)
    rng = random.Random(0)
    assert [policy.delay_ms(RETRYABLE, a, rng) for a in range(5)] == [100, 200, 400, 800, 1_000]


async def test_loop_backs_off_exponentially_between_attempts(
    autojump_clock: trio.abc.Clock,
) -> None:
    provider = ScriptedProvider(
        [
            Reply.failure("overloaded", retryable=True),
            Reply.failure("overloaded", retryable=True),
            Reply.text("ok"),
        ]
    )
    options = AgentOptions(model="m", retry=RetryPolicy(base_delay_ms=1_000, jitter=0))
    start = trio.current_time()
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, options=options
    ) as agent:
        agent.followup("hi")
        await agent.when_idle()
    assert [r.delay_ms for r in data_of(agent.session, "request/retry")] == [1_000, 2_000]
    assert trio.current_time() - start == pytest.approx(3.0)


async def test_retry_is_logged_inside_the_open_step_between_the_attempts() -> None:
    provider = ScriptedProvider([Reply.failure("overloaded", retryable=True), Reply.text("ok")])
    options = AgentOptions(model="m", retry=RetryPolicy(base_delay_ms=0))
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, options=options
    ) as agent:
        agent.followup("hi")
        await agent.when_idle()
    assert types(agent.session) == [
        "turn/start",
        "step/start",
        "user/message",
        "request/header",
        "assistant/chunk",
        "request/retry",
        "assistant/chunk",
        "assistant/chunk",
        "assistant/message",
        "step/end",
        "turn/end",
    ]


async def test_request_error_listener_sees_each_failed_attempt_0_based(
    autojump_clock: trio.abc.Clock,
) -> None:
    seen: list[int] = []

    async def spy(failure: Failure, attempt: int) -> Retry | None:
        seen.append(attempt)
        return None

    provider = ScriptedProvider([Reply.failure("overloaded", retryable=True)] * 3)
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.on_request_error(spy)
        agent.followup("hi")
        await agent.when_idle()
    assert seen == [0, 1, 2]
    assert [r.attempt for r in data_of(agent.session, "request/retry")] == [0, 1]


async def test_disposed_request_error_listener_is_no_longer_consulted() -> None:
    calls: list[int] = []

    async def always_retry(failure: Failure, attempt: int) -> Retry | None:
        calls.append(attempt)
        return Retry(delay_ms=0)

    provider = ScriptedProvider([Reply.failure("bad_request", status=400)])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.on_request_error(always_retry).dispose()
        agent.followup("hi")
        await agent.when_idle()
    assert calls == []
    assert turn_end_kinds(agent.session) == ["error"]


async def test_disposal_during_a_retry_wait_aborts_disposed(
    autojump_clock: trio.abc.Clock,
) -> None:
    provider = ScriptedProvider(
        [Reply.failure("rate_limited", retryable=True, retry_after_ms=50_000), Reply.text("x")]
    )
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("hi")
        await trio.sleep(1)
        start = trio.current_time()
    assert trio.current_time() - start < 1
    end = data_of(agent.session, "turn/end")[0]
    assert end.reason.reason is not None and end.reason.reason.kind == "disposed"
    assert len(provider.requests) == 1


async def test_retry_reuses_the_step_assembly_when_the_prompt_changes_during_the_wait(
    autojump_clock: trio.abc.Clock,
) -> None:
    prompt = SystemPrompt(persona="p")
    provider = ScriptedProvider(
        [Reply.failure("overloaded", retryable=True), Reply.text("a"), Reply.text("b")]
    )
    options = AgentOptions(model="m", retry=RetryPolicy(base_delay_ms=1_000, jitter=0))
    async with open_agent(system_prompt=prompt, provider=provider, options=options) as agent:
        agent.followup("one")
        await trio.sleep(0.5)
        prompt.section(PromptSection(name="late", order=50, text="Late rule."))
        await agent.when_idle()
        agent.followup("two")
        await agent.when_idle()
    systems = [r.system or "" for r in provider.requests]
    assert systems[0] == systems[1]
    assert systems[2].endswith("Late rule.")
    assert [h.reason for h in data_of(agent.session, "request/header")] == ["initial", "change"]


async def test_retry_request_carries_history_appended_during_the_wait(
    autojump_clock: trio.abc.Clock,
) -> None:
    provider = ScriptedProvider([Reply.failure("overloaded", retryable=True), Reply.text("ok")])
    options = AgentOptions(model="m", retry=RetryPolicy(base_delay_ms=1_000, jitter=0))
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, options=options
    ) as agent:
        agent.followup("hi")
        await trio.sleep(0.5)
        await compact_surface(agent.session, "summary")
        await agent.when_idle()
    assert request_texts(provider.requests[0]) == ["hi"]
    assert request_texts(provider.requests[1]) == ["summary"]
    assert {(r.turn, r.step) for r in data_of(agent.session, "request/retry")} == {(0, 0)}


async def test_system_text_is_rendered_once_per_step_across_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rendered: list[str] = []

    def counting_render(assembly: PromptAssembly) -> str:
        text = render_prompt(assembly)
        rendered.append(text)
        return text

    monkeypatch.setattr(loop_module, "render_prompt", counting_render)
    provider = ScriptedProvider(
        [Reply.failure("overloaded", retryable=True)] * 2 + [Reply.text("ok")]
    )
    options = AgentOptions(model="m", retry=RetryPolicy(base_delay_ms=0))
    async with open_agent(
        system_prompt=SystemPrompt(persona="p"), provider=provider, options=options
    ) as agent:
        agent.followup("hi")
        await agent.when_idle()
    assert len(provider.requests) == 3
    assert len(rendered) == 1


async def test_failed_attempt_after_streamed_text_gets_no_assistant_message() -> None:
    class FailsMidAnswer(ScriptedProvider):
        async def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
            if not self.requests:
                self.requests.append(request)
                yield TextDelta(text="half")
                yield FinishChunk(
                    reason="error", failure=Failure(code="overloaded", retryable=True)
                )
                return
            async with aclosing(super().stream(request)) as chunks:
                async for chunk in chunks:
                    yield chunk

    provider = FailsMidAnswer([Reply.text("whole")])
    options = AgentOptions(model="m", retry=RetryPolicy(base_delay_ms=0))
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, options=options
    ) as agent:
        agent.followup("hi")
        await agent.when_idle()
    messages = data_of(agent.session, "assistant/message")
    assert [m.message.text for m in messages] == ["whole"]
    assert data_of(agent.session, "assistant/chunk")[0].chunk == TextDelta(text="half")
    assert request_texts(provider.requests[1]) == ["hi"]
