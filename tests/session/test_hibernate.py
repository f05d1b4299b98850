"""Hibernation: an idle session releases its in-memory log and reloads it from the store."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from actors.agent import AgentOptions, open_agent
from actors.messages import UserSource
from actors.prompt import SystemPrompt
from actors.providers import Reply, ScriptedProvider
from actors.session import (
    MemoryStore,
    Session,
    SessionError,
    SessionHibernatingError,
    SQLiteStore,
)
from actors.session.events import Event, TurnEnd, TurnEndReason, TurnStart, UserMessage


def user(text: str) -> UserMessage:
    return UserMessage(content=text, source=UserSource())


async def filled_session(store: MemoryStore | None = None) -> Session:
    session = await Session.create(store or MemoryStore(), "s")
    await session.append(TurnStart(turn=0))
    await session.append(user("hello"))
    await session.append(TurnEnd(turn=0, reason=TurnEndReason(kind="completed")))
    return session


async def test_a_hibernating_session_keeps_its_length_and_refuses_synchronous_reads() -> None:
    session = await filled_session()
    assert session.hibernate()
    assert (session.hibernating, len(session), session.durable_seq) == (True, 3, 2)
    with pytest.raises(SessionHibernatingError, match="session 's' is hibernating"):
        session.derive_messages()
    with pytest.raises(SessionHibernatingError):
        _ = session.events


async def test_waking_reloads_exactly_the_events_and_messages_it_released() -> None:
    session = await filled_session()
    events, messages = session.events, session.derive_messages()
    session.hibernate()
    await session.wake()
    assert not session.hibernating
    assert (session.events, session.derive_messages()) == (events, messages)


async def test_an_append_wakes_the_session_and_numbers_on() -> None:
    session = await filled_session()
    session.hibernate()
    appended = await session.append(TurnStart(turn=1))
    assert (appended.seq, session.hibernating, session.next_turn()) == (3, False, 2)


async def test_an_open_watch_keeps_the_session_awake() -> None:
    session = await filled_session()
    async with session.watch(from_seq=0) as events:
        assert not session.hibernate()
        assert (await events.receive()).seq == 0
    assert session.hibernate()


async def test_watching_a_hibernating_session_wakes_it() -> None:
    session = await filled_session()
    session.hibernate()
    async with session.watch(from_seq=0) as events:
        assert [(await events.receive()).seq for _ in range(3)] == [0, 1, 2]
        assert not session.hibernating


class LosingStore(MemoryStore):
    """A memory store that, once `lose` is set, gives back every event but the last."""

    lose = False

    async def load(self, session_id: str) -> list[Event]:
        events = await super().load(session_id)
        return events[:-1] if self.lose else events


async def test_a_store_that_lost_events_fails_the_wake_naming_the_session() -> None:
    store = LosingStore()
    session = await filled_session(store)
    session.hibernate()
    store.lose = True
    with pytest.raises(SessionError, match="'s': waking from hibernation found 2 stored events"):
        await session.wake()
    assert session.hibernating


async def test_a_hibernating_agent_runs_its_next_turn_over_the_reloaded_history(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "s.sqlite")
    provider = ScriptedProvider([Reply.text("first"), Reply.text("second")])
    async with trio.open_nursery() as nursery:
        await nursery.start(store.serve)
        async with open_agent(
            system_prompt=SystemPrompt(),
            provider=provider,
            options=AgentOptions(model="m", hibernate=True),
            store=store,
        ) as agent:
            agent.followup("one")
            await agent.when_idle()
            assert agent.session.hibernating
            agent.followup("two")
            await agent.when_idle()
            assert agent.session.hibernating
            await agent.session.wake()
            turns = [e.data for e in agent.session.events if isinstance(e.data, TurnEnd)]
        nursery.cancel_scope.cancel()
    assert [t.reason.kind for t in turns] == ["completed", "completed"]
    texts = [block.text for m in provider.requests[1].messages for block in m.content]  # type: ignore[attr-defined]
    assert texts[:2] == ["one", "first"] and "two" in texts


async def test_an_agent_without_the_option_never_hibernates() -> None:
    provider = ScriptedProvider([Reply.text("first")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        agent.followup("one")
        await agent.when_idle()
        assert not agent.session.hibernating


class _StepCounter(trio.abc.Instrument):
    """Counts the times one task is scheduled."""

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.steps += 1


async def test_waking_a_hibernating_session_takes_one_scheduling_pass_the_stores_load() -> None:
    session = await filled_session()
    session.hibernate()
    counter = _StepCounter(trio.lowlevel.current_task())
    trio.lowlevel.add_instrument(counter)
    try:
        await session.wake()
    finally:
        trio.lowlevel.remove_instrument(counter)
    assert (counter.steps, session.hibernating) == (1, False)


@pytest.mark.parametrize("hibernating", [True, False])
async def test_a_wake_is_a_checkpoint_whether_or_not_the_session_hibernates(
    hibernating: bool,
) -> None:
    session = await filled_session()
    if hibernating:
        session.hibernate()
    with trio.CancelScope() as scope:
        scope.cancel()
        await session.wake()
    assert scope.cancelled_caught
    assert session.hibernating is hibernating
