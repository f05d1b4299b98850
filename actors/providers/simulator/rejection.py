"""`Rejection`: a chat request the simulator refuses, with DeepSeek's status and wording."""

from __future__ import annotations


class Rejection(Exception):
    """A chat request fails validation.

    Attributes:
        status: The HTTP status to answer with (400 or 422).
        message: The error message, naming the offending field.
        param: The offending request parameter, if any.
    """

    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def wrong_type(field: str, value: object, expected: str) -> Rejection:
    """A `422` for a field of the wrong JSON type, worded as DeepSeek's deserializer words it."""
    kinds = {bool: "boolean", int: "integer", float: "floating point", str: "string"}
    kind = kinds.get(type(value), "null" if value is None else type(value).__name__)
    return Rejection(
        422,
        f"Failed to deserialize the JSON body into the target type: {field}: "
        f"invalid type: {kind} {value!r}, expected {expected}",
        param=field,
    )


def out_of_range(field: str, low: float, high: float) -> Rejection:
    """A `400` for a number outside its range, worded as DeepSeek words it."""
    message = f"Invalid {field} value, the valid range of {field} is [{low:g}, {high:g}]"
    return Rejection(400, message, param=field)
