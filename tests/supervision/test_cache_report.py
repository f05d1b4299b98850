"""`harness cache`'s prefix-break report: each deliberate break at its byte offset and lane."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from actors.agent import AgentOptions, Tool, open_agent
from actors.messages import Message
from actors.prompt import AssembleContext, PromptAssembly, PromptSection, SystemPrompt
from actors.prompt.types import NextListener
from actors.providers import Reply, ScriptedProvider
from actors.providers.chunks import Usage
from actors.session import rebuild_request, request_attempts
from actors.session.events import UserMessage
from supervision.cache_report import cache_report, find_break, request_spans


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def common_length(a: Sequence[object], b: Sequence[object]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def first_difference(a: bytes, b: bytes) -> int:
    return common_length(a, b)


async def noop(arguments: dict[str, Any] | str, call: object) -> str:
    return "ok"


def tool(name: str) -> Tool:
    return Tool(
        name=name, description=f"The {name} tool.", parameters={"type": "object"}, execute=noop
    )


def usage(prompt: int, cached: int) -> Usage:
    return Usage(input_tokens=prompt, output_tokens=5, cache_read_tokens=cached)


async def run_session() -> tuple[str, list[dict[str, Any]]]:
    """Five turns: plain, appended, section changed, tools reordered, history rewritten."""
    prompt = SystemPrompt(persona="You are terse.")
    guidance = prompt.section(PromptSection(name="guidance", order=10, text="Rule: be brief."))
    provider = ScriptedProvider([Reply.text(f"answer {n}", usage(100 + n, 50)) for n in range(5)])
    async with open_agent(
        system_prompt=prompt,
        provider=provider,
        options=AgentOptions(model="m"),
        tools=[tool("alpha"), tool("beta")],
    ) as agent:
        for text in ("first", "second"):
            agent.followup(text)
            await agent.when_idle()
        guidance.dispose()
        prompt.section(PromptSection(name="guidance", order=10, text="Rule: be thorough."))
        agent.followup("third")
        await agent.when_idle()

        async def reverse(
            assembly: PromptAssembly, ctx: AssembleContext, next: NextListener
        ) -> PromptAssembly:
            result = await next()
            result.tools = list(reversed(result.tools))
            return result

        prompt.on_assemble(reverse)
        agent.followup("fourth")
        await agent.when_idle()
        first_user = next(e for e in agent.session.events if isinstance(e.data, UserMessage))
        first_answer = agent.session.events[first_user.seq + 1 :]
        answer_seq = next(e.seq for e in first_answer if e.type == "assistant/message")
        await agent.session.append(
            UserMessage(
                content=Message.user("Summary: the user said first; you answered.").content,
                source=Message.user("x").source,
            ),
            surface_op="replace",
            source_event_seqs=[first_user.seq, answer_seq],
        )
        agent.followup("fifth")
        await agent.when_idle()
    return agent.session.id, agent.session.to_json()


def requests_of(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [rebuild_request(log, t, s, a).to_json() for t, s, a in request_attempts(log)]


async def test_each_request_reports_its_cache_figures_and_break() -> None:
    session_id, log = await run_session()
    report = cache_report(session_id, log)
    assert [(r.turn, r.step) for r in report.requests] == [(n, 0) for n in range(5)]
    assert [r.prompt_tokens for r in report.requests] == [100, 101, 102, 103, 104]
    assert all(r.cache_hit_tokens == 50 for r in report.requests)
    assert report.requests[0].header == "initial"
    assert report.requests[0].prefix_break is None
    assert report.requests[1].prefix_break is None  # only appended
    assert report.requests[1].header is None


async def test_changed_section_breaks_the_system_lane_at_the_first_changed_byte() -> None:
    session_id, log = await run_session()
    requests = requests_of(log)
    before, after = requests[1], requests[2]
    brk = cache_report(session_id, log).requests[2].prefix_break
    assert brk is not None and brk.lane == "system"
    lead = dumps({"config": before["config"]})[:-1] + b',"system":"'
    common = before["system"][: common_length(before["system"], after["system"])]
    assert brk.offset == len(lead) + len(dumps(common)[1:-1])  # as escaped in JSON
    assert brk.offset == first_difference(dumps(before), dumps(after))
    assert cache_report(session_id, log).requests[2].header == "change"


async def test_reordered_tools_break_the_tool_lane_naming_the_tool() -> None:
    session_id, log = await run_session()
    requests = requests_of(log)
    before, after = requests[2], requests[3]
    assert [t["name"] for t in after["tools"]] == ["beta", "alpha"]
    brk = cache_report(session_id, log).requests[3].prefix_break
    assert brk is not None and brk.lane == "tool" and brk.tool == "beta"
    assert brk.offset == first_difference(dumps(before), dumps(after))
    # The offset is inside the first tool's name: `{"name":"` then a vs b.
    assert dumps(before)[: brk.offset].endswith(b'"tools":[{"name":"')


async def test_rewritten_history_breaks_the_message_lane_at_its_index() -> None:
    session_id, log = await run_session()
    requests = requests_of(log)
    before, after = requests[3], requests[4]
    brk = cache_report(session_id, log).requests[4].prefix_break
    assert brk is not None and brk.lane == "message"
    assert brk.message_index == 0 and brk.message_source == "user (user)"
    assert brk.offset == first_difference(dumps(before), dumps(after))
    text = dumps(after)[: brk.offset].decode()
    assert text.endswith('"messages":[{"role":"user","content":[{"type":"text","text":"')


async def test_report_json_shape() -> None:
    session_id, log = await run_session()
    out = cache_report(session_id, log).to_json()
    assert out["sessionId"] == session_id
    assert out["breaks"] == 3
    assert out["promptTokens"] == 510 and out["cacheHitTokens"] == 250
    row = out["requests"][2]
    assert set(row) == {
        "turn",
        "step",
        "attempt",
        "header",
        "promptTokens",
        "cacheHitTokens",
        "outputTokens",
        "hitRatio",
        "requestBytes",
        "commonPrefixBytes",
        "limitTokens",
        "prefixBreak",
    }
    assert row["prefixBreak"]["lane"] == "system"
    assert 0 < out["limitRatio"] < 1


def test_spans_cover_every_byte_and_match_the_canonical_json() -> None:
    request = {
        "config": {"provider": "p", "model": "m"},
        "system": "é",
        "tools": [{"name": "a", "description": "", "parameters": {}}],
        "messages": [{"role": "user", "content": []}],
    }
    data, spans = request_spans(request)
    assert data == dumps(request)
    assert spans[0].start == 0 and spans[-1].end == len(data)
    assert all(a.end == b.start for a, b in itertools.pairwise(spans))


def test_a_system_text_that_appears_breaks_the_system_lane() -> None:
    before = {"config": {"model": "m"}, "messages": [{"role": "user", "content": []}]}
    after = {**before, "system": "new"}
    _, brk = find_break(before, after)
    assert brk is not None and brk.lane == "system"


def test_a_changed_config_breaks_the_config_lane() -> None:
    before = {"config": {"model": "m"}, "messages": []}
    after = {"config": {"model": "n"}, "messages": []}
    common, brk = find_break(before, after)
    assert brk is not None and brk.lane == "config"
    assert brk.offset == common == len('{"config":{"model":"')


json_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)
tools = st.lists(
    st.builds(lambda n, d: {"name": n, "description": d, "parameters": {}}, json_text, json_text),
    max_size=3,
)
messages = st.lists(
    st.builds(
        lambda role, text: {"role": role, "content": [{"type": "text", "text": text}]},
        st.sampled_from(["user", "assistant"]),
        json_text,
    ),
    max_size=4,
)


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {"config": {"model": draw(json_text)}}
    if draw(st.booleans()):
        out["system"] = draw(json_text)
    chosen = draw(tools)
    if chosen:
        out["tools"] = chosen
    out["messages"] = draw(messages)
    return out


@given(requests(), requests())
def test_the_break_is_the_first_differing_byte_in_the_lane_that_holds_it(
    before: dict[str, Any], after: dict[str, Any]
) -> None:
    common, brk = find_break(before, after)
    a, b = dumps(before), dumps(after)
    if b.startswith(a[:-2]):
        assert brk is None and common == len(a) - 2
        return
    assert brk is not None and brk.offset == common == first_difference(a, b)
    if brk.lane == "config":
        assert a[:common].count(b'"system"') == 0 and b'"tools"' not in a[:common]
    if brk.lane == "tool":
        names = {t["name"] for t in before.get("tools", []) + after.get("tools", [])}
        assert brk.tool in names
    if brk.lane == "message":
        assert brk.message_index is not None
        assert brk.message_index < max(len(before["messages"]), len(after["messages"]), 1)
