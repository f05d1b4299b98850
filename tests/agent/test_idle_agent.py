"""An idle agent holds no task: waking input starts its loop task, which ends when it is idle."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from actors.agent import AgentOptions, InboxFullError, open_agent
from actors.agent.agent import INBOX_CAPACITY
from actors.agent.result import AgentClosedError
from actors.prompt import SystemPrompt
from actors.providers import Reply, ScriptedProvider
from actors.session import MemoryStore
from actors.session.events import Event
from tests.agent.helpers import FlushHookStore, GatedProvider, turn_end_kinds, types


class GatedLoadStore(MemoryStore):
    """A memory store whose next `load` waits for `gate` (a wake from hibernation that hangs)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: trio.Event | None = None
        self.loading = trio.Event()

    async def load(self, session_id: str) -> list[Event]:
        gate, self.gate = self.gate, None
        if gate is not None:
            self.loading.set()
            await gate.wait()
        return await super().load(session_id)


async def test_an_idle_agent_has_no_task_of_its_own_and_input_starts_one() -> None:
    provider = ScriptedProvider([Reply.text("first"), Reply.text("second")])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        await trio.testing.wait_all_tasks_blocked()
        assert not agent.statistics().loop_task
        assert not agent._nursery.child_tasks
        agent.followup("one")
        assert agent.statistics().loop_task and len(agent._nursery.child_tasks) == 1
        await agent.when_idle()
        await trio.testing.wait_all_tasks_blocked()
        assert not agent.statistics().loop_task
        assert not agent._nursery.child_tasks
        assert agent._idle is None and agent._turn_done is None  # no event kept either
        agent.followup("two")
        await agent.when_idle()
    assert turn_end_kinds(agent.session) == ["completed", "completed"]


async def test_hibernate_wake_turn_runs_over_the_whole_history_with_no_task_while_idle() -> None:
    provider = ScriptedProvider([Reply.text("first"), Reply.text("second")])
    options = AgentOptions(model="m", hibernate=True)
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, options=options
    ) as agent:
        agent.followup("one")
        await agent.when_idle()
        await trio.testing.wait_all_tasks_blocked()
        assert agent.session.hibernating and not agent._nursery.child_tasks
        agent.followup("two")
        await agent.when_idle()
        await agent.session.wake()
    assert turn_end_kinds(agent.session) == ["completed", "completed"]
    texts = [block.text for m in provider.requests[1].messages for block in m.content]  # type: ignore[attr-defined]
    assert texts[:2] == ["one", "first"] and "two" in texts


async def test_input_that_arrives_while_the_loop_task_hibernates_gets_its_turn() -> None:
    store = FlushHookStore()
    provider = ScriptedProvider([Reply.text("first"), Reply.text("second")])
    options = AgentOptions(model="m", hibernate=True)
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, options=options, store=store
    ) as agent:
        seen: list[bool] = []

        async def follow_up_during_the_hibernating_flush() -> None:
            agent.followup("two")
            # The loop task still runs: no second task starts, and it takes the wake.
            seen.append(len(agent._nursery.child_tasks) == 1)

        async def then_at_the_next_flush() -> None:
            store.before_flush = follow_up_during_the_hibernating_flush

        async def at_the_turn_end_flush() -> None:
            store.before_flush = then_at_the_next_flush

        # A turn flushes before its request and at its end; the next flush is hibernation's.
        store.before_flush = at_the_turn_end_flush
        agent.followup("one")
        await agent.when_idle()
        assert seen == [True]
        await agent.session.wake()
    assert turn_end_kinds(agent.session) == ["completed", "completed"]
    assert types(agent.session).count("user/message") == 2


async def test_cancel_during_a_wake_runs_no_turn_and_keeps_the_input_for_the_next_wake() -> None:
    store = GatedLoadStore()
    provider = ScriptedProvider([Reply.text(text) for text in ("first", "second", "third")])
    options = AgentOptions(model="m", hibernate=True)
    async with open_agent(
        system_prompt=SystemPrompt(), provider=provider, options=options, store=store
    ) as agent:
        agent.followup("one")
        await agent.when_idle()
        assert agent.session.hibernating
        gate = store.gate = trio.Event()
        agent.followup("two")
        await store.loading.wait()
        agent.cancel(keep_inbox=True)  # while the session reloads: no turn is live yet
        gate.set()
        await agent.when_idle()
        await trio.testing.wait_all_tasks_blocked()
        assert len(provider.requests) == 1 and not agent._nursery.child_tasks
        agent.followup("three")  # the next wake un-parks the kept input
        await agent.when_idle()
        await agent.session.wake()
    assert turn_end_kinds(agent.session) == ["completed", "completed", "completed"]
    last = [block.text for m in provider.requests[2].messages for block in m.content]  # type: ignore[attr-defined]
    assert last[-1] == "three" and "two" in last  # kept, in order, before the new input


async def test_input_while_the_agent_closes_starts_no_turn_and_later_input_is_refused() -> None:
    gate = trio.Event()
    store = FlushHookStore()
    provider = GatedProvider([Reply.text("never")], gate)
    tasks_during_close: list[int] = []
    async with open_agent(system_prompt=SystemPrompt(), provider=provider, store=store) as agent:

        async def follow_up_while_closing() -> None:
            agent.followup("late")  # filed while the agent disposes: no loop task starts for it
            tasks_during_close.append(len(agent._nursery.child_tasks))

        agent.followup("one")
        await trio.testing.wait_all_tasks_blocked()  # the request waits at the gate
        store.before_flush = follow_up_while_closing  # the aborted turn's closing flush
    assert tasks_during_close == [1]  # only the loop task that is closing the turn
    with pytest.raises(AgentClosedError):
        agent.followup("after")
    assert turn_end_kinds(agent.session) == ["aborted"]
    assert types(agent.session).count("turn/start") == 1


async def test_a_full_inbox_refuses_input_by_name_and_keeps_what_it_holds() -> None:
    provider = ScriptedProvider([])
    async with open_agent(system_prompt=SystemPrompt(), provider=provider) as agent:
        for index in range(INBOX_CAPACITY):
            agent.inject(f"note {index}")
        with pytest.raises(InboxFullError, match=f"inbox holds {INBOX_CAPACITY} unclaimed"):
            agent.inject("one too many")
        assert agent.inbox.statistics().next_step == INBOX_CAPACITY
