"""Session references: @session mentions recall bounded surfaces of stored sessions."""

from __future__ import annotations

import pytest

from actors.agent import Agent, open_agent
from actors.context import ContextPluginError, SessionReferences, session_mentions
from actors.messages import Message, PluginSource
from actors.prompt import PromptContext, SystemPrompt
from actors.providers import Reply, ScriptedProvider
from actors.session import MemoryStore
from tests.context.helpers import entered, from_plugin, labels, make_session, run_turn

PLUGIN = "session-reference"


def recalls(agent: Agent) -> list[Message]:
    return from_plugin(entered(agent.session), PLUGIN)


async def test_mentioned_sessions_are_recalled_in_mention_order_as_one_message() -> None:
    store = MemoryStore()
    await make_session(store, "alpha", [("what is 2+2?", "4")])
    await make_session(store, "beta", [("name a colour", "teal")])
    provider = ScriptedProvider([Reply.text("ok")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider, store=store) as agent:
        SessionReferences(store=store).install(agent)
        await run_turn(agent, "compare @session:beta with @session:alpha.")
    [recall] = recalls(agent)
    assert recall.source == PluginSource(plugin=PLUGIN, form="recall", sections=("beta", "alpha"))
    assert recall.text.index("## Session beta") < recall.text.index("## Session alpha")
    assert "[user] name a colour\n[assistant] teal" in recall.text
    assert "[user] what is 2+2?\n[assistant] 4" in recall.text


async def test_the_recall_follows_the_mentioning_message() -> None:
    store = MemoryStore()
    await make_session(store, "alpha", [("q", "a")])
    prompt = SystemPrompt()
    prompt.context(PromptContext(name="sandbox:policy", order=110, text="read-only"))
    provider = ScriptedProvider([Reply.text("ok")])
    async with open_agent(system_prompt=prompt, provider=provider, store=store) as agent:
        SessionReferences(store=store).install(agent)
        agent.steer("see @session:alpha")
        agent.steer("and then answer")
        await agent.when_idle()
    assert labels(provider.requests[0].messages) == [
        "user:see @session:alpha",
        PLUGIN,
        "user:and then answer",
        "runtime-context",
    ]


async def test_mentions_in_several_messages_are_recalled_as_one_message_after_the_last() -> None:
    store = MemoryStore()
    await make_session(store, "alpha", [("q", "a")])
    await make_session(store, "beta", [("q", "b")])
    provider = ScriptedProvider([Reply.text("ok")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider, store=store) as agent:
        SessionReferences(store=store).install(agent)
        agent.steer("first @session:beta")
        agent.steer("then @session:alpha and @session:beta")
        await agent.when_idle()
    assert labels(provider.requests[0].messages) == [
        "user:first @session:beta",
        "user:then @session:alpha and @session:beta",
        PLUGIN,
    ]
    [recall] = recalls(agent)
    assert recall.source == PluginSource(plugin=PLUGIN, form="recall", sections=("beta", "alpha"))


async def test_a_message_without_mentions_gets_no_recall() -> None:
    store = MemoryStore()
    provider = ScriptedProvider([Reply.text("ok")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider, store=store) as agent:
        SessionReferences(store=store).install(agent)
        await run_turn(agent, "mail me at a@session:x.org or about sessions")
    assert recalls(agent) == []


async def test_an_unknown_session_is_reported_in_the_recall_text() -> None:
    store = MemoryStore()
    await make_session(store, "alpha", [("q", "a")])
    references = SessionReferences(store=store)
    recall = await references.recall("@session:ghost and @session:alpha")
    assert recall is not None
    assert "## Session ghost\n\n[unknown session: the store has no session 'ghost']" in recall.text
    assert recall.source == PluginSource(plugin=PLUGIN, form="recall", sections=("alpha",))


async def test_at_most_max_sessions_are_recalled_and_the_rest_are_named() -> None:
    store = MemoryStore()
    for name in ("s1", "s2", "s3"):
        await make_session(store, name, [("q", "a")])
    recall = await SessionReferences(store=store, max_sessions=2).recall(
        "@session:s1 @session:s2 @session:s3"
    )
    assert recall is not None
    assert "## Session s3" not in recall.text
    assert recall.text.endswith(
        "[not recalled: @session:s3; at most 2 sessions are recalled at once]"
    )


async def test_only_the_newest_max_messages_are_recalled_and_the_cut_is_stated() -> None:
    store = MemoryStore()
    await make_session(store, "long", [(f"q{i}", f"a{i}") for i in range(5)])
    recall = await SessionReferences(store=store, max_messages=3).recall("@session:long")
    assert recall is not None
    assert recall.text.endswith(
        "[showing the last 3 of 10 messages; at most 3 messages and 4000 characters are "
        "recalled per session]\n[assistant] a3\n[user] q4\n[assistant] a4"
    )


async def test_a_session_is_cut_to_max_chars_and_the_cut_is_stated() -> None:
    store = MemoryStore()
    await make_session(store, "wordy", [("q" * 30, "a" * 30)])
    recall = await SessionReferences(store=store, max_chars=45).recall("@session:wordy")
    assert recall is not None
    assert recall.text.endswith(
        "[showing the last 1 of 2 messages; at most 20 messages and 45 characters are "
        "recalled per session]\n[assistant] " + "a" * 30
    )


async def test_a_newest_message_longer_than_max_chars_is_cut_and_says_so() -> None:
    store = MemoryStore()
    await make_session(store, "wordy", [("q", "a" * 30)])
    recall = await SessionReferences(store=store, max_chars=20).recall("@session:wordy")
    assert recall is not None
    assert recall.text.endswith(
        "\n[assistant] " + "a" * 8 + " [cut: this message is longer than the 20-character "
        "limit per session]"
    )


async def test_referencing_a_session_never_changes_its_log() -> None:
    store = MemoryStore()
    await make_session(store, "alpha", [("q", "a")])
    before = [event.seq for event in await store.load("alpha")]
    await SessionReferences(store=store).recall("@session:alpha")
    assert [event.seq for event in await store.load("alpha")] == before


def test_mentions_are_found_in_order_each_once() -> None:
    text = "@session:b, then @session:a.b and @session:b again; not x@session:c"
    assert session_mentions(text) == ["b", "a.b"]


def test_a_non_positive_bound_is_refused_naming_it() -> None:
    with pytest.raises(ContextPluginError, match="max_chars"):
        SessionReferences(store=MemoryStore(), max_chars=0)
