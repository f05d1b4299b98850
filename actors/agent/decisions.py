"""What pre-step listeners and request-error listeners decide."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TypeAlias

import attrs

from actors.messages import Message
from actors.prompt.types import PromptAssembly
from actors.providers.chunks import Failure


def _messages(value: Iterable[Message]) -> list[Message]:
    return list(value)


@attrs.frozen(kw_only=True)
class Enter:
    """Open the step with these messages (claimed input, snapshots, plugin context)."""

    messages: list[Message] = attrs.field(factory=list, converter=_messages)


@attrs.frozen(kw_only=True)
class Reject:
    """Refuse the step: the turn ends `blocked`."""

    reason: str = ""


StepDecision: TypeAlias = Enter | Reject


class FailTurn(Exception):
    """Raised by a pre-step listener to end the turn `error` with `code` and this message.

    The step does not open; input it claimed goes back to the inbox.
    """

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


@attrs.frozen(kw_only=True)
class Retry:
    """Retry the failed request after `delay_ms` (None: the retry policy's delay)."""

    delay_ms: int | None = None


@attrs.frozen(kw_only=True)
class StepProposal:
    """What a pre-step listener sees: the step about to open.

    `messages` are the claimed inbox messages; `context` the runtime-context
    snapshot (or tombstone) the projection proposes, if any; `assembly` this
    step's prompt assembly (read it, do not mutate it).
    """

    turn: int
    step: int
    messages: Sequence[Message]
    context: Message | None
    assembly: PromptAssembly


PreStepNext: TypeAlias = Callable[[], Awaitable[StepDecision]]
PreStepListener: TypeAlias = Callable[[StepProposal, PreStepNext], Awaitable[StepDecision]]
RequestErrorListener: TypeAlias = Callable[[Failure, int], Awaitable[Retry | None]]
"""`async def listener(failure, attempt) -> Retry | None`; `attempt` is the 0-based failed one."""
