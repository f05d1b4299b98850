"""The root of the actor tree: `open_runtime()`.

The runtime's root nursery runs, in start order: the prompt registry
service (change fan-out), the session store's writer (unless the store is
already running), one provider actor per configured provider that has a
`serve` method, the awake agents' memory trimmer (`supervision.awake`,
where the C library can trim), and the root supervisor, under which agents
run. Leaving
the runtime stops them in reverse order: the supervisor first (every agent
writes its closing events), then the store is flushed, then the providers,
the store writer and the registry service stop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol, runtime_checkable

import attrs
import trio

from actors.agent import Agent, AgentOptions, Tool, open_agent, start_hosted_agent
from actors.agent.tools import shared_tools
from actors.boundary import one_exception
from actors.prompt import PromptSection, PromptStatistics, SystemPrompt
from actors.prompt import RegistryChange as RegistryChange
from actors.prompt import RegistryService as RegistryService
from actors.prompt import RegistryStatistics as RegistryStatistics
from actors.prompt import RegistrySubscription as RegistrySubscription
from actors.providers import Provider
from actors.scope import Registration, Scope
from actors.session import MemoryStore, SessionStore
from actors.session.session import WallClock, new_session_id, system_clock_ms
from supervision.awake import AwakeAgents, AwakeStatistics, find_malloc_trim
from supervision.gc_policy import DEFAULT_GC_THRESHOLDS, GcThresholds, applied_thresholds
from supervision.subagents import SubagentProvider, open_subagents
from supervision.supervisor import (
    Child,
    ChildHost,
    ChildSpec,
    ChildStart,
    HostedChildSpec,
    NotRunningError,
    RestartType,
    Strategy,
    SupervisionError,
    Supervisor,
    SupervisorStatistics,
)

SHUTDOWN_GRACE_SECONDS = 60.0
"""How long leaving the runtime may take to stop its services in order."""


class UnknownProviderError(SupervisionError):
    """An agent asked for a provider name the runtime was not configured with."""


class MissingModelError(SupervisionError):
    """An agent was started with no model: no `options` and no runtime `default_options`."""


class ShutdownError(SupervisionError):
    """The runtime's services did not stop within `SHUTDOWN_GRACE_SECONDS`."""


@runtime_checkable
class _Served(Protocol):
    """Something with a `serve(*, task_status)` service method (a provider actor, a store)."""

    def serve(self, *, task_status: trio.TaskStatus[Any] = ...) -> Awaitable[None]:
        """Run until cancelled; call `task_status.started()` once usable."""
        ...


@attrs.frozen(kw_only=True)
class RuntimeStatistics:
    """A snapshot of the runtime: its services, supervisor, registry service and prompt.

    `awake` counts the hosted agents awake now and the allocator trims done.
    """

    name: str
    services: tuple[str, ...]
    supervisor: SupervisorStatistics
    registry: RegistryStatistics
    prompt: PromptStatistics
    awake: AwakeStatistics


@attrs.define(eq=False)
class _Service:
    """One service task of the root nursery, stoppable on its own."""

    name: str
    cancel_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    done: trio.Event = attrs.field(factory=trio.Event)
    stopping: bool = False

    async def run(
        self,
        serve: Callable[..., Awaitable[None]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            with self.cancel_scope:
                await serve(task_status=task_status)
        finally:
            self.done.set()

    async def stop(self) -> None:
        self.stopping = True
        self.cancel_scope.cancel()
        await self.done.wait()


@attrs.define(eq=False)
class Runtime:
    """The running tree: the runtime scope, the shared registry and store, providers, agents.

    Every agent started here runs under `supervisor`, in a scope whose
    parent is `scope`. Get one with `open_runtime`.
    """

    name: str
    scope: Scope
    system_prompt: SystemPrompt
    store: SessionStore
    providers: Mapping[str, Provider]
    supervisor: Supervisor
    registry: RegistryService
    _clock: WallClock
    _services: list[_Service]
    default_options: AgentOptions | None = None
    """What `start_agent` uses when it is given no `options` (None: options are required)."""
    awake_agents: AwakeAgents = attrs.field(factory=AwakeAgents)
    """Counts (and bounds) the agents without subagents awake at once (see `open_runtime`)."""

    def registry_changes(self) -> AbstractAsyncContextManager[RegistrySubscription]:
        """An async context manager yielding a coalescing channel of registry changes.

        Raises:
            NotRunningError: the registry service does not run.
        """
        return _subscribe(self.registry)

    async def start_agent(
        self,
        *,
        options: AgentOptions | None = None,
        session_id: str | None = None,
        tools: Sequence[Tool] = (),
        subagents: Sequence[SubagentProvider] = (),
        setup: Callable[[Agent], None] | None = None,
        child_setup: Callable[[Agent], None] | None = None,
        restart: RestartType = "permanent",
    ) -> Child[Agent]:
        """Start an agent actor under the root supervisor; returns once it accepts input.

        `options` names the model (and provider); without it the runtime's
        `default_options` apply, and with neither the call fails: there is
        no placeholder model. The agent runs `self.providers[options.provider_name]` over the
        session `session_id` (a new id when None; an existing one resumes),
        with its scope's parent the runtime scope, `tools`, and the given
        subagent providers activated. `setup(agent)` runs before the agent
        is handed out and again on every restart, so its registrations (in
        `agent.scope`) are in place before the first step of each
        incarnation, and the previous incarnation's are gone.
        `child_setup(child)` runs in each subagent before its first step
        (e.g. to shadow `deployment:persona` in the child's scope). After a crash
        the child restarts over the same session: the interrupted turn is
        closed `interrupted` and the next request logs a `resume` header.
        `child.value` is the current incarnation's `Agent`. An agent with no
        subagent providers is a hosted child (`HostedChildSpec`): it holds no
        task while idle, its turns run in the supervisor's nursery, and it
        keeps its session's lease until it is stopped (`Agent.shutdown`).

        Cancellation: cancellable while the agent starts (nothing is kept).

        Raises:
            MissingModelError: no `options` and no runtime `default_options`.
            UnknownProviderError: no provider has that name.
            ChildStartError: the agent failed to start (`setup` raised, the
                session could not be opened).
            NotRunningError: the runtime is shutting down.
        """
        options = options or self.default_options
        if options is None:
            raise MissingModelError(
                f"runtime {self.name!r}: start_agent needs options=AgentOptions(model=...) "
                "naming the model (or open_runtime(default_options=...)); there is no default model"
            )
        provider = self.providers.get(options.provider_name)
        if provider is None:
            raise UnknownProviderError(
                f"runtime {self.name!r} has no provider {options.provider_name!r}; "
                f"configured: {sorted(self.providers)}"
            )
        sid = session_id or new_session_id()
        spec: ChildSpec[Agent] | HostedChildSpec[Agent]
        if subagents:
            spec = ChildSpec(
                id=f"agent:{sid}",
                start=self._agent_start(
                    provider=provider,
                    options=options,
                    session_id=sid,
                    tools=tuple(tools),
                    subagents=tuple(subagents),
                    setup=setup,
                    child_setup=child_setup,
                ),
                restart=restart,
            )
        else:
            spec = HostedChildSpec(
                id=f"agent:{sid}",
                start=_HostedStart(
                    runtime=self,
                    provider=provider,
                    options=options,
                    session_id=sid,
                    tools=shared_tools(tools),
                    setup=setup,
                ),
                stop=Agent.shutdown,
                restart=restart,
            )
        return await self.supervisor.start_child(spec)

    def statistics(self) -> RuntimeStatistics:
        """Running services, the supervisor's, the registry service's and the prompt's counters."""
        return RuntimeStatistics(
            name=self.name,
            services=tuple(s.name for s in self._services if not s.done.is_set()),
            supervisor=self.supervisor.statistics(),
            registry=self.registry.statistics(),
            prompt=self.system_prompt.statistics(),
            awake=self.awake_agents.statistics(),
        )

    def _agent_start(
        self,
        *,
        provider: Provider,
        options: AgentOptions,
        session_id: str,
        tools: tuple[Tool, ...],
        subagents: tuple[SubagentProvider, ...],
        setup: Callable[[Agent], None] | None,
        child_setup: Callable[[Agent], None] | None,
    ) -> ChildStart[Agent]:
        def ready(agent: Agent, task_status: trio.TaskStatus[Agent]) -> None:
            if setup is not None:
                setup(agent)
            task_status.started(agent)

        async def start(*, task_status: trio.TaskStatus[Agent] = trio.TASK_STATUS_IGNORED) -> None:
            async with open_agent(
                system_prompt=self.system_prompt,
                provider=provider,
                options=options,
                store=self.store,
                session_id=session_id,
                tools=tools,
                scope=self.scope,
                clock=self._clock,
            ) as agent:
                # Only an agent with subagent providers gets a children's supervisor
                # (a nursery and a task it would otherwise hold while idle).
                if not subagents:
                    ready(agent, task_status)
                    await trio.sleep_forever()
                async with open_subagents(
                    agent,
                    system_prompt=self.system_prompt,
                    provider=provider,
                    options=options,
                    tools=tools,
                    setup=child_setup,
                ) as children:
                    for subagent_provider in subagents:
                        children.activate(subagent_provider)
                    ready(agent, task_status)
                    await trio.sleep_forever()

        return start


@attrs.frozen(kw_only=True, eq=False)
class _HostedStart:
    """Starts an incarnation of an agent with no subagents: no task while idle, its turns run
    as the host's tasks (`start_hosted_agent`), then `setup` runs.

    An object rather than a closure: the supervisor keeps it for the agent's whole life (to
    restart it), and a closure over these names costs several times as much.
    """

    runtime: Runtime
    provider: Provider
    options: AgentOptions
    session_id: str
    tools: tuple[Tool, ...]
    setup: Callable[[Agent], None] | None

    async def __call__(self, host: ChildHost) -> Agent:
        runtime = self.runtime
        agent = await start_hosted_agent(
            system_prompt=runtime.system_prompt,
            provider=self.provider,
            options=self.options,
            store=runtime.store,
            host=host,
            session_id=self.session_id,
            tools=self.tools,
            scope=runtime.scope,
            clock=runtime._clock,
            awake_slots=runtime.awake_agents,
        )
        try:
            if self.setup is not None:
                self.setup(agent)
        except BaseException:
            await agent.shutdown()
            raise
        return agent


@asynccontextmanager
async def _subscribe(registry: RegistryService) -> AsyncIterator[RegistrySubscription]:
    # The service lives in `actors`, which cannot raise supervision's errors;
    # the runtime keeps its contract of `NotRunningError` for a stopped service.
    if not registry.running:
        raise NotRunningError("the registry service is not running")
    async with registry.subscribe() as subscription:
        yield subscription


@asynccontextmanager
async def open_runtime(
    *,
    system_prompt: SystemPrompt,
    store: SessionStore | None = None,
    providers: Mapping[str, Provider] | None = None,
    sections: Sequence[PromptSection] = (),
    name: str = "runtime",
    strategy: Strategy = "one_for_one",
    max_restarts: int = 3,
    restart_period: float = 5.0,
    clock: WallClock = system_clock_ms,
    default_options: AgentOptions | None = None,
    max_awake: int | None = None,
    trim_memory: bool = True,
    gc_thresholds: GcThresholds | None = DEFAULT_GC_THRESHOLDS,
) -> AsyncIterator[Runtime]:
    """Open the root nursery, start the runtime's services and yield the `Runtime`.

    Started in order: the registry service; `store`'s writer unless the
    store is already running (`store=None`: a fresh `MemoryStore`); each
    provider that has a `serve` method (e.g. a `ProviderActor`); the root
    supervisor (`strategy`, at most `max_restarts` restarts within
    `restart_period` seconds). `sections` (deployment-wide guidance) are
    registered in the global layer for the runtime's life. `default_options`
    is what `start_agent` uses when given no options (a configured profile).

    `max_awake` (None: no bound) bounds how many agents without subagent
    providers are awake at once: an agent holds a slot from before its
    session wakes until it is idle again, and woken input beyond the bound
    waits for a slot, first come first served, as a queue entry (its loop
    task starts once it holds a slot). With
    `AgentOptions(hibernate=True)` a burst of input to many idle sessions
    then loads at most `max_awake` logs at a time, so its memory stays
    bounded. A tool that awaits another such agent's turn may wait for ever
    once every slot is held by waiting turns: size it above that depth.

    With `trim_memory` (the default) the runtime gives the memory a burst
    of such agents freed back to the operating system once they are all
    idle again (glibc's `malloc_trim`, where the C library has it; a no-op
    elsewhere): after at least `supervision.awake.TRIM_AFTER_SLEEPS` awake
    periods ended and `TRIM_QUIET_SECONDS` with none awake, never per step
    (see `supervision.awake`).

    While it is open the process's cyclic garbage collector runs at
    `gc_thresholds` (`gc.set_threshold`; by default a young threshold of
    100,000 instead of CPython's 700, so a burst of many concurrent turns
    does not keep re-walking its live heap); the process's own thresholds
    come back once the last runtime that set any closes. None leaves the
    collector alone (see `supervision.gc_policy`).

    Leaving the context stops everything in reverse order, shielded: the
    supervisor terminates every agent (a live turn ends aborted, cause
    "disposed", and is written), the store is flushed, then the providers,
    the store writer and the registry service stop; the sections are
    removed and the runtime scope is closed. So no event an agent appended
    is lost.

    Every error leaves as one exception (never an `ExceptionGroup`); the
    body's own exceptions propagate unchanged.

    Raises:
        RestartIntensityError: the root supervisor gave up; the body is cancelled.
        SessionError: the store cannot be opened (the message names its path).
        ProviderError: a provider cannot start (e.g. a malformed base URL).
        ShutdownError: the services did not stop within
            `SHUTDOWN_GRACE_SECONDS`.
        PromptError: a section is invalid or already registered.
        ValueError: `max_awake` is below 1.
        GcPolicyError: a `gc_thresholds` value is not a positive integer.
    """
    awake_agents = AwakeAgents(limit=max_awake, trim=find_malloc_trim() if trim_memory else None)
    store = store or MemoryStore()
    providers = dict(providers or {})
    scope = Scope(name=name)
    registry = RegistryService(system_prompt=system_prompt)
    supervisor = Supervisor(
        name=name, strategy=strategy, max_restarts=max_restarts, period=restart_period
    )
    services: list[_Service] = []
    guidance: list[Registration] = []
    stuck: list[str] = []
    with one_exception(), applied_thresholds(gc_thresholds):
        async with trio.open_nursery() as nursery:

            async def start(service_name: str, serve: Callable[..., Awaitable[None]]) -> None:
                service = _Service(name=service_name)
                services.append(service)
                await nursery.start(service.run, serve)

            try:
                await start("registry", registry.serve)
                if not store.running:
                    await start("store", store.serve)
                for provider_name, provider in providers.items():
                    if isinstance(provider, _Served):
                        await start(f"provider:{provider_name}", provider.serve)
                if awake_agents.trim is not None:
                    await start("awake", awake_agents.serve)
                await start("supervisor", supervisor.serve)
                guidance.extend(system_prompt.section(section) for section in sections)
                yield Runtime(
                    name=name,
                    scope=scope,
                    system_prompt=system_prompt,
                    store=store,
                    providers=providers,
                    supervisor=supervisor,
                    registry=registry,
                    clock=clock,
                    services=services,
                    default_options=default_options,
                    awake_agents=awake_agents,
                )
            finally:
                try:
                    with trio.CancelScope(shield=True), trio.move_on_after(SHUTDOWN_GRACE_SECONDS):
                        for service in reversed(services):
                            await service.stop()
                            if service.name == "supervisor":
                                await store.flush()
                    stuck = [s.name for s in services if s.stopping and not s.done.is_set()]
                finally:
                    for registration in guidance:
                        registration.dispose()
                    scope.close()
                    nursery.cancel_scope.cancel()
    if stuck:
        raise ShutdownError(
            f"runtime {name!r}: services did not stop within {SHUTDOWN_GRACE_SECONDS}s: {stuck}"
        )
