"""Immutable JSON values: deep snapshots that many readers can share safely.

`freeze_json` turns a JSON-like value into one nobody can mutate: objects
become `FrozenDict` (a `dict` subclass, so `json.dumps` and equality with
plain dicts keep working) and arrays become tuples. `thaw_json` gives back a
fresh, fully mutable deep copy.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn, TypeAlias

JSONValue: TypeAlias = Any
"""A JSON-like value: None, bool, int, float, str, list/tuple or str-keyed mapping."""


class FrozenDict(dict[str, Any]):
    """A `dict` whose mutating methods raise `TypeError`.

    It is a real `dict` subclass so the C JSON encoder serialises it exactly
    like a plain dict (same key order, same bytes).
    """

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("this JSON object is an immutable snapshot; copy it with thaw_json()")

    __setitem__ = _refuse
    __delitem__ = _refuse
    __ior__ = _refuse
    clear = _refuse
    pop = _refuse
    popitem = _refuse
    setdefault = _refuse
    update = _refuse

    __slots__ = ("_text",)

    def json_text(self) -> str:
        """The compact JSON text of this object, computed once."""
        try:
            return self._text
        except AttributeError:
            self._text: str = json.dumps(self, separators=(",", ":"), ensure_ascii=False)
            return self._text

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self.items()))

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> FrozenDict:
        return self

    def __reduce__(self) -> tuple[type[FrozenDict], tuple[list[tuple[str, Any]]]]:
        return (FrozenDict._from_items, (list(self.items()),))  # type: ignore[return-value]

    @classmethod
    def _from_items(cls, items: Iterable[tuple[str, Any]]) -> FrozenDict:
        return cls(items)


def freeze_json(value: JSONValue, *, where: str = "value") -> JSONValue:
    """Return an immutable deep snapshot of a JSON-like value.

    Raises:
        TypeError: a value is not JSON-like (non-str key, NaN, an object); the
            message names the path inside `where`.
    """
    if value is None or isinstance(value, (bool, int, str, FrozenDict)):
        # A FrozenDict is only ever built by this function, so it is frozen all the way down.
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(f"{where} holds a non-finite number {value!r}; JSON cannot carry it")
        return value
    if isinstance(value, Mapping):
        out: dict[str, JSONValue] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where} has a non-string key {key!r}")
            out[key] = freeze_json(item, where=f"{where}.{key}")
        return FrozenDict(out)
    if isinstance(value, (list, tuple)):
        return tuple(freeze_json(item, where=f"{where}[{i}]") for i, item in enumerate(value))
    raise TypeError(f"{where} holds {type(value).__name__}, which is not JSON-like")


def freeze_object(value: Mapping[str, Any], *, where: str) -> Mapping[str, Any]:
    """`freeze_json` for a value that must be a JSON object.

    Raises:
        TypeError: `value` is not a JSON object of JSON-like values; the
            message names the path inside `where`.
    """
    frozen = freeze_json(value, where=where)
    if not isinstance(frozen, Mapping):
        raise TypeError(f"{where} must be a JSON object, got {type(value).__name__}")
    return frozen


def thaw_json(value: JSONValue) -> JSONValue:
    """Return a fresh, fully mutable deep copy (dicts and lists) of a JSON-like value."""
    if isinstance(value, FrozenDict):
        # Decoding the cached text is far cheaper than walking the structure in Python.
        return json.loads(value.json_text())
    if isinstance(value, Mapping):
        return {key: thaw_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw_json(item) for item in value]
    return value
