"""The session package's error types."""


class SessionError(Exception):
    """Any failure to record, load, derive or replay a session log.

    The message names the offending event (type and seq) or session.
    """


class UnknownEventError(SessionError):
    """A stored event has a type this version does not know and is not marked ignorable."""


class ReplacementError(SessionError):
    """A replacement event cites an event that is missing, not a surface event, or gone."""


class SessionHibernatingError(SessionError):
    """A synchronous read of a hibernating session; `await session.wake()` first."""
