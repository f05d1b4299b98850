"""The retry policy and request-error listeners."""

from __future__ import annotations

import random

import pytest
import trio

from actors.agent import AgentOptions, Retry, RetryPolicy, open_agent
from actors.prompt import SystemPrompt
from actors.providers import Failure, Reply, ScriptedProvider
from tests.agent.helpers import data_of, turn_end_kinds

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
