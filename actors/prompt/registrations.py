"""Layered storage of prompt registrations: validated adds, disposal and change notification.

`Registrations` holds the global `Layer`, one `Layer` per scope that
registered something, and the scope-tagged listeners and change callbacks.
Every add validates its entry, stores it and returns a `Registration` whose
disposal removes exactly that entry; each registration or disposal (except of
change callbacks) bumps `generation`, invalidates the derived plans and
notifies the change callbacks. Internal to `actors.prompt`: `SystemPrompt` is
the public face of this storage.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any, Literal, TypeAlias, get_args

import attrs

from actors.prompt.entries import (
    ChangeCallbackEntry,
    Layer,
    ListenerEntry,
    ProtectionEntry,
    ToolProviderEntry,
    VariableEntry,
)
from actors.prompt.errors import ClosedScopeRegistrationError, PromptError
from actors.prompt.types import (
    AssembleListener,
    ChangeCallback,
    PromptContext,
    PromptProtection,
    PromptSection,
    ToolProvider,
    VariableProvider,
)
from actors.scope import Registration, Scope

_VARIABLE_NAME = re.compile(r"[a-z][a-z0-9_]*")
# The logger `SystemPrompt.on_change` documents, wherever this code lives.
_logger = logging.getLogger("actors.prompt.registry")

Kind: TypeAlias = Literal[
    "sections",
    "contexts",
    "suppressors",
    "tool_providers",
    "variables",
    "protections",
    "listeners",
    "change_callbacks",
]
"""The kinds of registration `PromptStatistics` counts."""


@attrs.frozen(kw_only=True)
class PromptStatistics:
    """A point-in-time summary of a `SystemPrompt`, cheap to take.

    The first eight fields count live registrations of each kind, over every
    layer. `scoped_layers` counts scopes that currently hold registrations.
    `changes_notified` counts change notifications fired (one per
    registration or disposal of anything but a change callback);
    `change_callback_errors` counts change callbacks that raised.
    """

    sections: int
    contexts: int
    suppressors: int
    tool_providers: int
    variables: int
    protections: int
    listeners: int
    change_callbacks: int
    scoped_layers: int
    changes_notified: int
    change_callback_errors: int


_EMPTY_LAYER = Layer()


class Registrations:
    """Every live registration of one `SystemPrompt`, by layer, and the change bookkeeping.

    Each `add_*` method validates, stores, counts and notifies, and returns the
    `Registration` that undoes it (owned by `scope` when given). `invalidate`
    is called on every change that notifies, before the change callbacks, so
    derived caches never outlive the registrations they were built from.
    """

    def __init__(self, *, invalidate: Callable[[], None]) -> None:
        self.global_layer = Layer()
        self.layers: dict[Scope, Layer] = {}
        self.listeners: list[ListenerEntry] = []
        self.generation = 0
        """Bumped on every registration or disposal that notifies."""
        self._invalidate = invalidate
        self._change_callbacks: list[ChangeCallbackEntry] = []
        self._variable_seq = 0
        self._counts: dict[Kind, int] = dict.fromkeys(get_args(Kind), 0)
        self._changes_notified = 0
        self._change_callback_errors = 0

    def add_section(self, section: PromptSection, scope: Scope | None) -> Registration:
        """Store a section in `scope`'s layer (see `SystemPrompt.section`)."""
        if not isinstance(section, PromptSection):
            raise PromptError(f"section() takes a PromptSection, got {type(section).__name__}")
        _check_entry(section.name, section.text, "section")
        _check_open(scope, f"section {section.name!r}")
        if section.name in self._existing(scope).sections:
            raise PromptError(f"section {section.name!r} is already registered in {_where(scope)}")
        if scope is not None and section.name in self._globally_protected_sections():
            raise PromptError(
                f"section {section.name!r} is protected globally; {_where(scope)} cannot shadow it"
            )
        layer = self._layer(scope)
        layer.sections[section.name] = section
        return self._commit(scope, "sections", layer, section, section.name)

    def add_context(self, context: PromptContext, scope: Scope | None) -> Registration:
        """Store a runtime context in `scope`'s layer (see `SystemPrompt.context`)."""
        if not isinstance(context, PromptContext):
            raise PromptError(f"context() takes a PromptContext, got {type(context).__name__}")
        _check_entry(context.name, context.text, "context")
        _check_open(scope, f"context {context.name!r}")
        if context.name in self._existing(scope).contexts:
            raise PromptError(f"context {context.name!r} is already registered in {_where(scope)}")
        layer = self._layer(scope)
        layer.contexts[context.name] = context
        return self._commit(scope, "contexts", layer, context, context.name)

    def add_suppressor(self, scope: Scope | None) -> Registration:
        """Count one runtime-context suppressor in `scope`'s layer."""
        _check_open(scope, "a runtime-context suppressor")
        layer = self._layer(scope)
        layer.suppressors += 1
        return self._commit(scope, "suppressors", layer)

    def add_tool_provider(self, provider: ToolProvider, scope: Scope | None) -> Registration:
        """Append a tool provider to `scope`'s layer (see `SystemPrompt.tools`)."""
        if not callable(provider):
            raise PromptError(f"tools() takes a callable provider, got {provider!r}")
        _check_open(scope, f"tool provider {_label(provider)!r}")
        layer = self._layer(scope)
        entry = ToolProviderEntry(provider=provider, label=_label(provider))
        layer.tool_providers.append(entry)
        return self._commit(scope, "tool_providers", layer, entry)

    def add_variable(
        self, name: str, provider: VariableProvider, scope: Scope | None
    ) -> Registration:
        """Store a variable provider in `scope`'s layer (see `SystemPrompt.variable`)."""
        if not isinstance(name, str) or _VARIABLE_NAME.fullmatch(name) is None:
            raise PromptError(f"variable name {name!r} must match [a-z][a-z0-9_]*")
        if not callable(provider):
            raise PromptError(f"variable {name!r} needs a callable provider, got {provider!r}")
        _check_open(scope, f"variable {name!r}")
        if name in self._existing(scope).variables:
            raise PromptError(f"variable {name!r} is already registered in {_where(scope)}")
        layer = self._layer(scope)
        self._variable_seq += 1
        entry = VariableEntry(name=name, provider=provider, seq=self._variable_seq)
        layer.variables[name] = entry
        return self._commit(scope, "variables", layer, entry, name)

    def add_protection(self, protection: PromptProtection, scope: Scope | None) -> Registration:
        """Append a protection to `scope`'s layer (see `SystemPrompt.protect`)."""
        if not isinstance(protection, PromptProtection):
            raise PromptError(
                f"protect() takes a PromptProtection, got {type(protection).__name__}"
            )
        if not protection.sections and not protection.tools:
            raise PromptError("protect() needs at least one section or tool name")
        for name in (*protection.sections, *protection.tools):
            if not isinstance(name, str):
                raise PromptError(f"protected name {name!r} is not a str")
        _check_open(scope, f"protection of {protection.sections!r} / {protection.tools!r}")
        if scope is None:
            for shadowing_scope, shadowing_layer in self.layers.items():
                for name in protection.sections:
                    if name in shadowing_layer.sections:
                        raise PromptError(
                            f"cannot protect section {name!r} globally: "
                            f"{_where(shadowing_scope)} already shadows it"
                        )
        layer = self._layer(scope)
        entry = ProtectionEntry(protection=protection)
        layer.protections.append(entry)
        return self._commit(scope, "protections", layer, entry)

    def add_listener(self, listener: AssembleListener, scope: Scope | None) -> Registration:
        """Append a waterfall listener tagged with `scope` (see `SystemPrompt.on_assemble`)."""
        if not callable(listener):
            raise PromptError(f"on_assemble() takes a callable listener, got {listener!r}")
        _check_open(scope, f"assemble listener {_label(listener)!r}")
        entry = ListenerEntry(listener=listener, label=_label(listener), scope=scope)
        self.listeners.append(entry)
        return self._commit(scope, "listeners", None, entry)

    def add_change_callback(self, callback: ChangeCallback, scope: Scope | None) -> Registration:
        """Append a change callback; neither this nor its disposal notifies."""
        if not callable(callback):
            raise PromptError(f"on_change() takes a callable, got {callback!r}")
        _check_open(scope, f"change callback {_label(callback)!r}")
        entry = ChangeCallbackEntry(callback=callback, label=_label(callback))
        self._change_callbacks.append(entry)
        return self._commit(scope, "change_callbacks", None, entry)

    def statistics(self) -> PromptStatistics:
        """Counts of live registrations per kind and of change notifications so far."""
        return PromptStatistics(
            **self._counts,
            scoped_layers=len(self.layers),
            changes_notified=self._changes_notified,
            change_callback_errors=self._change_callback_errors,
        )

    def _existing(self, scope: Scope | None) -> Layer:
        if scope is None:
            return self.global_layer
        return self.layers.get(scope) or _EMPTY_LAYER

    def _layer(self, scope: Scope | None) -> Layer:
        if scope is None:
            return self.global_layer
        layer = self.layers.get(scope)
        if layer is None:
            layer = self.layers[scope] = Layer()
        return layer

    def _drop_if_empty(self, scope: Scope | None, layer: Layer) -> None:
        if scope is not None and layer.is_empty() and self.layers.get(scope) is layer:
            del self.layers[scope]

    def _globally_protected_sections(self) -> set[str]:
        return {
            name for entry in self.global_layer.protections for name in entry.protection.sections
        }

    def _commit(
        self,
        scope: Scope | None,
        kind: Kind,
        layer: Layer | None,
        entry: object = None,
        name: str | None = None,
    ) -> Registration:
        """Count and announce a stored entry; its `Registration` removes it (see `_Removal`)."""
        registration = Registration(
            remove=_Removal(
                registrations=self, scope=scope, kind=kind, layer=layer, entry=entry, name=name
            )
        )
        self._counts[kind] += 1
        if scope is not None:
            scope.own(registration)
        self._changed(kind != "change_callbacks")
        return registration

    def _remove(self, removal: _Removal) -> None:
        """Undo what `_commit` recorded in `removal`: remove its entry, count, announce."""
        kind, layer, entry = removal.kind, removal.layer, removal.entry
        if layer is None:
            _remove_identical(
                self.listeners if kind == "listeners" else self._change_callbacks, entry
            )
        else:
            if kind == "suppressors":
                layer.suppressors -= 1
            elif kind in ("tool_providers", "protections"):
                _remove_identical(getattr(layer, kind), entry)
            else:  # a table by name: the entry goes only if it still is the one registered
                table = getattr(layer, kind)
                if table.get(removal.name) is entry:
                    del table[removal.name]
            self._drop_if_empty(removal.scope, layer)
        self._counts[kind] -= 1
        self._changed(kind != "change_callbacks")

    def _changed(self, notify: bool) -> None:
        # Change callbacks are no assembly input: adding or removing one
        # neither invalidates plans nor notifies.
        if not notify:
            return
        self.generation += 1
        self._invalidate()
        self._changes_notified += 1
        for entry in tuple(self._change_callbacks):
            try:
                entry.callback()
            except Exception:
                self._change_callback_errors += 1
                _logger.exception("prompt change callback %r raised", entry.label)


@attrs.frozen(kw_only=True)
class _Removal:
    """What one registration stored, and where: calling it removes exactly that entry.

    A small object rather than a closure over the same names: every idle
    agent keeps a few registrations for its whole life, and a closure
    (function, cells and their tuple) costs several times this.
    """

    registrations: Registrations
    scope: Scope | None
    kind: Kind
    layer: Layer | None  # None: the registry-wide listeners or change callbacks
    entry: object
    name: str | None  # the key of an entry kept in a table by name

    def __call__(self) -> None:
        self.registrations._remove(self)


def _check_open(scope: Scope | None, what: str) -> None:
    if scope is not None and scope.closed:
        raise ClosedScopeRegistrationError(
            f"scope {scope.name!r} is closed; cannot register {what} into it"
        )


def _where(scope: Scope | None) -> str:
    return "the global layer" if scope is None else f"scope {scope.name!r}"


def _check_entry(name: object, text: object, kind: str) -> None:
    if not isinstance(name, str) or not name:
        raise PromptError(f"{kind} name must be a non-empty str, got {name!r}")
    if not isinstance(text, str) and not callable(text):
        raise PromptError(f"{kind} {name!r}: text must be a str or a callable, got {text!r}")


def _label(fn: object) -> str:
    name = getattr(fn, "__qualname__", None)
    return name if isinstance(name, str) else repr(fn)


def _remove_identical(items: list[Any], item: object) -> None:
    for index, candidate in enumerate(items):
        if candidate is item:
            del items[index]
            return
