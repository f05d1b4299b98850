"""Tmux context: where the agent's shell lives, prepended to the first step of a turn."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import trio

from actors.agent import Agent, Enter, StepProposal
from actors.agent.decisions import PreStepNext, StepDecision
from actors.context.errors import ContextPluginError
from actors.context.retained import SNAPSHOT_FORM, RetainedPluginMessage, entered_step
from actors.messages import Message, PluginSource
from actors.scope import Registration
from actors.session import Session

TMUX_PLUGIN = "tmux"
"""The `plugin` name on tmux snapshots."""
TMUX_FORMAT = (
    "#{session_name}\t#{window_index}\t#{window_name}\t#{pane_index}\t#{pane_current_path}"
)
"""What the location query asks tmux to print: five tab-separated fields."""
TMUX_COMMAND = ("tmux", "display-message", "-p", TMUX_FORMAT)
"""The default location query."""


@attrs.frozen(kw_only=True)
class TmuxLocation:
    """The tmux pane the agent's shell runs in."""

    session: str
    window_index: str
    window_name: str
    pane_index: str
    cwd: str

    @classmethod
    def parse(cls, output: str) -> TmuxLocation | None:
        """The location printed for `TMUX_FORMAT`, or None when `output` is not one."""
        fields = output.rstrip("\r\n").split("\t")
        if len(fields) != 5:
            return None
        session, window_index, window_name, pane_index, cwd = fields
        if not (session and window_index and pane_index):
            return None
        return cls(
            session=session,
            window_index=window_index,
            window_name=window_name,
            pane_index=pane_index,
            cwd=cwd,
        )

    def render(self) -> str:
        """The snapshot text."""
        return (
            f"tmux location: session {self.session!r}, window {self.window_index} "
            f"({self.window_name!r}), pane {self.pane_index}; the pane's working directory "
            f"is {self.cwd}."
        )


async def query_tmux_location(command: Sequence[str] = TMUX_COMMAND) -> TmuxLocation | None:
    """Run the location query `command` and parse what it prints.

    Returns None, without raising, when the command cannot be started (no
    tmux installed), exits non-zero (no tmux server, not inside tmux) or
    prints something that is not a location.

    Cancellation: cancelling kills the query process.
    """
    try:
        result = await trio.run_process(
            list(command), capture_stdout=True, capture_stderr=True, check=False
        )
    except OSError:
        return None
    if result.returncode != 0:
        return None
    return TmuxLocation.parse(result.stdout.decode("utf-8", errors="replace"))


def _check_interval(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value >= 0:
        raise ContextPluginError(
            f"tmux context: refresh_interval must be a non-negative number of seconds, "
            f"got {value!r}"
        )


def _command(value: Sequence[str]) -> tuple[str, ...]:
    command = tuple(value)
    if not command:
        raise ContextPluginError("tmux context: the location query command is empty")
    return command


@attrs.frozen(kw_only=True)
class TmuxContext:
    """The agent's tmux location, told to the model on the first step of a turn.

    Attributes:
        shell_tool: the tool whose commands run in tmux; without it in the
            step's tools the location is irrelevant and never queried.
        refresh_interval: seconds on the Trio clock between two location
            queries (counted from the last query, successful or not).
        command: the location query; it must print `TMUX_FORMAT`'s fields.

    Raises:
        ContextPluginError: a negative interval or an empty command.
    """

    shell_tool: str = "bash"
    refresh_interval: float = attrs.field(default=30.0, validator=_check_interval)
    command: tuple[str, ...] = attrs.field(default=TMUX_COMMAND, converter=_command)

    def install(self, agent: Agent) -> Registration:
        """Prepend `agent`'s tmux location to the first step of its turns, as a pre-step listener.

        On a turn's first step that runs, when the step's tools include
        `shell_tool` and the refresh interval has passed, the listener runs
        the query (after the downstream decision, so a rejected step costs no
        process). When it succeeds and the location differs from the one the
        session retains, a snapshot (source plugin "tmux", form "snapshot")
        is put first in the decision. A missing tmux or a failing query adds
        nothing and raises nothing. Disposing the returned registration
        removes the listener.
        """
        state = _TmuxState(
            config=self, session=agent.session, retained=RetainedPluginMessage(plugin=TMUX_PLUGIN)
        )
        return agent.on_pre_step(state.pre_step)


@attrs.define(eq=False)
class _TmuxState:
    """One installation's query clock and view of the retained location."""

    config: TmuxContext
    session: Session
    retained: RetainedPluginMessage
    _queried_at: float | None = attrs.field(default=None, init=False)

    async def pre_step(self, proposal: StepProposal, next: PreStepNext) -> StepDecision:
        decision = await next()
        entered = entered_step(proposal, decision)
        if entered is None or proposal.step != 0 or not self._has_shell(proposal):
            return decision
        now = trio.current_time()
        if self._queried_at is not None and now - self._queried_at < self.config.refresh_interval:
            return decision
        self._queried_at = now
        location = await query_tmux_location(self.config.command)
        if location is None:
            return decision
        text = location.render()
        self.retained.catch_up(self.session)
        if text == self.retained.snapshot_text:
            return decision
        message = Message.user(text, PluginSource(plugin=TMUX_PLUGIN, form=SNAPSHOT_FORM))
        return Enter(messages=[message, *entered.messages])

    def _has_shell(self, proposal: StepProposal) -> bool:
        return any(tool.name == self.config.shell_tool for tool in proposal.assembly.tools)
