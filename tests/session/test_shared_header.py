"""Shared request headers: every agent building an equal header holds the same object."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Mapping
from typing import Any

import trio

from actors.agent import AgentOptions
from actors.jsonvalue import freeze_object
from actors.prompt import SystemPrompt
from actors.prompt.types import ToolSchema
from actors.providers import Reply, ScriptedProvider
from actors.session.header import RequestHeader, shared_header
from supervision import open_runtime


def _frozen(config: dict[str, str]) -> Mapping[str, Any]:
    return freeze_object(config, where="config")


TOOLS = tuple(ToolSchema(name=f"t{n}", description="d", parameters={}) for n in range(3))


def test_the_same_config_system_and_schemas_give_one_canonical_header() -> None:
    config = _frozen({"model": "m"})
    header = shared_header(config, "system text", TOOLS)
    assert header == RequestHeader(config={"model": "m"}, system="system text", tools=TOOLS)
    assert shared_header(config, "system " + "text", TOOLS) is header
    assert shared_header(config, "other text", TOOLS) is not header
    assert shared_header(_frozen({"model": "n"}), "system text", TOOLS) is not header
    copies = tuple(ToolSchema(name=t.name, description="d", parameters={}) for t in TOOLS)
    assert shared_header(config, "system text", copies) == header  # equal, not shared


def test_a_shared_header_is_canonical() -> None:
    header = shared_header(_frozen({"model": "m"}), "", ())
    assert header.system is None
    assert header.tools == ()


def test_a_header_nobody_holds_is_freed() -> None:
    header = shared_header(_frozen({"model": "gone"}), "held once", TOOLS)
    held = weakref.ref(header)
    del header
    gc.collect()
    assert held() is None


async def test_agents_with_the_same_prompt_and_options_send_one_header_object() -> None:
    provider = ScriptedProvider([Reply.text("a"), Reply.text("b")])
    options = AgentOptions(model="m", hibernate=True)
    async with open_runtime(system_prompt=SystemPrompt(), providers={"default": provider}) as rt:
        agents = [(await rt.start_agent(options=options)).value for _ in range(2)]
        async with trio.open_nursery() as nursery:
            for agent in agents:
                nursery.start_soon(agent.run, "hello")
    first, second = provider.requests
    assert first.system is second.system
    assert first.tools is second.tools
    assert first.config is second.config
