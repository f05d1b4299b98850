"""One writer per session: leases, owner epochs (fencing tokens) and their errors.

A writer takes a `Lease` on a session before it writes (`open_agent` does
this before the session accepts any input). A lease has an *owner* (who
holds it, for error messages and operators), an *expiry* on the wall clock
(renewed by the store while the holder lives) and an *epoch*: a per-session
counter that grows by one at every acquisition and is never reused. The
epoch is the fencing token: every commit carries the epoch of the lease it
was written under, and the store accepts the rows only when that epoch is
still the session's current one, checked in the same transaction as the
insert. So:

- a second live writer is refused at acquisition (`SessionBusyError`, naming
  the session and the holder) before it accepts input;
- an expired lease (the holder crashed, or stalled past the expiry) is taken
  over: the new holder gets epoch + 1;
- the old holder's later writes carry the old epoch and are refused
  (`SessionFencedError`), never interleaved with the new holder's; its
  renewals fail the same way, so it learns it lost the session even when it
  is not writing;
- an expired lease whose epoch is still current (nobody took over) keeps
  accepting its holder's writes: expiry only decides whether another writer
  may take over, and the epoch alone decides which writes are accepted;
- a refused commit fails that session only: the rest of the batch commits.

Writes without a lease (tests, `Session.fork`'s copy into a new session) are
accepted only while nobody holds a live lease on the session.

How this carries to a shared PostgreSQL store (many node processes, one
log): the same `leases` table, `(session_id PRIMARY KEY, owner, epoch,
expires_at)`. Acquisition is one statement,
`INSERT ... ON CONFLICT (session_id) DO UPDATE SET owner = excluded.owner,
epoch = leases.epoch + 1, expires_at = now() + ttl WHERE leases.expires_at <
now() OR leases.owner IS NULL RETURNING epoch` (no row back: busy; read the
holder for the message). Expiry uses the database's `now()`, never a node's
clock, so clock skew between machines cannot make two holders. A group
commit inserts its batch with `INSERT ... SELECT ... FROM unnest(...) LEFT
JOIN leases USING (session_id) WHERE leases.epoch = batch.epoch (or, for a
write without a lease, no live holder) ON CONFLICT (session_id, seq) DO
NOTHING RETURNING session_id, seq`, each row's checksum computed by the
node as here; a session whose first seq does not continue its stored
`max(seq)` is refused the same way. The batch reads the lease rows it
checks `FOR SHARE`, so a takeover (an `UPDATE` of that row) waits for a
commit in flight, and the new holder, which loads the log only after its
acquisition returned, sees every row the old epoch got in. Rows of a fenced
session (stale epoch) or a conflicting seq simply do not come back, so that
session's appends fail with `SessionFencedError` while the others commit, and
the `(session_id, seq)` primary key remains the last line of defence.
Renewal is one `UPDATE leases SET expires_at = now() + ttl WHERE
(session_id, epoch) IN (...) RETURNING session_id` per node per period; a
session missing from the answer was taken over. `SQLiteStore` implements
exactly this scheme with the file's write lock standing in for row locks.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

import attrs

from actors.session.errors import SessionError

WallClockMs = Callable[[], int]
"""Returns the wall-clock time in epoch milliseconds (shared by every process on the store)."""

DEFAULT_LEASE_TTL_SECONDS = 10.0
"""How long a lease outlives its holder's last renewal; renewals come every third of it."""


def wall_clock_ms() -> int:
    """The machine's wall clock in epoch milliseconds."""
    return time.time_ns() // 1_000_000


def default_owner() -> str:
    """`pid 1234 on host 'name'`: who this process is, for lease holders and their errors."""
    return f"pid {os.getpid()} on host {socket.gethostname()!r}"


@attrs.frozen(kw_only=True)
class Lease:
    """The right to write one session, as granted by a store.

    Attributes:
        session_id: the session.
        owner: who holds it (`default_owner()` unless the caller named itself).
        epoch: the fencing token; every commit under this lease carries it.
        expires_ms: wall-clock expiry (epoch ms) as granted; renewals extend
            it in the store, not in this object.
    """

    session_id: str
    owner: str
    epoch: int
    expires_ms: int


class SessionBusyError(SessionError):
    """Another live writer holds the session's lease; nothing was written.

    Attributes:
        session_id: the session.
        holder: the current holder's owner string.
        retry_after: seconds until trying again makes sense (the holder's
            lease runs out then, by the store's clock, unless it is renewed);
            None when the store cannot tell.
    """

    def __init__(
        self, message: str, *, session_id: str, holder: str, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.holder = holder
        self.retry_after = retry_after


class SessionFencedError(SessionError):
    """This writer's lease was taken over: its writes are refused from now on.

    Attributes:
        session_id: the session.
        epoch: the epoch this writer held.
    """

    def __init__(self, message: str, *, session_id: str, epoch: int) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.epoch = epoch


def describe_holder(owner: str, epoch: int, expires_ms: int, now_ms: int) -> str:
    """`pid 7 on host 'a' (epoch 3, lease expires in 4.2 s)`: a holder, for error messages."""
    return f"{owner} (epoch {epoch}, lease expires in {(expires_ms - now_ms) / 1000:.1f} s)"
