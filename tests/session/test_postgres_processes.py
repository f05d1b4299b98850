"""Two processes on one PostgreSQL log: a writer killed or stalled past its lease is replaced.

The child (`tests/session/postgres_writer.py`) writes a session as fast as
it can; the test kills it (`SIGKILL`) or stops it (`SIGSTOP`) past its
lease, takes the session over from this process, and checks from the
database alone that the log stayed contiguous, that nothing the child saw
durable was lost, and that the stalled child's late writes were refused.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import trio

from actors.session import Event, Lease, PostgresStore, SessionBusyError
from actors.session.events import TurnStart

TTL = 1.0
ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def writer_process(dsn: str, session_id: str) -> Iterator[subprocess.Popen[str]]:
    """The child writer, stopped by its PID (SIGKILL) however the test ends."""
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.session.postgres_writer", dsn, session_id, str(TTL)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield child
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)
            os.kill(child.pid, signal.SIGKILL)
        child.wait()
        assert child.stdout is not None
        child.stdout.close()


async def read_until(child: subprocess.Popen[str], *wanted: str) -> list[str]:
    """The child's output lines up to and including the first that starts with one of `wanted`."""
    assert child.stdout is not None
    stdout = child.stdout
    lines: list[str] = []
    with trio.fail_after(30):
        while not lines or not lines[-1].startswith(wanted):
            line = await trio.to_thread.run_sync(stdout.readline)
            assert line, f"the child ended before printing {wanted!r}: {lines}"
            lines.append(line.strip())
    return lines


async def take_over(store: PostgresStore, session_id: str) -> Lease:
    """Acquire the session's lease as soon as the old holder's expires (within 3 lease lengths)."""
    for _ in range(30):
        try:
            return await store.acquire_lease(session_id, owner="parent")
        except SessionBusyError:
            await trio.sleep(TTL / 10)
    raise AssertionError("the stalled holder's lease never expired")


def durable_seqs(lines: list[str]) -> list[int]:
    return [int(line.split()[1]) for line in lines if line.startswith("durable")]


async def continue_log(store: PostgresStore, session_id: str, lease: Lease) -> int:
    """Append one marker event (turn 999) after what is stored; its seq."""
    seq = len(await store.load(session_id))
    marker = Event(type="turn/start", seq=seq, time=0, data=TurnStart(turn=999))
    await store.append(session_id, [marker], lease=lease)
    await store.flush(session_id)
    return seq


async def test_a_killed_writer_loses_nothing_it_saw_durable(postgres_dsn: str) -> None:
    store = PostgresStore(postgres_dsn)
    await store.create("s")
    async with trio.open_nursery() as nursery:
        await nursery.start(store.serve)
        with writer_process(postgres_dsn, "s") as child:
            seen = durable_seqs(await read_until(child, "durable 5"))
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
        lease = await take_over(store, "s")
        marker = await continue_log(store, "s", lease)
        nursery.cancel_scope.cancel()
    events = await PostgresStore(postgres_dsn).load("s")  # checks contiguity and checksums
    assert set(seen) <= {event.seq for event in events}
    assert events[-1].seq == marker and events[-1].data == TurnStart(turn=999)


async def test_a_writer_stalled_past_its_lease_is_fenced_when_it_resumes(postgres_dsn: str) -> None:
    store = PostgresStore(postgres_dsn)
    await store.create("s")
    async with trio.open_nursery() as nursery:
        await nursery.start(store.serve)
        with writer_process(postgres_dsn, "s") as child:
            before = await read_until(child, "durable 5")
            os.kill(child.pid, signal.SIGSTOP)
            lease = await take_over(store, "s")
            marker = await continue_log(store, "s", lease)
            os.kill(child.pid, signal.SIGCONT)
            # Fenced at its next commit, or, when the stop caught it inside a commit,
            # its transaction was ended by the server after one lease length.
            after = await read_until(child, "fenced", "lost")
            assert child.wait() in (3, 4)
        nursery.cancel_scope.cancel()
    events = await PostgresStore(postgres_dsn).load("s")
    assert set(durable_seqs(before + after)) < {event.seq for event in events}
    assert all(seq < marker for seq in durable_seqs(before + after))
    assert [event.seq for event in events if event.data == TurnStart(turn=999)] == [marker]
    assert len(events) == marker + 1
