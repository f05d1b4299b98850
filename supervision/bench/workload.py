"""The parallel-session workload, as plain data every framework can run.

One turn of two steps per session: the user message asks for a tool call
to `echo` (the simulator's `call NAME {json}` line), the tool result goes
back, and the model answers with text. Every request carries a
12-paragraph system prompt, 40 tools of two parameters each (`echo` among
them) and the current time as a dynamic fact, placed wherever each
framework puts dynamic instructions (harness: the `time` context plugin,
a user-role snapshot after the stable prefix).

`workload_json()` is what the peer scripts read, so every framework gets
byte-identical prompt text, tool schemas and user messages.
"""

from __future__ import annotations

import json
from typing import Any

PARAGRAPH = (
    "Work carefully and verify every change you make. Prefer small, reviewable edits; "
    "explain what you changed and why. When a command fails, read its output before retrying. "
)
SYSTEM_PARAGRAPHS = 12
TOOL_COUNT = 40
ECHO_TOOL = "echo"
MODEL = "deepseek-chat"
API_KEY = "sk-simulator"
SESSION_MARK = "<N>"
"""Where a peer puts the session number in `user_message_template`."""


def system_prompt_text() -> str:
    """The 12-paragraph system prompt, paragraphs separated by blank lines."""
    return "\n\n".join(
        f"Guideline {index + 1}. {PARAGRAPH * 3}".strip() for index in range(SYSTEM_PARAGRAPHS)
    )


def system_paragraphs() -> list[str]:
    """The system prompt's paragraphs, in order (harness registers one section each)."""
    return system_prompt_text().split("\n\n")


def tool_definitions() -> list[dict[str, Any]]:
    """The 40 tools as `{"name", "description", "parameters"}`; the first is `echo`.

    Every tool takes two parameters: a required string `text` and an
    optional integer `repeat`.
    """
    tools = []
    for index in range(TOOL_COUNT):
        name = ECHO_TOOL if index == 0 else f"tool_{index:02d}"
        tools.append(
            {
                "name": name,
                "description": (
                    "Echo the given text back."
                    if index == 0
                    else f"Tool number {index}: does one small thing well."
                ),
                "parameters": {
                    "type": "object",
                    "properties": {
                        "text": {"type": "string", "description": "The text to work on."},
                        "repeat": {"type": "integer", "description": "How many times."},
                    },
                    "required": ["text"],
                },
            }
        )
    return tools


def user_message(session: int) -> str:
    """The user message of session `session`: it makes the model call `echo` once."""
    arguments = json.dumps({"text": f"session {session}"}, separators=(",", ":"))
    return f"Please echo my session number.\ncall {ECHO_TOOL} {arguments}"


def echo(text: str) -> str:
    """What the `echo` tool returns for `text` (every framework returns the same)."""
    return text


def workload_json() -> dict[str, Any]:
    """Everything a peer script needs, as JSON-ready data."""
    return {
        "model": MODEL,
        "api_key": API_KEY,
        "system": system_prompt_text(),
        "tools": tool_definitions(),
        "echo_tool": ECHO_TOOL,
        "user_message_template": user_message(0).replace("session 0", f"session {SESSION_MARK}"),
    }
