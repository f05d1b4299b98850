"""`function_tool`: a `Tool` made from a typed Python function and its Google-style docstring.

The JSON schema comes from the signature's type hints, the descriptions from
the docstring; both are worked out when the tool is made, so an annotation
the schema cannot express fails then, naming the function and parameter,
not when the model first calls the tool. Arguments reach the function as
keyword arguments, converted from JSON by this module's cattrs converter
(the tool-argument boundary): nested objects become their attrs class or
`TypedDict`.
"""

from __future__ import annotations

import functools
import inspect
import json
import types
import typing
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, overload

import attrs
import cattrs
import docstring_parser
import trio

from actors.agent.tool_call import ToolInvocation
from actors.agent.tools import Tool

CALL_PARAMETER = "call"
"""A parameter with this name receives the `ToolInvocation` (the `tool/call` event and its
idempotency key) instead of a model argument."""

SUPPORTED = (
    "str, int, float, bool, None, list[T], dict[str, T], Literal[...], T | None, "
    "attrs classes and TypedDicts"
)

_converter = cattrs.Converter()
"""The tool-argument boundary: JSON arguments → annotated Python values, and results → JSON."""


def _structure_typeddict(value: Any, cls: type) -> dict[str, Any]:
    # Our own hook: cattrs reads `__required_keys__`, which misses NotRequired[...]
    # written as a string annotation. Validation has already checked the keys.
    hints = typing.get_type_hints(cls)
    return {key: _converter.structure(item, hints[key]) for key, item in value.items()}


_converter.register_structure_hook_func(
    lambda cls: isinstance(cls, type) and typing.is_typeddict(cls), _structure_typeddict
)
_converter.register_structure_hook(type(None), lambda value, _: value)  # validated as null

_PRIMITIVES: Mapping[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    type(None): "null",
    None: "null",
}


class _Unsupported(Exception):
    """Internal: `annotation` (inside the parameter being built) has no JSON schema."""

    def __init__(self, annotation: Any, why: str = "") -> None:
        super().__init__(annotation, why)
        self.annotation = annotation
        self.why = why


def _words(text: str | None) -> str:
    """Docstring text as one line (docstrings wrap lines; the model needs none of that)."""
    return " ".join((text or "").split())


def _docstring(obj: object) -> docstring_parser.Docstring:
    return docstring_parser.parse(inspect.getdoc(obj) or "", docstring_parser.DocstringStyle.GOOGLE)


def _first_paragraph(doc: docstring_parser.Docstring) -> str:
    first = doc.short_description or ""
    if doc.long_description and not doc.blank_after_short_description:
        first = f"{first}\n{doc.long_description.split(chr(10) * 2)[0]}"
    return _words(first)


def _is_typeddict(annotation: Any) -> bool:
    return isinstance(annotation, type) and typing.is_typeddict(annotation)


def _json_default(value: Any) -> tuple[bool, Any]:
    """(True, value) when a default can appear in the schema as JSON."""
    try:
        return True, json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return False, None


@attrs.define(eq=False)
class _SchemaBuilder:
    """Builds JSON schemas for one function's annotations; guards against recursive classes."""

    _building: list[type] = attrs.field(factory=list)

    def schema(self, annotation: Any) -> dict[str, Any]:
        if typing.get_origin(annotation) in (typing.Annotated, typing.Required, typing.NotRequired):
            return self.schema(typing.get_args(annotation)[0])
        if annotation in _PRIMITIVES:
            return {"type": _PRIMITIVES[annotation]}
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if origin is Literal:
            return self._literal(annotation, args)
        if origin in (types.UnionType, typing.Union):
            rest = [a for a in args if a is not type(None)]
            if len(rest) != 1 or len(args) != 2:
                raise _Unsupported(annotation, "only unions of one type with None are supported")
            return {"anyOf": [self.schema(rest[0]), {"type": "null"}]}
        if origin is list:
            if len(args) != 1:
                raise _Unsupported(annotation, "give the item type, e.g. list[str]")
            return {"type": "array", "items": self.schema(args[0])}
        if origin is dict:
            if len(args) != 2 or args[0] is not str:
                raise _Unsupported(annotation, "only dict[str, T] is supported")
            return {"type": "object", "additionalProperties": self.schema(args[1])}
        if annotation in (list, dict):
            raise _Unsupported(annotation, "give the item type, e.g. list[str] or dict[str, int]")
        if isinstance(annotation, type) and (attrs.has(annotation) or _is_typeddict(annotation)):
            return self._object(annotation)
        raise _Unsupported(annotation)

    def _literal(self, annotation: Any, values: tuple[Any, ...]) -> dict[str, Any]:
        for value in values:
            if not (value is None or isinstance(value, str | int | float | bool)):
                raise _Unsupported(annotation, f"literal {value!r} is not a JSON value")
        schema: dict[str, Any] = {"enum": list(values)}
        kinds = {"boolean" if isinstance(v, bool) else _PRIMITIVES.get(type(v)) for v in values}
        if kinds <= {"integer", "number"}:
            # "number" also refuses booleans, which Python would let equal 1 and 0.
            kinds = {"number"} if len(kinds) > 1 else kinds
        if len(kinds) == 1:
            schema = {"type": kinds.pop(), **schema}
        return schema

    def _object(self, cls: type) -> dict[str, Any]:
        if cls in self._building:
            raise _Unsupported(cls, "recursive classes are not supported")
        self._building.append(cls)
        try:
            doc = _docstring(cls)
            described = {p.arg_name: _words(p.description) for p in doc.params}
            properties: dict[str, Any] = {}
            required: list[str] = []
            for field, annotation, default in _fields(cls):
                prop = self.schema(annotation)
                if described.get(field):
                    prop["description"] = described[field]
                if default is _REQUIRED:
                    required.append(field)
                elif default is not _NO_JSON_DEFAULT:
                    prop["default"] = default
                properties[field] = prop
            schema: dict[str, Any] = {"type": "object"}
            # Only the class's own docstring: inspect.getdoc would fall back to a base's.
            summary = _first_paragraph(doc) if cls.__doc__ else ""
            if summary:
                schema["description"] = summary
            schema["properties"] = properties
            if required:
                schema["required"] = required
            schema["additionalProperties"] = False
            return schema
        finally:
            self._building.pop()


_REQUIRED = object()
_NO_JSON_DEFAULT = object()


def _default_marker(default: Any) -> Any:
    ok, value = _json_default(default)
    return value if ok else _NO_JSON_DEFAULT


def _fields(cls: type) -> list[tuple[str, Any, Any]]:
    """(name, annotation, default marker) of an attrs class's or TypedDict's fields."""
    hints = typing.get_type_hints(cls, include_extras=True)
    if _is_typeddict(cls):
        # `__required_keys__` misses NotRequired[...] written as a string annotation
        # (postponed evaluation), so the resolved hint decides when it says so.
        required_keys = getattr(cls, "__required_keys__", frozenset(hints))
        out: list[tuple[str, Any, Any]] = []
        for name, hint in hints.items():
            origin = typing.get_origin(hint)
            needed = origin is typing.Required or (
                origin is not typing.NotRequired and name in required_keys
            )
            out.append((name, hint, _REQUIRED if needed else _NO_JSON_DEFAULT))
        return out
    fields: list[tuple[str, Any, Any]] = []
    for field in attrs.fields(cls):
        if not field.init:
            continue
        if field.default is attrs.NOTHING:
            marker = _REQUIRED
        elif isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            marker = _NO_JSON_DEFAULT
        else:
            marker = _default_marker(field.default)
        fields.append((field.alias or field.name, hints.get(field.name, field.type), marker))
    return fields


@attrs.frozen(kw_only=True)
class _Parameter:
    name: str
    annotation: Any


def _parameters(
    fn: Callable[..., Any], tool_name: str
) -> tuple[dict[str, Any], list[_Parameter], bool]:
    """The arguments schema, the model-facing parameters and whether `call` is taken."""
    where = f"function_tool {tool_name!r} ({getattr(fn, '__qualname__', fn)!r})"
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except (NameError, TypeError) as exc:
        raise TypeError(f"{where}: cannot resolve its type hints: {exc}") from exc
    doc = _docstring(fn)
    described = {p.arg_name: _words(p.description) for p in doc.params}
    signature = inspect.signature(fn)
    unknown = sorted(set(described) - set(signature.parameters))
    if unknown:
        raise TypeError(
            f"{where}: the docstring's Args name {', '.join(map(repr, unknown))}, "
            f"which {'is not a parameter' if len(unknown) == 1 else 'are not parameters'}"
        )
    properties: dict[str, Any] = {}
    required: list[str] = []
    taken: list[_Parameter] = []
    wants_call = False
    for parameter in signature.parameters.values():
        name = parameter.name
        if name == CALL_PARAMETER:
            wants_call = True
            continue
        if parameter.kind not in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            raise TypeError(
                f"{where}: parameter {name!r} is {parameter.kind.description}; a tool takes "
                "keyword arguments only"
            )
        if name not in hints:
            raise TypeError(f"{where}: parameter {name!r} has no type annotation")
        annotation = hints[name]
        try:
            prop = _SchemaBuilder().schema(annotation)
        except _Unsupported as exc:
            why = f" ({exc.why})" if exc.why else ""
            inner = "" if exc.annotation is annotation else f" (inside {annotation!r})"
            raise TypeError(
                f"{where}: parameter {name!r} has an unsupported annotation "
                f"{exc.annotation!r}{inner}{why}; supported: {SUPPORTED}"
            ) from None
        if described.get(name):
            prop["description"] = described[name]
        if parameter.default is parameter.empty:
            required.append(name)
        else:
            marker = _default_marker(parameter.default)
            if marker is not _NO_JSON_DEFAULT:
                prop["default"] = marker
        properties[name] = prop
        taken.append(_Parameter(name=name, annotation=annotation))
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    schema["additionalProperties"] = False
    return schema, taken, wants_call


def _result_text(value: Any) -> str:
    """A function's return value as the tool result: a str as is, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(_converter.unstructure(value), ensure_ascii=False)


def _make(fn: Callable[..., Any], *, name: str | None, description: str | None) -> Tool:
    tool_name = name or getattr(fn, "__name__", "")
    if not tool_name:
        raise TypeError(f"function_tool({fn!r}): give the tool a name (name=...)")
    schema, taken, wants_call = _parameters(fn, tool_name)
    is_async = inspect.iscoroutinefunction(fn)

    async def execute(arguments: dict[str, Any] | str, call: ToolInvocation) -> str:
        if not isinstance(arguments, dict):
            raise TypeError(f"tool {tool_name!r} takes a JSON object of arguments")
        kwargs = {
            p.name: _converter.structure(arguments[p.name], p.annotation)
            for p in taken
            if p.name in arguments
        }
        if wants_call:
            kwargs[CALL_PARAMETER] = call
        if is_async:
            result = await typing.cast(Callable[..., Awaitable[Any]], fn)(**kwargs)
        else:
            result = await trio.to_thread.run_sync(functools.partial(fn, **kwargs))
        return _result_text(result)

    text = description if description is not None else _first_paragraph(_docstring(fn))
    return Tool(tool_name, text, schema, execute)


@overload
def function_tool(
    fn: Callable[..., Any], *, name: str | None = ..., description: str | None = ...
) -> Tool: ...


@overload
def function_tool(
    fn: None = ..., *, name: str | None = ..., description: str | None = ...
) -> Callable[[Callable[..., Any]], Tool]: ...


def function_tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """A `Tool` made from a typed function: `@function_tool`, `@function_tool(name=...)`
    or `function_tool(fn, name=...)`.

    The arguments schema comes from the type hints: `str`, `int`, `float`,
    `bool`, `None`, `list[T]`, `dict[str, T]`, `Literal[...]`, `T | None`,
    attrs classes and `TypedDict`s (nested objects; their docstring's
    `Attributes:` describe the fields). A parameter with a default is not
    required. Extra arguments are refused. The description is `description`,
    else the docstring's first paragraph; each parameter's description comes
    from the docstring's `Args:` section.

    The function gets its arguments as keyword arguments, nested objects
    converted to their attrs class or dict; a parameter named `call` receives
    the `ToolInvocation`: the `tool/call` event and its `idempotency_key`
    (`(session_id, seq)` of that logged call, the same for every execution
    of it). An `async def` is awaited; a plain `def` runs in a
    worker thread via `trio.to_thread.run_sync` (cancelling the turn waits for
    the thread to return; it is never abandoned). A `str` result is the tool
    result as is; anything else is sent as JSON.

    Raises:
        TypeError: a parameter has no annotation or one the schema cannot
            express, is positional-only or variadic, or the docstring's `Args:`
            names a parameter that does not exist; the message names the
            function and the parameter.
    """
    if fn is None:
        return functools.partial(_make, name=name, description=description)
    return _make(fn, name=name, description=description)
