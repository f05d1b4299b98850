"""Time context: the current wall-clock time, as a sourced snapshot appended to a step."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import attrs
import trio

from actors.agent import Agent, Enter, StepProposal
from actors.agent.decisions import PreStepNext, StepDecision
from actors.context.errors import ContextPluginError
from actors.context.retained import SNAPSHOT_FORM, entered_step, plugin_of
from actors.messages import Message, PluginSource
from actors.scope import Registration
from actors.session import Session
from actors.session.events import UserMessage
from actors.session.session import WallClock

TIME_PLUGIN = "time"
"""The `plugin` name on time snapshots."""


def _check_timezone(
    instance: object, attribute: attrs.Attribute[str | None], value: str | None
) -> None:
    if value is None:
        return
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ContextPluginError(
            f"time context: unknown timezone {value!r}; give an IANA name such as "
            "'Europe/Paris', or None for the machine's timezone"
        ) from None


def _check_interval(
    instance: object, attribute: attrs.Attribute[float | None], value: float | None
) -> None:
    if value is not None and not value > 0:
        raise ContextPluginError(
            f"time context: refresh_interval must be a positive number of seconds or None, "
            f"got {value!r}"
        )


@attrs.frozen(kw_only=True)
class TimeContext:
    """The current time, appended to every step that runs as a `time` snapshot.

    Attributes:
        timezone: IANA name the time is shown in; None shows the machine's
            local timezone.
        refresh_interval: seconds on the Trio clock during which a delivered
            time is still current, so no step inside that interval gets a new
            one; None delivers the time on every step.
        clock: the wall clock (epoch milliseconds); None reads the agent's
            session clock.

    Raises:
        ContextPluginError: an unknown timezone or a non-positive interval.
    """

    timezone: str | None = attrs.field(default=None, validator=_check_timezone)
    refresh_interval: float | None = attrs.field(default=None, validator=_check_interval)
    clock: WallClock | None = None

    def render(self, epoch_ms: int) -> str:
        """The snapshot text for the instant `epoch_ms`, to the second."""
        instant = datetime.fromtimestamp(epoch_ms // 1000, tz=UTC)
        if self.timezone is None:
            local = instant.astimezone()
            zone = f"{local.tzname()}, the machine's timezone"
        else:
            local = instant.astimezone(ZoneInfo(self.timezone))
            zone = self.timezone
        return f"Current time: {local.isoformat()} ({local:%A}, {zone})."

    def install(self, agent: Agent) -> Registration:
        """Add the time to every step of `agent` that runs, as a pre-step listener.

        The snapshot is appended after the downstream decision (this listener
        calls `next()` first), so it follows whatever inner listeners and the
        runtime-context projection entered. It is a user-role message with
        source plugin "time", form "snapshot"; the system text is never
        touched. A refresh interval counts from the last snapshot the session
        actually retained: a step that was rejected, or whose time snapshot an
        outer listener dropped, does not restart it. Disposing the returned
        registration removes the listener.
        """
        state = _TimeState(
            config=self, session=agent.session, clock=self.clock or agent.session.clock
        )
        return agent.on_pre_step(state.pre_step)


@attrs.define(eq=False)
class _TimeState:
    """One installation's refresh bookkeeping."""

    config: TimeContext
    session: Session
    clock: WallClock
    _delivered_at: float | None = attrs.field(default=None, init=False)
    _offered_at: float | None = attrs.field(default=None, init=False)
    _offered_from: int = attrs.field(default=0, init=False)

    async def pre_step(self, proposal: StepProposal, next: PreStepNext) -> StepDecision:
        decision = await next()
        entered = entered_step(proposal, decision)
        if entered is None:
            return decision
        self._confirm_offer()
        now = trio.current_time()
        interval = self.config.refresh_interval
        delivered_at = self._delivered_at
        if interval is not None and delivered_at is not None and now - delivered_at < interval:
            return decision
        self._offered_at = now
        self._offered_from = len(self.session)
        message = Message.user(
            self.config.render(self.clock()), PluginSource(plugin=TIME_PLUGIN, form=SNAPSHOT_FORM)
        )
        return Enter(messages=[*entered.messages, message])

    def _confirm_offer(self) -> None:
        """Count the last offered snapshot as delivered once the session holds it."""
        if self._offered_at is None:
            return
        for event in self.session.events_since(self._offered_from):
            data = event.data
            if isinstance(data, UserMessage) and plugin_of(data.to_message()) == TIME_PLUGIN:
                self._delivered_at = self._offered_at
                break
        self._offered_at = None
