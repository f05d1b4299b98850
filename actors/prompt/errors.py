"""The prompt registry's error type."""


class PromptError(ValueError):
    """Any registration, assembly, ordering or rendering failure of the prompt registry.

    The message always names the offending section, context, variable or tool.
    """
