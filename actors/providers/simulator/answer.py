"""What the simulator answers a validated chat with, and the usage it reports.

`compose_answer` takes the next queued reply, else the first matching rule
of the model script, else the deterministic model's reply (shaped by
`tool_choice` and `response_format`); gives its tool calls ids, ends its
text before the first stop sequence and cuts it to `max_tokens`, settles
the finish reason, and counts usage: prompt and completion tokens, and the
prompt tokens the prefix cache already held (then caches the prompt
followed by the reply as the client will send it back).

The prompt is counted as the model sees it: `reasoning_content` takes part
only where DeepSeek keeps it (in thinking mode, on assistant messages with
tool calls); elsewhere it is ignored, so clients that send it and clients
that drop it hit the cache alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from actors.providers.simulator.cache import PrefixCache
from actors.providers.simulator.faults import Fault, SimFinishReason
from actors.providers.simulator.model import (
    ReplyScript,
    SimReply,
    call_id,
    default_reasoning,
    deterministic_reply,
    tool_call_json,
)
from actors.providers.simulator.prompt_chain import PromptChains
from actors.providers.simulator.script import ModelScript
from actors.providers.simulator.tokens import message_text, tokenize
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
    chat: Chat,
    fault: Fault,
    *,
    replies: ReplyScript,
    script: ModelScript | None,
    cache: PrefixCache,
    chains: PromptChains,
    reply_tokens: int,
) -> Answer:
    """Answer `chat`, accounting its prompt and reply in `cache`.

    Args:
        chat: The validated request.
        fault: The request's fault (it may force the finish reason).
        replies: Queued replies; the next one, if any, is consumed.
        script: Reply rules tried when no reply is queued.
        cache: The prefix cache, looked up for the prompt and then given the
            prompt followed by the reply.
        chains: The memo of the prompt's tokens and block digests, per
            segment (the same figures as rendering the whole prompt).
        reply_tokens: The length of a deterministic filler reply, in tokens.
    """
    texts = [chat.tools_header] if chat.tools_header else []
    texts += [message_text(message) for message in _as_seen(chat.messages, chat.thinking)]
    prompt, prompt_digests = chains.walk(chat.cache_key, texts)
    seed = prompt.seed
    ruled = script.reply_for(chat.messages) if script is not None else None
    if ruled is not None:
        ruled = attrs.evolve(ruled, reasoning=_reasoning_in_mode(ruled, chat))
    reply = (
        replies.take()
        or ruled
        or deterministic_reply(
            chat.messages,
            thinking=chat.thinking,
            reply_tokens=reply_tokens,
            seed=seed,
            tools=chat.tools or (),
            choice=chat.tool_choice,
            json_mode=chat.json_mode,
        )
    )
    calls = tuple(
        call if call.id is not None else attrs.evolve(call, id=call_id(seed, n))
        for n, call in enumerate(reply.tool_calls)
    )
    text_tokens = tokenize(_until_stop(reply.text, chat.stop))
    truncated = chat.max_tokens is not None and len(text_tokens) > chat.max_tokens
    if chat.max_tokens is not None:
        text_tokens = text_tokens[: chat.max_tokens]
    reply = attrs.evolve(reply, text="".join(text_tokens), tool_calls=calls)
    finish = fault.finish_reason or reply.finish_reason
    if finish is None:
        finish = "tool_calls" if calls else "length" if truncated else "stop"
    reasoning_tokens = tokenize(reply.reasoning)
    completion = chains.extend(
        prompt, message_text(_echo(reply, chat.thinking and chat.profile != "r1"))
    )
    hit = cache.lookup_and_insert_digests(
        [*prompt_digests, *completion.blocks], len(prompt_digests)
    )
    completion_count = (
        len(reasoning_tokens)
        + len(text_tokens)
        + sum(len(tokenize(call.name + call.arguments)) for call in calls)
    )
    usage: dict[str, Any] = {
        "prompt_tokens": prompt.tokens,
        "completion_tokens": completion_count,
        "total_tokens": prompt.tokens + completion_count,
        "prompt_tokens_details": {"cached_tokens": hit},
        "prompt_cache_hit_tokens": hit,
        "prompt_cache_miss_tokens": prompt.tokens - hit,
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


def _reasoning_in_mode(reply: SimReply, chat: Chat) -> str:
    """A scripted rule's reasoning as the mode allows: none without thinking, some with it."""
    if not chat.thinking:
        return ""
    return reply.reasoning or default_reasoning(chat.messages)


def _until_stop(text: str, stop: tuple[str, ...]) -> str:
    """`text` up to the first stop sequence in it (all of it when there is none)."""
    found = [index for index in (text.find(s) for s in stop if s) if index >= 0]
    return text[: min(found)] if found else text


def _as_seen(messages: Sequence[Mapping[str, Any]], thinking: bool) -> list[Mapping[str, Any]]:
    """The messages as the model reads them: `reasoning_content` only where it takes part."""
    seen: list[Mapping[str, Any]] = []
    for message in messages:
        keep = thinking and bool(message.get("tool_calls"))
        if "reasoning_content" in message and not keep:
            message = {key: value for key, value in message.items() if key != "reasoning_content"}
        seen.append(message)
    return seen


def _echo(reply: SimReply, with_reasoning: bool) -> dict[str, Any]:
    """The assistant message a client following DeepSeek's rule sends back for `reply`."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.tool_calls and with_reasoning:
        message["reasoning_content"] = reply.reasoning
    if reply.tool_calls:
        message["tool_calls"] = [tool_call_json(call) for call in reply.tool_calls]
    return message
