"""The PromptRegistry service: fans registry change notifications out to async subscribers.

`RegistryService` is the actor (DESIGN §2) that watches one `SystemPrompt`
through `on_change` and notifies every `RegistrySubscription`; a subscription
holds at most one pending, coalescing `RegistryChange`. Stopping the service
removes its change callback and ends every subscription. `open_runtime`
(`supervision.runtime`) runs one in its root nursery.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

import attrs
import trio

from actors.prompt.errors import RegistryNotRunningError, RegistryServiceError
from actors.prompt.registry import SystemPrompt


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
            RegistryServiceError: the service is already running.
        """
        if self._wake is not None:
            raise RegistryServiceError("the registry service is already running")
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
            RegistryNotRunningError: the service does not run.
        """
        if self._wake is None:
            raise RegistryNotRunningError("the registry service is not running")
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
