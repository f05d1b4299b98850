"""What a running tool receives as `call`: the logged `tool/call` event and its idempotency key.

The log fences every write (one writer per session), but a tool's effects
outside the log (a payment, an e-mail, a row in someone else's database)
are not fenced by it. So every execution gets an `IdempotencyKey`: the
`(session_id, seq)` of the `tool/call` event it executes. The agent runs a
tool only once that event is durable, so the key names that one logged call
for good: any execution of it, in any process, before or after a takeover,
carries the same key, and no other call ever does. A tool with side effects
passes `str(call.idempotency_key)` to the system it changes (an
`Idempotency-Key` header, a unique column) so that a repeated execution is
recognised there.
"""

from __future__ import annotations

import attrs

from actors.session.events import Event, ToolCallRequested


@attrs.frozen(kw_only=True)
class IdempotencyKey:
    """`(session_id, seq)` of a logged `tool/call` event: one key per logged call, for good.

    Stable: derived only from where the call is logged, so every execution
    of that call gets an equal key. Unique: seqs are unique within a
    session and never reused once durable, so two logged calls never share
    one. `str(key)` is `"<session_id>:<seq>"` (the seq never holds a colon,
    so the text splits back unambiguously at its last one).
    """

    session_id: str
    seq: int

    def __str__(self) -> str:
        return f"{self.session_id}:{self.seq}"


@attrs.frozen(kw_only=True)
class ToolInvocation(ToolCallRequested):
    """The `tool/call` event as a tool receives it (`call`), with its `idempotency_key`.

    A `ToolCallRequested` (turn, step, call_id, name, arguments as logged),
    so code written against the plain event keeps working.
    """

    idempotency_key: IdempotencyKey

    @classmethod
    def of(cls, session_id: str, event: Event) -> ToolInvocation:
        """The invocation of the `tool/call` logged as `event` in session `session_id`.

        Raises:
            TypeError: `event` is not a `tool/call` event (the message names its type and seq).
        """
        call = event.data
        if not isinstance(call, ToolCallRequested):
            raise TypeError(
                f"session {session_id!r}: event seq {event.seq} is {event.type}, not tool/call"
            )
        return cls(
            turn=call.turn,
            step=call.step,
            call_id=call.call_id,
            name=call.name,
            arguments=call.arguments,
            idempotency_key=IdempotencyKey(session_id=session_id, seq=event.seq),
        )
