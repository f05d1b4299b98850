"""Agents under the runtime hold no task while idle, hibernate, and wake from the store.

An agent started by `Runtime.start_agent` without subagent providers is a
hosted child of the root supervisor (`HostedChildSpec`): its loop task runs
in the supervisor's nursery only while it has input, and with
`AgentOptions(hibernate=True)` its idle session keeps no events. These tests
check that N idle agents hold no task, that a woken agent's requests are
the ones it would have sent awake (byte for byte, rebuildable from the log),
that nothing is lost over hibernation and shutdown, that a hibernated session
keeps its lease against a second process, and what a failing or cancelled
wake does.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from pathlib import Path

import pytest
import trio
import trio.testing

from actors.agent import Agent, AgentClosedError, AgentOptions, start_hosted_agent
from actors.messages import TextBlock
from actors.prompt import SystemPrompt
from actors.providers import Chunk, GenerateRequest, Reply, ScriptedProvider
from actors.session import MemoryStore, SessionError, SQLiteStore, rebuild_request
from actors.session.events import Event
from supervision import AwakeAgents, ChildHost, HostedChildSpec, Supervisor, open_runtime
from supervision.supervisor import NotRunningError
from tests.agent.helpers import dump, turn_end_kinds

HIBERNATE = AgentOptions(model="m", hibernate=True)
PROBE = Path(__file__).with_name("lease_probe.py")


class WakeStore(MemoryStore):
    """A memory store whose loads can be held (`gate`) or made to fail (`fail_loads`)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: trio.Event | None = None
        self.loading = trio.Event()
        self.fail_loads = 0
        self.loads = 0

    async def load(self, session_id: str) -> list[Event]:
        self.loads += 1
        if self.fail_loads:
            self.fail_loads -= 1
            await trio.lowlevel.checkpoint()
            raise SessionError(f"session {session_id!r}: the disk refused a read")
        gate, self.gate = self.gate, None
        if gate is not None:
            self.loading.set()
            await gate.wait()
        return await super().load(session_id)


def _supervisor_tasks(supervisor: Supervisor) -> int:
    nursery = supervisor._nursery
    assert nursery is not None
    return len(nursery.child_tasks)


async def test_idle_agents_hold_no_task_in_the_runtime_and_hibernate() -> None:
    sessions = 25
    provider = ScriptedProvider([Reply.text(f"r{n}") for n in range(2 * sessions)])
    async with open_runtime(system_prompt=SystemPrompt(), providers={"default": provider}) as rt:
        agents = [(await rt.start_agent(options=HIBERNATE)).value for _ in range(sessions)]
        await trio.testing.wait_all_tasks_blocked()
        assert _supervisor_tasks(rt.supervisor) == 0
        for agent in agents:
            agent.followup("hello")
        assert _supervisor_tasks(rt.supervisor) == sessions  # one loop task per woken agent
        for agent in agents:
            await agent.when_idle()
        await trio.testing.wait_all_tasks_blocked()
        assert _supervisor_tasks(rt.supervisor) == 0
        assert all(agent.session.hibernating for agent in agents)
        assert all(not agent.statistics().loop_task for agent in agents)
        assert rt.statistics().supervisor.children == sessions
        # Nor an Event: a child makes one only while someone waits for its state to change.
        assert all(child._changed is None for child in rt.supervisor.children())


async def test_a_new_session_is_not_read_back_on_first_wake_a_resumed_one_starts_hibernated() -> (
    None
):
    store = WakeStore()
    provider = ScriptedProvider([Reply.text("one"), Reply.text("two")])
    async with open_runtime(
        system_prompt=SystemPrompt(), store=store, providers={"default": provider}
    ) as rt:
        child = await rt.start_agent(options=HIBERNATE, session_id="s")
        agent = child.value
        assert not agent.session.hibernating  # nothing to release yet
        agent.followup("a")
        await agent.when_idle()
        assert store.loads == 0 and agent.session.hibernating
        await rt.supervisor.terminate_child(child.id)
        resumed = (await rt.start_agent(options=HIBERNATE, session_id="s")).value
        assert resumed.session.hibernating and store.loads == 1  # loaded to open it, released
        resumed.followup("b")
        await resumed.when_idle()
        assert store.loads == 2
        await resumed.session.wake()
    assert turn_end_kinds(resumed.session) == ["completed", "completed"]


async def test_a_woken_agent_sends_what_it_would_have_sent_awake(tmp_path: Path) -> None:
    def script() -> list[Reply]:
        return [Reply.text("one"), Reply.text("two"), Reply.text("three")]

    sent = {}
    for hibernate in (False, True):
        provider = ScriptedProvider(script())
        store = SQLiteStore(tmp_path / f"h{hibernate}.sqlite")
        async with open_runtime(
            system_prompt=SystemPrompt(), store=store, providers={"default": provider}
        ) as rt:
            child = await rt.start_agent(
                options=AgentOptions(model="m", hibernate=hibernate), session_id="s"
            )
            agent = child.value
            for text in ("a", "b", "c"):
                agent.followup(text)
                await agent.when_idle()
                assert agent.session.hibernating is hibernate
            await agent.session.wake()
            log = agent.session.to_json()
        sent[hibernate] = [dump(request) for request in provider.requests]
        # One header for the session's life: the prefix stays byte-stable over hibernation.
        assert [event["type"] for event in log].count("request/header") == 1
        rebuilt = [dump(rebuild_request(log, turn, 0)) for turn in range(3)]
        assert rebuilt == sent[hibernate]
    assert sent[True] == sent[False]


async def test_nothing_is_lost_over_hibernation_and_shutdown(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    provider = ScriptedProvider([Reply.text(f"r{n}") for n in range(20)])
    async with open_runtime(
        system_prompt=SystemPrompt(), store=SQLiteStore(path), providers={"default": provider}
    ) as rt:
        agents = [(await rt.start_agent(options=HIBERNATE)).value for _ in range(5)]
        for turn in range(2):
            for agent in agents:
                agent.followup(f"{agent.session.id} turn {turn}")
            for agent in agents:
                await agent.when_idle()
        counts = [len(agent.session) for agent in agents]
    reopened = SQLiteStore(path)
    for agent, count in zip(agents, counts, strict=True):
        events = await reopened.load(agent.session.id)
        assert len(events) == count
        ends = [e.data.reason.kind for e in events if e.type == "turn/end"]  # type: ignore[attr-defined]
        assert ends == ["completed", "completed"]
        lease = await reopened.acquire_lease(agent.session.id)  # every lease was given back
        await reopened.release_lease(lease)


def _probe(path: Path, session_id: str) -> str:
    done = subprocess.run(
        [sys.executable, str(PROBE), str(path), session_id],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return done.stdout.strip()


async def test_a_hibernated_session_keeps_its_lease_against_a_second_process(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.sqlite"
    provider = ScriptedProvider([Reply.text("one"), Reply.text("two")])
    async with open_runtime(
        system_prompt=SystemPrompt(), store=SQLiteStore(path), providers={"default": provider}
    ) as rt:
        agent = (await rt.start_agent(options=HIBERNATE, session_id="s")).value
        agent.followup("a")
        await agent.when_idle()
        assert agent.session.hibernating
        answer = await trio.to_thread.run_sync(_probe, path, "s")
        assert answer.startswith("busy ") and f"{agent.session.lease.owner}" in answer  # type: ignore[union-attr]
        agent.followup("b")  # the same writer, same epoch: its writes are still accepted
        await agent.when_idle()
        await agent.session.wake()
        assert turn_end_kinds(agent.session) == ["completed", "completed"]
    assert (await trio.to_thread.run_sync(_probe, path, "s")).startswith("acquired ")


async def test_a_wake_that_fails_to_read_the_log_crashes_the_agent_which_restarts() -> None:
    store = WakeStore()
    provider = ScriptedProvider([Reply.text("one"), Reply.text("two")])
    async with open_runtime(
        system_prompt=SystemPrompt(), store=store, providers={"default": provider}
    ) as rt:
        child = await rt.start_agent(options=HIBERNATE, session_id="s")
        first = child.value
        first.followup("a")
        await first.when_idle()
        store.fail_loads = 1
        with pytest.raises(AgentClosedError):
            await first.run("b")  # its wake crashes the agent: the input dies with it
        second = await child.wait_running(incarnation=1)
        assert first.closed and first.scope.closed and second.session.id == "s"
        assert second.session.lease is not None and second.session.lease.epoch == 2
        await second.run("c")
        await second.session.wake()
    assert turn_end_kinds(second.session) == ["completed", "completed"]
    assert [m.text for m in provider.requests[-1].messages] == ["a", "one", "c"]
    assert rt.statistics().supervisor.crashes == 1


async def test_cancel_during_a_wake_drops_the_input_and_the_agent_stays_usable() -> None:
    store = WakeStore()
    provider = ScriptedProvider([Reply.text("one"), Reply.text("two")])
    async with open_runtime(
        system_prompt=SystemPrompt(), store=store, providers={"default": provider}
    ) as rt:
        agent = (await rt.start_agent(options=HIBERNATE)).value
        agent.followup("a")
        await agent.when_idle()
        gate = store.gate = trio.Event()
        agent.followup("b")
        await store.loading.wait()
        agent.cancel()  # no turn runs yet: the input is dropped
        gate.set()
        await agent.when_idle()
        agent.followup("c")
        await agent.when_idle()
        await agent.session.wake()
    assert turn_end_kinds(agent.session) == ["completed", "completed"]
    assert [m.text for m in provider.requests[-1].messages] == ["a", "one", "c"]


async def test_shutdown_during_a_wake_stops_the_loop_task_and_gives_the_lease_back() -> None:
    store = WakeStore()
    provider = ScriptedProvider([Reply.text("one")])
    async with open_runtime(
        system_prompt=SystemPrompt(), store=store, providers={"default": provider}
    ) as rt:
        agent = (await rt.start_agent(options=HIBERNATE, session_id="s")).value
        agent.followup("a")
        await agent.when_idle()
        store.gate = trio.Event()  # never set: the wake hangs
        agent.followup("b")
        await store.loading.wait()
    assert agent.closed and not agent.statistics().loop_task
    lease = await store.acquire_lease("s")
    assert lease.epoch == 2
    assert [event.type for event in await store.load("s")].count("turn/end") == 1  # b: never run


# -- the supervisor's hosted children -------------------------------------------------


class HostedWorker:
    """A hosted child that runs one task per `work()` and records its stops."""

    def __init__(self) -> None:
        self.stops: list[int] = []
        self.hosts: list[ChildHost] = []
        self.release = trio.Event()

    async def start(self, host: ChildHost) -> int:
        await trio.lowlevel.checkpoint()
        self.hosts.append(host)
        return len(self.hosts) - 1

    async def stop(self, value: int) -> None:
        await trio.lowlevel.checkpoint()
        self.stops.append(value)

    def work(self, *, crash: bool = False) -> None:
        async def task() -> None:
            if crash:
                raise RuntimeError("the hosted task broke")
            await self.release.wait()

        self.hosts[-1].start_soon(task)


async def test_a_hosted_child_has_no_task_its_crash_stops_and_restarts_it() -> None:
    worker = HostedWorker()
    supervisor = Supervisor(name="sup")
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.serve)
        child = await supervisor.start_child(
            HostedChildSpec(id="w", start=worker.start, stop=worker.stop)
        )
        await trio.testing.wait_all_tasks_blocked()
        assert child.value == 0 and _supervisor_tasks(supervisor) == 0
        worker.work()
        await trio.testing.wait_all_tasks_blocked()
        assert _supervisor_tasks(supervisor) == 1
        worker.work(crash=True)
        assert await child.wait_running(incarnation=1) == 1
        assert worker.stops == [0]  # stopped before the restart; its other task was cancelled
        await trio.testing.wait_all_tasks_blocked()
        assert _supervisor_tasks(supervisor) == 0
        assert supervisor.statistics().crashes == 1
        worker.work()
        exit = await supervisor.terminate_child("w")
        assert exit.reason == "terminated" and worker.stops == [0, 1]
        assert _supervisor_tasks(supervisor) == 0
        nursery.cancel_scope.cancel()


async def test_a_hosted_child_whose_start_fails_is_not_kept() -> None:
    async def start(host: ChildHost) -> int:
        await trio.lowlevel.checkpoint()
        raise ValueError("no")

    async def stop(value: int) -> None:
        raise AssertionError("a child that never started is not stopped")

    supervisor = Supervisor(name="sup")
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.serve)
        with pytest.raises(Exception, match="failed to start") as failed:
            await supervisor.start_child(HostedChildSpec(id="w", start=start, stop=stop))
        assert isinstance(failed.value.__cause__, ValueError)
        assert supervisor.children() == []
        nursery.cancel_scope.cancel()


async def test_max_awake_bounds_how_many_sessions_are_loaded_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sessions, bound = 6, 2
    awake_seen: list[int] = []
    agents: list[Agent] = []

    class CountingProvider(ScriptedProvider):
        async def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
            await trio.sleep(1)  # a slow model: every woken agent would pile up
            awake_seen.append(sum(not agent.session.hibernating for agent in agents))
            async with aclosing(super().stream(request)) as chunks:
                async for chunk in chunks:
                    yield chunk

    provider = CountingProvider([Reply.text(f"r{n}") for n in range(2 * sessions)])
    async with open_runtime(
        system_prompt=SystemPrompt(), providers={"default": provider}, max_awake=bound
    ) as rt:
        agents += [(await rt.start_agent(options=HIBERNATE)).value for _ in range(sessions)]
        for agent in agents:
            agent.followup("first")
        for agent in agents:
            await agent.when_idle()
        for agent in agents:
            agent.followup("second")
        for agent in agents:
            await agent.when_idle()
        for agent in agents:
            await agent.session.wake()
            assert turn_end_kinds(agent.session) == ["completed", "completed"]
    # The first pass: new, empty sessions are not hibernated, so only the second counts.
    assert len(awake_seen) == 2 * sessions and max(awake_seen[sessions:]) == bound


def _loop_tasks() -> int:
    """How many agent loop tasks (running `Agent._run_loop`) exist in this Trio run."""
    count = 0
    tasks = [trio.lowlevel.current_root_task()]
    while tasks:
        task = tasks.pop()
        assert task is not None
        awaited: object = task.coro
        while awaited is not None:  # the loop task may run inside its host's wrapper
            if getattr(awaited, "cr_code", None) is Agent._run_loop.__code__:
                count += 1
                break
            awaited = getattr(awaited, "cr_await", None)
        tasks += [child for nursery in task.child_nurseries for child in nursery.child_tasks]
    return count


class SlowProvider(ScriptedProvider):
    """A scripted model that takes a second per request."""

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
        await trio.sleep(1)
        async with aclosing(super().stream(request)) as chunks:
            async for chunk in chunks:
                yield chunk


async def test_agents_waiting_for_an_awake_slot_hold_no_task(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sessions = 5
    provider = SlowProvider([Reply.text(f"r{n}") for n in range(sessions)])
    async with open_runtime(
        system_prompt=SystemPrompt(), providers={"default": provider}, max_awake=1
    ) as rt:
        agents = [(await rt.start_agent(options=HIBERNATE)).value for _ in range(sessions)]
        for agent in agents:
            agent.followup("hello")
        await trio.sleep(0.5)
        assert _loop_tasks() == 1
        awake = rt.statistics().awake
        assert (awake.awake, awake.waiting) == (1, sessions - 1)
        assert all(agent.status == "running" for agent in agents)  # woken, waiting for a slot
        for agent in agents:
            await agent.when_idle()
        assert trio.current_time() == pytest.approx(sessions * 1.0, abs=0.5)  # one at a time
        assert _loop_tasks() == 0 and rt.statistics().awake.waiting == 0
        for agent in agents:
            await agent.session.wake()
            assert turn_end_kinds(agent.session) == ["completed"]


async def test_an_agent_shut_down_while_it_waits_for_a_slot_never_starts_its_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    provider = SlowProvider([Reply.text("first"), Reply.text("never")])
    async with open_runtime(
        system_prompt=SystemPrompt(), providers={"default": provider}, max_awake=1
    ) as rt:
        busy = (await rt.start_agent(options=HIBERNATE)).value
        waiting = await rt.start_agent(options=HIBERNATE)
        busy.followup("first")
        ticket = waiting.value.submit("never")
        await trio.sleep(0.5)
        assert rt.statistics().awake.waiting == 1
        closed = waiting.value
        await rt.supervisor.terminate_child(waiting.id)
        assert closed.status == "idle"
        with pytest.raises(AgentClosedError):
            await ticket.outcome()
        await busy.when_idle()
        await trio.sleep(5)
        assert _loop_tasks() == 0
        assert len(provider.requests) == 1  # the closed agent's input never reached the model
        awake = rt.statistics().awake
        assert (awake.awake, awake.waiting) == (0, 0)  # its place declined when its turn came


class RefusingHost:
    """A host that starts tasks in a nursery until `refuse` is set, then refuses them (as a
    supervisor's `ChildHost` refuses a stopping child's)."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.refuse = False

    def start_soon(self, async_fn: Callable[[], Awaitable[object]], /) -> None:
        if self.refuse:
            raise NotRunningError("this host is stopping its agents")
        self.nursery.start_soon(async_fn)


async def test_a_slot_admitting_an_agent_its_host_refuses_goes_to_the_next_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = MemoryStore()
    slots = AwakeAgents(limit=1, trim=None)
    provider = SlowProvider([Reply.text("first"), Reply.text("third")])
    async with trio.open_nursery() as nursery:
        hosts = [RefusingHost(nursery) for _ in range(3)]
        first, refused, third = [
            await start_hosted_agent(
                system_prompt=SystemPrompt(),
                provider=provider,
                options=HIBERNATE,
                store=store,
                host=host,
                awake_slots=slots,
            )
            for host in hosts
        ]
        first.followup("first")
        refused.followup("refused")
        third.followup("third")
        assert slots.statistics().waiting == 2
        hosts[1].refuse = True
        await third.when_idle()  # the refused agent's slot went on to the third
        assert first.status == refused.status == "idle"
        sent = [request.messages[-1].content[0] for request in provider.requests]
        assert [block.text for block in sent if isinstance(block, TextBlock)] == ["first", "third"]
        assert (slots.statistics().awake, slots.statistics().waiting) == (0, 0)
        for agent in (first, refused, third):
            await agent.shutdown()


async def test_max_awake_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_awake must be at least 1, got 0"):
        async with open_runtime(system_prompt=SystemPrompt(), max_awake=0):
            pass
