"""`AwakeSlots`: how a host bounds its agents awake at once without a task per waiting agent.

An agent woken by input asks its host's slots to admit it (`admit`, with a
callback that starts its loop task). With a slot free the callback runs at
once; otherwise it waits in the slots' queue, first come first served, as
one reference, and runs when an awake agent's loop task ends and gives its
slot back (`release`). So a burst of input to many idle agents starts
only as many loop tasks as there are slots: the others stay records, not
tasks blocked on a lock (each with its stack of frames and cancel scopes,
allocated during the burst and scattered over the memory it used).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

AdmitCallback = Callable[[], bool]
"""Called once the agent holds a slot: starts its loop task and returns True, or returns False
when the agent no longer wants it (it closed while it waited); the slot is then freed. An agent
that closes while it waits gives nothing back at once: its callback declines when its turn
comes (closing never searches the queue)."""


class AwakeSlots(Protocol):
    """Slots shared by a host's agents: one held from an agent's wake until it is idle again."""

    def admit(self, start: AdmitCallback, /) -> None:
        """Run `start` now if a slot is free and nobody waits, else once one frees (in order).

        `start` runs synchronously, in whichever task frees the slot; it
        must not block or raise.
        """
        ...

    def release(self) -> None:
        """Give back a slot an admitted agent held; may admit the next waiting one."""
        ...
