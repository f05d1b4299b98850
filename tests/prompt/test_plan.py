"""Assembly plans: a scope's plan, built over its parent's, is the flat merge of its whole chain."""

from __future__ import annotations

from operator import attrgetter

from hypothesis import given
from hypothesis import strategies as st

from actors.prompt import PromptContext, PromptProtection, PromptSection, SystemPrompt
from actors.prompt.plan import Plan
from actors.prompt.types import (
    AssembleContext,
    NextListener,
    PromptAssembly,
    TextProvider,
    ToolProviderResult,
)
from actors.scope import Scope

# The scopes of the examples: a root, its two children, and a grandchild under the first.
LAYERS = ("global", "root", "a", "b", "a1")
PARENT = {"root": None, "a": "root", "b": "root", "a1": "a"}

layer_names = st.sampled_from(LAYERS)
registrations = st.lists(
    st.tuples(
        st.sampled_from(("section", "context", "suppress", "tools", "protect", "listener")),
        layer_names,
        st.sampled_from(("n1", "n2", "n3")),
        st.integers(min_value=0, max_value=3),
        st.booleans(),
    ),
    max_size=14,
)


def _flat_plan(prompt: SystemPrompt, scope: Scope | None) -> dict[str, object]:
    """What the plan of `scope` must hold: every layer of its chain merged at once (DESIGN §4)."""
    regs = prompt._registrations
    scopes = () if scope is None else tuple(reversed(scope.chain()))
    layers = [regs.global_layer, *(regs.layers[s] for s in scopes if s in regs.layers)]
    sections: dict[str, PromptSection] = {}
    contexts: dict[str, PromptContext] = {}
    for layer in layers:
        sections.update(layer.sections)
        contexts.update(layer.contexts)
    ordered_sections = tuple(sorted(sections.values(), key=attrgetter("order")))
    ordered_contexts = tuple(sorted(contexts.values(), key=attrgetter("order")))
    members = set(scopes)
    return {
        "scopes": scopes,
        "suppressed": any(layer.suppressors for layer in layers),
        "sections": ordered_sections,
        "prebuilt_sections": tuple(
            (s.name, s.text) if isinstance(s.text, str) else None for s in ordered_sections
        ),
        "complete": tuple(i for i, s in enumerate(ordered_sections) if s.complete),
        "contexts": ordered_contexts,
        "prebuilt_contexts": tuple(
            (c.name, c.text) if isinstance(c.text, str) else None for c in ordered_contexts
        ),
        "tool_providers": tuple(p for layer in layers for p in layer.tool_providers),
        "listeners": tuple(e for e in regs.listeners if e.scope is None or e.scope in members),
        "protected_sections": frozenset(
            n for layer in layers for e in layer.protections for n in e.protection.sections
        ),
        "protected_tools": frozenset(
            n for layer in layers for e in layer.protections for n in e.protection.tools
        ),
    }


def _as_dict(plan: Plan) -> dict[str, object]:
    return {
        "scopes": plan.scopes,
        "suppressed": plan.suppressed,
        "sections": plan.sections,
        "prebuilt_sections": tuple(
            None if s is None else (s.name, s.text) for s in plan.prebuilt_sections
        ),
        "complete": plan.complete,
        "contexts": plan.contexts,
        "prebuilt_contexts": tuple(
            None if c is None else (c.name, c.text) for c in plan.prebuilt_contexts
        ),
        "tool_providers": plan.tool_providers,
        "listeners": plan.listeners,
        "protected_sections": plan.protected_sections,
        "protected_tools": plan.protected_tools,
    }


def _text_of(name: str) -> TextProvider:
    return lambda ctx: name


def _tools(ctx: AssembleContext) -> ToolProviderResult:
    return ToolProviderResult(schemas=())


async def _listener(
    assembly: PromptAssembly, ctx: AssembleContext, next_: NextListener
) -> PromptAssembly:
    raise AssertionError("plans never run listeners")


@given(
    registered=registrations,
    order=st.permutations(["global", *PARENT]),
    dispose_first=st.booleans(),
)
def test_each_plan_is_the_flat_merge_of_its_chain(
    registered: list[tuple[str, str, str, int, bool]],
    order: list[str],
    dispose_first: bool,
) -> None:
    prompt = SystemPrompt(include_harness_identity=False)
    scopes: dict[str, Scope] = {}
    for name, parent in PARENT.items():
        scopes[name] = Scope(name=name, parent=None if parent is None else scopes[parent])
    handles = []
    for kind, layer, name, number, flag in registered:
        scope = None if layer == "global" else scopes[layer]
        text: TextProvider = f"{name} of {layer}" if flag else _text_of(name)
        try:
            if kind == "section":
                handles.append(
                    prompt.section(
                        PromptSection(
                            name=name, order=number, text=text, complete=flag and number == 0
                        ),
                        scope=scope,
                    )
                )
            elif kind == "context":
                handles.append(
                    prompt.context(PromptContext(name=name, order=number, text=text), scope=scope)
                )
            elif kind == "suppress":
                handles.append(prompt.suppress_runtime_context(scope=scope))
            elif kind == "tools":
                handles.append(prompt.tools(_tools, scope=scope))
            elif kind == "protect":
                handles.append(
                    prompt.protect(
                        PromptProtection(sections=(name,) if flag else (), tools=(name,)),
                        scope=scope,
                    )
                )
            else:
                handles.append(prompt.on_assemble(_listener, scope=scope))
        except Exception:
            continue  # a registration the registry refuses (a duplicate name): not an example
    if dispose_first and handles:
        handles[0].dispose()
    cache = prompt._plans
    for layer in order:
        scope = None if layer == "global" else scopes[layer]
        assert _as_dict(cache.get(prompt._registrations, scope)) == _flat_plan(prompt, scope)
