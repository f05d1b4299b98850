"""The examples of docs/simulator.md do what the page says."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from actors.providers.simulator import ModelScript, SimulatorConfig, SimulatorEngine
from tests.providers.simulator_helpers import post

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "simulator.md").read_text()
ECHO = {"type": "function", "function": {"name": "echo", "parameters": {"type": "object"}}}


def _block(language: str) -> str:
    match = re.search(rf"```{language}\n(.*?)```", PAGE, re.S)
    assert match, language
    return re.sub(r"^  ", "", match.group(1), flags=re.M)


async def _message(engine: SimulatorEngine, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": "deepseek-chat", "messages": messages, "tools": [ECHO]}
    response = await post(engine, body)
    assert response.status == 200, response.body
    message = json.loads(response.body)["choices"][0]["message"]
    assert isinstance(message, dict)
    return message


async def test_the_call_line_example_makes_one_call() -> None:
    message = await _message(SimulatorEngine(), [{"role": "user", "content": _block("text")}])
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "read_file"
    assert json.loads(call["function"]["arguments"]) == {"path": "notes.txt"}


async def test_the_script_example_runs_the_two_step_turn() -> None:
    script = ModelScript.from_json(json.loads(_block("json")))
    engine = SimulatorEngine(SimulatorConfig(script=script))
    user = {"role": "user", "content": "please echo hello"}
    (call,) = (await _message(engine, [user]))["tool_calls"]
    assert call["function"]["name"] == "echo"
    history = [
        user,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "hello"},
    ]
    assert (await _message(engine, history))["content"] == "Done: the tool answered."
