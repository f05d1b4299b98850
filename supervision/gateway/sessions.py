"""The sessions the gateway can reach: live agents under the runtime's supervisor, and stored logs.

`SessionDirectory` starts agents of named `AgentProfile`s (`session/new`),
attaches to stored sessions (`session/load`, `session/resume`), closes them,
lists them, summarises them, and decides which sessions a principal may
see (the token's session filter). It reads the runtime through public APIs
only: `Runtime.start_agent`, the supervisor's children, the store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs
import trio

from actors.agent import Agent, AgentOptions, Tool
from actors.session import Event, Session, SessionError, UnknownSessionError
from actors.session.events import AssistantMessage, StepEnd, StepStart, TurnEnd, TurnStart
from supervision.gateway.auth import Principal, Token
from supervision.runtime import Runtime
from supervision.subagents import SubagentProvider
from supervision.supervisor import Child, RestartType, SupervisionError, UnknownChildError

AGENT_CHILD_PREFIX = "agent:"
"""The supervisor child id of a session's agent is this prefix plus the session id."""


def _tools(tools: Iterable[Tool]) -> tuple[Tool, ...]:
    return tuple(tools)


@attrs.frozen(kw_only=True)
class AgentProfile:
    """What `session/new` starts: model options, tools, and an optional per-agent setup.

    `subagents` are the delegation tools the agent gets; `child_setup` runs
    in each of its subagents before their first step.
    """

    options: AgentOptions
    tools: tuple[Tool, ...] = attrs.field(default=(), converter=_tools)
    setup: Callable[[Agent], None] | None = None
    subagents: tuple[SubagentProvider, ...] = ()
    child_setup: Callable[[Agent], None] | None = None


@attrs.define(eq=False)
class _Known:
    """What the gateway remembers of a session it started or attached."""

    agent: str
    created_at: int
    parent: str | None = None
    owner: Token | None = None


@attrs.define(eq=False)
class SessionDirectory:
    """The gateway's view of the runtime's sessions (see the module docstring)."""

    runtime: Runtime
    profiles: dict[str, AgentProfile]
    agent_restart: RestartType = "transient"
    """How the supervisor treats a session agent that crashed (a node uses "temporary": a
    session whose lease was taken over is dropped, and taken back only on its next call)."""
    _known: dict[str, _Known] = attrs.field(factory=dict, init=False)
    _adopted: dict[str, Agent] = attrs.field(factory=dict, init=False)
    _children: dict[str, Child[Agent]] = attrs.field(factory=dict, init=False)
    _restarts: dict[str, int] = attrs.field(factory=dict, init=False)
    _starting: dict[str, trio.Event] = attrs.field(factory=dict, init=False)
    _listeners: list[Callable[[str, str, str | None], None]] = attrs.field(factory=list, init=False)
    _start_listeners: list[Callable[[str], None]] = attrs.field(factory=list, init=False)
    _figures: dict[str, LogFigures] = attrs.field(factory=dict, init=False)
    """The figures of live sessions' durable logs, folded as far as read (see `figures_now`)."""

    # -- lookup -------------------------------------------------------------

    def child(self, session_id: str) -> Child[Agent] | None:
        """The supervisor child running `session_id`, if any (running or restarting)."""
        child = self._children.get(session_id)
        if child is None:
            try:
                child = self.runtime.supervisor.child(AGENT_CHILD_PREFIX + session_id)
            except UnknownChildError:
                return None
        if child.state == "stopped":
            self._children.pop(session_id, None)
            self._figures.pop(session_id, None)
            return None
        self._children[session_id] = child
        return child

    def live_agent(self, session_id: str) -> Agent | None:
        """The running agent of `session_id`, or None when it is not running."""
        adopted = self._adopted.get(session_id)
        if adopted is not None:
            if not adopted.scope.closed:
                return adopted
            del self._adopted[session_id]
            self._figures.pop(session_id, None)
        child = self.child(session_id)
        if child is None or child.state != "running":
            return None
        return child.value

    def live_session(self, session_id: str) -> Session | None:
        """The live `Session` of `session_id`, or None."""
        agent = self.live_agent(session_id)
        return None if agent is None else agent.session

    async def exists(self, session_id: str) -> bool:
        """True when the session runs or is stored."""
        if self.child(session_id) is not None:
            return True
        try:
            return await self.runtime.store.exists(session_id)
        except SessionError:
            return False

    async def session_ids(self) -> list[str]:
        """Every stored or live session id, stored ones in creation order."""
        stored = await self.runtime.store.list_sessions()
        seen = set(stored)
        live = [
            child.id[len(AGENT_CHILD_PREFIX) :]
            for child in self.runtime.supervisor.children()
            if child.id.startswith(AGENT_CHILD_PREFIX)
        ]
        return stored + [sid for sid in live if sid not in seen]

    async def events(self, session_id: str) -> Sequence[Event]:
        """The durable events of `session_id`: from the live log, else loaded from the store.

        A hibernating session is read from the store without being woken
        (all of its events are durable, and it keeps hibernating).

        Raises:
            UnknownSessionError: the session is neither live nor stored.
        """
        session = self.live_session(session_id)
        if session is not None and not session.hibernating:
            return session.durable_events(0)
        return await self.runtime.store.load(session_id)

    def agent_of(self, session_id: str) -> str:
        """The profile name the session runs (or last ran) under."""
        known = self._known.get(session_id)
        return "default" if known is None else known.agent

    def parent_of(self, session_id: str) -> str | None:
        """The parent session id, for sessions the gateway knows to be subagents."""
        known = self._known.get(session_id)
        return None if known is None else known.parent

    # -- authorization --------------------------------------------------------

    def visible(self, principal: Principal, session_id: str) -> bool:
        """True when the principal's session filter covers `session_id`."""
        sessions = principal.token.sessions
        if sessions == "*":
            return True
        if sessions == "own":
            current: str | None = session_id
            while current is not None:
                known = self._known.get(current)
                if known is not None and known.owner == principal.token:
                    return True
                current = None if known is None else known.parent
            return False
        return session_id in sessions

    # -- lifecycle --------------------------------------------------------------

    def on_change(self, listener: Callable[[str, str, str | None], None]) -> Callable[[], None]:
        """Call `listener(session_id, change, status)` on each change; returns an unsubscribe.

        `change` is "added", "status" or "removed"; `status` is the status a
        "status" change reports (as the durable log has it), else None.
        """
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def on_start(self, listener: Callable[[str], None]) -> Callable[[], None]:
        """Call `listener(session_id)` when the directory starts, attaches or adopts an agent.

        Returns an unsubscribe.
        """
        self._start_listeners.append(listener)
        return lambda: self._start_listeners.remove(listener)

    def live_session_ids(self) -> list[str]:
        """The ids of the sessions whose agents run now (the supervisor's and adopted ones)."""
        ids = [
            child.id[len(AGENT_CHILD_PREFIX) :]
            for child in self.runtime.supervisor.children()
            if child.id.startswith(AGENT_CHILD_PREFIX)
        ]
        ids.extend(sid for sid in self._adopted if sid not in ids)
        return [sid for sid in ids if self.live_agent(sid) is not None]

    def profile(self, name: str) -> AgentProfile:
        """The profile `name`. Raises `KeyError` naming the known ones."""
        try:
            return self.profiles[name]
        except KeyError:
            raise KeyError(
                f"unknown agent profile {name!r}; configured: {sorted(self.profiles)}"
            ) from None

    async def create(
        self,
        *,
        profile: str,
        owner: Token | None,
        session_id: str | None = None,
        parent: str | None = None,
    ) -> Agent:
        """Start a new session's agent of `profile` under the runtime's supervisor.

        Raises:
            KeyError: no such profile.
            SupervisionError: the agent could not start.
        """
        chosen = self.profile(profile)
        child = await self.runtime.start_agent(
            options=chosen.options,
            tools=chosen.tools,
            session_id=session_id,
            setup=chosen.setup,
            subagents=chosen.subagents,
            child_setup=chosen.child_setup,
            restart=self.agent_restart,
        )
        agent = child.value
        self._children[agent.session.id] = child
        self._known[agent.session.id] = _Known(
            agent=profile, created_at=agent.session.clock(), parent=parent, owner=owner
        )
        self._started(agent.session.id)
        self._notify(agent.session.id, "added")
        return agent

    def adopt(self, child: Agent, *, agent: str, parent: str) -> None:
        """Record a subagent that `parent`'s agent started, and announce it ("added").

        It is listed with `parentSessionId`, seen by every token that sees its
        parent, and live (its status, log and inspection) until its agent ends.
        """
        session_id = child.session.id
        self._adopted[session_id] = child
        self._known[session_id] = _Known(
            agent=agent, created_at=child.session.clock(), parent=parent
        )
        self._started(session_id)
        self._notify(session_id, "added")

    async def attach(self, session_id: str) -> Agent:
        """The running agent of a stored session, starting it (its profile, else default) if needed.

        Concurrent attaches of one session start it once.

        Raises:
            UnknownSessionError: the store has no such session.
            SupervisionError: the agent could not start.
        """
        while True:
            agent = self.live_agent(session_id)
            if agent is not None:
                return agent
            child = self.child(session_id)
            if child is not None:
                return await child.wait_running(incarnation=child.incarnation)
            starting = self._starting.get(session_id)
            if starting is None:
                break
            await starting.wait()
        # Claimed before the store is asked, so a concurrent attach waits instead of starting twice.
        done = self._starting[session_id] = trio.Event()
        try:
            if not await self.runtime.store.exists(session_id):
                raise UnknownSessionError(f"session {session_id!r} is not stored")
            name = self.agent_of(session_id)
            chosen = self.profile(name if name in self.profiles else "default")
            child = await self.runtime.start_agent(
                options=chosen.options,
                tools=chosen.tools,
                session_id=session_id,
                setup=chosen.setup,
                subagents=chosen.subagents,
                child_setup=chosen.child_setup,
                restart=self.agent_restart,
            )
            self._children[session_id] = child
            self._known.setdefault(
                session_id, _Known(agent=name, created_at=child.value.session.clock())
            )
            self._started(session_id)
            return child.value
        finally:
            del self._starting[session_id]
            done.set()

    async def close(self, session_id: str) -> bool:
        """Stop the session's agent (its log stays); False when it was not running."""
        child = self.child(session_id)
        if child is None:
            return False
        try:
            await self.runtime.supervisor.terminate_child(child.id)
        except SupervisionError:
            return False
        self._figures.pop(session_id, None)
        self._notify(session_id, "removed")
        return True

    async def restart(self, session_id: str) -> Agent:
        """Stop the session's agent and start it again over its log (a new incarnation)."""
        await self.close(session_id)
        agent = await self.attach(session_id)
        self._restarts[session_id] = self._restarts.get(session_id, 0) + 1
        return agent

    def incarnation(self, session_id: str) -> int:
        """How many times the session's agent was restarted (by its supervisor or the gateway)."""
        child = self.child(session_id)
        own = 0 if child is None else child.incarnation
        return self._restarts.get(session_id, 0) + own

    def _started(self, session_id: str) -> None:
        for listener in list(self._start_listeners):
            listener(session_id)

    def _notify(self, session_id: str, change: str, status: str | None = None) -> None:
        for listener in list(self._listeners):
            listener(session_id, change, status)

    # -- summaries ----------------------------------------------------------------

    def announce_status(self, session_id: str, status: str) -> None:
        """Tell the `_harness/sessions/watch` subscribers that the session's status is `status`."""
        self._notify(session_id, "status", status)

    def figures_now(self, session_id: str) -> LogFigures | None:
        """The figures of a live session's durable log, without reading the store.

        An awake session's are folded on from where they were last read (only
        the events made durable since are looked at); a hibernating session's
        log cannot change until it wakes, so its figures are the ones cached
        when they cover its whole log. None: the session is not live, or it
        hibernates and its figures were not read since it last ran
        (`figures` reads them from the store).
        """
        session = self.live_session(session_id)
        if session is None:
            return None
        cached = self._figures.get(session_id, NO_FIGURES)
        if session.hibernating:
            return cached if cached.head == len(session) - 1 else None
        if cached.head < session.durable_seq:
            cached = self._figures[session_id] = cached.fold(
                session.durable_events(cached.head + 1)
            )
        return cached

    async def figures(self, session_id: str) -> LogFigures:
        """The figures of the session's durable log: `figures_now`, else read from the store.

        A hibernating session is read from the store without being woken
        (and its figures cached until it runs again); a stopped one is read
        each time.

        Raises:
            UnknownSessionError: the session is neither live nor stored.
        """
        figures = self.figures_now(session_id)
        if figures is not None:
            return figures
        cached = self._figures.get(session_id, NO_FIGURES)
        events = await self.runtime.store.load(session_id)
        session = self.live_session(session_id)
        if session is None or not session.hibernating:
            return NO_FIGURES.fold(events)
        figures = cached.fold(events[cached.head + 1 :])
        self._figures[session_id] = figures
        return figures

    def note_durable(self, session_id: str, events: Sequence[Event]) -> None:
        """Fold durable `events` (contiguous, in seq order) into a live session's cached figures
        when they continue them, so a session that hibernates right after is summarised
        without reading the store."""
        cached = self._figures.get(session_id)
        if (
            cached is not None
            and events
            and events[0].seq <= cached.head + 1 <= events[-1].seq
            and self.live_agent(session_id) is not None
        ):
            self._figures[session_id] = cached.fold(events[cached.head + 1 - events[0].seq :])

    def summary_now(self, session_id: str) -> dict[str, Any] | None:
        """The `SessionSummary` of a live session, without reading the store (`figures_now`);
        None when it would need the store."""
        agent = self.live_agent(session_id)
        figures = None if agent is None else self.figures_now(session_id)
        if agent is None or figures is None:
            return None
        return figures.summary(
            session_id,
            status=agent.status,
            agent=self.agent_of(session_id),
            parent=self.parent_of(session_id),
        )

    async def summary(self, session_id: str) -> dict[str, Any]:
        """The `SessionSummary` of `session_id` (camelCase, as on the wire).

        A live session's comes from `figures` (a hibernating one is not
        woken); a stopped one's from its stored log.

        Raises:
            UnknownSessionError: the session is neither live nor stored.
        """
        summary = self.summary_now(session_id)
        if summary is not None:
            return summary
        agent = self.live_agent(session_id)
        try:
            figures = await self.figures(session_id)
        except UnknownSessionError:
            if self.child(session_id) is None:
                raise
            figures = NO_FIGURES  # its agent is starting and has not stored the session yet
        if agent is not None:
            status: str = agent.status
        else:
            status = "starting" if self.child(session_id) is not None else "stopped"
        return figures.summary(
            session_id,
            status=status,
            agent=self.agent_of(session_id),
            parent=self.parent_of(session_id),
        )


@attrs.frozen(kw_only=True)
class LogFigures:
    """What a `SessionSummary` says of the first `head + 1` events of a durable log.

    Every figure is a fold over the events, so `fold` advances them over
    the events after `head` without looking at the earlier ones again.
    """

    head: int = -1
    created_at: int = 0
    updated_at: int = 0
    turn: int = -1
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0

    def fold(self, events: Sequence[Event]) -> LogFigures:
        """These figures advanced over `events`, the events from seq `head + 1` on, in order."""
        if not events:
            return self
        turn = self.turn
        input_tokens, output_tokens = self.input_tokens, self.output_tokens
        cache_read = self.cache_read_tokens
        for event in events:
            data = event.data
            if isinstance(data, AssistantMessage) and data.usage is not None:
                input_tokens += data.usage.input_tokens
                output_tokens += data.usage.output_tokens
                cache_read += data.usage.cache_read_tokens
            elif isinstance(data, TurnStart):
                turn = data.turn
        return LogFigures(
            head=events[-1].seq,
            created_at=self.created_at if self.head >= 0 else events[0].time,
            updated_at=events[-1].time,
            turn=turn,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cache_read_tokens=cache_read,
        )

    def summary(
        self, session_id: str, *, status: str, agent: str, parent: str | None
    ) -> dict[str, Any]:
        """The `SessionSummary` (camelCase, as on the wire) with these figures."""
        summary: dict[str, Any] = {
            "sessionId": session_id,
            "agent": agent,
            "status": status,
            "createdAt": self.created_at,
            "updatedAt": self.updated_at,
            "headSeq": self.head,
            "turn": self.turn,
            "usage": {
                "inputTokens": self.input_tokens,
                "outputTokens": self.output_tokens,
                "cacheReadTokens": self.cache_read_tokens,
            },
        }
        if parent is not None:
            summary["parentSessionId"] = parent
        return summary


NO_FIGURES = LogFigures()
"""The figures of an empty log."""


def open_position(events: Sequence[Event]) -> tuple[int | None, int | None]:
    """The open turn and open step at the end of `events` (None where none is open)."""
    turn: int | None = None
    step: int | None = None
    for event in events:
        data = event.data
        if isinstance(data, TurnStart):
            turn, step = data.turn, None
        elif isinstance(data, TurnEnd):
            turn, step = None, None
        elif isinstance(data, StepStart):
            step = data.step
        elif isinstance(data, StepEnd):
            step = None
    return turn, step
