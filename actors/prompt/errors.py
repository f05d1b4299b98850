"""The prompt registry's error types."""


class PromptError(ValueError):
    """Any registration, assembly, ordering or rendering failure of the prompt registry.

    The message always names the offending section, context, variable or tool.
    """


class RegistryServiceError(PromptError):
    """The registry service was used in a state that does not allow it (already running)."""


class RegistryNotRunningError(RegistryServiceError):
    """The registry service was asked for a subscription while it does not run."""
