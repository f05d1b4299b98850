"""What the simulator answers a validated chat with, and the usage it reports.

`compose_answer` takes the next scripted reply or the deterministic model's,
gives its tool calls ids, cuts its text to `max_tokens`, settles the finish
reason, and counts usage: prompt and completion tokens, and the prompt
tokens the prefix cache already held (then caches the prompt followed by
the reply as the client will send it back).
"""

from __future__ import annotations

import hashlib
from typing import Any

import attrs

from actors.providers.simulator.cache import PrefixCache
from actors.providers.simulator.config import Profile
from actors.providers.simulator.faults import Fault, SimFinishReason
from actors.providers.simulator.model import (
    ReplyScript,
    SimReply,
    call_id,
    deterministic_reply,
    tool_call_json,
)
from actors.providers.simulator.tokens import render_message, render_prompt, tokenize
from actors.providers.simulator.validation import Chat


@attrs.frozen(kw_only=True)
class Answer:
    """The reply to one chat request, ready to stream.

    Attributes:
        reply: The reply, its text cut to `max_tokens` and every tool call
            with an id.
        reasoning_tokens: The reply's reasoning, tokenized.
        text_tokens: The reply's text, tokenized.
        finish: The finish reason.
        usage: The usage to report.
    """

    reply: SimReply
    reasoning_tokens: list[str]
    text_tokens: list[str]
    finish: SimFinishReason
    usage: dict[str, Any]


def compose_answer(
    chat: Chat, fault: Fault, *, replies: ReplyScript, cache: PrefixCache, reply_tokens: int
) -> Answer:
    """Answer `chat`, accounting its prompt and reply in `cache`.

    Args:
        chat: The validated request.
        fault: The request's fault (it may force the finish reason).
        replies: Scripted replies; the next one, if any, is consumed.
        cache: The prefix cache, looked up for the prompt and then given the
            prompt followed by the reply.
        reply_tokens: The length of a deterministic filler reply, in tokens.
    """
    prompt = render_prompt(chat.tools, chat.messages)
    seed = hashlib.sha256("".join(prompt).encode()).digest()
    reply = replies.take() or deterministic_reply(
        chat.messages,
        thinking=chat.thinking,
        reply_tokens=reply_tokens,
        seed=seed,
    )
    calls = tuple(
        call if call.id is not None else attrs.evolve(call, id=call_id(seed, n))
        for n, call in enumerate(reply.tool_calls)
    )
    text_tokens = tokenize(reply.text)
    truncated = chat.max_tokens is not None and len(text_tokens) > chat.max_tokens
    if chat.max_tokens is not None:
        text_tokens = text_tokens[: chat.max_tokens]
    reply = attrs.evolve(reply, text="".join(text_tokens), tool_calls=calls)
    finish = fault.finish_reason or reply.finish_reason
    if finish is None:
        finish = "tool_calls" if calls else "length" if truncated else "stop"
    reasoning_tokens = tokenize(reply.reasoning)
    completion = render_message(_echo(reply, chat.profile))
    hit = cache.lookup(chat.cache_key, prompt)
    cache.insert(chat.cache_key, prompt + completion)
    completion_count = (
        len(reasoning_tokens)
        + len(text_tokens)
        + sum(len(tokenize(call.name + call.arguments)) for call in calls)
    )
    usage: dict[str, Any] = {
        "prompt_tokens": len(prompt),
        "completion_tokens": completion_count,
        "total_tokens": len(prompt) + completion_count,
        "prompt_tokens_details": {"cached_tokens": hit},
        "prompt_cache_hit_tokens": hit,
        "prompt_cache_miss_tokens": len(prompt) - hit,
    }
    if reasoning_tokens:
        usage["completion_tokens_details"] = {"reasoning_tokens": len(reasoning_tokens)}
    return Answer(
        reply=reply,
        reasoning_tokens=reasoning_tokens,
        text_tokens=text_tokens,
        finish=finish,
        usage=usage,
    )


def _echo(reply: SimReply, profile: Profile) -> dict[str, Any]:
    """The assistant message a client following `profile` sends back for `reply`."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.tool_calls and profile == "v4":
        message["reasoning_content"] = reply.reasoning
    if reply.tool_calls:
        message["tool_calls"] = [tool_call_json(call) for call in reply.tool_calls]
    return message
