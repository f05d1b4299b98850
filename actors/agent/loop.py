"""The turn/step machine: everything one turn does, logged before model I/O.

Per turn: `turn/start`; per proposed step: claim inbox → assemble → render
runtime context → projection → pre-step listeners → (if entered)
`step/start`, `user/message`s, system text rendered once, then per attempt:
header (if new or changed), flush, request, chunks, `assistant/message`,
tool calls and results, `step/end`. Every failure ends the turn with a
`turn/end` that says why; only a failure to write the log escapes.

Events that follow each other with nothing to wait for in between are
written as one store append (one checkpoint): a step's opening events with
the header its first attempt sends, the batch carrying the finish with the
answer and its tool calls, the tool results with `step/end`, and the last
step's `step/end` with `turn/end`. The log holds the same events in the
same order as with one append each.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Mapping, Sequence
from contextlib import aclosing
from typing import Any, Literal

import attrs
import trio

from actors.agent.decisions import (
    Enter,
    FailTurn,
    PreStepListener,
    Reject,
    RequestErrorListener,
    Retry,
    StepDecision,
    StepProposal,
)
from actors.agent.inbox import Claim, Inbox
from actors.agent.options import AgentOptions
from actors.agent.projection import RuntimeContextProjection
from actors.agent.stream import StreamAccumulator
from actors.agent.tool_call import ToolInvocation
from actors.agent.tools import ToolRegistry
from actors.jsonvalue import freeze_object
from actors.messages import Message
from actors.prompt import (
    AssembleContext,
    PromptAssembly,
    PromptError,
    SystemPrompt,
    render_context_snapshot,
    render_prompt,
)
from actors.providers.base import Provider, chunk_batches
from actors.providers.chunks import Failure, FinishChunk
from actors.providers.request import GenerateRequest
from actors.scope import Scope
from actors.session.errors import SessionError
from actors.session.events import (
    AssistantChunk,
    AssistantMessage,
    Event,
    EventData,
    RequestHeaderLogged,
    RequestRetry,
    StepEnd,
    StepStart,
    ToolCallRequested,
    ToolError,
    ToolResult,
    TurnEnd,
    TurnEndReason,
    TurnError,
    TurnStart,
    UserMessage,
)
from actors.session.header import RequestHeader, header_equals, shared_header
from actors.session.replay import RENDER_FAILED
from actors.session.session import Session

WRITE_GRACE_SECONDS = 5.0
"""How long shielded end-of-turn writes may take after a cancellation."""


AbortCause = Literal["user", "parent", "disposed"]

MAX_STEPS = "max_steps"
"""The turn-error code when a turn would need more steps than `AgentOptions.max_steps`."""


class _TurnFailed(Exception):
    """Internal: the turn ends with `reason` (raised out of a step)."""

    def __init__(self, reason: TurnEndReason) -> None:
        super().__init__(reason.kind)
        self.reason = reason


def _failure_error(failure: Failure) -> TurnError:
    return TurnError(
        message=failure.message or failure.code,
        code=failure.code,
        status=failure.status,
        retry_after_ms=failure.retry_after_ms,
    )


@attrs.frozen(kw_only=True)
class LoopStatistics:
    """Counters of one agent loop."""

    turns: int
    steps: int
    requests: int
    retries: int


@attrs.define(eq=False)
class AgentLoop:
    """Runs turns for one agent over its session. Owned and driven by `Agent`.

    Public entry point: `run_turn()`. Cancelling the scope the caller wraps
    it in aborts the turn; the cause recorded in `turn/end` is read from
    `abort_cause` (default "disposed").
    """

    session: Session
    system_prompt: SystemPrompt
    provider: Provider
    options: AgentOptions
    tools: ToolRegistry
    inbox: Inbox
    scope: Scope
    agent: object
    rng: random.Random
    pre_step: list[PreStepListener] = attrs.field(factory=list)
    request_error: list[RequestErrorListener] = attrs.field(factory=list)
    abort_cause: AbortCause = "disposed"
    keep_claimed_on_abort: bool = False
    _projection: RuntimeContextProjection | None = attrs.field(factory=RuntimeContextProjection)
    """None while hibernated (rebuilt from the log by the next step's catch-up)."""
    _config: Mapping[str, Any] = attrs.field(factory=dict, init=False)
    _last_header: RequestHeader | None = attrs.field(default=None, init=False)
    _built_header: RequestHeader | None = attrs.field(default=None, init=False)
    _header_logged: bool = attrs.field(default=False, init=False)
    _turns: int = attrs.field(default=0, init=False)
    _steps: int = attrs.field(default=0, init=False)
    _requests: int = attrs.field(default=0, init=False)
    _retries: int = attrs.field(default=0, init=False)
    _unentered: Claim | None = attrs.field(default=None, init=False)
    turn_message: Message | None = attrs.field(default=None, init=False)
    """The next-turn message the current (or last) turn's first step claimed, if any."""
    _resumed: bool = attrs.field(default=False, init=False)
    _hibernated: bool = attrs.field(default=False, init=False)
    _closing: Sequence[EventData] = attrs.field(default=(), init=False)
    """The last step's closing events (tool results, `step/end`), written with `turn/end`
    (the shared empty tuple between turns, so an idle loop keeps no list of its own)."""

    def __attrs_post_init__(self) -> None:
        self._config = _shared_config(self.options.request_config())
        self._last_header = self.session.header()
        self._resumed = len(self.session) > 0

    def hibernate(self) -> None:
        """Drop what only the last turn needed (its message, projection, header), until `woke`.

        Called once the session hibernated: what is dropped is re-derived
        from the log on wake, so nothing a later step sends changes. The
        prompt's cached assembly plan for the agent's scope goes too (the
        next assembly rebuilds it, as after any registration).
        """
        self._hibernated = True
        if self._last_header is not self._built_header:  # the reused one is kept anyway
            self._last_header = None
        self.turn_message = None
        self._projection = None
        self.system_prompt.forget_plan(self.scope)

    def woke(self) -> None:
        """Re-derive, from the woken session, what `hibernate` dropped; a no-op when awake."""
        if self._hibernated:
            if self._last_header is None:
                self._last_header = self.session.header()
            self._hibernated = False

    def statistics(self) -> LoopStatistics:
        """Turns, steps, requests and retries run by this loop."""
        return LoopStatistics(
            turns=self._turns, steps=self._steps, requests=self._requests, retries=self._retries
        )

    async def _append_shielded(self, *items: EventData, flush: bool = False) -> None:
        """Write closing events even while the turn is being cancelled (durably if `flush`)."""
        # One scope: shielded from the turn's cancellation, bounded by its own deadline.
        with trio.CancelScope(shield=True, deadline=trio.current_time() + WRITE_GRACE_SECONDS):
            await self.session.extend(items)
            if flush:
                await self.session.flush()

    # -- turn -------------------------------------------------------------

    async def run_turn(self, on_parked: Callable[[], None]) -> TurnEndReason:
        """Run one turn to its `turn/end` and return why it ended.

        Cancellation (of the caller's scope) ends the turn `aborted` with
        `abort_cause`. Input claimed by a step that never opened is not lost:
        after an error, or an abort with `keep_claimed_on_abort`, it goes back
        to the front of the inbox, and `on_parked` is called so the owner
        waits for a new wake before another turn (a failing turn does not
        repeat on its own).
        Raises only when the log itself cannot be written (`SessionError`).
        """
        turn = self.session.next_turn()
        self._turns += 1
        self.abort_cause = "disposed"
        self.keep_claimed_on_abort = False
        self.turn_message = None
        self._closing = ()
        await self.session.append(TurnStart(turn=turn))
        reason: TurnEndReason | None = None
        log_broken = False
        try:
            reason = await self._turn_body(turn)
        except _TurnFailed as failed:
            reason = failed.reason
        except FailTurn as failed:
            reason = TurnEndReason.failed(TurnError(message=str(failed), code=failed.code))
        except SessionError:
            log_broken = True
            raise
        except Exception as exc:
            reason = TurnEndReason.failed(
                TurnError(message=f"{type(exc).__name__}: {exc}", code="internal")
            )
        finally:
            if reason is None and not log_broken:
                # Leaving without a reason means cancellation (possibly inside an
                # exception group from a nursery below): the turn was aborted.
                reason = TurnEndReason.aborted(self.abort_cause)
            if self._unentered is not None and reason is not None:
                if reason.kind == "error" or (
                    reason.kind == "aborted" and self.keep_claimed_on_abort
                ):
                    self.inbox.put_back(self._unentered)
                    on_parked()
                self._unentered = None
            closing, self._closing = self._closing, ()
            if reason is not None:
                await self._append_shielded(*closing, TurnEnd(turn=turn, reason=reason), flush=True)
        return reason

    async def _turn_body(self, turn: int) -> TurnEndReason:
        step = 0
        limit = self.options.max_steps
        while True:
            if limit is not None and step >= limit:
                return TurnEndReason.failed(
                    TurnError(
                        message=f"turn {turn} needs a step {step + 1} but AgentOptions.max_steps "
                        f"is {limit}; the step was not started",
                        code=MAX_STEPS,
                    )
                )
            claim = self.inbox.claim(first_step=step == 0)
            if step == 0:
                self.turn_message = claim.turn_message
            self._unentered = claim
            assembly, decision = await self._propose(turn, step, claim.messages)
            # From here on the listeners have decided what happens to the claim.
            self._unentered = None
            if isinstance(decision, Reject):
                return TurnEndReason(kind="blocked")
            if step == 0 and not decision.messages:
                return TurnEndReason.completed()
            outcome = await self._run_step(turn, step, assembly, decision.messages)
            if outcome is not None:
                return outcome
            step += 1

    async def _propose(
        self, turn: int, step: int, claimed: list[Message]
    ) -> tuple[PromptAssembly, StepDecision]:
        try:
            assembly = await self.system_prompt.assemble(
                AssembleContext(scope=self.scope, agent=self.agent)
            )
            text, sections = render_context_snapshot(assembly)
        except PromptError as exc:
            raise _TurnFailed(
                TurnEndReason.failed(TurnError(message=str(exc), code="prompt_error"))
            ) from exc
        projection = self._projection
        if projection is None:
            projection = self._projection = RuntimeContextProjection()
        projection.catch_up(self.session)
        candidate = projection.propose(text, sections)
        default = [*claimed, candidate] if candidate is not None else list(claimed)
        proposal = StepProposal(
            turn=turn, step=step, messages=tuple(claimed), context=candidate, assembly=assembly
        )
        decision = await self._decide(proposal, default)
        return assembly, decision

    async def _decide(self, proposal: StepProposal, default: list[Message]) -> StepDecision:
        return await _decide_from(tuple(self.pre_step), 0, proposal, default)

    # -- step -------------------------------------------------------------

    async def _run_step(
        self, turn: int, step: int, assembly: PromptAssembly, entered: Sequence[Message]
    ) -> TurnEndReason | None:
        """Run one entered step; returns a turn-ending reason, or None to go on."""
        opening: list[EventData] = [StepStart(turn=turn, step=step)]
        for message in entered:
            if message.role != "user" or message.source is None:
                raise TypeError(f"step {turn}.{step} entered a non-user message: {message!r}")
            opening.append(UserMessage(content=message.content, source=message.source))
        self._steps += 1
        # Rendered before the step opens, so that the header its first attempt
        # sends (when new or changed) is written with the opening events; a
        # failure is reported once the step is open, as if rendered after.
        header: RequestHeader | None = None
        render_failure: Exception | None = None
        try:
            header = self.request_header(render_prompt(assembly), assembly)
        except Exception as exc:
            render_failure = exc
        header_event = None if header is None else self._header_event(header)
        if header_event is None:
            await self.session.extend(opening)
        else:
            await self.session.extend([*opening, header_event])
            self._header_was_logged(header_event.header)
        closing: list[EventData] = []
        goes_on = False
        try:
            if isinstance(render_failure, PromptError):
                return TurnEndReason.failed(
                    TurnError(message=str(render_failure), code=RENDER_FAILED)
                )
            if render_failure is not None:
                raise render_failure
            assert header is not None
            streamed = await self._request_with_retries(turn, step, header)
            result = streamed.result
            if result.reason == "max-tokens":
                answer = AssistantMessage(
                    turn=turn,
                    step=step,
                    message=result.message(with_tool_calls=False),
                    usage=result.usage,
                )
                await self._log_answer(streamed, [answer])
                return TurnEndReason(kind="max-tokens")
            try:
                message = result.message(with_tool_calls=True)
            except Exception:
                await self._log_answer(streamed, [])
                raise
            answer = AssistantMessage(turn=turn, step=step, message=message, usage=result.usage)
            if message.tool_calls:
                calls = [
                    ToolCallRequested(
                        turn=turn,
                        step=step,
                        call_id=block.id,
                        name=block.name,
                        arguments=block.arguments,
                    )
                    for block in message.tool_calls
                ]
                logged = await self._log_answer(streamed, [answer, *calls])
                await self._run_tools(turn, step, logged[-len(calls) :], closing)
                goes_on = True
                return None
            await self._log_answer(streamed, [answer])
            if self.inbox.has_step_work():
                goes_on = True
                return None
            return TurnEndReason.completed()
        finally:
            closing.append(StepEnd(turn=turn, step=step))
            if goes_on:
                await self._append_shielded(*closing)
            else:
                # The turn ends here (or is failing): `run_turn` writes these with `turn/end`.
                self._closing = closing

    def request_header(self, system: str, assembly: PromptAssembly) -> RequestHeader:
        """The canonical header a step with this system text and assembly sends.

        The last one built is reused (the same object) while the system text
        and the tools are equal: the config is fixed for the loop. A new one
        is the header every agent building an equal one shares
        (`shared_header`), so an idle agent keeps no header of its own.
        """
        tools = tuple(assembly.tools)
        built = self._built_header
        if built is not None and built.system == (system or None) and built.tools == tools:
            return built
        header = shared_header(self._config, system, tools)
        self._built_header = header
        return header

    def would_log_header(self, header: RequestHeader) -> bool:
        """True when the next attempt sending `header` logs a `request/header` first."""
        return not self._header_logged or not self._same_header(header)

    def _same_header(self, header: RequestHeader) -> bool:
        last = self._last_header
        return header is last or header_equals(last, header)

    def _header_event(self, header: RequestHeader) -> RequestHeaderLogged | None:
        """The `request/header` event an attempt sending `header` logs first, if any."""
        if not self._header_logged:
            reason: Literal["initial", "resume", "change"] = (
                "resume" if self._resumed else "initial"
            )
        elif not self._same_header(header):
            reason = "change"
        else:
            return None
        return RequestHeaderLogged(header=header, reason=reason)

    def _header_was_logged(self, header: RequestHeader) -> None:
        self._last_header = header
        self._header_logged = True

    async def _log_header(self, header: RequestHeader) -> None:
        event = self._header_event(header)
        if event is not None:
            await self.session.append(event)
            self._header_was_logged(header)

    async def _request_with_retries(self, turn: int, step: int, header: RequestHeader) -> _Streamed:
        """Send attempts until one does not fail; its finishing batch is left to the caller."""
        attempt = 0
        retry: RequestRetry | None = None
        while True:
            # `request/retry` is logged only once the wait is over and the
            # retried request is about to go out, and the messages are taken
            # right after the last event this attempt logs: the log then says
            # exactly which attempts were sent, and with what.
            if retry is not None:
                await self.session.append(retry)
            await self._log_header(header)
            messages = self.session.derive_messages()
            await self.session.flush()
            request = GenerateRequest(
                config=header.config, system=header.system, tools=header.tools, messages=messages
            )
            streamed = await self._stream(turn, step, request)
            failure = streamed.result.failure
            if failure is None:
                return streamed
            # A failed attempt keeps its chunks in the log (and gets no answer).
            await self._log_answer(streamed, [])
            delay_ms = await self._retry_delay(failure, attempt)
            if delay_ms is None:
                raise _TurnFailed(TurnEndReason.failed(_failure_error(failure)))
            self._retries += 1
            await trio.sleep(delay_ms / 1000)
            retry = RequestRetry(
                turn=turn, step=step, attempt=attempt, delay_ms=delay_ms, failure=failure
            )
            attempt += 1

    async def _retry_delay(self, failure: Failure, attempt: int) -> int | None:
        for listener in list(self.request_error):
            decision = await listener(failure, attempt)
            if isinstance(decision, Retry):
                if decision.delay_ms is not None:
                    return decision.delay_ms
                policy_delay = self.options.retry.delay_ms(
                    attrs.evolve(failure, retryable=True), attempt, self.rng
                )
                return 0 if policy_delay is None else policy_delay
            if decision is not None:
                raise TypeError(
                    f"request-error listener {listener!r} returned {decision!r}, not Retry or None"
                )
        return self.options.retry.delay_ms(failure, attempt, self.rng)

    async def _stream(self, turn: int, step: int, request: GenerateRequest) -> _Streamed:
        """Stream one attempt, logging each batch of chunks as one append, up to the finish.

        The batch that carries the finish is not logged here: the caller
        logs it with the events that follow it (`_log_answer`).
        """
        self._requests += 1
        result = StreamAccumulator()
        final: list[EventData] = []
        before_final: AssistantMessage | None = None
        finished = False
        try:
            async with aclosing(chunk_batches(self.provider, request)) as batches:
                async for batch in batches:
                    end = next(
                        (n + 1 for n, chunk in enumerate(batch) if isinstance(chunk, FinishChunk)),
                        None,
                    )
                    taken = batch if end is None else batch[:end]
                    events: list[EventData] = [
                        AssistantChunk(turn=turn, step=step, chunk=chunk) for chunk in taken
                    ]
                    if end is None:
                        await self.session.extend(events)
                        for chunk in taken:
                            result.add(chunk)
                        continue
                    before_final = _interrupted_answer(turn, step, result)
                    final = events
                    for chunk in taken:
                        result.add(chunk)
                    break
            finished = True
        finally:
            if not finished:
                # Cancelled (or the provider broke) mid-stream: keep what was
                # logged as an interrupted answer.
                kept = before_final if final else _interrupted_answer(turn, step, result)
                if kept is not None:
                    await self._append_shielded(kept)
        if result.finish is None:
            failure = Failure(
                code="stream_incomplete",
                message="the provider's stream ended without a finish chunk",
            )
            result.add(FinishChunk(reason="error", failure=failure))
        return _Streamed(result=result, final=final, before_final=before_final)

    async def _log_answer(self, streamed: _Streamed, after: list[EventData]) -> list[Event]:
        """Log an attempt's finishing batch and `after` (its answer, tool calls) as one append.

        Cancelled before the store took them, nothing of them is logged and
        what was logged before is kept as an interrupted answer, as when the
        stream itself is cancelled.
        """
        items = [*streamed.final, *after]
        if not items:
            return []
        written = False
        try:
            logged = await self.session.extend(items)
            written = True
        finally:
            if not written and streamed.before_final is not None:
                await self._append_shielded(streamed.before_final)
        return logged

    # -- tools ------------------------------------------------------------

    async def _run_tools(
        self, turn: int, step: int, logged: Sequence[Event], closing: list[EventData]
    ) -> None:
        """Run the logged `tool/call`s once durable; their results go to `closing`, in call order.

        Every call gets a result in `closing`, even when cancelled, so the
        log never holds a tool call the provider would reject as unanswered.
        """
        calls = [ToolInvocation.of(self.session.id, event) for event in logged]
        results: list[ToolResult | None] = [None] * len(calls)

        async def run_one(index: int, call: ToolInvocation) -> None:
            results[index] = await self.tools.run(call)

        try:
            # A tool runs only once its call is durable, so its idempotency key
            # (the call's seq) can never be reused for another call after a
            # crash, and a writer that lost the session (fenced) runs nothing.
            await self.session.flush()
            if len(calls) == 1:
                await run_one(0, calls[0])  # one call: no nursery needed
            else:
                async with trio.open_nursery() as nursery:
                    for index, call in enumerate(calls):
                        nursery.start_soon(run_one, index, call)
        finally:
            closing.extend(
                result
                if result is not None
                else ToolResult(
                    turn=turn,
                    step=step,
                    call_id=call.call_id,
                    content="the tool call was cancelled before it finished",
                    is_error=True,
                    error=ToolError(name="Cancelled", code="cancelled"),
                )
                for call, result in zip(calls, results, strict=True)
            )


def _shared_config(config: dict[str, Any]) -> Mapping[str, Any]:
    """`config` frozen, one object for every agent whose config is equal.

    Agents started with equal options then log headers that share their
    config (and the codec's decoded copy of it), and none freezes it again.

    Raises:
        TypeError: `config` is not a JSON object of JSON-like values (names the path).
    """
    try:
        # Each value's type is in the key: 1, 1.0 and True are equal and hash alike, but
        # are sent (and logged) as different JSON.
        return _frozen_config(tuple((key, type(value), value) for key, value in config.items()))
    except TypeError:  # an unhashable value: frozen on its own, or refused by name
        return freeze_object(config, where="config")


@functools.lru_cache(maxsize=64)
def _frozen_config(items: tuple[tuple[str, type, Any], ...]) -> Mapping[str, Any]:
    return freeze_object({key: value for key, _, value in items}, where="config")


async def _decide_from(
    listeners: tuple[PreStepListener, ...],
    index: int,
    proposal: StepProposal,
    default: list[Message],
) -> StepDecision:
    """The decision of `listeners[index:]`; past the last one, `default` is entered.

    Each listener's `next` is a partial of this function rather than a
    closure that refers to itself, so a step leaves no reference cycle
    behind for the garbage collector to find.

    Raises:
        TypeError: a listener returned something other than `Enter` or `Reject`.
    """
    if index == len(listeners):
        return Enter(messages=default)
    listener = listeners[index]
    decision = await listener(
        proposal, functools.partial(_decide_from, listeners, index + 1, proposal, default)
    )
    if not isinstance(decision, Enter | Reject):
        raise TypeError(
            f"pre-step listener {listener!r} returned {decision!r}, not Enter or Reject"
        )
    return decision


def _interrupted_answer(turn: int, step: int, result: StreamAccumulator) -> AssistantMessage | None:
    """The interrupted `assistant/message` keeping what `result` holds, if it holds anything."""
    if not result.has_content:
        return None
    return AssistantMessage(
        turn=turn,
        step=step,
        message=result.message(with_tool_calls=False),
        usage=result.usage,
        interrupted=True,
    )


@attrs.frozen(kw_only=True)
class _Streamed:
    """One attempt's stream: the chunks folded, and what of it the caller still has to log.

    `final` holds the `assistant/chunk` events of the batch that carried the
    finish (not logged yet); `before_final` is the interrupted answer that
    keeps what was logged before them, for when writing them fails.
    """

    result: StreamAccumulator
    final: list[EventData]
    before_final: AssistantMessage | None
