"""A dry run of the next step's assembly: what the agent would send, with each entry's origin.

`inspect_next_step` assembles the agent's prompt exactly as the loop does
at the start of a step (same scope, same `AssembleContext`), renders the
system text and the runtime-context sections, and builds the request header
the next attempt would send. It logs nothing, calls no provider and runs no
`pre_step` listener, so inspecting never changes the agent's log or its
behaviour. Sections, contexts and tools carry the scope that supplied them
(and the layers they shadow), so per-agent shadowing is visible.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import attrs

from actors.agent.loop import AgentLoop
from actors.prompt import (
    AssembleContext,
    EntryOrigin,
    PromptAssembly,
    render_context_sections,
    render_prompt,
)
from actors.scope import Scope
from actors.session.header import RequestHeader

GLOBAL_SCOPE = "global"
"""The scope label of entries registered in the global layer."""

LISTENER_SCOPE = "listener"
"""The scope label of entries no layer registers (a waterfall listener added them)."""


@attrs.frozen(kw_only=True)
class InspectedSection:
    """One system-text section of the next step, as rendered.

    Attributes:
        name: the section name.
        order: its order (None when a listener added it).
        scope: the label of the layer that supplies it (`GLOBAL_SCOPE`, a
            scope's name, or `LISTENER_SCOPE`).
        shadows: labels of the farther layers whose same-named entry it hides.
        complete: True for a complete section.
        text: its interpolated text.
        bytes: the UTF-8 length of `text`.
        sha256: the hex SHA-256 of `text` in UTF-8.
    """

    name: str
    order: float | None
    scope: str
    shadows: tuple[str, ...]
    complete: bool
    text: str
    bytes: int
    sha256: str


@attrs.frozen(kw_only=True)
class InspectedContext:
    """One non-empty runtime-context section of the next step, interpolated."""

    name: str
    order: float | None
    scope: str
    shadows: tuple[str, ...]
    text: str


@attrs.frozen(kw_only=True)
class InspectedTool:
    """One tool of the next request, in request order, with the scope of its provider."""

    name: str
    scope: str


@attrs.frozen(kw_only=True)
class StepInspection:
    """What the agent's next step would send.

    Attributes:
        header: the canonical request header of the next attempt.
        header_changed: True when that attempt would log a `request/header`
            (the first of this incarnation, or different from the last one).
        sections: the system-text sections, in order (empty ones included).
        contexts: the non-empty runtime-context sections, in order.
        tools: the tools, in request order.
        variables: every variable of the assembly (None: registered, no value).
    """

    header: RequestHeader
    header_changed: bool
    sections: tuple[InspectedSection, ...]
    contexts: tuple[InspectedContext, ...]
    tools: tuple[InspectedTool, ...]
    variables: Mapping[str, str | None]


def scope_label(scope: Scope | None) -> str:
    """`GLOBAL_SCOPE` for the global layer, else the scope's name."""
    return GLOBAL_SCOPE if scope is None else scope.name


async def inspect_next_step(loop: AgentLoop) -> StepInspection:
    """Dry-run the assembly of `loop`'s next step.

    Assembly runs as in a step (text providers, tool providers and
    `on_assemble` listeners are called: they are the program being
    inspected); nothing else happens.

    Cancellation: cancellable wherever the assembly awaits; nothing is changed.

    Raises:
        PromptError: the assembly or rendering failed; the message names the
            section, context, variable or tool.
    """
    assembly = await loop.system_prompt.assemble(
        AssembleContext(scope=loop.scope, agent=loop.agent)
    )
    system = render_prompt(assembly)
    header = loop.request_header(system, assembly)
    origins = loop.system_prompt.origins(loop.scope)
    sections = []
    for section in assembly.sections:
        origin = origins.sections.get(section.name)
        text = render_prompt(
            PromptAssembly(sections=[section], contexts=[], tools=[], variables=assembly.variables)
        )
        encoded = text.encode()
        sections.append(
            InspectedSection(
                name=section.name,
                order=None if origin is None else origin.order,
                scope=_label(origin),
                shadows=_shadows(origin),
                complete=origin is not None and origin.complete,
                text=text,
                bytes=len(encoded),
                sha256=hashlib.sha256(encoded).hexdigest(),
            )
        )
    contexts = []
    for context in render_context_sections(assembly):
        origin = origins.contexts.get(context.name)
        contexts.append(
            InspectedContext(
                name=context.name,
                order=None if origin is None else origin.order,
                scope=_label(origin),
                shadows=_shadows(origin),
                text=context.text,
            )
        )
    tools = tuple(
        InspectedTool(name=tool.name, scope=_label(origins.tools.get(tool.name)))
        for tool in header.tools
    )
    return StepInspection(
        header=header,
        header_changed=loop.would_log_header(header),
        sections=tuple(sections),
        contexts=tuple(contexts),
        tools=tools,
        variables=dict(assembly.variables),
    )


def _label(origin: EntryOrigin | None) -> str:
    return LISTENER_SCOPE if origin is None else scope_label(origin.scope)


def _shadows(origin: EntryOrigin | None) -> tuple[str, ...]:
    return () if origin is None else tuple(scope_label(s) for s in origin.shadows)
