"""The runtime: its services, shutdown order, registry fan-out and supervised agents."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from actors.agent import Agent, AgentOptions
from actors.messages import UserSource
from actors.prompt import PERSONA_ORDER, PERSONA_SECTION, PromptSection, SystemPrompt
from actors.providers import ProviderError, Reply, ScriptedProvider, ToolCall
from actors.providers.actor import ProviderActor
from actors.providers.openai_compat import OpenAICompatProvider
from actors.session import MemoryStore, SessionError, SQLiteStore
from actors.session.events import TurnEnd, TurnEndReason, UserMessage
from supervision import (
    MissingModelError,
    NotRunningError,
    RegistryChange,
    RestartIntensityError,
    ShutdownError,
    SpawnProvider,
    UnknownProviderError,
    open_runtime,
)
from supervision.awake import find_malloc_trim
from supervision.runtime import SHUTDOWN_GRACE_SECONDS
from tests.agent.helpers import data_of, turn_end_kinds
from tests.supervision.helpers import FlakyStore, ServedProvider, WatchedProvider, WriterStore

OPTIONS = AgentOptions(model="m")


async def test_runtime_runs_registry_store_writer_provider_actors_and_supervisor(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[str] = []
    served = ServedProvider(script=[], log=log)
    async with open_runtime(
        system_prompt=SystemPrompt(),
        store=WriterStore(log=log),
        providers={"served": served, "plain": ScriptedProvider([])},
    ) as runtime:
        stats = runtime.statistics()
        trimmer = ("awake",) if find_malloc_trim() is not None else ()  # see test_awake.py
        assert stats.services == ("registry", "store", "provider:served", *trimmer, "supervisor")
        assert stats.supervisor.running and stats.registry.running
    assert log == ["store started", "provider started", "provider stopped", "store stopped"]
    assert runtime.statistics().services == ()


async def test_leaving_the_runtime_stops_services_in_reverse_order_losing_no_event(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[str] = []
    store = WriterStore(log=log)
    provider = ServedProvider(script=[Reply.hang("half")], log=log)
    async with open_runtime(
        system_prompt=SystemPrompt(), store=store, providers={"default": provider}
    ) as runtime:
        child = await runtime.start_agent(options=OPTIONS)
        child.value.followup("hi")
        await provider.wait_requests(1)
        session_id = child.value.session.id
    assert log == [
        "store started",
        "provider started",
        "stream closed",
        "provider stopped",
        "store stopped",
    ]
    durable = store.durable[session_id]
    assert [e.seq for e in durable] == list(range(len(durable)))
    assert durable[-1].data == TurnEnd(turn=0, reason=TurnEndReason.aborted("disposed"))


async def test_leaving_the_runtime_flushes_the_store_before_its_writer_stops(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = WriterStore(log=[], write_delay=1.0)
    async with open_runtime(
        system_prompt=SystemPrompt(), store=store, providers={"default": ScriptedProvider([])}
    ) as runtime:
        child = await runtime.start_agent(options=OPTIONS)
        session = child.value.session
        for text in "abc":  # accepted by the store, still queued for its slow writer
            await session.append(UserMessage(content=text, source=UserSource()))
    assert store.durable[session.id] == list(session.events)
    assert [e.data.to_message().text for e in store.durable[session.id]] == ["a", "b", "c"]


async def test_registry_changes_coalesce_while_the_subscriber_has_not_looked(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = SystemPrompt()
    async with open_runtime(system_prompt=prompt) as runtime, runtime.registry_changes() as changes:
        prompt.section(PromptSection(name="a", order=1, text="a"))
        first = await changes.receive()
        assert first.changes == 1
        for name in "bcd":
            prompt.section(PromptSection(name=name, order=1, text=name))
        second = await changes.receive()
        assert second == RegistryChange(generation=first.generation + 3, changes=3)
        with trio.move_on_after(1) as waited:
            await changes.receive()
        assert waited.cancelled_caught
        stats = runtime.statistics().registry
        assert (stats.subscribers, stats.notices, stats.coalesced) == (1, 2, 2)


async def test_registry_subscriptions_end_when_the_runtime_stops(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = SystemPrompt()
    received: list[RegistryChange | str] = []
    async with trio.open_nursery() as nursery, open_runtime(system_prompt=prompt) as runtime:

        async def consume(*, task_status: trio.TaskStatus[None]) -> None:
            async with runtime.registry_changes() as changes:
                task_status.started()
                async for change in changes:
                    received.append(change)
            received.append("ended")

        await nursery.start(consume)
        prompt.section(PromptSection(name="a", order=1, text="a"))
        await trio.sleep(1)
    assert received == [RegistryChange(generation=1, changes=1), "ended"]


async def test_registry_changes_after_the_runtime_stopped_raise_not_running_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_runtime(system_prompt=SystemPrompt()) as runtime:
        pass
    with pytest.raises(NotRunningError, match="the registry service is not running"):
        async with runtime.registry_changes():
            pytest.fail("subscribed to a registry service that is not running")


async def test_agent_runs_the_provider_named_in_its_options(
    autojump_clock: trio.testing.MockClock,
) -> None:
    a = ScriptedProvider([Reply.text("from a")])
    b = ScriptedProvider([Reply.text("from b")])
    async with open_runtime(system_prompt=SystemPrompt(), providers={"a": a, "b": b}) as runtime:
        child = await runtime.start_agent(options=AgentOptions(model="m", provider_name="b"))
        child.value.followup("hi")
        await child.value.when_idle()
    assert (len(a.requests), len(b.requests)) == (0, 1)
    assert b.requests[0].config["provider"] == "b"


async def test_unknown_provider_name_is_rejected_naming_the_configured_ones(
    autojump_clock: trio.testing.MockClock,
) -> None:
    providers = {"a": ScriptedProvider([]), "b": ScriptedProvider([])}
    async with open_runtime(system_prompt=SystemPrompt(), providers=providers) as runtime:
        with pytest.raises(
            UnknownProviderError, match=r"no provider 'c'; configured: \['a', 'b'\]"
        ):
            await runtime.start_agent(options=AgentOptions(model="m", provider_name="c"))


async def test_crashed_agent_restarts_over_its_session_with_a_resume_header(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = FlakyStore()
    provider = ScriptedProvider([Reply.text("one"), Reply.text("two"), Reply.text("three")])
    async with open_runtime(
        system_prompt=SystemPrompt(), store=store, providers={"default": provider}
    ) as runtime:
        child = await runtime.start_agent(options=OPTIONS, session_id="s1")
        first = child.value
        first.followup("a")
        await first.when_idle()
        store.fail_next("assistant/message")
        first.followup("b")
        second = await child.wait_running(incarnation=1)
        assert second is not first and second.session.id == "s1"
        second.followup("c")
        await second.when_idle()
    assert turn_end_kinds(second.session) == ["completed", "interrupted", "completed"]
    assert [h.reason for h in data_of(second.session, "request/header")] == ["initial", "resume"]
    assert [m.text for m in provider.requests[-1].messages] == ["a", "one", "b", "c"]


async def test_a_failed_turn_is_not_a_crash_and_restarts_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    provider = ScriptedProvider(
        [Reply.failure("unauthorized", "bad key", status=401), Reply.text("ok")]
    )
    async with open_runtime(
        system_prompt=SystemPrompt(), providers={"default": provider}
    ) as runtime:
        child = await runtime.start_agent(options=OPTIONS)
        agent = child.value
        agent.followup("a")
        await agent.when_idle()
        agent.followup("b")
        await agent.when_idle()
        assert (child.incarnation, child.value) == (0, agent)
        stats = runtime.statistics().supervisor
        assert (stats.restarts, stats.crashes) == (0, 0)
    assert turn_end_kinds(agent.session) == ["error", "completed"]


async def test_sibling_agent_never_notices_a_restart(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = FlakyStore()
    calm = WatchedProvider(script=[Reply.hang()])
    providers = {"crashy": ScriptedProvider([Reply.text("x")]), "calm": calm}
    async with open_runtime(
        system_prompt=SystemPrompt(), store=store, providers=providers
    ) as runtime:
        sibling_child = await runtime.start_agent(
            options=AgentOptions(model="m", provider_name="calm")
        )
        sibling = sibling_child.value
        sibling.followup("long task")
        await calm.wait_requests(1)
        crashy = await runtime.start_agent(options=AgentOptions(model="m", provider_name="crashy"))
        store.fail_next("assistant/message")
        crashy.value.followup("boom")
        await crashy.wait_running(incarnation=1)
        assert sibling_child.incarnation == 0 and sibling_child.value is sibling
        assert sibling.status == "running" and turn_end_kinds(sibling.session) == []
        sibling.cancel()
        await sibling.when_idle()
    assert data_of(sibling.session, "turn/end")[0].reason == TurnEndReason.aborted("user")


async def test_restarted_agent_has_only_its_new_registrations_before_its_first_step(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = SystemPrompt()
    store = FlakyStore()
    provider = ScriptedProvider([Reply.text("one"), Reply.text("two"), Reply.text("three")])
    incarnations: list[Agent] = []

    def setup(agent: Agent) -> None:
        section = PromptSection(
            name="incarnation", order=50, text=f"incarnation {len(incarnations)}"
        )
        prompt.section(section, scope=agent.scope)
        incarnations.append(agent)

    async with open_runtime(
        system_prompt=prompt, store=store, providers={"default": provider}
    ) as runtime:
        child = await runtime.start_agent(options=OPTIONS, setup=setup)
        sections_with_one_agent = prompt.statistics().sections
        child.value.followup("a")
        await child.value.when_idle()
        store.fail_next("assistant/message")
        child.value.followup("b")
        second = await child.wait_running(incarnation=1)
        assert incarnations[0].scope.closed
        assert prompt.statistics().sections == sections_with_one_agent
        second.followup("c")
        await second.when_idle()
    assert provider.requests[-1].system is not None
    assert "incarnation 1" in provider.requests[-1].system
    assert "incarnation 0" not in provider.requests[-1].system


async def test_every_agent_scope_descends_from_the_runtime_scope(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = SystemPrompt()
    provider = ScriptedProvider(
        [
            Reply.tool_calls([ToolCall(id="c1", name="subagent", arguments={"prompt": "go"})]),
            Reply.text("child done"),
            Reply.text("parent done"),
        ]
    )
    async with open_runtime(system_prompt=prompt, providers={"default": provider}) as runtime:
        prompt.section(
            PromptSection(name="runtime:note", order=10, text="runtime note"), scope=runtime.scope
        )
        child = await runtime.start_agent(options=OPTIONS, subagents=[SpawnProvider()])
        agent = child.value
        assert agent.scope.parent is runtime.scope
        agent.followup("delegate")
        await agent.when_idle()
    parent_request, child_request, _ = provider.requests
    assert child_request.messages[0].text == "go"
    assert child_request.system is not None and "runtime note" in child_request.system
    assert parent_request.system is not None and "runtime note" in parent_request.system
    assert data_of(agent.session, "tool/result")[0].content == "child done"


async def test_deployment_sections_live_in_the_global_layer_for_the_runtimes_life(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = SystemPrompt(persona="You are terse.")
    guidance = PromptSection(name="tool:bash", order=105, text="Check the exit code.")
    provider = ScriptedProvider([Reply.text("ok")])
    async with open_runtime(
        system_prompt=prompt, sections=[guidance], providers={"default": provider}
    ) as runtime:
        global_layer = await prompt.assemble()
        assert [s.name for s in global_layer.sections] == [
            "harness:identity",
            "deployment:persona",
            "tool:bash",
        ]
        child = await runtime.start_agent(options=OPTIONS)
        child.value.followup("hi")
        await child.value.when_idle()
    system = provider.requests[0].system
    assert system is not None and "You are terse." in system and "Check the exit code." in system
    assert "tool:bash" not in [s.name for s in (await prompt.assemble()).sections]


async def test_agent_restart_loop_fails_the_runtime_with_restart_intensity_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = FlakyStore()
    broken = False

    def setup(agent: Agent) -> None:
        if broken:
            raise RuntimeError("plugin failed to load")

    with pytest.raises(RestartIntensityError, match=r"child 'agent:s1' crashed"):
        async with open_runtime(
            system_prompt=SystemPrompt(),
            store=store,
            providers={"default": ScriptedProvider([Reply.text("x")])},
            max_restarts=2,
        ) as runtime:
            child = await runtime.start_agent(options=OPTIONS, session_id="s1", setup=setup)
            broken = True
            store.fail_next("assistant/message")
            child.value.followup("boom")
            await trio.sleep_forever()
    assert runtime.statistics().supervisor.restarts == 2


async def test_memory_store_is_the_default_and_needs_no_writer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_runtime(system_prompt=SystemPrompt()) as runtime:
        assert isinstance(runtime.store, MemoryStore)
        assert "store" not in runtime.statistics().services


@attrs.define(eq=False)
class StubbornProvider(WatchedProvider):
    """A provider actor whose cleanup outlasts the runtime's shutdown grace period."""

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(SHUTDOWN_GRACE_SECONDS * 2)


async def test_services_that_outlast_the_shutdown_grace_period_raise_shutdown_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    stubborn = StubbornProvider(script=[])
    with pytest.raises(ShutdownError, match=r"did not stop within 60.0s: \['provider:slow'\]"):
        async with open_runtime(system_prompt=SystemPrompt(), providers={"slow": stubborn}):
            pass


async def test_sqlite_store_keeps_every_event_of_a_turn_live_at_shutdown(tmp_path: Path) -> None:
    # A real clock on purpose: the SQLite writer commits in worker threads,
    # and an autojump clock would fire the write deadlines while they run.
    path = tmp_path / "sessions.db"
    provider = WatchedProvider(script=[Reply.hang("half an answer")])
    async with open_runtime(
        system_prompt=SystemPrompt(), store=SQLiteStore(path), providers={"default": provider}
    ) as runtime:
        child = await runtime.start_agent(options=OPTIONS, session_id="s1")
        agent = child.value
        agent.followup("hi")
        await provider.wait_requests(1)
    stored = await SQLiteStore(path).load("s1")
    assert [e.type for e in stored] == [e.type for e in agent.session.events]
    assert stored[-1].data == TurnEnd(turn=0, reason=TurnEndReason.aborted("disposed"))


async def test_runtime_agent_children_run_the_child_setup_before_their_first_step(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prompt = SystemPrompt(persona="deployment persona")

    def child_persona(child: Agent) -> None:
        prompt.section(
            PromptSection(name=PERSONA_SECTION, order=PERSONA_ORDER, text="child persona"),
            scope=child.scope,
        )

    provider = ScriptedProvider(
        [
            Reply.tool_calls([ToolCall(id="c1", name="subagent", arguments={"prompt": "work"})]),
            Reply.text("worked"),
            Reply.text("done"),
        ]
    )
    async with open_runtime(system_prompt=prompt, providers={"default": provider}) as runtime:
        child = await runtime.start_agent(
            options=OPTIONS, subagents=[SpawnProvider()], child_setup=child_persona
        )
        child.value.followup("go")
        await child.value.when_idle()
    parent_request, child_request, _ = provider.requests
    assert parent_request.system is not None and "deployment persona" in parent_request.system
    assert child_request.system is not None and "child persona" in child_request.system
    assert "deployment persona" not in child_request.system


async def test_start_agent_without_a_model_is_refused() -> None:
    async with open_runtime(
        system_prompt=SystemPrompt(), providers={"default": ScriptedProvider([])}
    ) as runtime:
        with pytest.raises(MissingModelError, match=r"start_agent needs options=AgentOptions"):
            await runtime.start_agent()


async def test_start_agent_uses_the_runtime_default_options() -> None:
    provider = ScriptedProvider([Reply.text("hi")])
    async with open_runtime(
        system_prompt=SystemPrompt(),
        providers={"default": provider},
        default_options=AgentOptions(model="deepseek-chat"),
    ) as runtime:
        child = await runtime.start_agent()
        await child.value.run("hello")
    assert provider.requests[0].config["model"] == "deepseek-chat"


async def test_bad_provider_url_leaves_open_runtime_as_one_provider_error() -> None:
    actor = ProviderActor(
        name="deepseek",
        factory=lambda client: OpenAICompatProvider(client, base_url="not a url", api_key=None),
    )
    with pytest.raises(ProviderError, match=r"base_url 'not a url' must be an absolute"):
        async with open_runtime(system_prompt=SystemPrompt(), providers={"deepseek": actor}):
            pytest.fail("the runtime started with a provider that cannot work")


async def test_bad_store_path_leaves_open_runtime_as_one_session_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    path = blocker / "sessions.sqlite"
    with pytest.raises(SessionError, match=rf"SQLite store '{path}'"):
        async with open_runtime(system_prompt=SystemPrompt(), store=SQLiteStore(path)):
            pytest.fail("the runtime started over an unusable store")
