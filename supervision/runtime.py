"""The root of the actor tree: `open_runtime()`.

The runtime's root nursery runs, in start order: the prompt registry
service (change fan-out), the session store's writer (unless the store is
already running), one provider actor per configured provider that has a
`serve` method, and the root supervisor, under which agents run. Leaving
the runtime stops them in reverse order: the supervisor first (every agent
writes its closing events), then the store is flushed, then the providers,
the store writer and the registry service stop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from typing import Any, Protocol, runtime_checkable

import attrs
import trio

from actors.agent import Agent, AgentOptions, Tool, open_agent
from actors.prompt import PromptSection, PromptStatistics, SystemPrompt
from actors.providers import Provider
from actors.scope import Registration, Scope
from actors.session import MemoryStore, SessionStore
from actors.session.session import WallClock, new_session_id, system_clock_ms
from supervision.subagents import SubagentProvider, open_subagents
from supervision.supervisor import (
    Child,
    ChildSpec,
    ChildStart,
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


class ShutdownError(SupervisionError):
    """The runtime's services did not stop within `SHUTDOWN_GRACE_SECONDS`."""


@runtime_checkable
class _Served(Protocol):
    """Something with a `serve(*, task_status)` service method (a provider actor, a store)."""

    def serve(self, *, task_status: trio.TaskStatus[Any] = ...) -> Awaitable[None]:
        """Run until cancelled; call `task_status.started()` once usable."""
        ...


# -- registry service -------------------------------------------------------


@attrs.frozen(kw_only=True)
class RegistryChange:
    """The prompt registry changed since the subscriber's previous notice.

    `generation` counts every change the registry service has seen;
    `changes` is how many of them this notice stands for (more than one when
    notices were coalesced because the subscriber had not looked yet).
    """

    generation: int
    changes: int


@attrs.frozen(kw_only=True)
class RegistryStatistics:
    """Counters of the registry service.

    `notices` counts notices received by subscribers, `coalesced` the changes
    folded into another notice (a slow subscriber's overflow).
    """

    running: bool
    subscribers: int
    changes: int
    notices: int
    coalesced: int


@attrs.define(eq=False)
class RegistrySubscription(trio.abc.ReceiveChannel[RegistryChange]):
    """A receive channel of registry changes that holds at most one pending notice.

    Overflow behaviour: coalesce. While a notice is pending, further changes
    fold into it (its `changes` grows), so a subscriber that falls behind
    costs nothing and learns only "changed since you last looked". The
    channel ends (`EndOfChannel`) when the registry service stops.
    """

    _service: RegistryService
    _seen: int
    _latest: int
    _wakeup: trio.Event = attrs.field(factory=trio.Event, init=False)
    _ended: bool = attrs.field(default=False, init=False)
    _closed: bool = attrs.field(default=False, init=False)

    async def receive(self) -> RegistryChange:
        """The next notice, waiting for a change if none is pending.

        Cancellation: cancellable; a pending notice stays pending.

        Raises:
            trio.EndOfChannel: the registry service stopped.
            trio.ClosedResourceError: this subscription was closed.
        """
        await trio.lowlevel.checkpoint()
        while True:
            if self._closed:
                raise trio.ClosedResourceError("this registry subscription is closed")
            if self._latest > self._seen:
                change = RegistryChange(generation=self._latest, changes=self._latest - self._seen)
                self._seen = self._latest
                self._service._delivered(change)
                return change
            if self._ended:
                raise trio.EndOfChannel
            self._wakeup = trio.Event()
            await self._wakeup.wait()

    async def aclose(self) -> None:
        """Stop receiving; the service forgets this subscriber."""
        self._close()
        await trio.lowlevel.checkpoint()

    def _notify(self, generation: int) -> None:
        self._latest = generation
        self._wakeup.set()

    def _end(self) -> None:
        self._ended = True
        self._wakeup.set()

    def _close(self) -> None:
        self._closed = True
        self._service._forget(self)
        self._wakeup.set()


@attrs.define(eq=False)
class RegistryService:
    """Fans the prompt registry's change notifications out to async subscribers.

    The registry's `on_change` callback only queues a wake-up for this
    actor (a channel of capacity 1; overflow: coalesce, since one wake-up
    covers every change before it is handled); the actor then notifies every
    subscription.
    """

    system_prompt: SystemPrompt
    _subscribers: list[RegistrySubscription] = attrs.field(factory=list, init=False)
    _wake: trio.MemorySendChannel[None] | None = attrs.field(default=None, init=False)
    _changes: int = attrs.field(default=0, init=False)
    _notices: int = attrs.field(default=0, init=False)
    _coalesced: int = attrs.field(default=0, init=False)

    @property
    def running(self) -> bool:
        """True while `serve` runs."""
        return self._wake is not None

    def statistics(self) -> RegistryStatistics:
        """Subscribers, changes seen, notices delivered and changes coalesced."""
        return RegistryStatistics(
            running=self.running,
            subscribers=len(self._subscribers),
            changes=self._changes,
            notices=self._notices,
            coalesced=self._coalesced,
        )

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Watch the registry until cancelled; `task_status.started()` once watching.

        Cancellation ends every subscription (their receivers see
        `EndOfChannel`) and removes the change callback.

        Raises:
            SupervisionError: the service is already running.
        """
        if self._wake is not None:
            raise SupervisionError("the registry service is already running")
        send, receive = trio.open_memory_channel[None](1)
        self._wake = send
        registration = self.system_prompt.on_change(self._changed)
        try:
            task_status.started()
            async with receive:
                async for _ in receive:
                    for subscriber in list(self._subscribers):
                        subscriber._notify(self._changes)
        finally:
            registration.dispose()
            self._wake = None
            for subscriber in self._subscribers:
                subscriber._end()
            self._subscribers.clear()

    @asynccontextmanager
    async def subscribe(self) -> AsyncIterator[RegistrySubscription]:
        """Yield a subscription that receives a notice after each later registry change.

        Leaving the context closes it.

        Raises:
            NotRunningError: the service does not run.
        """
        if self._wake is None:
            raise NotRunningError("the registry service is not running")
        subscription = RegistrySubscription(service=self, seen=self._changes, latest=self._changes)
        self._subscribers.append(subscription)
        async with subscription:
            yield subscription

    def _changed(self) -> None:
        self._changes += 1
        if self._wake is not None:
            # A full channel means a wake-up is pending; handling it covers this change.
            with suppress(trio.WouldBlock):
                self._wake.send_nowait(None)

    def _delivered(self, change: RegistryChange) -> None:
        self._notices += 1
        self._coalesced += change.changes - 1

    def _forget(self, subscription: RegistrySubscription) -> None:
        if subscription in self._subscribers:
            self._subscribers.remove(subscription)


# -- runtime ------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class RuntimeStatistics:
    """A snapshot of the runtime: its services, supervisor, registry service and prompt."""

    name: str
    services: tuple[str, ...]
    supervisor: SupervisorStatistics
    registry: RegistryStatistics
    prompt: PromptStatistics


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

    def registry_changes(self) -> AbstractAsyncContextManager[RegistrySubscription]:
        """An async context manager yielding a coalescing channel of registry changes.

        Raises:
            NotRunningError: the registry service does not run.
        """
        return self.registry.subscribe()

    async def start_agent(
        self,
        *,
        options: AgentOptions | None = None,
        session_id: str | None = None,
        tools: Sequence[Tool] = (),
        subagents: Sequence[SubagentProvider] = (),
        setup: Callable[[Agent], None] | None = None,
        restart: RestartType = "permanent",
    ) -> Child[Agent]:
        """Start an agent actor under the root supervisor; returns once it accepts input.

        The agent runs `self.providers[options.provider_name]` over the
        session `session_id` (a new id when None; an existing one resumes),
        with its scope's parent the runtime scope, `tools`, and the given
        subagent providers activated. `setup(agent)` runs before the agent
        is handed out and again on every restart, so its registrations (in
        `agent.scope`) are in place before the first step of each
        incarnation, and the previous incarnation's are gone. After a crash
        the child restarts over the same session: the interrupted turn is
        closed `interrupted` and the next request logs a `resume` header.
        `child.value` is the current incarnation's `Agent`.

        Cancellation: cancellable while the agent starts (nothing is kept).

        Raises:
            UnknownProviderError: no provider has that name.
            ChildStartError: the agent failed to start (`setup` raised, the
                session could not be opened).
            NotRunningError: the runtime is shutting down.
        """
        options = options or AgentOptions(model="m")
        provider = self.providers.get(options.provider_name)
        if provider is None:
            raise UnknownProviderError(
                f"runtime {self.name!r} has no provider {options.provider_name!r}; "
                f"configured: {sorted(self.providers)}"
            )
        sid = session_id or new_session_id()
        spec = ChildSpec(
            id=f"agent:{sid}",
            start=self._agent_start(
                provider=provider,
                options=options,
                session_id=sid,
                tools=tuple(tools),
                subagents=tuple(subagents),
                setup=setup,
            ),
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
    ) -> ChildStart[Agent]:
        async def start(*, task_status: trio.TaskStatus[Agent] = trio.TASK_STATUS_IGNORED) -> None:
            async with (
                open_agent(
                    system_prompt=self.system_prompt,
                    provider=provider,
                    options=options,
                    store=self.store,
                    session_id=session_id,
                    tools=tools,
                    scope=self.scope,
                    clock=self._clock,
                ) as agent,
                open_subagents(
                    agent,
                    system_prompt=self.system_prompt,
                    provider=provider,
                    options=options,
                    tools=tools,
                ) as children,
            ):
                for subagent_provider in subagents:
                    children.activate(subagent_provider)
                if setup is not None:
                    setup(agent)
                task_status.started(agent)
                await trio.sleep_forever()

        return start


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
) -> AsyncIterator[Runtime]:
    """Open the root nursery, start the runtime's services and yield the `Runtime`.

    Started in order: the registry service; `store`'s writer unless the
    store is already running (`store=None`: a fresh `MemoryStore`); each
    provider that has a `serve` method (e.g. a `ProviderActor`); the root
    supervisor (`strategy`, at most `max_restarts` restarts within
    `restart_period` seconds). `sections` (deployment-wide guidance) are
    registered in the global layer for the runtime's life.

    Leaving the context stops everything in reverse order, shielded: the
    supervisor terminates every agent (a live turn ends aborted, cause
    "disposed", and is written), the store is flushed, then the providers,
    the store writer and the registry service stop; the sections are
    removed and the runtime scope is closed. So no event an agent appended
    is lost.

    Raises:
        RestartIntensityError: (in an exception group, from the root
            nursery) the root supervisor gave up; the body is cancelled.
        ShutdownError: the services did not stop within
            `SHUTDOWN_GRACE_SECONDS`.
        PromptError: a section is invalid or already registered.
    """
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
