"""Public boundaries raise one exception, never a bare `ExceptionGroup`.

Trio nurseries wrap whatever leaves them in an exception group (strict
groups). An `open_*` context manager of this project unwraps that group at
its edge so its caller sees the one domain exception (`SessionError`,
`ProviderError`, `PromptError`, `SupervisionError`, ...) that names the
store path, session, provider or section, chained `from` the group.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import trio


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            out.extend(_leaves(exc))
        else:
            out.append(exc)
    return out


def representative(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The one exception a group stands for: None when it holds only cancellations.

    A `KeyboardInterrupt` or other non-`Exception` wins; otherwise the first
    failure. When there are several failures, the others are named in a note
    on the one returned, so nothing is hidden.
    """
    failures = [exc for exc in _leaves(group) if not isinstance(exc, trio.Cancelled)]
    if not failures:
        return None
    chosen = next((exc for exc in failures if not isinstance(exc, Exception)), failures[0])
    others = [exc for exc in failures if exc is not chosen]
    if others:
        chosen.add_note(
            "also raised: " + "; ".join(f"{type(exc).__name__}: {exc}" for exc in others)
        )
    return chosen


@contextmanager
def one_exception() -> Iterator[None]:
    """Re-raise an exception group leaving the block as the one exception it stands for.

    The exception keeps its own `__cause__` when it has one (the group is
    then its `__context__`); otherwise it is chained from the group. A group
    of cancellations only is re-raised unchanged, so Trio can deliver the
    cancellation.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        chosen = representative(group)
        if chosen is None:
            raise
        if chosen.__cause__ is not None:
            # Keep the exception's own cause (the OSError behind a domain
            # error); the group stays reachable as its context.
            raise chosen from chosen.__cause__
        raise chosen from group
