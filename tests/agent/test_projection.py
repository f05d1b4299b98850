"""Runtime-context projection: full snapshots only on change, tombstones, compaction."""

from __future__ import annotations

from actors.agent import Enter, StepProposal, Tool, open_agent
from actors.agent.decisions import PreStepNext, StepDecision
from actors.agent.projection import TOMBSTONE_TEXT
from actors.messages import PluginSource
from actors.prompt import PromptContext, SystemPrompt
from actors.providers import Reply, ScriptedProvider, ToolCall
from actors.session import MemoryStore
from actors.session.events import UserMessage
from tests.agent.helpers import data_of

PREAMBLE = "Current runtime context. This snapshot supersedes earlier runtime-context snapshots."


def snapshots(agent: object) -> list[UserMessage]:
    return [
        d
        for d in data_of(agent.session, "user/message")  # type: ignore[attr-defined]
        if isinstance(d.source, PluginSource) and d.source.plugin == "runtime-context"
    ]


async def test_changed_context_is_appended_as_one_sourced_snapshot() -> None:
    prompt = SystemPrompt()
    prompt.context(PromptContext(name="sandbox:policy", order=110, text="read-only"))
    provider = ScriptedProvider([Reply.text("a"), Reply.text("b")])
    async with open_agent(system_prompt=prompt, provider=provider) as agent:
        agent.followup("one")
        await agent.when_idle()
        agent.followup("two")
        await agent.when_idle()
    found = snapshots(agent)
    assert len(found) == 1
    assert found[0].content[0].text == f"{PREAMBLE}\n\nread-only"
    assert found[0].source == PluginSource(
        plugin="runtime-context", form="snapshot", sections=("sandbox:policy",)
    )
    assert provider.requests[0].system == provider.requests[1].system


async def test_empty_first_snapshot_emits_nothing() -> None:
    provider = ScriptedProvider([Reply.text("a")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("one")
        await agent.when_idle()
    assert snapshots(agent) == []


async def test_disappearing_context_emits_a_tombstone() -> None:
    prompt = SystemPrompt()
    registration = prompt.context(PromptContext(name="approval:policy", order=115, text="ask"))
    provider = ScriptedProvider([Reply.text("a"), Reply.text("b"), Reply.text("c")])
    async with open_agent(system_prompt=prompt, provider=provider) as agent:
        agent.followup("one")
        await agent.when_idle()
        registration.dispose()
        agent.followup("two")
        await agent.when_idle()
        agent.followup("three")
        await agent.when_idle()
    found = snapshots(agent)
    assert [s.content[0].text for s in found][1] == TOMBSTONE_TEXT
    assert found[1].source == PluginSource(plugin="runtime-context")
    assert len(found) == 2


async def test_changed_context_value_appends_a_new_full_snapshot() -> None:
    prompt = SystemPrompt()
    mode = {"value": "read-only"}
    prompt.context(PromptContext(name="sandbox:policy", order=110, text=lambda ctx: mode["value"]))
    provider = ScriptedProvider([Reply.text("a"), Reply.text("b")])
    async with open_agent(system_prompt=prompt, provider=provider) as agent:
        agent.followup("one")
        await agent.when_idle()
        mode["value"] = "workspace-write"
        agent.followup("two")
        await agent.when_idle()
    texts = [s.content[0].text for s in snapshots(agent)]
    assert texts == [f"{PREAMBLE}\n\nread-only", f"{PREAMBLE}\n\nworkspace-write"]


async def test_snapshot_removed_by_a_pre_step_listener_is_proposed_again() -> None:
    removed = {"count": 0}

    async def drop_context_once(proposal: StepProposal, next: PreStepNext) -> StepDecision:
        decision = await next()
        if removed["count"] == 0 and proposal.context is not None:
            removed["count"] += 1
            assert isinstance(decision, Enter)
            return Enter(messages=[m for m in decision.messages if m is not proposal.context])
        return decision

    prompt = SystemPrompt()
    prompt.context(PromptContext(name="sandbox:policy", order=110, text="read-only"))
    provider = ScriptedProvider([Reply.text("a"), Reply.text("b")])
    async with open_agent(system_prompt=prompt, provider=provider) as agent:
        agent.on_pre_step(drop_context_once)
        agent.followup("one")
        await agent.when_idle()
        assert snapshots(agent) == []
        agent.followup("two")
        await agent.when_idle()
    assert len(snapshots(agent)) == 1


async def test_compaction_of_the_retained_snapshot_makes_the_next_step_reassert_it() -> None:
    prompt = SystemPrompt()
    prompt.context(PromptContext(name="sandbox:policy", order=110, text="read-only"))
    provider = ScriptedProvider([Reply.text("a"), Reply.text("b")])
    async with open_agent(system_prompt=prompt, provider=provider) as agent:
        agent.followup("one")
        await agent.when_idle()
        first = [e.seq for e in agent.session.surface_events()]
        await agent.session.append(
            UserMessage(
                content="Summary of earlier work.", source=PluginSource(plugin="compaction")
            ),
            surface_op="replace",
            source_event_seqs=first,
        )
        agent.followup("two")
        await agent.when_idle()
    assert len(snapshots(agent)) == 2
    last = provider.requests[-1].messages
    assert last[0].text == "Summary of earlier work."
    assert last[-1].text == f"{PREAMBLE}\n\nread-only"


async def test_unchanged_context_is_not_repeated_on_a_later_step_of_the_same_turn() -> None:
    async def noop(arguments: dict[str, object] | str, call: object) -> str:
        return "ok"

    prompt = SystemPrompt()
    prompt.context(PromptContext(name="sandbox:policy", order=110, text="read-only"))
    provider = ScriptedProvider(
        [Reply.tool_calls([ToolCall(id="1", name="noop")]), Reply.text("done")]
    )
    tool = Tool(name="noop", description="d", parameters={}, execute=noop)
    async with open_agent(system_prompt=prompt, provider=provider, tools=[tool]) as agent:
        agent.followup("one")
        await agent.when_idle()
    assert len(data_of(agent.session, "step/start")) == 2
    assert len(snapshots(agent)) == 1


async def test_context_returning_after_a_tombstone_is_asserted_again() -> None:
    prompt = SystemPrompt()
    mode = {"value": "read-only"}
    prompt.context(PromptContext(name="sandbox:policy", order=110, text=lambda ctx: mode["value"]))
    provider = ScriptedProvider([Reply.text("a"), Reply.text("b"), Reply.text("c")])
    async with open_agent(system_prompt=prompt, provider=provider) as agent:
        for value in ("read-only", "", "read-only"):
            mode["value"] = value
            agent.followup(f"with {value!r}")
            await agent.when_idle()
    texts = [s.content[0].text for s in snapshots(agent)]
    assert texts == [f"{PREAMBLE}\n\nread-only", TOMBSTONE_TEXT, f"{PREAMBLE}\n\nread-only"]


async def test_suppressing_runtime_context_after_a_snapshot_emits_a_tombstone() -> None:
    prompt = SystemPrompt()
    prompt.context(PromptContext(name="sandbox:policy", order=110, text="read-only"))
    provider = ScriptedProvider([Reply.text("a"), Reply.text("b")])
    async with open_agent(system_prompt=prompt, provider=provider) as agent:
        agent.followup("one")
        await agent.when_idle()
        prompt.suppress_runtime_context()
        agent.followup("two")
        await agent.when_idle()
    assert [s.content[0].text for s in snapshots(agent)][1:] == [TOMBSTONE_TEXT]


async def test_resumed_agent_does_not_repeat_the_retained_snapshot() -> None:
    store = MemoryStore()
    prompt = SystemPrompt()
    prompt.context(PromptContext(name="sandbox:policy", order=110, text="read-only"))
    async with open_agent(
        system_prompt=prompt, provider=ScriptedProvider([Reply.text("a")]), store=store
    ) as first:
        first.followup("one")
        await first.when_idle()
    provider = ScriptedProvider([Reply.text("b")])
    async with open_agent(
        system_prompt=prompt, provider=provider, store=store, session_id=first.session.id
    ) as second:
        second.followup("two")
        await second.when_idle()
    assert len(snapshots(second)) == 1
    assert [m.text for m in provider.requests[0].messages][-1] == "two"


async def test_snapshot_follows_the_claimed_messages_and_names_its_sections_in_order() -> None:
    prompt = SystemPrompt()
    prompt.context(PromptContext(name="b:second", order=120, text="second"))
    prompt.context(PromptContext(name="a:first", order=110, text="first"))
    prompt.context(PromptContext(name="c:empty", order=130, text=""))
    provider = ScriptedProvider([Reply.text("a")])
    async with open_agent(system_prompt=prompt, provider=provider) as agent:
        agent.followup("hi")
        agent.steer("also")
        await agent.when_idle()
    messages = provider.requests[0].messages
    assert [m.text for m in messages] == ["hi", "also", f"{PREAMBLE}\n\nfirst\n\nsecond"]
    assert messages[2].source == PluginSource(
        plugin="runtime-context", form="snapshot", sections=("a:first", "b:second")
    )
