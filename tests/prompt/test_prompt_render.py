"""Strict rendering: interpolation rules, dropping empty sections, the context snapshot."""

from __future__ import annotations

import re

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from actors.prompt import (
    RUNTIME_CONTEXT_PREAMBLE,
    AssembledContext,
    AssembledSection,
    PromptAssembly,
    PromptError,
    join_context_sections,
    render_context_sections,
    render_context_snapshot,
    render_prompt,
)

PREAMBLE = (
    "Current runtime context. This snapshot supersedes earlier runtime-context snapshots.\n\n"
)

NAME = re.compile(r"[a-z][a-z0-9_]*")
names = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)
# Literal text that cannot open or close a group on its own or across a join.
literals = st.text(alphabet=st.characters(blacklist_characters="{}"), max_size=12)


def one_section(text: str, variables: dict[str, str | None] | None = None) -> PromptAssembly:
    return PromptAssembly(
        sections=[AssembledSection(name="persona", text=text)], variables=variables or {}
    )


def render_one(text: str, variables: dict[str, str | None] | None = None) -> str:
    return render_prompt(one_section(text, variables))


def test_reference_is_replaced_by_its_value() -> None:
    assert render_one("model: {{model}}.", {"model": "m1"}) == "model: m1."


def test_unknown_reference_names_section_and_lists_registered_variables() -> None:
    with pytest.raises(PromptError) as info:
        render_one("I am {{modle}}", {"model": "m", "cwd": "/w"})

    assert str(info.value) == (
        "unknown prompt variable {{modle}} in section 'persona'; registered: cwd, model"
    )


def test_valueless_reference_raises() -> None:
    with pytest.raises(PromptError, match=r"\{\{cwd\}\} in section 'persona' has no value"):
        render_one("in {{cwd}}", {"cwd": None})


@pytest.mark.parametrize("name", ["keys", "get", "items", "values", "copy"])
def test_lookup_never_falls_through_to_dict_attributes(name: str) -> None:
    with pytest.raises(PromptError, match="unknown prompt variable"):
        render_one("{{" + name + "}}", {"model": "m"})


@pytest.mark.parametrize(
    "text", ["{{__class__}}", "{{ model }}", "{{Model}}", "{{}}", "{{1x}}", "{{a-b}}"]
)
def test_malformed_reference_raises(text: str) -> None:
    with pytest.raises(PromptError, match=r"malformed prompt variable reference .* 'persona'"):
        render_one(text, {"model": "m", "__class__": "c"})


def test_triple_braces_raise() -> None:
    with pytest.raises(PromptError, match="malformed"):
        render_one("{{{model}}}", {"model": "m"})


def test_lone_open_braces_without_a_later_close_are_literal() -> None:
    assert render_one("{{model}} then {{ never closed", {"model": "m"}) == "m then {{ never closed"


def test_open_braces_with_a_later_close_raise() -> None:
    with pytest.raises(PromptError, match="malformed"):
        render_one("{{model} and later }}", {"model": "m"})


def test_substituted_values_are_not_scanned_again() -> None:
    assert render_one("{{a}}", {"a": "{{b}}", "b": "no"}) == "{{b}}"


def test_sections_are_joined_with_a_blank_line_and_empty_ones_vanish() -> None:
    assembly = PromptAssembly(
        sections=[
            AssembledSection(name="one", text="first"),
            AssembledSection(name="empty", text=""),
            AssembledSection(name="becomes_empty", text="{{nothing}}"),
            AssembledSection(name="two", text="second"),
        ],
        variables={"nothing": ""},
    )

    assert render_prompt(assembly) == "first\n\nsecond"


def test_whitespace_only_section_is_kept() -> None:
    assembly = PromptAssembly(
        sections=[AssembledSection(name="a", text="a"), AssembledSection(name="b", text=" ")]
    )

    assert render_prompt(assembly) == "a\n\n "


def test_render_error_names_a_context() -> None:
    assembly = PromptAssembly(contexts=[AssembledContext(name="sandbox", text="{{mode}}")])

    with pytest.raises(PromptError, match="in context 'sandbox'"):
        render_context_sections(assembly)


def test_context_sections_are_interpolated_and_empty_ones_dropped() -> None:
    assembly = PromptAssembly(
        contexts=[
            AssembledContext(name="empty", text=""),
            AssembledContext(name="mode", text="mode {{mode}}"),
        ],
        variables={"mode": "plan"},
    )

    assert render_context_sections(assembly) == [AssembledContext(name="mode", text="mode plan")]


def test_join_context_sections_prefixes_the_preamble() -> None:
    sections = [AssembledContext(name="a", text="A"), AssembledContext(name="b", text="B")]

    assert RUNTIME_CONTEXT_PREAMBLE == PREAMBLE
    assert join_context_sections(sections) == PREAMBLE + "A\n\nB"


def test_join_context_sections_is_empty_when_nothing_is_left() -> None:
    assert join_context_sections([AssembledContext(name="a", text="")]) == ""


def test_render_context_snapshot_returns_text_and_sections() -> None:
    assembly = PromptAssembly(contexts=[AssembledContext(name="a", text="A")])

    assert render_context_snapshot(assembly) == (
        PREAMBLE + "A",
        [AssembledContext(name="a", text="A")],
    )


def test_render_context_snapshot_of_no_contexts_is_empty() -> None:
    assert render_context_snapshot(PromptAssembly()) == ("", [])


@given(text=st.text(min_size=1).filter(lambda text: "{{" not in text))
def test_text_without_open_braces_renders_unchanged(text: str) -> None:
    assert render_one(text) == text


@given(
    parts=st.lists(st.tuples(literals, names, st.text()), min_size=1, max_size=5),
    tail=literals,
)
def test_rendering_concatenates_literals_and_values(
    parts: list[tuple[str, str, str]], tail: str
) -> None:
    variables: dict[str, str | None] = {}
    for _, name, value in parts:
        variables.setdefault(name, value)
    template = "".join(f"{literal}{{{{{name}}}}}" for literal, name, _ in parts) + tail
    expected = "".join(f"{literal}{variables[name]}" for literal, name, _ in parts) + tail

    assert render_one(template, variables) == expected


@given(name=names, value=st.text(), tail=literals)
def test_values_are_never_rescanned(name: str, value: str, tail: str) -> None:
    assert render_one("{{" + name + "}}" + tail, {name: value}) == value + tail


@given(content=st.text(max_size=10).filter(lambda content: "}" not in content))
def test_group_that_is_not_a_name_raises_even_if_registered(content: str) -> None:
    assume(NAME.fullmatch(content) is None)

    with pytest.raises(PromptError, match="malformed"):
        render_one("{{" + content + "}}", {content: "v"})


@given(prefix=literals, suffix=st.text().filter(lambda text: "}}" not in text))
def test_open_braces_without_a_later_close_are_literal(prefix: str, suffix: str) -> None:
    text = prefix + "{{" + suffix

    assert render_one(text) == text


def test_equal_assemblies_render_to_one_shared_string() -> None:
    first = render_prompt(one_section("model: {{model}}.", {"model": "m1"}))
    again = render_prompt(one_section("model: " + "{{model}}.", {"model": "m1"}))
    assert first == "model: m1." and again is first
    assert render_prompt(one_section("model: {{model}}.", {"model": "m2"})) == "model: m2."


def test_a_failed_render_is_not_remembered() -> None:
    with pytest.raises(PromptError, match="has no value"):
        render_one("in {{cwd}}", {"cwd": None})
    assert render_one("in {{cwd}}", {"cwd": "/w"}) == "in /w"
    with pytest.raises(PromptError, match="has no value"):
        render_one("in {{cwd}}", {"cwd": None})


def test_a_variable_that_is_not_a_string_is_refused_by_name() -> None:
    assembly = one_section("in {{cwd}}")
    assembly.variables = {"cwd": ["/w"]}  # type: ignore[dict-item]
    with pytest.raises(PromptError, match=r"\{\{cwd\}\} in section 'persona' is list, not str"):
        render_prompt(assembly)
