"""Scripting the simulator's model per benchmark or test: reply rules, loadable from JSON.

A `ModelScript` is an ordered list of rules. For each chat request the
first rule whose condition matches the *new input* (the messages after the
last assistant message) gives the reply; when none matches, the built-in
deterministic model answers. The JSON form, e.g. for `harness simulator
--script FILE`:

    {"rules": [
      {"when": {"input": "tool"}, "reply": {"text": "Done."}},
      {"when": {"input": "user", "contains": "weather"},
       "reply": {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}}
    ]}

`when.input` is `"user"` (new input without tool results), `"tool"` (it
holds tool results) or `"any"` (the default); `when.contains` is a
substring the new input's text must hold. `reply` takes `text`,
`reasoning`, `tool_calls` (each `name`, `arguments` as an object or a
string sent verbatim, optional `id`) and `finish_reason`. A rule's
reasoning is sent only in thinking mode, where a rule without one gets the
built-in model's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeAlias

import attrs

from actors.providers.simulator.faults import SimFinishReason
from actors.providers.simulator.model import SimReply, SimToolCall, since_last_assistant
from actors.providers.simulator.tokens import content_text

InputKind: TypeAlias = Literal["user", "tool", "any"]
"""What a rule's new input must be: user text only, tool results, or anything."""

_INPUT_KINDS = ("user", "tool", "any")
_FINISH_REASONS = ("stop", "length", "tool_calls", "insufficient_system_resource", "content_filter")
_REPLY_FIELDS = ("text", "reasoning", "tool_calls", "finish_reason")
_CALL_FIELDS = ("name", "arguments", "id")


class ScriptError(ValueError):
    """A model script is invalid; the message names the offending rule and field."""


@attrs.frozen(kw_only=True)
class ScriptRule:
    """One rule: a condition on the new input and the reply it gives.

    Attributes:
        input: The kind of new input the rule matches.
        contains: A substring the new input's text must contain; None matches any.
        reply: The reply given when the rule matches.
    """

    input: InputKind = "any"
    contains: str | None = None
    reply: SimReply

    def matches(self, messages: Sequence[Mapping[str, Any]]) -> bool:
        """Whether the rule applies to validated `messages`."""
        tail = since_last_assistant(messages)
        has_results = any(message["role"] == "tool" for message in tail)
        if (self.input == "user" and has_results) or (self.input == "tool" and not has_results):
            return False
        if self.contains is None:
            return True
        text = "\n".join(
            content_text(message.get("content"))
            for message in tail
            if message["role"] in ("user", "tool")
        )
        return self.contains in text


@attrs.frozen(kw_only=True)
class ModelScript:
    """Ordered reply rules; the first match answers.

    Attributes:
        rules: The rules, tried in order.
    """

    rules: tuple[ScriptRule, ...]

    def reply_for(self, messages: Sequence[Mapping[str, Any]]) -> SimReply | None:
        """The reply of the first rule matching `messages`, or None when none does."""
        for rule in self.rules:
            if rule.matches(messages):
                return rule.reply
        return None

    @classmethod
    def from_json(cls, value: object) -> ModelScript:
        """A script from its JSON form (see the module docstring).

        Raises:
            ScriptError: the value is not a valid script; the message names
                the rule and the field.
        """
        if not isinstance(value, Mapping) or set(value) != {"rules"}:
            raise ScriptError('a model script must be a JSON object {"rules": [...]}')
        rules = value["rules"]
        if not isinstance(rules, list):
            raise ScriptError("script field rules must be a list")
        return cls(rules=tuple(_rule(index, rule) for index, rule in enumerate(rules)))

    @classmethod
    def load(cls, path: Path) -> ModelScript:
        """Read a script from a JSON file.

        Raises:
            ScriptError: the file is unreadable, not JSON, or not a valid script.
        """
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ScriptError(f"cannot read model script {path}: {exc}") from exc
        try:
            return cls.from_json(value)
        except ScriptError as exc:
            raise ScriptError(f"{path}: {exc}") from exc


def _rule(index: int, value: object) -> ScriptRule:
    where = f"rules[{index}]"
    if not (isinstance(value, Mapping) and "reply" in value and set(value) <= {"when", "reply"}):
        raise ScriptError(f'{where} must be an object {{"when": {{...}}, "reply": {{...}}}}')
    when = value.get("when", {})
    if not isinstance(when, Mapping) or not set(when) <= {"input", "contains"}:
        raise ScriptError(f"{where}.when may hold only input and contains")
    kind = when.get("input", "any")
    if kind not in _INPUT_KINDS:
        raise ScriptError(f"{where}.when.input must be one of {', '.join(_INPUT_KINDS)}")
    contains = when.get("contains")
    if contains is not None and not isinstance(contains, str):
        raise ScriptError(f"{where}.when.contains must be a string")
    return ScriptRule(input=kind, contains=contains, reply=_reply(where, value["reply"]))


def _reply(where: str, value: object) -> SimReply:
    if not isinstance(value, Mapping) or not set(value) <= set(_REPLY_FIELDS):
        raise ScriptError(f"{where}.reply must be an object of {', '.join(_REPLY_FIELDS)}")
    for field in ("text", "reasoning"):
        if not isinstance(value.get(field, ""), str):
            raise ScriptError(f"{where}.reply.{field} must be a string")
    finish: SimFinishReason | None = value.get("finish_reason")
    if finish is not None and finish not in _FINISH_REASONS:
        choices = ", ".join(_FINISH_REASONS)
        raise ScriptError(f"{where}.reply.finish_reason must be one of {choices}")
    calls = value.get("tool_calls", [])
    if not isinstance(calls, list):
        raise ScriptError(f"{where}.reply.tool_calls must be a list")
    return SimReply(
        text=value.get("text", ""),
        reasoning=value.get("reasoning", ""),
        tool_calls=tuple(
            _call(f"{where}.reply.tool_calls[{number}]", call) for number, call in enumerate(calls)
        ),
        finish_reason=finish,
    )


def _call(where: str, value: object) -> SimToolCall:
    if not isinstance(value, Mapping) or not set(value) <= set(_CALL_FIELDS) or "name" not in value:
        raise ScriptError(f"{where} must be an object with name, arguments and optional id")
    name, arguments, call_id = value["name"], value.get("arguments", {}), value.get("id")
    if not isinstance(name, str) or not name:
        raise ScriptError(f"{where}.name must be a non-empty string")
    if isinstance(arguments, Mapping):
        arguments = json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)
    if not isinstance(arguments, str):
        raise ScriptError(f"{where}.arguments must be an object or a string")
    if call_id is not None and not isinstance(call_id, str):
        raise ScriptError(f"{where}.id must be a string")
    return SimToolCall(name=name, arguments=arguments, id=call_id)
