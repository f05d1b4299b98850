"""Generated signatures: the schema accepts exactly the arguments the function accepts."""

from __future__ import annotations

import functools
import inspect
import json
import math
from typing import Any, Literal, NotRequired, Required, TypedDict

import attrs
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.agent import function_tool
from actors.agent.validation import InvalidArguments
from actors.session.events import ToolCallRequested

# An annotation spec is a small tree: ("str",), ("list", spec), ("class", fields), ...
Spec = tuple[Any, ...]

PRIMITIVES = ["str", "int", "float", "bool", "none"]
NAMES = ["alpha", "beta", "gamma", "delta"]
FIELD_NAMES = ["x", "y", "z"]


def _specs() -> st.SearchStrategy[Spec]:
    leaves = st.one_of(
        st.sampled_from(PRIMITIVES).map(lambda p: (p,)),
        st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3, unique=True).map(
            lambda values: ("literal", tuple(values))
        ),
        st.lists(st.integers(-3, 3), min_size=1, max_size=3, unique=True).map(
            lambda values: ("literal", tuple(values))
        ),
    )

    def extend(children: st.SearchStrategy[Spec]) -> st.SearchStrategy[Spec]:
        fields = st.lists(
            st.tuples(st.sampled_from(FIELD_NAMES), children, st.booleans()),
            min_size=1,
            max_size=3,
            unique_by=lambda f: f[0],
        ).map(tuple)
        return st.one_of(
            children.map(lambda c: ("list", c)),
            children.map(lambda c: ("dict", c)),
            children.filter(lambda c: c[0] not in ("optional", "none")).map(
                lambda c: ("optional", c)
            ),
            st.tuples(st.sampled_from(["attrs", "typeddict"]), fields),
        )

    return st.recursive(leaves, extend, max_leaves=4)


SPECS = _specs()
_classes = 0


def annotation_of(spec: Spec) -> Any:
    """The Python annotation a spec stands for (building classes as needed)."""
    global _classes
    kind = spec[0]
    simple = {"str": str, "int": int, "float": float, "bool": bool, "none": None}
    if kind in simple:
        return simple[kind]
    if kind == "literal":
        return Literal[spec[1]]
    if kind == "list":
        return list[annotation_of(spec[1])]  # type: ignore[misc]
    if kind == "dict":
        return dict[str, annotation_of(spec[1])]  # type: ignore[misc]
    if kind == "optional":
        return annotation_of(spec[1]) | None
    _classes += 1
    fields = spec[1]
    if kind == "typeddict":
        hints = {
            name: (Required if needed else NotRequired)[annotation_of(sub)]
            for name, sub, needed in fields
        }
        return TypedDict(f"TD{_classes}", hints)  # type: ignore[operator]
    attributes = {
        name: attrs.field(type=annotation_of(sub), **({} if needed else {"default": None}))
        for name, sub, needed in sorted(fields, key=lambda f: not f[2])
    }
    cls = attrs.make_class(f"C{_classes}", attributes, frozen=True)
    cls.__annotations__ = {name: a.type for name, a in attributes.items()}  # type: ignore[attr-defined]
    return cls


def accepts(spec: Spec, value: Any) -> bool:
    """Whether a JSON value is an acceptable argument for the annotation `spec` (the reference)."""
    kind = spec[0]
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if kind == "float":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "none":
        return value is None
    if kind == "literal":
        values = spec[1]
        same_type = isinstance(value, str) == isinstance(values[0], str)
        return not isinstance(value, bool) and same_type and value in values
    if kind == "list":
        return isinstance(value, list) and all(accepts(spec[1], item) for item in value)
    if kind == "dict":
        return isinstance(value, dict) and all(accepts(spec[1], v) for v in value.values())
    if kind == "optional":
        return value is None or accepts(spec[1], value)
    # attrs class or TypedDict: an object with the required fields, no others, each acceptable
    if not isinstance(value, dict):
        return False
    fields = {name: (sub, needed) for name, sub, needed in spec[1]}
    if set(value) - set(fields):
        return False
    for name, (sub, needed) in fields.items():
        if name not in value:
            if needed:
                return False
        elif not accepts(sub, value[name]):
            return False
    return True


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=False, width=32)
    | st.sampled_from(["a", "b", "z", ""]),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from([*FIELD_NAMES, "w"]), children, max_size=3)
    ),
    max_leaves=6,
)


@functools.cache
def valid_value(spec: Spec) -> st.SearchStrategy[Any]:
    """Values `accepts(spec, value)` holds for (by construction)."""
    kind = spec[0]
    if kind == "str":
        return st.text(max_size=5)
    if kind == "int":
        return st.integers(-100, 100)
    if kind == "float":
        return st.floats(allow_nan=False, allow_infinity=False, width=32) | st.integers(-5, 5)
    if kind == "bool":
        return st.booleans()
    if kind == "none":
        return st.none()
    if kind == "literal":
        return st.sampled_from(spec[1])
    if kind == "list":
        return st.lists(valid_value(spec[1]), max_size=3)
    if kind == "dict":
        return st.dictionaries(st.text(max_size=3), valid_value(spec[1]), max_size=3)
    if kind == "optional":
        return st.none() | valid_value(spec[1])
    parts = {name: (valid_value(sub), needed) for name, sub, needed in spec[1]}
    required = {name: s for name, (s, needed) in parts.items() if needed}
    optional = {name: s for name, (s, needed) in parts.items() if not needed}
    return st.fixed_dictionaries(required, optional=optional)


@functools.cache
def candidate(spec: Spec) -> st.SearchStrategy[Any]:
    """A value that is often, but not always, acceptable."""
    return valid_value(spec) | JSON


@st.composite
def signatures_and_arguments(
    draw: st.DrawFn,
) -> tuple[list[tuple[str, Spec, bool]], dict[str, Any]]:
    names = draw(st.lists(st.sampled_from(NAMES), max_size=3, unique=True))
    params = [(name, draw(SPECS), draw(st.booleans())) for name in names]
    arguments: dict[str, Any] = {}
    for name, spec, required in params:
        if (required or draw(st.booleans())) and draw(st.integers(0, 9)) > 0:
            arguments[name] = draw(candidate(spec))
    if draw(st.integers(0, 9)) == 0:
        arguments["extra"] = 1
    return params, arguments


def make_function(params: list[tuple[str, Spec, bool]], seen: list[dict[str, Any]]) -> Any:
    async def fn(**kwargs: Any) -> str:
        seen.append(kwargs)
        return "ok"

    ordered = sorted(params, key=lambda p: not p[2])  # required first
    fn.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=inspect.Parameter.empty if required else None,
            )
            for name, _, required in ordered
        ]
    )
    fn.__annotations__ = {name: annotation_of(spec) for name, spec, _ in ordered}
    fn.__annotations__["return"] = str
    return fn


def reference(params: list[tuple[str, Spec, bool]], arguments: dict[str, Any]) -> bool:
    """Whether the function can be called with these keyword arguments, by the annotations."""
    specs = {name: (spec, required) for name, spec, required in params}
    if set(arguments) - set(specs):
        return False
    for name, (spec, required) in specs.items():
        if name not in arguments:
            if required:
                return False
        elif not accepts(spec, arguments[name]):
            return False
    return True


def finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(finite(v) for v in value)
    if isinstance(value, dict):
        return all(finite(v) for v in value.values())
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(signatures_and_arguments())
def test_schema_accepts_exactly_the_arguments_the_function_accepts(
    case: tuple[list[tuple[str, Spec, bool]], dict[str, Any]],
) -> None:
    params, arguments = case
    seen: list[dict[str, Any]] = []
    tool = function_tool(make_function(params, seen), name="generated")
    raw = json.dumps(arguments)
    expected = reference(params, arguments)
    try:
        checked = tool.check(raw)
    except InvalidArguments:
        assert not expected, f"refused acceptable arguments {raw} for {params}"
        return
    assert expected, f"accepted unacceptable arguments {raw} for {params}"
    call = ToolCallRequested(turn=0, step=0, call_id="c", name="generated", arguments=raw)
    assert trio.run(tool.execute, checked, call) == "ok"
    assert set(seen[0]) == set(arguments)
