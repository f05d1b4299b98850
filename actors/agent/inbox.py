"""The agent's inbox: input parked for the next turn or the next step."""

from __future__ import annotations

import attrs

from actors.messages import Message


@attrs.frozen(kw_only=True)
class InboxStatistics:
    """Queue depths of an inbox."""

    next_turn: int
    next_step: int


@attrs.frozen(kw_only=True)
class Claim:
    """What one proposed step took from the inbox.

    `turn_message` is the next-turn message a first step takes (if any);
    `step_messages` the next-step messages, in order.
    """

    turn_message: Message | None
    step_messages: tuple[Message, ...]

    @property
    def messages(self) -> list[Message]:
        """Every claimed message, in the order the step sees them."""
        head = [self.turn_message] if self.turn_message is not None else []
        return [*head, *self.step_messages]


@attrs.define(eq=False)
class Inbox:
    """Two FIFO queues: next-turn input (`followup`) and next-step input (`steer`, `inject`).

    A turn's first step claims one next-turn message followed by every
    next-step message; later steps claim only next-step messages. Claiming
    removes what it returns.
    """

    # Lists, not deques: they hold a message or two, and an empty deque costs 600 bytes
    # for every idle agent.
    _next_turn: list[Message] = attrs.field(factory=list, init=False)
    _next_step: list[Message] = attrs.field(factory=list, init=False)

    def __len__(self) -> int:
        """How many messages are parked, for both queues together."""
        return len(self._next_turn) + len(self._next_step)

    def put_next_turn(self, message: Message) -> None:
        """Park `message` for a turn of its own."""
        self._next_turn.append(message)

    def put_next_step(self, message: Message) -> None:
        """Park `message` for the next step (of the live turn, or the next turn)."""
        self._next_step.append(message)

    def has_turn_work(self) -> bool:
        """True when something could start a turn."""
        return bool(self._next_turn or self._next_step)

    def has_step_work(self) -> bool:
        """True when the live turn has input for another step."""
        return bool(self._next_step)

    def claim(self, *, first_step: bool) -> Claim:
        """Remove and return what the proposed step takes."""
        turn_message = None
        if first_step and self._next_turn:
            # `del`, not `pop(0)`: emptying a list by `pop` leaves it a fresh zero-size buffer
            # (allocated during the turn, kept while the agent idles); `del` frees it.
            turn_message = self._next_turn[0]
            del self._next_turn[0]
        step_messages = tuple(self._next_step)
        self._next_step.clear()
        return Claim(turn_message=turn_message, step_messages=step_messages)

    def put_back(self, claim: Claim) -> None:
        """Return a claim whose step never opened, ahead of everything parked."""
        if claim.turn_message is not None:
            self._next_turn.insert(0, claim.turn_message)
        self._next_step[:0] = claim.step_messages

    def parks_for_a_turn(self, message: Message) -> bool:
        """True when `message` itself (not an equal one) is parked for a turn of its own."""
        return any(parked is message for parked in self._next_turn)

    def clear(self) -> None:
        """Drop every parked message."""
        self._next_turn.clear()
        self._next_step.clear()

    def statistics(self) -> InboxStatistics:
        """Current queue depths."""
        return InboxStatistics(next_turn=len(self._next_turn), next_step=len(self._next_step))
