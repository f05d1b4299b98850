"""Time context: the current wall-clock time, as a sourced snapshot appended to a step."""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import attrs
import trio

from actors.agent import Agent, Enter, StepProposal
from actors.agent.decisions import PreStepNext, StepDecision
from actors.context.errors import ContextPluginError
from actors.context.retained import SNAPSHOT_FORM, entered_step
from actors.messages import Message, PluginSource, Source
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
        if self.timezone is None:
            local = datetime.fromtimestamp(epoch_ms // 1000, tz=UTC).astimezone()
            return _text(local, f"{local.tzname()}, the machine's timezone")
        return _zoned_text(self.timezone, epoch_ms // 1000)

    def snapshot(self, epoch_ms: int) -> Message:
        """The time snapshot message for the instant `epoch_ms` (see `render`).

        With a configured timezone, every snapshot of one second is the same
        (immutable) message object, rendered once for all the agents that
        step in that second; the machine's timezone is read at each call.
        """
        if self.timezone is None:
            return _snapshot_message(self.render(epoch_ms))
        return _zoned_snapshot(self.timezone, epoch_ms // 1000)

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


_SOURCE = PluginSource(plugin=TIME_PLUGIN, form=SNAPSHOT_FORM)


def _text(local: datetime, zone: str) -> str:
    return f"Current time: {local.isoformat()} ({local:%A}, {zone})."


def _is_time(source: Source) -> bool:
    return isinstance(source, PluginSource) and source.plugin == TIME_PLUGIN


def _snapshot_message(text: str) -> Message:
    return Message.user(text, _SOURCE)


@functools.lru_cache(maxsize=16)
def _zoned_text(timezone: str, epoch_second: int) -> str:
    """The text of one second in an IANA timezone (a few seconds and zones are kept)."""
    local = datetime.fromtimestamp(epoch_second, tz=UTC).astimezone(ZoneInfo(timezone))
    return _text(local, timezone)


@functools.lru_cache(maxsize=16)
def _zoned_snapshot(timezone: str, epoch_second: int) -> Message:
    """The snapshot message of one second in an IANA timezone, shared (messages are immutable)."""
    return _snapshot_message(_zoned_text(timezone, epoch_second))


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
        interval = self.config.refresh_interval
        if interval is not None:
            # Only an interval needs to know when a snapshot was delivered: without one
            # nothing is kept between steps (no timestamps left behind by each turn).
            self._confirm_offer()
            now = trio.current_time()
            delivered_at = self._delivered_at
            if delivered_at is not None and now - delivered_at < interval:
                return decision
            self._offered_at = now
            self._offered_from = len(self.session)
        return Enter(messages=[*entered.messages, self.config.snapshot(self.clock())])

    def _confirm_offer(self) -> None:
        """Count the last offered snapshot as delivered once the session holds it."""
        if self._offered_at is None:
            return
        for event in self.session.events_since(self._offered_from):
            data = event.data
            if isinstance(data, UserMessage) and _is_time(data.source):
                self._delivered_at = self._offered_at
                break
        self._offered_at = None
