"""Subagents: child agents a parent agent delegates tasks to, as tools.

A subagent provider decides where a child's conversation starts:
`SpawnProvider` gives it a fresh session (`inherits_parent_context` False),
`ForkProvider` a copy of the parent's completed turns, never the turn in
flight (`inherits_parent_context` True). `Subagents.activate(provider)`
exposes a provider to the parent's model as a tool (`subagent`,
`subagent_fork`) whose description and `prompt` parameter description are
derived from that flag; the tool exists exactly while the activation does.

Each delegation runs one child agent actor under the parent's own
supervisor (opened by `open_subagents`, inside the parent actor), with the
parent's scope as its scope's parent: the child inherits every
parent-scoped registration and may shadow one named slot for itself. The
child's final assistant text is the tool's result. While delegations run, a
`subagent:delegation` runtime context in the parent's scope names them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, ClassVar, Protocol

import attrs
import trio

from actors.agent import Agent, AgentOptions, Tool, open_agent
from actors.prompt import PromptContext, SystemPrompt
from actors.providers import Provider
from actors.scope import Registration, Scope
from actors.session import Session
from actors.session.events import AssistantMessage, TurnEnd, TurnEndReason
from supervision.supervisor import (
    Child,
    ChildExit,
    ChildSpec,
    ChildStart,
    SupervisionError,
    Supervisor,
)

DELEGATION_CONTEXT = "subagent:delegation"
"""Name of the runtime context that lists the running delegations."""
DELEGATION_ORDER = 120
"""Order of the `subagent:delegation` context."""
PARENT_ABORT_GRACE_SECONDS = 15.0
"""How long a cancelled delegation waits for its child to record its aborted turn."""
LABEL_LIMIT = 60
"""Longest label derived from a prompt when the model gave none."""


class SubagentError(SupervisionError):
    """A delegation failed: bad arguments, or the child did not complete its turn."""


class SubagentProvider(Protocol):
    """Where a child agent's conversation starts.

    `tool_name` is the name of the tool that exposes the provider;
    `inherits_parent_context` says whether the child sees the parent's
    conversation (it words the tool); `open_session` creates the child's
    session in the parent's store and returns its id.
    """

    @property
    def tool_name(self) -> str:
        """The model-facing tool name."""
        ...

    @property
    def inherits_parent_context(self) -> bool:
        """True when the child starts with the parent's completed turns."""
        ...

    async def open_session(self, parent: Agent) -> str:
        """Create the child's session in `parent.session.store`; return its id."""
        ...


@attrs.frozen(kw_only=True)
class SpawnProvider:
    """Children start from a fresh, empty session."""

    tool_name: str = "subagent"
    inherits_parent_context: ClassVar[bool] = False

    async def open_session(self, parent: Agent) -> str:
        """A new empty session in the parent's store.

        Cancellation: cancellable; a cancelled call may leave an empty session.
        """
        session = await Session.create(parent.session.store, clock=parent.session.clock)
        return session.id


@attrs.frozen(kw_only=True)
class ForkProvider:
    """Children start with the parent's completed turns (via `Session.fork`)."""

    tool_name: str = "subagent_fork"
    inherits_parent_context: ClassVar[bool] = True

    async def open_session(self, parent: Agent) -> str:
        """A durable fork of the parent's session up to its last completed turn.

        Cancellation: cancellable; a cancelled call may leave a partial fork
        that no child uses.
        """
        child = await parent.session.fork()
        await child.flush()
        return child.id


def _wording(inherits_parent_context: bool) -> tuple[str, str]:
    """The tool description and the `prompt` parameter description for a provider."""
    if inherits_parent_context:
        return (
            "Delegate a task to a forked subagent. The subagent inherits this conversation's "
            "completed turns (not the turn in progress) and continues from a copy of them on "
            "its own; its final answer comes back as this tool's result.",
            "What the forked subagent should do. It already knows the conversation so far, "
            "so state only what is new: the task, and anything said in the current turn.",
        )
    return (
        "Delegate a task to a subagent: a separate agent that starts from a fresh context. "
        "It does not see this conversation; its final answer comes back as this tool's result.",
        "The complete task for the subagent, with every fact, path and constraint it needs: "
        "it does not see this conversation.",
    )


def subagent_tool_parameters(provider: SubagentProvider) -> dict[str, Any]:
    """The JSON schema of a subagent tool's arguments, worded from `provider`."""
    _, prompt_description = _wording(provider.inherits_parent_context)
    return {
        "type": "object",
        "properties": {
            "label": {
                "type": "string",
                "description": "A short label for the task, a few words, shown while it runs.",
            },
            "prompt": {"type": "string", "description": prompt_description},
        },
        "required": ["prompt"],
    }


@attrs.frozen(kw_only=True)
class Delegation:
    """A delegation in flight: the tool that started it, its label, the child's session."""

    tool_name: str
    label: str
    session_id: str


@attrs.frozen(kw_only=True)
class SubagentStatistics:
    """Counters of one parent's subagents."""

    running: int
    started: int
    completed: int
    failed: int
    aborted: int
    tools: tuple[str, ...]


@attrs.define(eq=False)
class _Outcome:
    """What a child's run recorded: how its turn ended and its final text."""

    reason: TurnEndReason | None = None
    text: str = ""

    def record(self, session: Session, first_turn: int) -> None:
        for event in session.events:
            data = event.data
            if isinstance(data, AssistantMessage) and data.turn >= first_turn:
                if not data.interrupted:
                    self.text = data.message.text
            elif isinstance(data, TurnEnd) and data.turn >= first_turn:
                self.reason = data.reason


def _parse_arguments(tool_name: str, arguments: dict[str, Any] | str) -> tuple[str, str]:
    if not isinstance(arguments, dict):
        raise SubagentError(f"tool {tool_name!r} takes a JSON object, got {arguments!r}")
    prompt = arguments.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise SubagentError(f"tool {tool_name!r} needs a non-empty string 'prompt'")
    label = arguments.get("label")
    if label is not None and not isinstance(label, str):
        raise SubagentError(f"tool {tool_name!r}: 'label' must be a string, got {label!r}")
    if not label:
        first_line = prompt.strip().splitlines()[0]
        label = (
            first_line if len(first_line) <= LABEL_LIMIT else first_line[: LABEL_LIMIT - 1] + "…"
        )
    return prompt, label


@attrs.define(eq=False)
class Subagents:
    """One parent agent's subagents: its supervisor, its active providers, its delegations.

    Create it with `open_subagents`. Children are `temporary` children of
    `supervisor`, one per delegation; they end when their delegation does.
    """

    parent: Agent
    supervisor: Supervisor
    _system_prompt: SystemPrompt
    _provider: Provider
    _options: AgentOptions
    _tools: tuple[Tool, ...]
    _setup: Callable[[Agent], None] | None
    _scope: Scope
    _running: list[Delegation] = attrs.field(factory=list, init=False)
    _context: Registration | None = attrs.field(default=None, init=False)
    _started: int = attrs.field(default=0, init=False)
    _completed: int = attrs.field(default=0, init=False)
    _failed: int = attrs.field(default=0, init=False)
    _aborted: int = attrs.field(default=0, init=False)
    _tool_names: list[str] = attrs.field(factory=list, init=False)

    def activate(self, provider: SubagentProvider) -> Registration:
        """Expose `provider` to the parent's model as the tool `provider.tool_name`.

        The tool is in the parent's tool registry (so the next step's prompt
        shows it and the loop can run it) until the returned registration is
        disposed, the parent's scope closes or `open_subagents` exits.
        Delegations already running are not affected by disposal.

        Raises:
            ToolRegistryError: the parent already has a tool of that name.
            ScopeClosedError: the subagents are closed.
        """
        description, _ = _wording(provider.inherits_parent_context)

        async def execute(arguments: dict[str, Any] | str, call: object) -> str:
            return await self._delegate(provider, arguments)

        tool = Tool(
            name=provider.tool_name,
            description=description,
            parameters=subagent_tool_parameters(provider),
            execute=execute,
        )
        tools = self.parent.tools
        tools.add(tool)
        self._tool_names.append(tool.name)

        def remove() -> None:
            self._tool_names.remove(tool.name)
            if tools.get(tool.name) is tool:
                tools.remove(tool.name)

        return self._scope.own(Registration(remove=remove))

    def delegations(self) -> list[Delegation]:
        """The running delegations, in start order."""
        return list(self._running)

    def statistics(self) -> SubagentStatistics:
        """Delegations running and finished, and the tools of the active providers."""
        return SubagentStatistics(
            running=len(self._running),
            started=self._started,
            completed=self._completed,
            failed=self._failed,
            aborted=self._aborted,
            tools=tuple(self._tool_names),
        )

    async def _delegate(self, provider: SubagentProvider, arguments: dict[str, Any] | str) -> str:
        """Run one child to the end of its turn and return its final text.

        Cancellation (the parent's turn is aborted): the child's turn is
        aborted with cause "parent" and its `turn/end` awaited (shielded, at
        most `PARENT_ABORT_GRACE_SECONDS`) before `Cancelled` propagates.
        """
        prompt, label = _parse_arguments(provider.tool_name, arguments)
        session_id = await provider.open_session(self.parent)
        delegation = Delegation(tool_name=provider.tool_name, label=label, session_id=session_id)
        outcome = _Outcome()
        self._begin(delegation)
        try:
            child = await self.supervisor.start_child(
                ChildSpec(
                    id=f"subagent:{session_id}",
                    start=self._child_start(session_id, prompt, outcome),
                    restart="temporary",
                )
            )
            exit = await self._wait(child)
        except Exception:
            self._failed += 1
            raise
        finally:
            self._end(delegation)
        return self._result(delegation, exit, outcome)

    async def _wait(self, child: Child[Agent]) -> ChildExit:
        try:
            return await child.wait_stopped()
        finally:
            if child.exit is None and child.state == "running":
                # Cancelled: the parent's turn is being aborted.
                self._aborted += 1
                with (
                    trio.CancelScope(shield=True),
                    trio.move_on_after(PARENT_ABORT_GRACE_SECONDS),
                ):
                    child.value.abort("parent")
                    await child.wait_stopped()

    def _result(self, delegation: Delegation, exit: ChildExit, outcome: _Outcome) -> str:
        where = f"subagent {delegation.label!r} (session {delegation.session_id!r})"
        if exit.reason != "normal":
            self._failed += 1
            raise SubagentError(f"{where} {exit.reason}: {exit.error!r}") from exit.error
        reason = outcome.reason
        if reason is None or reason.kind != "completed":
            self._failed += 1
            kind = "no turn" if reason is None else reason.kind
            detail = f": {reason.error.message}" if reason and reason.error else ""
            raise SubagentError(f"{where} ended its turn {kind}{detail}")
        self._completed += 1
        return outcome.text

    def _child_start(self, session_id: str, prompt: str, outcome: _Outcome) -> ChildStart[Agent]:
        async def start(*, task_status: trio.TaskStatus[Agent] = trio.TASK_STATUS_IGNORED) -> None:
            async with open_agent(
                system_prompt=self._system_prompt,
                provider=self._provider,
                options=self._options,
                store=self.parent.session.store,
                session_id=session_id,
                tools=self._tools,
                scope=self.parent.scope,
                clock=self.parent.session.clock,
            ) as agent:
                if self._setup is not None:
                    self._setup(agent)
                first_turn = agent.session.next_turn()
                agent.followup(prompt)
                task_status.started(agent)
                await agent.when_idle()
                outcome.record(agent.session, first_turn)

        return start

    def _begin(self, delegation: Delegation) -> None:
        self._started += 1
        self._running.append(delegation)
        self._refresh_context()

    def _end(self, delegation: Delegation) -> None:
        self._running.remove(delegation)
        self._refresh_context()

    def _refresh_context(self) -> None:
        if self._context is not None:
            self._context.dispose()
            self._context = None
        if self._running and not self.parent.scope.closed:
            lines = [f"- {d.tool_name}: {d.label} (session {d.session_id})" for d in self._running]
            self._context = self._system_prompt.context(
                PromptContext(
                    name=DELEGATION_CONTEXT,
                    order=DELEGATION_ORDER,
                    text="Subagent delegations in progress:\n" + "\n".join(lines),
                ),
                scope=self.parent.scope,
            )

    def _close(self) -> None:
        self._scope.close()
        if self._context is not None:
            self._context.dispose()
            self._context = None


@asynccontextmanager
async def open_subagents(
    parent: Agent,
    *,
    system_prompt: SystemPrompt,
    provider: Provider,
    options: AgentOptions | None = None,
    tools: Sequence[Tool] = (),
    setup: Callable[[Agent], None] | None = None,
) -> AsyncIterator[Subagents]:
    """Run a supervisor for `parent`'s children and yield the `Subagents` that use it.

    Children run `provider` with `options` (default: the parent's), the
    given `tools`, in the parent's store, with the parent's scope as their
    scope's parent; `setup(child)` runs in each child before its first step
    (e.g. to shadow a section in the child's scope).

    Leaving the context removes the subagent tools and terminates running
    children (their turns end aborted, cause "disposed"); open it inside
    the parent's `open_agent` so it closes first.

    Raises:
        SupervisionError: the supervisor failed (it never restarts a child,
            so only on a bug).
    """
    supervisor = Supervisor(name=f"subagents:{parent.session.id}")
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.serve)
        subagents = Subagents(
            parent=parent,
            supervisor=supervisor,
            system_prompt=system_prompt,
            provider=provider,
            options=options or parent.options,
            tools=tuple(tools),
            setup=setup,
            scope=Scope(name=f"subagents:{parent.session.id}", parent=parent.scope),
        )
        try:
            yield subagents
        finally:
            subagents._close()
            nursery.cancel_scope.cancel()
