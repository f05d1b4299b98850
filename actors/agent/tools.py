"""Tools the model can call, and the registry that feeds their schemas to the prompt."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import attrs

from actors.agent.tool_call import ToolInvocation
from actors.agent.validation import (
    INVALID_ARGUMENTS,
    INVALID_ARGUMENTS_CODE,
    InvalidArguments,
    Validate,
    check_arguments,
    compile_parameters,
)
from actors.containment import uncontained_part
from actors.prompt.types import AssembleContext, ToolProviderResult, ToolSchema
from actors.session.events import ToolError, ToolResult

ToolExecute = Callable[[dict[str, Any] | str, ToolInvocation], Awaitable[str]]
"""`async def execute(arguments, call) -> str`. When the registry runs a tool,
`arguments` is always the parsed JSON object, already validated against the
tool's `parameters` (the `str` alternative stays for callers that call
`execute` themselves), and `call` is the `ToolInvocation`: the logged
`tool/call` event with its `idempotency_key`."""


class ToolRegistryError(ValueError):
    """A tool registry was given a duplicate or malformed tool."""


@attrs.frozen  # positional, as DESIGN §8 writes Tool(...)
class Tool:
    """A tool: `Tool(name, description, parameters, execute)`.

    `parameters` is the JSON Schema of the arguments object;
    `async def execute(arguments: dict | str, call) -> str` runs a call,
    where `call` is the `ToolInvocation`: the `tool/call` event with its
    `idempotency_key`, `(session_id, seq)` of that logged event, the same
    for every execution of that call (pass it on to whatever the tool
    changes outside the log, so a repeated execution is recognised). Before `execute` runs, the
    arguments are validated against `parameters`: a call whose arguments
    are not a JSON object or do not match gets an error `tool/result`
    (`error.name` "InvalidArguments", code "invalid_arguments") saying which
    parameter is wrong and what was expected, and `execute` is not called.
    Raising from `execute` yields an error `tool/result` carrying the
    exception's message; it never crashes the agent. To make a tool from a
    typed Python function, use `function_tool`.

    Raises:
        PromptError: the name or parameters are not a valid tool schema.
        ToolSchemaError: `parameters` is not a JSON Schema the validator can compile.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    execute: ToolExecute
    schema: ToolSchema = attrs.field(init=False, eq=False, repr=False)
    """The schema the prompt registry shows the model; one object per tool, so every
    session's assemblies (and the log codec's caches) share it."""
    _validate: Validate = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        # The schema snapshots (and validates) the parameters; the tool keeps
        # that same immutable snapshot, so both always agree.
        schema = ToolSchema(
            name=self.name, description=self.description, parameters=self.parameters
        )
        object.__setattr__(self, "schema", schema)
        object.__setattr__(self, "parameters", schema.parameters)
        object.__setattr__(self, "_validate", compile_parameters(self.name, schema.parameters))

    def check(self, raw_arguments: str) -> dict[str, Any]:
        """The raw JSON arguments of a call, parsed and validated against `parameters`.

        Raises:
            InvalidArguments: they are not a JSON object matching the schema;
                the message names the parameter and what was expected.
        """
        return check_arguments(self.name, raw_arguments, self._validate)


def parse_arguments(raw: str) -> dict[str, Any] | str:
    """The arguments as a JSON object, or the raw string when they are not one."""
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return raw
    return value if isinstance(value, dict) else raw


def _describe(exc: BaseException) -> str:
    """The model-facing text of a tool's exception: its message, or its type when it has none.

    A `BaseException` that is not an `Exception` (`SystemExit(2)`) is named
    with its type, as its bare message (`"2"`) would say nothing.
    """
    text = str(exc)
    if not isinstance(exc, Exception):
        return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text or type(exc).__name__


_SHARED_REGISTRIES = 64
_shared_registries: OrderedDict[
    tuple[int, ...], tuple[tuple[Tool, ...], dict[str, Tool], ToolProviderResult]
] = OrderedDict()
"""Built registries by the identity of their tools (each entry keeps its tools alive)."""


def shared_tools(tools: Iterable[Tool]) -> tuple[Tool, ...]:
    """`tools` as a tuple: the same one for every call with the same `Tool` objects in order.

    For whoever keeps an agent's tools for its whole life (to build its
    registry again on a restart): thousands of agents with the same tools
    then keep one tuple, not a copy each.

    Raises:
        ToolRegistryError: two tools share a name.
    """
    return _shared_entry(tools)[0]


def _shared_entry(
    tools: Iterable[Tool],
) -> tuple[tuple[Tool, ...], dict[str, Tool], ToolProviderResult]:
    """The cached (tools, table, provider result) of `tools`, built and cached if new.

    Raises:
        ToolRegistryError: two tools share a name.
    """
    listed = tuple(tools)
    key = tuple(map(id, listed))
    entry = _shared_registries.get(key)
    if entry is None:
        built = ToolRegistry()
        for tool in listed:
            built.add(tool)
        entry = (listed, built._tools, built._result)
        _shared_registries[key] = entry
        if len(_shared_registries) > _SHARED_REGISTRIES:
            _shared_registries.popitem(last=False)
    else:
        _shared_registries.move_to_end(key)
    return entry


@attrs.define(eq=False)
class ToolRegistry:
    """An agent's tools, by name.

    `provider` is a tool-schema provider for the prompt registry, so the
    schemas the model sees and the tools that run are the same set. It
    returns the same `ToolProviderResult` until the tools change, so the
    prompt registry validates it once.

    Registries made by `of` from the same `Tool` objects share one table
    and one result (every agent of a deployment has the same tools) until
    one of them adds or removes a tool: it then gets a copy of its own.
    """

    _tools: dict[str, Tool] = attrs.field(factory=dict, init=False)
    _result: ToolProviderResult = attrs.field(
        factory=lambda: ToolProviderResult(schemas=()), init=False
    )
    _shared: bool = attrs.field(default=False, init=False)

    @classmethod
    def of(cls, tools: Iterable[Tool]) -> ToolRegistry:
        """A registry holding `tools`.

        Raises:
            ToolRegistryError: two tools share a name.
        """
        entry = _shared_entry(tools)
        registry = cls()
        registry._tools, registry._result, registry._shared = entry[1], entry[2], True
        return registry

    def _own(self) -> None:
        """Copy a shared table before changing it."""
        if self._shared:
            self._tools = dict(self._tools)
            self._shared = False

    def add(self, tool: Tool) -> None:
        """Add `tool`; raises `ToolRegistryError` naming a duplicate."""
        if tool.name in self._tools:
            raise ToolRegistryError(f"tool {tool.name!r} is already registered")
        self._own()
        self._tools[tool.name] = tool
        self._result = ToolProviderResult(schemas=(*self._result.schemas, tool.schema))

    def remove(self, name: str) -> None:
        """Remove the tool `name`; raises `ToolRegistryError` when there is none."""
        if name not in self._tools:
            raise ToolRegistryError(f"no tool named {name!r}; registered: {self.names()}")
        self._own()
        del self._tools[name]
        schemas = tuple(schema for schema in self._result.schemas if schema.name != name)
        self._result = ToolProviderResult(schemas=schemas)

    def names(self) -> list[str]:
        """Registered tool names, in registration order."""
        return list(self._tools)

    def get(self, name: str) -> Tool | None:
        """The tool `name`, if registered."""
        return self._tools.get(name)

    def provider(self, ctx: AssembleContext) -> ToolProviderResult:
        """Tool-schema provider: every registered tool is visible."""
        return self._result

    async def run(self, call: ToolInvocation) -> ToolResult:
        """Execute `call`; an unknown tool, bad arguments or a raising tool give an error result.

        The tool's `execute` receives `call` itself, idempotency key included.

        Invalid arguments never reach `execute`.

        Whatever `execute` raises becomes an error result naming the
        exception type, `BaseException`s such as `SystemExit` included, so
        one tool can never take down its agent or the agent's siblings.

        Cancellation: `trio.Cancelled` and `KeyboardInterrupt` propagate. An
        exception group holding a `Cancelled` beside real failures (the
        tool's own nursery cancelled while a child raised) propagates as its
        `Cancelled` part, raised from the group; the call is being cancelled,
        so its result is the loop's "cancelled" one.
        """
        tool = self._tools.get(call.name)
        if tool is None:
            return ToolResult(
                turn=call.turn,
                step=call.step,
                call_id=call.call_id,
                content=f"unknown tool {call.name!r}; available: {', '.join(self._tools)}",
                is_error=True,
                error=ToolError(name="UnknownTool", code="unknown_tool"),
            )
        try:
            arguments = tool.check(call.arguments)
        except InvalidArguments as invalid:
            return ToolResult(
                turn=call.turn,
                step=call.step,
                call_id=call.call_id,
                content=str(invalid),
                is_error=True,
                error=ToolError(name=INVALID_ARGUMENTS, code=INVALID_ARGUMENTS_CODE),
            )
        try:
            content = await tool.execute(arguments, call)
        except BaseException as exc:  # a tool is a failure boundary: see actors.containment
            uncontained = uncontained_part(exc)
            if uncontained is exc:
                raise
            if uncontained is not None:
                raise uncontained from exc
            return ToolResult(
                turn=call.turn,
                step=call.step,
                call_id=call.call_id,
                content=_describe(exc),
                is_error=True,
                error=ToolError(name=type(exc).__name__, code="tool_error"),
            )
        return ToolResult(
            turn=call.turn, step=call.step, call_id=call.call_id, content=content, is_error=False
        )
