"""Which exceptions a failure boundary may contain, and which must always travel on.

A tool call and a supervised child are failure boundaries: whatever they
raise (`SystemExit` from an argparse-based helper included) is recorded as
their failure instead of taking down their siblings. Two kinds of exception
are never contained, because they are not failures of the code that raised
them: `trio.Cancelled` (structured cancellation reaching its cancel scope)
and `KeyboardInterrupt` (the user stopping the process). An exception group
holding either travels on too, since swallowing the group would swallow them.
"""

from __future__ import annotations

import trio

UNCONTAINED: tuple[type[BaseException], ...] = (trio.Cancelled, KeyboardInterrupt)
"""The exception types a failure boundary never turns into a failure result."""


def must_propagate(exc: BaseException) -> bool:
    """True when `exc` is, or is a group holding, a `Cancelled` or `KeyboardInterrupt`."""
    if isinstance(exc, UNCONTAINED):
        return True
    return isinstance(exc, BaseExceptionGroup) and exc.subgroup(UNCONTAINED) is not None


def uncontained_part(exc: BaseException) -> BaseException | None:
    """What of `exc` must propagate: all of it, its uncontained subgroup, or None.

    For an exception group mixing cancellation with real failures (a tool's
    own nursery cancelled while one of its children raised), only the
    `Cancelled` / `KeyboardInterrupt` leaves must propagate; the caller
    raises that subgroup `from` the group so the failures stay attached to
    the traceback. A `KeyboardInterrupt` anywhere keeps the whole group.
    """
    if isinstance(exc, UNCONTAINED):
        return exc
    if not isinstance(exc, BaseExceptionGroup):
        return None
    if exc.subgroup(KeyboardInterrupt) is not None:
        return exc
    return exc.subgroup(trio.Cancelled)
