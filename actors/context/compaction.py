"""Compaction that keeps caches warm: old turns become one summary, once, not every step.

A pre-step plugin. When the next request's estimated prompt tokens exceed
the agent's threshold, it asks the agent's own model for a summary of the
oldest completed turns in a separate request, then logs one replacement
`user/message` that stands in for those turns' surface events; the newest
`keep_turns` completed turns (and the live turn) stay verbatim.

Cache behaviour: the summary request is the header in effect plus a
*prefix* of the conversation the provider has already cached, plus one
instruction, so it is mostly a cache hit. After the replacement the prompt
prefix differs from the previous requests once (system and tools still
hit); every later step appends to the new prefix again, so caches stay warm
until the next compaction.

Log and replay: `compaction/request` (the cited seqs and the instruction,
made durable before the request is sent), the replacement `user/message`
(source plugin "compaction", form "summary"), then `compaction/end` (the
summary request's usage, or its failure). `rebuild_compaction_request`
rebuilds the summary request byte for byte from the log.

The runtime-context snapshot the replacement removed is re-asserted in the
same step (the projection only notices a replacement on its next step), so
the model never runs a step without its current runtime context.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import aclosing
from typing import Any

import attrs

from actors.agent import Agent, Enter, StepProposal
from actors.agent.decisions import FailTurn, PreStepNext, StepDecision
from actors.agent.projection import is_runtime_context, snapshot_message
from actors.agent.stream import StreamAccumulator
from actors.context.errors import ContextPluginError
from actors.messages import Message, PluginSource, ReasoningBlock, TextBlock, ToolCallBlock
from actors.prompt import render_context_snapshot
from actors.providers.chunks import Failure
from actors.providers.request import GenerateRequest
from actors.scope import Registration
from actors.session import Session
from actors.session.codec import event_from_json, unstructure_tools
from actors.session.errors import SessionError
from actors.session.events import (
    CompactionEnded,
    CompactionRequested,
    Event,
    RequestHeaderLogged,
    TurnStart,
    UserMessage,
)
from actors.session.header import RequestHeader
from actors.session.reducers import fold_request_header, message_of

COMPACTION_PLUGIN = "compaction"
"""The `plugin` name on summary messages and on the summary request's instruction."""
SUMMARY_FORM = "summary"
"""The `form` of the replacement message holding a summary."""
INSTRUCTION_FORM = "instruction"
"""The `form` of the instruction that ends a summary request."""
COMPACTION_FAILED = "compaction_failed"
"""The turn-error code when the summary request produced no summary."""

CHARS_PER_TOKEN = 4
"""The estimate's exchange rate: prompt characters per token (English text and JSON)."""
CONTEXT_WINDOWS: Mapping[str, int] = {
    "deepseek-chat": 131_072,
    "deepseek-reasoner": 131_072,
    "deepseek-v4-flash": 1_048_576,
    "deepseek-v4-pro": 1_048_576,
}
"""Context windows (tokens) of the models whose window is known."""
WINDOW_SHARE = 0.75
"""The default threshold: this share of the model's context window."""
MIN_REPLACED_SHARE = 0.25
"""A compaction must replace at least this share of the threshold (in estimated tokens):
when the kept turns alone keep the prompt near the threshold, compacting on every step
would change the prompt prefix every step, so it waits until enough old turns piled up."""

DEFAULT_INSTRUCTION = (
    "Summarise the conversation above for your own later use: the user's goals and "
    "preferences, decisions made, facts and tool results still needed, files and names "
    "mentioned, and anything left to do. Be complete but concise. Reply with the summary "
    "only, as plain text; do not call any tool."
)
SUMMARY_PREFIX = (
    "Summary of the earlier conversation (compacted; the newest turns follow verbatim):\n\n"
)


def default_threshold(model: str) -> int | None:
    """The default threshold for `model`: a share of its context window, None when unknown."""
    window = CONTEXT_WINDOWS.get(model)
    return None if window is None else int(window * WINDOW_SHARE)


def message_chars(message: Message) -> int:
    """The characters of a message that reach the prompt (text, reasoning, tool calls)."""
    total = 0
    for block in message.content:
        if isinstance(block, TextBlock | ReasoningBlock):
            total += len(block.text)
        elif isinstance(block, ToolCallBlock):
            total += len(block.name) + len(block.arguments)
    return total


def header_chars(header: RequestHeader) -> int:
    """The characters a header puts in every prompt (system text and tool schemas)."""
    tools = json.dumps(unstructure_tools(header.tools or ()), ensure_ascii=False)
    return len(header.system or "") + (len(tools) if header.tools else 0)


def _check_positive(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ContextPluginError(
            f"compaction: {attribute.name} must be a positive int, got {value!r}"
        )


def _check_keep(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ContextPluginError(f"compaction: keep_turns must be an int >= 0, got {value!r}")


@attrs.frozen(kw_only=True)
class Compaction:
    """Replaces the oldest completed turns with one summary when the prompt grows too big.

    The prompt size is estimated as `CHARS_PER_TOKEN` characters per token
    over the system text, tool schemas and surface messages, followed
    incrementally (O(new events) per step). A compaction happens only when
    the turns it would replace hold at least `MIN_REPLACED_SHARE` of the
    threshold, so the prompt prefix changes at most once per that much new
    conversation, never on every step.

    Attributes:
        threshold_tokens: compact when the next request's estimated prompt
            exceeds this many tokens; None takes `WINDOW_SHARE` of the
            model's context window when `CONTEXT_WINDOWS` knows the model,
            and otherwise never compacts.
        keep_turns: the newest completed turns kept verbatim (the live turn
            is always kept).
        instruction: the user message that ends the summary request.

    Raises:
        ContextPluginError: a non-positive threshold or a negative keep_turns.
    """

    threshold_tokens: int | None = attrs.field(default=None, validator=_check_positive)
    keep_turns: int = attrs.field(default=2, validator=_check_keep)
    instruction: str = DEFAULT_INSTRUCTION

    def threshold_for(self, model: str) -> int | None:
        """The threshold in force for an agent on `model` (None: compaction is off)."""
        return (
            self.threshold_tokens
            if self.threshold_tokens is not None
            else (default_threshold(model))
        )

    def install(self, agent: Agent) -> Registration:
        """Compact `agent`'s session before any step whose prompt would exceed the threshold.

        The check runs before the inner pre-step listeners, so every
        listener sees the compacted surface. A summary request that fails
        (or answers with a tool call or no text) is logged in
        `compaction/end` and fails the turn with code "compaction_failed"
        (the claimed input goes back to the inbox); the request-error
        policy is not applied to it. Disposing the returned registration
        removes the listener.
        """
        state = _CompactionState(
            config=self,
            agent=agent,
            threshold=self.threshold_for(agent.options.model),
        )
        return agent.on_pre_step(state.pre_step)


@attrs.define(eq=False)
class PromptSize:
    """Follows a session's prompt size as characters: header plus surface messages.

    `catch_up(session)` reads only the events appended since its last call;
    the surface is recounted only after a replacement.
    """

    header: RequestHeader | None = None
    turn_starts: list[int] = attrs.field(factory=list)
    compactions: int = 0
    _header_chars: int = 0
    _surface_chars: int = 0
    _seen: int = 0

    @property
    def chars(self) -> int:
        """Characters of the header in effect plus every message on the surface."""
        return self._header_chars + self._surface_chars

    def catch_up(self, session: Session) -> None:
        """Observe the events appended to `session` since the last call."""
        events = session.events_since(self._seen)
        self._seen += len(events)
        recount = False
        for event in events:
            data = event.data
            if isinstance(data, RequestHeaderLogged):
                self.header = data.header
                self._header_chars = header_chars(data.header)
            elif isinstance(data, TurnStart):
                self.turn_starts.append(event.seq)
            elif isinstance(data, CompactionRequested):
                self.compactions += 1
            if event.surface_op == "replace":
                recount = True
            elif event.is_surface:
                self._surface_chars += message_chars(message_of(event))
        if recount:
            self._surface_chars = sum(message_chars(m) for m in session.derive_messages())


@attrs.define(eq=False)
class _CompactionState:
    """One installation: the prompt-size tracker and the compaction itself."""

    config: Compaction
    agent: Agent
    threshold: int | None
    size: PromptSize = attrs.field(factory=PromptSize)

    async def pre_step(self, proposal: StepProposal, next: PreStepNext) -> StepDecision:
        offered = [*proposal.messages, *([proposal.context] if proposal.context else [])]
        if self.threshold is None or (proposal.step == 0 and not offered):
            return await next()
        session = self.agent.session
        self.size.catch_up(session)
        estimate = (self.size.chars + sum(message_chars(m) for m in offered)) // CHARS_PER_TOKEN
        compacted = False
        if estimate > self.threshold:
            compacted = await self._compact(proposal, self.threshold)
        decision = await next()
        if compacted and isinstance(decision, Enter):
            return self._reassert_context(proposal, decision)
        return decision

    def _replaceable(self, session: Session, threshold: int) -> list[Event]:
        """The surface events before the newest `keep_turns` completed turns and the live one.

        Empty when they hold (leaving earlier summaries aside) less than
        `MIN_REPLACED_SHARE` of the threshold.
        """
        kept = self.config.keep_turns + 1  # the live turn is the last turn/start
        if len(self.size.turn_starts) <= kept:
            return []
        boundary = self.size.turn_starts[-kept]
        surface = session.surface_events()
        cut = next(
            (
                index
                for index, event in enumerate(surface)
                if event.seq >= boundary and event.surface_op is None
            ),
            len(surface),
        )
        replaced = surface[:cut]
        fresh = sum(message_chars(message_of(e)) for e in replaced if not _is_summary(e))
        if fresh // CHARS_PER_TOKEN < MIN_REPLACED_SHARE * threshold:
            return []  # too little to gain: wait for more old turns
        return replaced

    async def _compact(self, proposal: StepProposal, threshold: int) -> bool:
        session = self.agent.session
        replaced = self._replaceable(session, threshold)
        if not replaced or self.size.header is None:
            return False
        number = self.size.compactions
        await session.append(
            CompactionRequested(
                compaction=number,
                turn=proposal.turn,
                step=proposal.step,
                replaces=tuple(event.seq for event in replaced),
                instruction=self.config.instruction,
            ),
            ignorable=True,
        )
        await session.flush()
        request = rebuild_compaction_request(session.events, number)
        result = StreamAccumulator()
        async with aclosing(self.agent.provider.stream(request)) as chunks:
            async for chunk in chunks:
                result.add(chunk)
                if result.finish is not None:
                    break
        failure = _summary_failure(result)
        if failure is not None:
            await session.append(
                CompactionEnded(compaction=number, usage=result.usage, failure=failure),
                ignorable=True,
            )
            raise FailTurn(
                f"compaction {number} of session {session.id!r} failed: "
                f"{failure.message or failure.code}",
                code=COMPACTION_FAILED,
            )
        summary = result.message(with_tool_calls=False).text
        await session.append(
            UserMessage(
                content=SUMMARY_PREFIX + summary,
                source=PluginSource(plugin=COMPACTION_PLUGIN, form=SUMMARY_FORM),
            ),
            surface_op="replace",
            source_event_seqs=[event.seq for event in replaced],
        )
        await session.append(CompactionEnded(compaction=number, usage=result.usage), ignorable=True)
        return True

    def _reassert_context(self, proposal: StepProposal, decision: Enter) -> Enter:
        """Add the runtime-context snapshot when the replacement removed the retained one."""
        if any(is_runtime_context(message) for message in decision.messages):
            return decision
        text, sections = render_context_snapshot(proposal.assembly)
        if not text:
            return decision
        retained = next(
            (
                message_of(event)
                for event in reversed(self.agent.session.surface_events())
                if isinstance(event.data, UserMessage)
                and is_runtime_context(event.data.to_message())
            ),
            None,
        )
        if retained is not None and retained.text == text:
            return decision
        return Enter(messages=[*decision.messages, snapshot_message(text, sections)])


def _is_summary(event: Event) -> bool:
    data = event.data
    return (
        isinstance(data, UserMessage)
        and isinstance(data.source, PluginSource)
        and data.source.plugin == COMPACTION_PLUGIN
    )


def _summary_failure(result: StreamAccumulator) -> Failure | None:
    if result.failure is not None:
        return result.failure
    if result.finish is None:
        return Failure(code="stream_incomplete", message="the summary stream ended early")
    if result.reason == "tool-calls":
        return Failure(code="summary_tool_call", message="the model called a tool, not a summary")
    if not result.message(with_tool_calls=False).text.strip():
        return Failure(code="summary_empty", message="the model returned no summary text")
    return None


def _log(events: Sequence[Mapping[str, Any] | Event]) -> list[Event]:
    return [e if isinstance(e, Event) else event_from_json(e) for e in events]


def compactions(events: Sequence[Mapping[str, Any] | Event]) -> list[int]:
    """The numbers of the compactions the log says were requested, in order."""
    return [e.data.compaction for e in _log(events) if isinstance(e.data, CompactionRequested)]


def rebuild_compaction_request(
    events: Sequence[Mapping[str, Any] | Event], compaction: int
) -> GenerateRequest:
    """The exact summary request sent for compaction number `compaction`.

    `events` is the durable JSON list (`session.to_json()`) or `Event`
    objects. The header is the latest one logged before the
    `compaction/request`; the messages are those of the cited surface
    events, then the logged instruction.

    Raises:
        SessionError: the log has no such compaction, or no header before it.
    """
    log = _log(events)
    position = next(
        (
            i
            for i, e in enumerate(log)
            if isinstance(e.data, CompactionRequested) and e.data.compaction == compaction
        ),
        None,
    )
    if position is None:
        raise SessionError(f"the log has no compaction {compaction}; it has {compactions(log)}")
    data = log[position].data
    assert isinstance(data, CompactionRequested)
    header = fold_request_header(log[:position])
    if header is None:
        raise SessionError(f"no request header was logged before compaction {compaction}")
    by_seq = {event.seq: event for event in log[:position]}
    missing = [seq for seq in data.replaces if seq not in by_seq]
    if missing:
        raise SessionError(f"compaction {compaction} cites seqs {missing} not logged before it")
    messages = [message_of(by_seq[seq]) for seq in data.replaces]
    messages.append(
        Message.user(
            data.instruction, PluginSource(plugin=COMPACTION_PLUGIN, form=INSTRUCTION_FORM)
        )
    )
    return GenerateRequest(
        config=header.config, system=header.system, tools=header.tools, messages=messages
    )
