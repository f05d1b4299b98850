"""Errors of the context plugins."""


class ContextPluginError(ValueError):
    """A context plugin was configured with a value it cannot use.

    The message names the plugin, the offending value and what is accepted.
    """
