"""The names and signatures DESIGN §8 promises to programs outside the project."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest

import actors.agent
import actors.providers
import actors.session
from actors.agent import AgentOptions, RetryPolicy, Tool, open_agent
from actors.providers import Reply, ScriptedProvider, ToolCall


@pytest.mark.parametrize(
    ("module", "name"),
    [
        *[
            (actors.agent, n)
            for n in ("open_agent", "Agent", "AgentOptions", "RetryPolicy", "Tool")
        ],
        *[(actors.agent, n) for n in ("Enter", "Reject", "Retry")],
        *[(actors.session, n) for n in ("MemoryStore", "SQLiteStore", "rebuild_request")],
        *[(actors.providers, n) for n in ("ScriptedProvider", "Reply", "ToolCall")],
    ],
)
def test_section_8_name_is_exported(module: object, name: str) -> None:
    assert hasattr(module, name)


def test_open_agent_takes_the_documented_keyword_arguments() -> None:
    parameters = inspect.signature(open_agent).parameters
    documented = ["system_prompt", "provider", "options", "store", "session_id", "tools", "scope"]
    assert all(parameters[name].kind is inspect.Parameter.KEYWORD_ONLY for name in documented)
    assert [parameters[n].default for n in documented[2:]] == [None, None, None, (), None]


def test_agent_options_defaults() -> None:
    options = AgentOptions(model="m")
    assert (options.provider_name, options.max_tokens, options.temperature) == (
        "default",
        None,
        None,
    )
    assert options.retry == RetryPolicy(max_retries=2)


def test_reply_constructors_take_the_documented_positional_arguments() -> None:
    assert Reply.text("t").body == "t"
    assert Reply.tool_calls([ToolCall(id="1", name="n", arguments="{}")], "x").body == "x"
    assert Reply.max_tokens("cut").kind == "max-tokens"
    failure = Reply.failure("code", "message", True).problem
    assert failure is not None
    assert (failure.code, failure.message, failure.retryable) == ("code", "message", True)
    assert Reply.hang("partial").body == "partial"
    assert ScriptedProvider([Reply.text("t")]).remaining == 1


async def _execute(arguments: dict[str, object] | str, call: object) -> str:
    return ""


@pytest.mark.parametrize(
    "construct",
    [
        lambda: AgentOptions("m"),
        lambda: Tool("t", "d", {}, _execute),
        lambda: ToolCall("c1", "t", "{}"),
    ],
    ids=["AgentOptions", "Tool", "ToolCall"],
)
def test_section_8_constructors_accept_positional_arguments(
    construct: Callable[[], object],
) -> None:
    construct()


@pytest.mark.parametrize(
    "name", ["function_tool", "TurnResult", "TurnFailedError", "AgentClosedError"]
)
def test_section_10_name_is_exported(name: str) -> None:
    assert hasattr(actors.agent, name)


def test_function_tool_takes_the_documented_arguments() -> None:
    parameters = inspect.signature(actors.agent.function_tool).parameters
    assert list(parameters) == ["fn", "name", "description"]
    assert parameters["fn"].default is None
    assert all(
        parameters[n].kind is inspect.Parameter.KEYWORD_ONLY for n in ("name", "description")
    )


def test_turn_result_fields_and_error_classes() -> None:
    fields = [f.name for f in actors.agent.TurnResult.__attrs_attrs__]
    assert fields == ["turn", "reason", "text", "messages", "usage"]
    assert issubclass(actors.agent.TurnFailedError, RuntimeError)
    assert AgentOptions(model="m").max_steps == 50
