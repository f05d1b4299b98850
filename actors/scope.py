"""Scopes and registration handles: the ownership layer of the prompt registry.

A `Scope` is an identity-compared node in a tree fixed at construction. Every
registration made "in" a scope is owned by it: closing the scope disposes each
of them. A `Registration` is the handle a registration call returns; disposing
it removes exactly the entry it stands for, once.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

import attrs


class ScopeClosedError(RuntimeError):
    """Raised when something tries to register into a scope that is already closed."""


@attrs.define(eq=False)
class Registration:
    """A handle whose `dispose()` removes exactly one registered entry.

    `dispose()` is idempotent: the first call runs the removal, later calls do
    nothing. The handle is also a context manager that disposes on exit.
    """

    _remove: Callable[[], None] = attrs.field(alias="remove")
    _disposed: bool = attrs.field(default=False, init=False)
    _owner: Scope | None = attrs.field(default=None, init=False, repr=False)

    @property
    def disposed(self) -> bool:
        """True once `dispose()` has run."""
        return self._disposed

    def dispose(self) -> None:
        """Remove the entry this handle stands for; a repeated call is a no-op."""
        if self._disposed:
            return
        self._disposed = True
        if self._owner is not None:
            self._owner._forget(self)
        self._remove()

    def __enter__(self) -> Registration:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.dispose()


@attrs.define(eq=False)
class Scope:
    """An identity-compared node in the scope tree.

    The parent link is fixed at construction, so cycles are impossible.
    `chain()` lists this scope and its ancestors, nearest first. `close()`
    disposes every registration owned by the scope (in reverse registration
    order) and refuses new ones afterwards; a closed scope can still be
    assembled, with no registrations of its own.
    """

    name: str
    parent: Scope | None = attrs.field(default=None, on_setattr=attrs.setters.frozen)
    # Keyed by the registrations themselves (hashed by identity), in registration order.
    _owned: dict[Registration, None] = attrs.field(factory=dict, init=False, repr=False)
    _closed: bool = attrs.field(default=False, init=False)

    @property
    def closed(self) -> bool:
        """True once `close()` has been called."""
        return self._closed

    def chain(self) -> list[Scope]:
        """This scope followed by its ancestors, nearest first."""
        out: list[Scope] = []
        node: Scope | None = self
        while node is not None:
            out.append(node)
            node = node.parent
        return out

    def own(self, registration: Registration) -> Registration:
        """Make this scope dispose `registration` when it closes.

        Raises:
            ScopeClosedError: the scope is closed (the registration is disposed
                first, so nothing leaks).
        """
        if self._closed:
            registration.dispose()
            raise ScopeClosedError(f"scope {self.name!r} is closed; cannot register into it")
        registration._owner = self
        self._owned[registration] = None
        return registration

    def _forget(self, registration: Registration) -> None:
        self._owned.pop(registration, None)

    def close(self) -> None:
        """Dispose every registration this scope owns; idempotent."""
        if self._closed:
            return
        self._closed = True
        owned, self._owned = list(self._owned), {}
        for registration in reversed(owned):
            registration.dispose()
