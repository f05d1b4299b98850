"""Compaction: one summary for the oldest turns, logged, rebuildable, and cache-friendly."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from actors.agent import AgentOptions, TurnFailedError, open_agent
from actors.agent.projection import is_runtime_context
from actors.context import (
    COMPACTION_PLUGIN,
    SUMMARY_FORM,
    Compaction,
    ContextPluginError,
    compactions,
    rebuild_compaction_request,
)
from actors.context.compaction import (
    PromptSize,
    default_threshold,
    header_chars,
    message_chars,
)
from actors.messages import PluginSource
from actors.prompt import PromptContext, SystemPrompt
from actors.providers import GenerateRequest, Reply, ScriptedProvider, ToolCall, Usage
from actors.session import rebuild_request, request_attempts
from actors.session.codec import event_from_json
from actors.session.events import CompactionEnded, CompactionRequested, UserMessage
from benchmarks.compaction_cache import Workload, is_summary_request, run_workload
from tests.agent.helpers import data_of, turn_end_kinds

LOW_THRESHOLD = 1000


def dump(request: GenerateRequest) -> str:
    return json.dumps(request.to_json(), separators=(",", ":"), ensure_ascii=False)


@pytest.fixture(scope="module")
def runs() -> tuple[Workload, Workload]:
    """The 40-turn workload without and with compaction (run once for the module)."""

    async def both() -> tuple[Workload, Workload]:
        plain = await run_workload(turns=40)
        compacted = await run_workload(
            turns=40, compaction=Compaction(threshold_tokens=LOW_THRESHOLD, keep_turns=2)
        )
        return plain, compacted

    return trio.run(both)


# -- the 40-turn session ------------------------------------------------------------------


def test_a_long_session_with_a_low_threshold_compacts_several_times(
    runs: tuple[Workload, Workload],
) -> None:
    _, compacted = runs
    assert len(compactions(compacted.log)) >= 3
    summaries = [s for s in compacted.sent if is_summary_request(s)]
    assert len(summaries) == len(compactions(compacted.log))


def test_every_step_request_rebuilds_byte_for_byte_from_the_log(
    runs: tuple[Workload, Workload],
) -> None:
    _, compacted = runs
    # The durable form, through real JSON, decoded once (rebuild_request takes either form).
    log = [event_from_json(e) for e in json.loads(json.dumps(compacted.log))]
    steps = [r for r in compacted.sent if not is_summary_request(r)]
    attempts = request_attempts(log)
    assert len(attempts) == len(steps)
    for (turn, step, attempt), sent in zip(attempts, steps, strict=True):
        assert dump(rebuild_request(log, turn, step, attempt)) == dump(sent)


def test_every_summary_request_rebuilds_byte_for_byte_from_the_log(
    runs: tuple[Workload, Workload],
) -> None:
    _, compacted = runs
    log = json.loads(json.dumps(compacted.log))
    summaries = [r for r in compacted.sent if is_summary_request(r)]
    rebuilt = [rebuild_compaction_request(log, n) for n in compactions(log)]
    assert [dump(r) for r in rebuilt] == [dump(r) for r in summaries]


def test_every_request_carries_the_current_runtime_context(
    runs: tuple[Workload, Workload],
) -> None:
    _, compacted = runs
    log = compacted.log
    steps = [r for r in compacted.sent if not is_summary_request(r)]
    for (turn, _, _), sent in zip(request_attempts(log), steps, strict=True):
        contexts = [m for m in sent.messages if is_runtime_context(m)]
        assert contexts, f"turn {turn}: the request has no runtime-context snapshot"
        assert compacted.policies[turn] in contexts[-1].text


def test_the_prompt_prefix_changes_once_per_compaction_never_per_step(
    runs: tuple[Workload, Workload],
) -> None:
    _, compacted = runs
    breaks = 0
    previous: GenerateRequest | None = None
    for request in compacted.sent:
        if is_summary_request(request):
            continue
        if previous is not None:
            same_header = (previous.system, previous.tools, dict(previous.config)) == (
                request.system,
                request.tools,
                dict(request.config),
            )
            extends = request.messages[: len(previous.messages)] == previous.messages
            assert same_header
            breaks += not extends
        previous = request
    assert breaks == len(compactions(compacted.log))


def test_cache_hit_ratio_stays_within_5_points_of_the_run_without_compaction(
    runs: tuple[Workload, Workload],
) -> None:
    plain, compacted = runs
    assert plain.hit_ratio - compacted.hit_ratio <= 0.05
    assert sum(r.prompt for r in compacted.rows) < sum(r.prompt for r in plain.rows)


def test_the_summary_replaces_the_oldest_turns_and_keeps_the_newest_verbatim(
    runs: tuple[Workload, Workload],
) -> None:
    _, compacted = runs
    log = compacted.log
    last = max(compactions(log))
    request_event = next(
        e for e in log if e["type"] == "compaction/request" and e["data"]["compaction"] == last
    )
    replacement = next(
        e for e in log if e.get("surface_op") == "replace" and e["seq"] > request_event["seq"]
    )
    assert replacement["data"]["source"] == {
        "kind": "plugin",
        "plugin": COMPACTION_PLUGIN,
        "form": SUMMARY_FORM,
    }
    assert replacement["source_event_seqs"] == request_event["data"]["replaces"]
    turn = request_event["data"]["turn"]
    kept_from = next(
        e["seq"] for e in log if e["type"] == "turn/start" and e["data"]["turn"] == turn - 2
    )
    by_seq = {e["seq"]: e for e in log}
    for seq in request_event["data"]["replaces"]:
        source = by_seq[seq]["data"].get("source", {})
        assert seq < kept_from or source.get("plugin") == COMPACTION_PLUGIN
    kept = [e for e in log if e["type"] == "assistant/message" and e["data"]["turn"] >= turn - 2]
    assert all(e["seq"] not in request_event["data"]["replaces"] for e in kept)


# -- rules, one by one, with a scripted model ------------------------------------------------


BIG = "x" * 400


async def scripted_session(
    script: list[Reply],
    *,
    threshold: int,
    keep_turns: int = 1,
    texts: tuple[str, ...] = (f"q0 {BIG}", f"q1 {BIG}", f"q2 {BIG}"),
) -> Any:
    """Turns of `texts` with compaction installed; stops at the first failed turn."""
    prompt = SystemPrompt(include_harness_identity=False)
    prompt.context(PromptContext(name="sandbox:policy", order=110, text="Sandbox: read-only."))
    provider = ScriptedProvider(script)
    async with open_agent(
        system_prompt=prompt, provider=provider, options=AgentOptions(model="m")
    ) as agent:
        Compaction(threshold_tokens=threshold, keep_turns=keep_turns).install(agent)
        for text in texts:
            try:
                await agent.run(text)
            except TurnFailedError:
                break
    return agent, provider


async def test_below_the_threshold_nothing_is_compacted() -> None:
    agent, provider = await scripted_session(
        [Reply.text("a"), Reply.text("b"), Reply.text("c")], threshold=100_000
    )
    assert compactions(agent.session.to_json()) == []
    assert len(provider.requests) == 3


async def test_summary_request_is_the_cached_prefix_plus_the_instruction() -> None:
    _agent, provider = await scripted_session(
        [Reply.text("a"), Reply.text("b"), Reply.text("SUMMARY"), Reply.text("c")],
        threshold=150,
    )
    summary_request = provider.requests[2]
    previous = provider.requests[1]
    cited = len(summary_request.messages) - 1
    assert summary_request.messages[:cited] == previous.messages[:cited]
    assert (summary_request.system, summary_request.tools) == (previous.system, previous.tools)
    instruction = summary_request.messages[-1]
    assert isinstance(instruction.source, PluginSource)
    assert instruction.source.plugin == COMPACTION_PLUGIN
    assert "do not call any tool" in instruction.text
    final = provider.requests[3]
    assert "SUMMARY" in final.messages[0].text
    assert final.messages[0].source == PluginSource(plugin=COMPACTION_PLUGIN, form=SUMMARY_FORM)


async def test_compaction_events_are_logged_in_order_and_marked_ignorable() -> None:
    agent, _ = await scripted_session(
        [Reply.text("a"), Reply.text("b"), Reply.text("SUMMARY"), Reply.text("c")],
        threshold=150,
    )
    log = agent.session.to_json()
    kinds = [e["type"] for e in log]
    start = kinds.index("compaction/request")
    assert kinds[start : start + 3] == ["compaction/request", "user/message", "compaction/end"]
    assert log[start]["ignorable"] is True and log[start + 2]["ignorable"] is True
    (ended,) = data_of(agent.session, "compaction/end")
    assert isinstance(ended, CompactionEnded) and ended.failure is None


async def test_the_runtime_context_is_reasserted_in_the_step_after_the_replacement() -> None:
    agent, provider = await scripted_session(
        [Reply.text("a"), Reply.text("SUMMARY"), Reply.text("b")],
        threshold=150,
        keep_turns=0,
        texts=(f"q0 {BIG}", f"q1 {BIG}"),
    )
    (requested,) = data_of(agent.session, "compaction/request")
    assert isinstance(requested, CompactionRequested)
    snapshots = [
        e.seq
        for e in agent.session.events
        if isinstance(e.data, UserMessage) and is_runtime_context(e.data.to_message())
    ]
    assert snapshots[0] in requested.replaces  # the snapshot was compacted away...
    final = provider.requests[2]
    contexts = [m for m in final.messages if is_runtime_context(m)]
    assert len(contexts) == 1 and contexts[0].text.endswith("Sandbox: read-only.")  # ...and back
    assert turn_end_kinds(agent.session) == ["completed", "completed"]


async def test_a_failed_summary_fails_the_turn_and_keeps_the_input() -> None:
    agent, _provider = await scripted_session(
        [Reply.text("a"), Reply.text("b"), Reply.failure("overloaded", "try later")],
        threshold=150,
    )
    assert turn_end_kinds(agent.session) == ["completed", "completed", "error"]
    end = data_of(agent.session, "turn/end")[-1]
    assert end.reason.error.code == "compaction_failed"
    assert "compaction 0" in end.reason.error.message and "try later" in end.reason.error.message
    (ended,) = data_of(agent.session, "compaction/end")
    assert ended.failure.code == "overloaded"
    assert agent.inbox.statistics().next_turn == 1  # the claimed input went back
    assert not any(e.surface_op for e in agent.session.events)


async def test_a_summary_answered_with_a_tool_call_fails_the_turn() -> None:
    agent, _ = await scripted_session(
        [Reply.text("a"), Reply.text("b"), Reply.tool_calls([ToolCall(id="1", name="x")])],
        threshold=150,
    )
    end = data_of(agent.session, "turn/end")[-1]
    assert end.reason.error.code == "compaction_failed"
    assert "called a tool" in end.reason.error.message


async def test_too_little_to_replace_waits_for_more_old_turns() -> None:
    # Turn 2's prompt is over the threshold, but the only compactable turn (turn 0)
    # holds less than a quarter of it: compacting would gain little, so it waits.
    agent, provider = await scripted_session(
        [Reply.text("a"), Reply.text("b"), Reply.text("c")],
        threshold=600,
        texts=("hi", "x" * 2000, "y" * 2000),
    )
    assert compactions(agent.session.to_json()) == []
    assert len(provider.requests) == 3


def test_default_threshold_comes_from_the_context_window_or_is_off() -> None:
    assert default_threshold("deepseek-chat") == int(131_072 * 0.75)
    assert default_threshold("some-local-model") is None
    assert Compaction().threshold_for("some-local-model") is None
    assert Compaction(threshold_tokens=5000).threshold_for("deepseek-chat") == 5000


@pytest.mark.parametrize(("field", "value"), [("threshold_tokens", 0), ("keep_turns", -1)])
def test_invalid_settings_are_refused(field: str, value: int) -> None:
    with pytest.raises(ContextPluginError, match=field):
        Compaction(**{field: value})


async def test_prompt_size_counts_the_header_and_the_surface_after_a_replacement() -> None:
    agent, _ = await scripted_session(
        [Reply.text("a"), Reply.text("b"), Reply.text("SUMMARY"), Reply.text("c")],
        threshold=150,
    )
    assert compactions(agent.session.to_json()) == [0]
    size = PromptSize()
    size.catch_up(agent.session)
    header = agent.session.header()
    assert header is not None
    expected = header_chars(header) + sum(message_chars(m) for m in agent.session.derive_messages())
    assert size.chars == expected


async def test_turn_result_usage_includes_the_summary_request() -> None:
    used = Usage(input_tokens=10, output_tokens=1, cache_read_tokens=0)
    prompt = SystemPrompt(include_harness_identity=False)
    provider = ScriptedProvider(
        [
            Reply.text("a", usage=used),
            Reply.text("b", usage=used),
            Reply.text(
                "SUMMARY", usage=Usage(input_tokens=100, output_tokens=5, cache_read_tokens=64)
            ),
            Reply.text("c", usage=used),
        ]
    )
    async with open_agent(
        system_prompt=prompt, provider=provider, options=AgentOptions(model="m")
    ) as agent:
        Compaction(threshold_tokens=150, keep_turns=1).install(agent)
        for text in (f"q0 {BIG}", f"q1 {BIG}"):
            await agent.run(text)
        result = await agent.run(f"q2 {BIG}")
    assert result.usage == Usage(input_tokens=110, output_tokens=6, cache_read_tokens=64)


async def test_turn_result_messages_leave_out_the_summary_of_earlier_turns() -> None:
    prompt = SystemPrompt(include_harness_identity=False)
    provider = ScriptedProvider(
        [Reply.text("a"), Reply.text("b"), Reply.text("SUMMARY"), Reply.text("c")]
    )
    async with open_agent(
        system_prompt=prompt, provider=provider, options=AgentOptions(model="m")
    ) as agent:
        Compaction(threshold_tokens=150, keep_turns=1).install(agent)
        for text in (f"q0 {BIG}", f"q1 {BIG}"):
            await agent.run(text)
        result = await agent.run(f"q2 {BIG}")
    assert compactions(agent.session.to_json()) == [0]
    assert [m.text[:2] for m in result.messages] == ["q2", "c"]
