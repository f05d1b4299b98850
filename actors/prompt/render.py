"""Strict rendering of an assembly: `{{name}}` interpolation, the system text, the context snapshot.

A reference is exactly `{{name}}` with `name` matching `[a-z][a-z0-9_]*`,
looked up only among the assembly's variable keys (never attributes).
Substituted values are never scanned again. A `{{` with no `}}` anywhere after
it is literal text; any other `{{ ... }}` group that is not a valid reference
(`{{ model }}`, `{{{model}}}`) raises, as do unknown and valueless references.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Iterable, Mapping
from typing import NoReturn, TypeAlias

import attrs

from actors.prompt.errors import PromptError
from actors.prompt.types import AssembledContext, PromptAssembly

RUNTIME_CONTEXT_PREAMBLE = (
    "Current runtime context. This snapshot supersedes earlier runtime-context snapshots.\n\n"
)
"""The fixed text that opens every non-empty runtime-context snapshot."""

# Non-greedy: a group runs from a `{{` to the first `}}` after it, so `{{{model}}}`
# is the malformed group `{{{model}}` rather than a reference inside literal braces.
_GROUP = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_NAME = re.compile(r"[a-z][a-z0-9_]*")


@attrs.frozen
class _Malformed:
    group: str


_Template: TypeAlias = tuple[str, ...] | _Malformed
"""A parsed text: literals at even indices, variable names at odd ones; or its first bad group."""


# Section texts repeat from step to step, so each distinct text is parsed once.
@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> _Template:
    parts: list[str] = []
    literal_start = 0
    for match in _GROUP.finditer(text):
        name = match.group(1)
        if _NAME.fullmatch(name) is None:
            return _Malformed(match.group(0))
        parts.append(text[literal_start : match.start()])
        parts.append(name)
        literal_start = match.end()
    parts.append(text[literal_start:])
    return tuple(parts)


def _interpolate(text: str, variables: Mapping[str, str | None], kind: str, name: str) -> str:
    if "{{" not in text:
        return text
    template = _parse(text)
    if isinstance(template, _Malformed):
        raise PromptError(
            f"malformed prompt variable reference {template.group} in {kind} {name!r}; "
            "a reference is {{name}} with name matching [a-z][a-z0-9_]*"
        )
    if len(template) == 1:
        return text
    out = [template[0]]
    for index in range(1, len(template), 2):
        value = variables.get(template[index])
        if not isinstance(value, str):
            _reject(variables, template[index], kind, name)
        out.append(value)
        out.append(template[index + 1])
    return "".join(out)


def _reject(variables: Mapping[str, str | None], variable: str, kind: str, name: str) -> NoReturn:
    if variable not in variables:
        registered = ", ".join(sorted(variables)) or "(none)"
        raise PromptError(
            f"unknown prompt variable {{{{{variable}}}}} in {kind} {name!r}; "
            f"registered: {registered}"
        )
    value = variables[variable]
    if value is None:
        raise PromptError(
            f"prompt variable {{{{{variable}}}}} in {kind} {name!r} has no value in this assembly"
        )
    raise PromptError(
        f"prompt variable {{{{{variable}}}}} in {kind} {name!r} is {type(value).__name__}, not str"
    )


def render_prompt(assembly: PromptAssembly) -> str:
    """Render the system text of an assembly.

    Each section is interpolated strictly against `assembly.variables`; sections
    whose interpolated text is exactly `""` are dropped; the rest are joined
    with a blank line, in list order.

    Raises:
        PromptError: a reference is malformed, unknown or valueless; the
            message names the section and lists the registered variables.
    """
    sections = assembly.sections
    variables = assembly.variables
    texts = tuple(section.text for section in sections)
    names = tuple(section.name for section in sections)
    values = tuple(variables.items())
    if all(value is None or type(value) is str for _, value in values):
        # Every step of every session renders the same sections again: once per distinct input.
        return _render_cached(texts, names, values)
    return _render(texts, names, variables)


def _render(
    texts: tuple[str, ...], names: tuple[str, ...], variables: Mapping[str, str | None]
) -> str:
    rendered = [
        _interpolate(text, variables, "section", name)
        for text, name in zip(texts, names, strict=True)
    ]
    # Interned: every session of a deployment renders the same text, and each
    # keeps it in its logged header; one shared string instead of a copy each.
    return sys.intern("\n\n".join(text for text in rendered if text))


@functools.lru_cache(maxsize=256)
def _render_cached(
    texts: tuple[str, ...], names: tuple[str, ...], values: tuple[tuple[str, str | None], ...]
) -> str:
    """`_render` of hashable variables, memoized (failures are raised again, never cached)."""
    return _render(texts, names, dict(values))


def render_context_sections(assembly: PromptAssembly) -> list[AssembledContext]:
    """Interpolate the assembly's contexts and keep the non-empty ones, in list order.

    Raises:
        PromptError: a reference is malformed, unknown or valueless; the
            message names the context.
    """
    variables = assembly.variables
    rendered: list[AssembledContext] = []
    for context in assembly.contexts:
        text = _interpolate(context.text, variables, "context", context.name)
        if text:
            rendered.append(AssembledContext(name=context.name, text=text))
    return rendered


def join_context_sections(sections: Iterable[AssembledContext]) -> str:
    """Join rendered contexts into one snapshot text.

    Returns `RUNTIME_CONTEXT_PREAMBLE` followed by the non-empty texts joined
    with a blank line, or `""` when no text is left.
    """
    texts = [section.text for section in sections if section.text]
    if not texts:
        return ""
    return RUNTIME_CONTEXT_PREAMBLE + "\n\n".join(texts)


def render_context_snapshot(assembly: PromptAssembly) -> tuple[str, list[AssembledContext]]:
    """Render the runtime-context snapshot of an assembly.

    Returns:
        The joined snapshot text (`""` when no context is left) and the
        rendered, non-empty contexts it was built from.

    Raises:
        PromptError: as `render_context_sections`.
    """
    sections = render_context_sections(assembly)
    return join_context_sections(sections), sections
