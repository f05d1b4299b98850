"""`Scope` and `Registration` on their own: identity, the fixed chain, ownership and disposal."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest

from actors.scope import Registration, Scope, ScopeClosedError


def test_chain_lists_the_scope_then_its_ancestors_nearest_first() -> None:
    root = Scope("root")
    child = Scope("child", parent=root)
    grandchild = Scope("grandchild", parent=child)

    assert grandchild.chain() == [grandchild, child, root]
    assert root.chain() == [root]


def test_scopes_compare_by_identity() -> None:
    first, second = Scope("same"), Scope("same")

    assert first != second
    assert first == first
    assert len({first, second}) == 2


def test_parent_link_cannot_be_changed_after_construction() -> None:
    root = Scope("root")
    child = Scope("child", parent=root)

    with pytest.raises(attrs.exceptions.FrozenAttributeError):
        root.parent = child

    assert root.parent is None
    assert child.chain() == [child, root]


def test_close_disposes_owned_registrations_in_reverse_order_once() -> None:
    scope = Scope("agent")
    disposed: list[str] = []

    def remover(label: str) -> Callable[[], None]:
        return lambda: disposed.append(label)

    for label in ("first", "second", "third"):
        scope.own(Registration(remove=remover(label)))

    scope.close()
    scope.close()

    assert disposed == ["third", "second", "first"]
    assert scope.closed


def test_registration_disposed_early_is_not_disposed_again_by_close() -> None:
    scope = Scope("agent")
    disposed: list[str] = []
    early = scope.own(Registration(remove=lambda: disposed.append("early")))

    early.dispose()
    scope.close()

    assert disposed == ["early"]


def test_owning_into_a_closed_scope_disposes_the_registration_and_raises() -> None:
    scope = Scope("done")
    scope.close()
    disposed: list[str] = []
    registration = Registration(remove=lambda: disposed.append("x"))

    with pytest.raises(ScopeClosedError, match="scope 'done' is closed"):
        scope.own(registration)

    assert registration.disposed
    assert disposed == ["x"]
