"""The prompt registry's error types."""

from actors.scope import ScopeClosedError


class PromptError(ValueError):
    """Any registration, assembly, ordering or rendering failure of the prompt registry.

    The message always names the offending section, context, variable or tool.
    """


class ClosedScopeRegistrationError(PromptError, ScopeClosedError):
    """A registration was made into a closed scope; the message names the scope and the entry.

    It is both a `PromptError` (every registry failure is) and the
    `ScopeClosedError` that `Scope.own` raises for the same mistake.
    """


class RegistryServiceError(PromptError):
    """The registry service was used in a state that does not allow it (already running)."""


class RegistryNotRunningError(RegistryServiceError):
    """The registry service was asked for a subscription while it does not run."""
