"""The Agent actor: a loop task over one session, alive only while there is work."""

from __future__ import annotations

import functools
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Literal, Protocol

import attrs
import trio

from actors.agent.awake_slots import AwakeSlots
from actors.agent.decisions import PreStepListener, RequestErrorListener
from actors.agent.inbox import Inbox, InboxStatistics
from actors.agent.inspect import StepInspection, inspect_next_step
from actors.agent.loop import WRITE_GRACE_SECONDS, AbortCause, AgentLoop, LoopStatistics
from actors.agent.options import AgentOptions
from actors.agent.result import (
    AgentClosedError,
    TurnFailedError,
    TurnResult,
    TurnTicket,
    failure_message,
    turn_result,
)
from actors.agent.tools import Tool, ToolRegistry
from actors.boundary import one_exception
from actors.messages import Message
from actors.prompt import AssembleContext, SystemPrompt
from actors.providers.base import Provider
from actors.scope import Registration, Scope
from actors.session.errors import SessionError
from actors.session.events import TurnEnd, TurnEndReason, TurnStart
from actors.session.lease import Lease
from actors.session.session import Session, WallClock, new_session_id, system_clock_ms
from actors.session.store import MemoryStore, SessionStore

INBOX_CAPACITY = 1024
"""Messages the inbox may hold unclaimed; beyond that `followup` & co. raise."""

_SHARED_RNG = random.Random()
"""The retry jitter of agents given no `rng` (one generator: its state is 2.5 KB)."""


class InboxFullError(RuntimeError):
    """The agent's inbox is full: the agent is not keeping up with its input."""


class TaskSpawner(Protocol):
    """Where an agent starts its loop task: its own nursery, or a host's (`start_hosted_agent`)."""

    def start_soon(self, async_fn: Callable[[], Awaitable[object]], /) -> None:
        """Start `async_fn()` as a task; it must not outlive the agent's owner.

        Raises an exception once it can no longer start tasks (its owner is
        stopping the agent).
        """
        ...


@attrs.frozen(kw_only=True)
class AgentStatistics:
    """A snapshot of an agent's state and counters.

    `loop_task` is True while the agent's loop task exists (a turn runs, or
    woken input waits for one) or waits for its host's awake slot to start
    (`start_hosted_agent`); an idle agent has none.
    """

    status: Literal["idle", "running"]
    loop_task: bool
    inbox: InboxStatistics
    loop: LoopStatistics


def _as_message(value: str | Message) -> Message:
    if isinstance(value, Message):
        if value.role != "user" or value.source is None:
            raise ValueError(f"agent input must be a user message with a source, got {value!r}")
        return value
    return Message.user(value)


@attrs.define(eq=False)
class Agent:
    """One session's actor: input goes into the inbox, turns run in the loop task.

    `followup`, `steer`, `inject`, `cancel`, `on_pre_step` and
    `on_request_error` are synchronous and safe to call from any task of the
    same Trio run. Input is filed in the inbox at once, in call order (at
    most `INBOX_CAPACITY` unclaimed messages; beyond that the call raises
    `InboxFullError` rather than dropping input or blocking a synchronous
    caller). Waking input starts the loop task in the agent's nursery if it
    is not running; the task runs turns while there is input and ends when
    the agent goes idle, so an idle agent holds no task, channel or
    cancel scope of its own (with `AgentOptions.hibernate`, not its log
    either). `await run(...)` queues a follow-up and waits for its turn's
    `TurnResult`; `submit(...)` queues one and returns its `TurnTicket`.
    Once `open_agent` has exited, every input method raises
    `AgentClosedError`.
    """

    session: Session
    scope: Scope
    _loop: AgentLoop
    _nursery: TaskSpawner
    _wake_requested: bool = False
    _loop_task: bool = False
    _disposing: bool = False
    _running: bool = False
    _parked: bool = False
    _turn_scope: trio.CancelScope | None = None
    # Events exist only while someone may wait for them (None: idle / no turn), so an
    # idle agent keeps none.
    _idle: trio.Event | None = None
    _turn_done: trio.Event | None = None
    _closed: bool = False
    _tickets: dict[int, TurnTicket] = attrs.field(factory=dict)
    """The unsettled tickets of `submit`, by the id of their message."""
    # The loop task's cancel scope and end, only while it runs (`shutdown` stops it).
    _loop_scope: trio.CancelScope | None = None
    _loop_done: trio.Event | None = None
    _lease_released: bool = False  # by `shutdown`
    _awake_slots: AwakeSlots | None = None
    """Shared by a host's agents, one held while awake (see `start_hosted_agent`)."""
    _waiting_for_slot: bool = False  # admitted by `_awake_slots` later, not yet started

    @property
    def status(self) -> Literal["idle", "running"]:
        """ "running" while a turn runs or woken input waits for one, else "idle"."""
        return "idle" if self._idle is None else "running"

    @property
    def inbox(self) -> Inbox:
        """The parked input."""
        return self._loop.inbox

    @property
    def options(self) -> AgentOptions:
        """The agent's model options."""
        return self._loop.options

    @property
    def tools(self) -> ToolRegistry:
        """The agent's tools (their schemas feed the prompt)."""
        return self._loop.tools

    @property
    def provider(self) -> Provider:
        """The provider the agent's requests go to."""
        return self._loop.provider

    @property
    def closed(self) -> bool:
        """True once `open_agent` has exited: input then raises `AgentClosedError`."""
        return self._closed

    # -- input ------------------------------------------------------------

    def followup(self, text_or_message: str | Message) -> None:
        """Queue input for a turn of its own and wake the agent.

        Raises:
            AgentClosedError: the agent's `open_agent` has exited.
        """
        self._submit("next-turn", text_or_message, wakes=True)

    def steer(self, text_or_message: str | Message) -> None:
        """Queue input for the next step and wake the agent.

        Raises:
            AgentClosedError: the agent's `open_agent` has exited.
        """
        self._submit("next-step", text_or_message, wakes=True)

    def inject(self, text_or_message: str | Message) -> None:
        """Queue input for the next step without waking the agent.

        Raises:
            AgentClosedError: the agent's `open_agent` has exited.
        """
        self._submit("next-step", text_or_message, wakes=False)

    def submit(self, text_or_message: str | Message) -> TurnTicket:
        """Queue `text_or_message` as a `followup`; the ticket tells how the turn that takes
        it ends, and settles whether or not anyone awaits it (so a task that stops waiting
        loses nothing another may still want to know).

        Raises:
            AgentClosedError: the agent's `open_agent` has exited.
            InboxFullError: the inbox holds `INBOX_CAPACITY` unclaimed messages.
        """
        ticket = TurnTicket(message=attrs.evolve(_as_message(text_or_message)))
        self._submit("next-turn", ticket.message, wakes=True)  # a distinct object to wait on
        self._tickets[id(ticket.message)] = ticket
        return ticket

    async def run(self, text_or_message: str | Message) -> TurnResult:
        """Queue `text_or_message` as a `followup` and wait for the end of the turn that takes it.

        Returns the `TurnResult` when that turn ends "completed" or
        "max-tokens".

        Cancellation: cancelling stops the wait only; the queued input still
        gets its turn.

        Raises:
            TurnFailedError: the turn ended "error", "blocked" or "aborted",
                or the input was dropped by `cancel()` before a turn took it.
            AgentClosedError: the agent was closed before (or while) the
                input waited for a turn.
            InboxFullError: the inbox holds `INBOX_CAPACITY` unclaimed messages.
        """
        return await self.submit(text_or_message).outcome()

    def cancel(self, keep_inbox: bool = False) -> None:
        """Abort the live turn (`turn/end` aborted, reason user).

        With `keep_inbox=False` queued input is dropped too; with True it
        stays parked until the next wake.
        """
        self.abort("user", keep_inbox=keep_inbox)

    def abort(self, cause: AbortCause, *, keep_inbox: bool = False) -> None:
        """Abort the live turn recording `cause` ("user", "parent" or "disposed").

        Input sent before the abort never wakes the agent; it is dropped, or
        with `keep_inbox=True` parked until input sent after the abort wakes it.
        """
        if not keep_inbox:
            self._loop.inbox.clear()
            live = self._loop.turn_message if self._turn_scope is not None else None
            dropped = TurnEndReason.aborted(cause)
            for key, ticket in list(self._tickets.items()):
                if ticket.message is not live:
                    del self._tickets[key]
                    ticket.settle(
                        error=TurnFailedError(
                            failure_message(self.session.id, None, dropped)
                            + "; the input was dropped before a turn took it",
                            reason=dropped,
                            turn=None,
                        )
                    )
        self._parked = True
        self._wake_requested = False
        if self._turn_scope is not None:
            self._loop.abort_cause = cause
            self._loop.keep_claimed_on_abort = keep_inbox
            self._turn_scope.cancel()
        self._refresh_idle()

    def _submit(
        self, kind: Literal["next-turn", "next-step"], value: str | Message, *, wakes: bool
    ) -> None:
        if self._closed:
            raise AgentClosedError(
                f"agent of session {self.session.id!r} is closed (its open_agent has exited); "
                "the input was not queued"
            )
        message = _as_message(value)
        if len(self._loop.inbox) >= INBOX_CAPACITY:
            raise InboxFullError(
                f"agent {self.session.id!r}: inbox holds {INBOX_CAPACITY} unclaimed messages"
            )
        if kind == "next-turn":
            self._loop.inbox.put_next_turn(message)
        else:
            self._loop.inbox.put_next_step(message)
        if wakes:
            self._wake_requested = True
            if not self._loop_task and not self._disposing:
                self._loop_task = True
                if self._awake_slots is None:
                    self._nursery.start_soon(self._run_loop)
                else:
                    self._waiting_for_slot = True
                    self._awake_slots.admit(self._admitted)
            self._refresh_idle()

    def _admitted(self) -> bool:
        """Start the loop task now that it holds an awake slot; False if the agent gave its
        place up while it waited (`dispose`), or its host can no longer start tasks (closing)."""
        if not self._waiting_for_slot:
            return False
        self._waiting_for_slot = False
        try:
            self._nursery.start_soon(self._run_loop)
        except Exception:  # the host refuses tasks: it is stopping this agent, which settles
            self._not_admitted()  # its tickets; the slot goes to the next agent waiting
            return False
        return True

    def _not_admitted(self) -> None:
        """The loop task that waited for a slot will not run: input filed now starts no turn."""
        self._loop_task = False
        self._wake_requested = False
        self._refresh_idle()

    # -- listeners --------------------------------------------------------

    def on_pre_step(self, listener: PreStepListener) -> Registration:
        """Add a pre-step listener; disposing the registration removes it."""
        self._loop.pre_step.append(listener)
        # A partial, not a closure: the registration lives as long as the agent.
        return self.scope.own(
            Registration(remove=functools.partial(list.remove, self._loop.pre_step, listener))
        )

    def on_request_error(self, listener: RequestErrorListener) -> Registration:
        """Add a request-error listener, consulted before the retry policy."""
        self._loop.request_error.append(listener)
        return self.scope.own(
            Registration(remove=functools.partial(list.remove, self._loop.request_error, listener))
        )

    # -- inspection -------------------------------------------------------

    async def inspect_next_step(self) -> StepInspection:
        """A dry run of the next step's assembly: the header, sections, tools, contexts, variables.

        Nothing is logged, no provider is called and no `pre_step` listener
        runs (a hibernating session is woken to read its last header); each
        section, context and tool names the scope it came from.
        Cancellation: cancellable; nothing is changed.

        Raises:
            PromptError: the assembly failed (the message names the section,
                variable or tool).
        """
        await self._wake()  # a hibernating agent's last header comes from its log
        return await inspect_next_step(self._loop)

    # -- waiting and statistics --------------------------------------------

    async def when_idle(self) -> None:
        """Return once no turn runs and no woken input waits.

        Cancellation: cancellable; nothing is affected by cancelling it.
        """
        while self._idle is not None:
            await self._idle.wait()
        await trio.lowlevel.checkpoint()

    def statistics(self) -> AgentStatistics:
        """Current status, queue depths and loop counters."""
        return AgentStatistics(
            status=self.status,
            loop_task=self._loop_task,
            inbox=self._loop.inbox.statistics(),
            loop=self._loop.statistics(),
        )

    def _refresh_idle(self) -> None:
        idle = not self._running and not self._wake_requested
        if idle and self._idle is not None:
            self._idle.set()
            self._idle = None
        elif not idle and self._idle is None:
            self._idle = trio.Event()

    # -- tasks ------------------------------------------------------------

    async def _run_loop(self) -> None:
        """The loop task: runs turns while woken input waits, then ends (the agent is idle).

        Started in the agent's nursery (or its host's) by waking input when
        it is not running; a wake that arrives while it runs (even while it
        hibernates the session) is taken before it ends. An exception (a
        broken log) ends it and propagates through that nursery (a host
        reports it as the agent's crash).
        """
        done = self._loop_done = trio.Event()
        try:
            with trio.CancelScope() as self._loop_scope:
                await self._run_woken()
        finally:
            self._loop_task = False
            self._loop_scope = self._loop_done = None
            done.set()

    async def _run_woken(self) -> None:
        if self._awake_slots is None:
            await self._run_turns()
            return
        try:
            await self._run_turns()
        finally:
            self._awake_slots.release()  # held since `_admitted`

    async def _run_turns(self) -> None:
        while self._wake_requested and not self._disposing:
            # A wake is input that arrived after any abort or failed turn: it un-parks.
            self._parked = False
            self._wake_requested = False
            self._running = True
            self._refresh_idle()
            try:
                await self._wake()
                while self._loop.inbox.has_turn_work() and not self._parked:
                    await self._run_one_turn()
                if self._loop.options.hibernate:
                    await self._hibernate()
            finally:
                self._running = False
                self._refresh_idle()
        if self._wake_requested:  # input filed while the agent closes: it starts no turn
            self._wake_requested = False
            self._refresh_idle()

    async def _hibernate(self) -> None:
        """Make the log durable and let the session release it until the next wake.

        A store that fails to flush leaves the session awake: the failure is
        the store's, and the next append reports it as that turn's error.
        """
        try:
            await self.session.flush()
        except SessionError:
            return
        self._release_log()

    async def _wake(self) -> None:
        """Load a hibernating session's log back, then what the loop derives from it.

        An awake session has nothing to load: no checkpoint then (the loop
        task calls this first thing, and the turn checkpoints soon enough).
        """
        if self.session.hibernating:
            await self.session.wake()
        self._loop.woke()

    def _release_log(self) -> None:
        """Let the (durable) session release its log, and the loop what it derived from it."""
        if self.session.hibernate():
            self._loop.hibernate()

    async def _run_one_turn(self) -> None:
        done = self._turn_done = trio.Event()
        start = len(self.session)
        try:
            with trio.CancelScope() as scope:
                self._turn_scope = scope
                await self._loop.run_turn(on_parked=self._park)
        finally:
            self._turn_scope = None
            self._settle_run(start)
            self._turn_done = None
            done.set()

    def _settle_run(self, start: int) -> None:
        """Settle the ticket of the message that began the turn at seq `start`."""
        message = self._loop.turn_message
        ticket = self._tickets.get(id(message)) if message is not None else None
        if ticket is None or ticket.message is not message:
            return
        events = self.session.events_since(start)
        first = next((i for i, e in enumerate(events) if isinstance(e.data, TurnStart)), None)
        last = next((i for i, e in enumerate(events) if isinstance(e.data, TurnEnd)), None)
        if first is None or last is None:
            return  # the log broke; closing the agent settles the ticket
        del self._tickets[id(message)]
        if not self._tickets:
            self._tickets.clear()  # frees the emptied table, kept otherwise while idle
        try:
            ticket.settle(result=turn_result(self.session.id, events[first : last + 1]))
        except TurnFailedError as failed:
            ticket.settle(error=failed, requeued=self._loop.inbox.parks_for_a_turn(message))

    def close(self) -> None:
        """Refuse further input and settle every unsettled `TurnTicket` (so every `run()`
        still waiting) with `AgentClosedError`.

        Called by `open_agent` when it exits; idempotent.
        """
        self._closed = True
        tickets, self._tickets = self._tickets, {}
        for ticket in tickets.values():
            ticket.settle(
                error=AgentClosedError(
                    f"agent of session {self.session.id!r} was closed before its input got a turn"
                )
            )

    def _park(self) -> None:
        self._parked = True

    async def shutdown(self) -> None:
        """End an agent of `start_hosted_agent`: its turn, its loop task, then its lease.

        Aborts a live turn (cause "disposed") and waits for its `turn/end`,
        refuses further input (`AgentClosedError`), closes the agent's
        scope, stops the loop task (a wake or hibernation in progress), makes
        the log durable and gives up the lease. Idempotent.

        Cancellation: shielded; each stage is bounded by `WRITE_GRACE_SECONDS`.
        """
        with trio.CancelScope(shield=True):
            await self.dispose()
            self.close()
            self.scope.close()
            if self._loop_scope is not None:
                self._loop_scope.cancel()
            done = self._loop_done
            if done is not None:
                with trio.move_on_after(WRITE_GRACE_SECONDS):
                    await done.wait()
            # The session keeps naming its lease (released or not): an owner that
            # checks it while the agent stops still sees whose it was.
            lease = None if self._lease_released else self.session.lease
            self._lease_released = True
            store = self.session.store
            with trio.move_on_after(WRITE_GRACE_SECONDS):
                try:
                    if store.running:
                        await store.flush(self.session.id)
                finally:
                    if lease is not None:
                        await store.release_lease(lease)

    async def dispose(self) -> None:
        """Abort a live turn with cause "disposed" and wait until its `turn/end` is written.

        Cancellation: shielded internally for at most the write grace period.
        """
        self._parked = True  # no further turn starts while the agent closes
        self._disposing = True
        if self._waiting_for_slot:  # its admission declines when its turn comes
            self._waiting_for_slot = False
            self._not_admitted()
        if self._turn_scope is not None:
            self._loop.abort_cause = "disposed"
            self._turn_scope.cancel()
        done = self._turn_done
        if done is None:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(WRITE_GRACE_SECONDS * 2):
            await done.wait()


@asynccontextmanager
async def open_agent(
    *,
    system_prompt: SystemPrompt,
    provider: Provider,
    options: AgentOptions | None = None,
    store: SessionStore | None = None,
    session_id: str | None = None,
    tools: Sequence[Tool] = (),
    scope: Scope | None = None,
    clock: WallClock = system_clock_ms,
    rng: random.Random | None = None,
) -> AsyncIterator[Agent]:
    """Run an agent over a session in its own nursery, yielding it once it accepts input.

    `store=None` uses a fresh `MemoryStore`; a store whose writer is not
    running is served by this agent's nursery for its lifetime. An existing
    `session_id` resumes that session (a turn left open by a crash is closed
    `interrupted`, every unanswered tool call answered `Interrupted`). The
    agent's scope is a child of `scope`; the variables `model` and
    `provider` and the agent's tools are registered in it.

    The agent is the session's one writer: it takes the session's lease
    first (before anything is loaded or accepted) and gives it up when the
    context exits, after its last events are durable.

    Leaving the context aborts a live turn (`turn/end` aborted, reason
    "disposed"), closes the agent's scope and cancels its tasks; from then
    on `followup`, `steer`, `inject` and `run` raise `AgentClosedError`.
    An exception from the agent's tasks (a bug or a broken log, never a
    failed turn) or from the body propagates out of the context as that one
    exception, never as an `ExceptionGroup`.

    Raises:
        SessionBusyError: another live writer holds the session (the
            message names it); raised before the agent accepts input.
        SessionError: the store cannot be opened (the message names its
            path) or the session cannot be loaded.
    """
    options = options or AgentOptions(model="m")
    store = store or MemoryStore()
    sid = session_id or new_session_id()
    with one_exception():
        lease = await store.acquire_lease(sid)
        try:
            async with _serving_agent(
                store=store,
                session_id=sid,
                lease=lease,
                system_prompt=system_prompt,
                provider=provider,
                options=options,
                tools=tools,
                scope=scope,
                clock=clock,
                rng=rng,
            ) as agent:
                yield agent
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(WRITE_GRACE_SECONDS):
                try:
                    if store.running:
                        await store.flush(sid)
                finally:
                    await store.release_lease(lease)


@asynccontextmanager
async def _serving_agent(
    *,
    store: SessionStore,
    session_id: str,
    lease: Lease,
    system_prompt: SystemPrompt,
    provider: Provider,
    options: AgentOptions,
    tools: Sequence[Tool],
    scope: Scope | None,
    clock: WallClock,
    rng: random.Random | None,
) -> AsyncIterator[Agent]:
    """`open_agent`'s body once the lease is held: the agent's nursery and tasks."""
    async with trio.open_nursery() as nursery:
        if not store.running:
            await nursery.start(store.serve)
        session = await Session.open(store, session_id, clock=clock, lease=lease)
        agent = _new_agent(
            session=session,
            system_prompt=system_prompt,
            provider=provider,
            options=options,
            tools=tools,
            scope=scope,
            rng=rng,
            nursery=nursery,
        )
        try:
            yield agent
        finally:
            await agent.dispose()
            agent.close()
            agent.scope.close()
            nursery.cancel_scope.cancel()


def _new_agent(
    *,
    session: Session,
    system_prompt: SystemPrompt,
    provider: Provider,
    options: AgentOptions,
    tools: Sequence[Tool],
    scope: Scope | None,
    rng: random.Random | None,
    nursery: TaskSpawner,
    awake_slots: AwakeSlots | None = None,
) -> Agent:
    """The agent over an open `session`, its scope registered; its loop task starts in `nursery`."""
    agent_scope = Scope(name=f"agent:{session.id}", parent=scope)
    registry = ToolRegistry.of(tools)
    agent = Agent(
        session=session,
        scope=agent_scope,
        loop=AgentLoop(
            session=session,
            system_prompt=system_prompt,
            provider=provider,
            options=options,
            tools=registry,
            inbox=Inbox(),
            scope=agent_scope,
            agent=None,
            rng=rng or _SHARED_RNG,
        ),
        nursery=nursery,
        awake_slots=awake_slots,
    )
    agent._loop.agent = agent
    system_prompt.variable("model", _option_value(options, "model"), scope=agent_scope)
    system_prompt.variable("provider", _option_value(options, "provider_name"), scope=agent_scope)
    system_prompt.tools(registry.provider, scope=agent_scope)
    return agent


@attrs.frozen
class _OptionValue:
    """The prompt variable `model` or `provider` of agents with these options."""

    options: AgentOptions
    field: Literal["model", "provider_name"]

    def __call__(self, ctx: AssembleContext) -> str:
        return self.options.model if self.field == "model" else self.options.provider_name


@functools.lru_cache(maxsize=64)
def _option_value(options: AgentOptions, field: Literal["model", "provider_name"]) -> _OptionValue:
    """The variable provider of `options.<field>`: one object for all agents with equal options
    (each agent keeps its registrations for life; a closure per agent costs ~0.2 KB)."""
    return _OptionValue(options, field)


async def start_hosted_agent(
    *,
    system_prompt: SystemPrompt,
    provider: Provider,
    options: AgentOptions,
    store: SessionStore,
    host: TaskSpawner,
    session_id: str | None = None,
    tools: Sequence[Tool] = (),
    scope: Scope | None = None,
    clock: WallClock = system_clock_ms,
    rng: random.Random | None = None,
    awake_slots: AwakeSlots | None = None,
) -> Agent:
    """An agent like `open_agent`'s, with no nursery or task of its own: `host` runs its loop task.

    For a runtime holding many sessions: while idle the agent is a few
    objects (with `AgentOptions.hibernate`, not even its log: a resumed
    session starts hibernated, not loaded until input), and waking
    input starts its loop task with `host.start_soon`; an exception of that
    task (a broken log) propagates through `host`, which must treat it as
    the agent's crash. The lease is taken first, as in `open_agent`, and
    held (renewed by the store) until `await agent.shutdown()`, which the
    owner must call once: a hibernating session keeps its lease, so no
    other writer takes the session while the agent lives. `store` must be
    running.

    `awake_slots` (`AwakeSlots`), shared by many agents, bounds how many
    of them are awake at once: waking input asks it to admit the agent,
    whose loop task starts only once it holds a slot (from before its
    session wakes until it went idle again, hibernated). Input beyond the
    bound waits, first come first served, with no task: a burst of wakes
    starts at most that many loop tasks and loads at most that many logs
    (the runtime's `supervision.awake.AwakeAgents` also gives memory back
    after a burst). A turn that waits for another agent sharing the slots
    (a tool awaiting its turn) may then wait for ever once every slot is
    held by such turns: size them above that depth.

    Cancellation: cancellable while the session loads; the lease is
    given back then.

    Raises:
        SessionBusyError: another live writer holds the session.
        SessionError: the store does not run, or the session cannot be loaded.
    """
    if not store.running:
        raise SessionError(
            f"start_hosted_agent: the store of session {session_id!r} is not running "
            "(a hosted agent does not serve its store)"
        )
    sid = session_id or new_session_id()
    lease = await store.acquire_lease(sid)
    try:
        session = await Session.open(store, sid, clock=clock, lease=lease)
        agent = _new_agent(
            session=session,
            system_prompt=system_prompt,
            provider=provider,
            options=options,
            tools=tools,
            scope=scope,
            rng=rng,
            nursery=host,
            awake_slots=awake_slots,
        )
    except BaseException:
        with trio.CancelScope(shield=True), trio.move_on_after(WRITE_GRACE_SECONDS):
            await store.release_lease(lease)
        raise
    # A resumed log waits in the store too; a new, empty one has nothing to release (waking
    # it would only read the store back).
    if options.hibernate and len(session) > 0:
        agent._release_log()
    return agent
