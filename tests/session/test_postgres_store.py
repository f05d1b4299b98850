"""`PostgresStore` specifics: schema versions, leases, fencing, damaged rows, lost connections.

The contract it shares with the other stores is in `test_store_contract.py`.
A second store object plays a second node; a lease is made to look
abandoned by expiring it in the database (expiry is the database's clock),
as a stalled or dead owner's would.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import trio
import trio.testing

from actors.session import (
    PostgresStore,
    SessionBusyError,
    SessionError,
    SessionFencedError,
    UnknownEventError,
    postgres_store,
)
from actors.session.checksum import event_checksum
from actors.session.postgres_schema import SCHEMA_VERSION, SchemaVersionError
from actors.session.postgres_store import MAX_READ_CONNECTIONS
from tests.session.store_helpers import PostgresBackend, serving, turn_start


def sql(dsn: str, query: str, *params: object) -> list[tuple[object, ...]]:
    """Run one statement from another connection; its rows, if it returns any."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        cursor = connection.execute(query.encode(), params)
        return cursor.fetchall() if cursor.description is not None else []


def expire_lease(dsn: str, session_id: str) -> None:
    """Make the session's lease look abandoned, as an owner that stopped renewing leaves it."""
    sql(
        dsn,
        "UPDATE harness_leases SET expires_at = clock_timestamp() - interval '1 second' "
        "WHERE session_id = %s",
        session_id,
    )


def insert_raw(dsn: str, session_id: str, seq: int, text: str) -> None:
    """Write an event row behind the store's back, with a valid checksum."""
    sql(
        dsn,
        "INSERT INTO harness_events VALUES (%s, %s, %s, %s)",
        session_id,
        seq,
        text,
        event_checksum(session_id, seq, text),
    )


async def until(condition: Callable[[], bool]) -> None:
    """Return once `condition()` holds, checking every 10 ms for at most 10 s."""
    for _ in range(1000):
        if condition():
            return
        await trio.sleep(0.01)
    raise AssertionError("the condition never held")


async def writer_waits_for_a_lock(dsn: str) -> None:
    """Return once the store's writer connection is blocked on a lock in the database.

    The server is the only witness of that, so this asks it every 10 ms (for at most 10 s).
    """
    await until(
        lambda: bool(
            sql(
                dsn,
                "SELECT 1 FROM pg_stat_activity "
                "WHERE application_name = 'harness writer' AND wait_event_type = 'Lock'",
            )
        )
    )


def stored_seqs(dsn: str, session_id: str) -> list[int]:
    rows = sql(dsn, "SELECT seq FROM harness_events WHERE session_id = %s ORDER BY seq", session_id)
    return [int(str(seq)) for (seq,) in rows]


# Schema.


async def test_the_schema_is_created_on_first_use(postgres_dsn: str) -> None:
    assert await PostgresStore(postgres_dsn).list_sessions() == []
    assert sql(postgres_dsn, "SELECT version FROM harness_schema") == [(SCHEMA_VERSION,)]
    tables = sql(
        postgres_dsn, "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
    )
    assert sorted(name for (name,) in tables) == [
        "harness_events",
        "harness_leases",
        "harness_nodes",
        "harness_schema",
        "harness_sessions",
    ]


async def test_stores_opening_a_fresh_database_at_once_create_the_schema_once(
    postgres_dsn: str,
) -> None:
    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(PostgresStore(postgres_dsn).list_sessions)
    assert sql(postgres_dsn, "SELECT version FROM harness_schema") == [(SCHEMA_VERSION,)]


async def test_an_older_schema_is_migrated_keeping_its_sessions(postgres_dsn: str) -> None:
    store = PostgresStore(postgres_dsn)
    async with serving(store):
        await store.create("s")
        await store.append("s", [turn_start(0)])
    # What version 1 left: no nodes table.
    sql(postgres_dsn, "DROP TABLE harness_nodes")
    sql(postgres_dsn, "UPDATE harness_schema SET version = 1")
    assert [e.seq for e in await PostgresStore(postgres_dsn).load("s")] == [0]
    assert sql(postgres_dsn, "SELECT version FROM harness_schema") == [(SCHEMA_VERSION,)]
    assert sql(postgres_dsn, "SELECT count(*) FROM harness_nodes") == [(0,)]


async def test_a_newer_schema_is_refused_and_left_alone(postgres_dsn: str) -> None:
    await PostgresStore(postgres_dsn).create("s")
    sql(postgres_dsn, "UPDATE harness_schema SET version = %s", SCHEMA_VERSION + 1)
    refused = rf"session schema is version {SCHEMA_VERSION + 1}, newer than this harness knows"
    with pytest.raises(SchemaVersionError, match=refused):
        await PostgresStore(postgres_dsn).load("s")
    with pytest.raises(SchemaVersionError, match=refused):
        await PostgresStore(postgres_dsn).serve()
    assert sql(postgres_dsn, "SELECT id FROM harness_sessions") == [("s",)]


async def test_an_unreachable_server_names_the_store(postgres_dsn: str) -> None:
    store = PostgresStore("postgresql://harness@127.0.0.1:1/nowhere")
    with pytest.raises(SessionError, match=r"PostgreSQL store '127\.0\.0\.1:1/nowhere'.*connect"):
        await store.list_sessions()


# Stored rows.


async def test_events_are_stored_as_exact_json_with_their_checksum(postgres_dsn: str) -> None:
    store = PostgresStore(postgres_dsn)
    async with serving(store):
        await store.create("s")
        await store.append("s", [turn_start(0)])
        await store.flush()
    ((text, checksum),) = sql(
        postgres_dsn, "SELECT event, checksum FROM harness_events WHERE session_id = 's'"
    )
    assert json.loads(str(text)) == {"type": "turn/start", "seq": 0, "time": 0, "data": {"turn": 0}}
    assert checksum == event_checksum("s", 0, str(text))
    assert store.durable_seq("s") == 0


async def test_a_row_that_fails_its_checksum_names_session_and_seq(postgres_dsn: str) -> None:
    store = PostgresStore(postgres_dsn)
    async with serving(store):
        await store.create("s")
        await store.append("s", [turn_start(0), turn_start(1, turn=1)])
    sql(postgres_dsn, "UPDATE harness_events SET event = replace(event, '1', '7') WHERE seq = 1")
    with pytest.raises(SessionError, match=r"session 's': stored event seq 1 fails its checksum"):
        await store.load("s")


async def test_a_stored_event_of_unknown_type_names_session_and_seq(postgres_dsn: str) -> None:
    store = PostgresStore(postgres_dsn)
    await store.create("s")
    insert_raw(postgres_dsn, "s", 0, '{"type":"memory/compacted","seq":0,"time":0,"data":{}}')
    with pytest.raises(UnknownEventError, match=r"session 's': event seq 0 has unknown type"):
        await store.load("s")


async def test_a_stored_event_that_is_not_json_names_session_and_seq(postgres_dsn: str) -> None:
    store = PostgresStore(postgres_dsn)
    await store.create("s")
    insert_raw(postgres_dsn, "s", 0, "not json")
    with pytest.raises(SessionError, match=r"session 's': stored event seq 0 is not valid JSON"):
        await store.load("s")


# Leases.


async def test_a_live_lease_refuses_a_second_writer_naming_the_holder(postgres_dsn: str) -> None:
    first, second = PostgresStore(postgres_dsn), PostgresStore(postgres_dsn)
    await first.create("s")
    lease = await first.acquire_lease("s", owner="node-a")
    busy = r"session 's' is busy: another live writer holds it: node-a \(epoch 1, lease expires in"
    with pytest.raises(SessionBusyError, match=busy) as refused:
        await second.acquire_lease("s", owner="node-b")
    assert (refused.value.session_id, refused.value.holder) == ("s", "node-a")
    async with serving(first), serving(second):
        await second.append("s", [turn_start(0)])  # without a lease
        with pytest.raises(SessionBusyError, match=r"refused session 's' seq 0\.\.0.*node-a"):
            await second.flush("s")
        await first.append("s", [turn_start(0)], lease=lease)
        await first.flush("s")
    assert stored_seqs(postgres_dsn, "s") == [0]


async def test_the_writer_renews_its_leases(postgres_dsn: str) -> None:
    holder = PostgresStore(postgres_dsn, lease_ttl=3.0)
    other = PostgresStore(postgres_dsn)

    def expiry() -> object:
        ((expires_at,),) = sql(postgres_dsn, "SELECT expires_at FROM harness_leases")
        return expires_at

    async with serving(holder):
        await holder.acquire_lease("s", owner="node-a")
        granted = expiry()
        await trio.sleep(1.5)  # past the first renewal, due after a third of the lease
        assert expiry() > granted  # type: ignore[operator]
        with pytest.raises(SessionBusyError, match="node-a"):
            await other.acquire_lease("s", owner="node-b")


async def test_a_released_lease_is_free_at_once_and_stays_fenced(postgres_dsn: str) -> None:
    first, second = PostgresStore(postgres_dsn), PostgresStore(postgres_dsn)
    await first.create("s")
    old = await first.acquire_lease("s")
    await first.release_lease(old)
    new = await second.acquire_lease("s")
    assert new.epoch == old.epoch + 1
    async with serving(first), serving(second):
        await second.append("s", [turn_start(0)], lease=new)
        await second.flush("s")
        with pytest.raises(SessionFencedError, match=f"epoch {old.epoch}"):
            await first.append("s", [turn_start(1)], lease=old)
    assert stored_seqs(postgres_dsn, "s") == [0]


async def test_an_expired_lease_is_taken_over_and_the_old_writer_is_fenced(
    postgres_dsn: str,
) -> None:
    old_store, new_store = PostgresStore(postgres_dsn), PostgresStore(postgres_dsn)
    for session_id in ("s", "other"):
        await old_store.create(session_id)
    old = await old_store.acquire_lease("s", owner="old")
    other = await old_store.acquire_lease("other", owner="old")
    async with serving(old_store), serving(new_store):
        await old_store.append("s", [turn_start(0)], lease=old)
        await old_store.flush("s")
        expire_lease(postgres_dsn, "s")  # the old writer stalled past its expiry
        new = await new_store.acquire_lease("s", owner="new")
        assert new.epoch == old.epoch + 1
        await new_store.append("s", [turn_start(1, turn=1)], lease=new)
        await new_store.flush("s")

        await old_store.append("s", [turn_start(1, turn=1)], lease=old)  # its late write
        fenced = r"refused session 's' seq 1\.\.1: the write lease of epoch 1 was taken over"
        with pytest.raises(SessionFencedError, match=rf"{fenced}.*held by new \(epoch 2"):
            await old_store.flush("s")
        with pytest.raises(SessionFencedError, match=fenced):
            await old_store.append("s", [turn_start(2, turn=2)], lease=old)
        await old_store.append("other", [turn_start(0)], lease=other)
        await old_store.flush("other")
        assert old_store.running
    assert stored_seqs(postgres_dsn, "s") == [0, 1]
    assert [e.seq for e in await new_store.load("s")] == [0, 1]


async def test_a_batch_with_one_fenced_session_commits_the_others(postgres_dsn: str) -> None:
    old_store, new_store = PostgresStore(postgres_dsn), PostgresStore(postgres_dsn)
    backend = PostgresBackend(postgres_dsn)
    leases = {}
    for session_id in ("z", "a", "b", "c"):
        await old_store.create(session_id)
        leases[session_id] = await old_store.acquire_lease(session_id, owner="old")
    expire_lease(postgres_dsn, "b")
    await new_store.acquire_lease("b", owner="new")

    async def flush_everything() -> None:
        with pytest.raises(SessionError, match=r"1 session\(s\) hold accepted appends"):
            await old_store.flush()

    async with serving(old_store), trio.open_nursery() as nursery:
        with backend.write_locked():
            await old_store.append("z", [turn_start(0)], lease=leases["z"])
            await trio.testing.wait_all_tasks_blocked()  # the writer is stuck on "z"
            for session_id in ("a", "b", "c"):
                await old_store.append(session_id, [turn_start(0)], lease=leases[session_id])
            nursery.start_soon(flush_everything)
            await trio.testing.wait_all_tasks_blocked()
        for session_id in ("z", "a", "c"):
            await old_store.flush(session_id)
        with pytest.raises(SessionFencedError, match=r"refused session 'b' seq 0\.\.0"):
            await old_store.flush("b")
        stats = old_store.statistics()
        assert (stats.largest_batch, stats.failed_appends, stats.broken_sessions) == (2, 1, 1)
        assert old_store.running
    assert [backend.stored_rows(session_id) for session_id in "zabc"] == [1, 1, 0, 1]


async def test_the_renewal_tells_a_writer_it_lost_the_session(postgres_dsn: str) -> None:
    old_store = PostgresStore(postgres_dsn, lease_ttl=0.3)
    new_store = PostgresStore(postgres_dsn)
    await old_store.create("s")
    old = await old_store.acquire_lease("s", owner="old")
    async with serving(old_store):
        expire_lease(postgres_dsn, "s")
        await new_store.acquire_lease("s", owner="new")
        await until(lambda: old_store.statistics().broken_sessions == 1)  # a renewal found out
        assert old_store.statistics().leases_held == 0
        with pytest.raises(SessionFencedError, match="epoch 1 was taken over by another writer"):
            await old_store.append("s", [turn_start(0)], lease=old)


async def test_a_lease_lost_to_a_renewal_is_reported_once(postgres_dsn: str) -> None:
    lost: list[str] = []
    old_store = PostgresStore(postgres_dsn, lease_ttl=0.3, lease_lost=lost.append)
    await old_store.create("s")
    old = await old_store.acquire_lease("s", owner="old")
    async with serving(old_store):
        assert old_store.holds_lease(old)
        expire_lease(postgres_dsn, "s")
        await PostgresStore(postgres_dsn).acquire_lease("s", owner="new")
        await until(lambda: lost == ["s"])  # the next renewal found out
        assert not old_store.holds_lease(old)
        await trio.sleep(0.3)  # more renewals: told once
        await old_store.release_lease(old)
        await old_store.flush()  # a session it lost and gave up is not undurable data
    assert lost == ["s"]


async def test_a_lease_lost_to_a_refused_commit_is_reported_once(postgres_dsn: str) -> None:
    lost: list[str] = []
    old_store = PostgresStore(postgres_dsn, lease_lost=lost.append)  # renews every 3.3 s
    await old_store.create("s")
    old = await old_store.acquire_lease("s", owner="old")
    async with serving(old_store):
        expire_lease(postgres_dsn, "s")
        await PostgresStore(postgres_dsn).acquire_lease("s", owner="new")
        await old_store.append("s", [turn_start(0)], lease=old)
        with pytest.raises(SessionFencedError, match="taken over"):
            await old_store.flush("s")
        assert lost == ["s"]
        assert not old_store.holds_lease(old)
        await old_store.release_lease(old)
        await old_store.flush()
    assert stored_seqs(postgres_dsn, "s") == []


async def test_a_refusal_that_comes_after_its_lease_was_given_up_is_no_undurable_data(
    postgres_dsn: str,
) -> None:
    # The writer gave up waiting for a slow commit and released its lease (as an
    # agent's shutdown does after its write grace); then the commit refused the append
    # as a stale writer's. That refusal used to break the session for good, so the
    # store's last flush reported undurable data and a node exited 1 on SIGTERM.
    old_store, new_store = PostgresStore(postgres_dsn), PostgresStore(postgres_dsn)
    backend = PostgresBackend(postgres_dsn)
    leases = {}
    for session_id in ("z", "s"):
        await old_store.create(session_id)
        leases[session_id] = await old_store.acquire_lease(session_id, owner="old")
    expire_lease(postgres_dsn, "s")
    await new_store.acquire_lease("s", owner="new")
    async with serving(old_store), trio.open_nursery() as nursery:
        with backend.write_locked():
            await old_store.append("z", [turn_start(0)], lease=leases["z"])
            await trio.testing.wait_all_tasks_blocked()  # the writer is stuck on "z"
            await old_store.append("s", [turn_start(0)], lease=leases["s"])
            waiting = trio.Event()

            async def flush_s() -> None:
                waiting.set()
                with pytest.raises(SessionFencedError, match=r"refused session 's' seq 0\.\.0"):
                    await old_store.flush("s")  # one waiting for it still hears of it

            nursery.start_soon(flush_s)
            await waiting.wait()
            await old_store.release_lease(leases["s"])
        await old_store.flush("z")
        await old_store.flush()
        stats = old_store.statistics()
        assert (stats.failed_appends, stats.fenced_appends, stats.broken_sessions) == (1, 1, 0)
    assert stored_seqs(postgres_dsn, "s") == []


async def test_a_busy_lease_says_when_it_runs_out(postgres_dsn: str) -> None:
    holder = PostgresStore(postgres_dsn, lease_ttl=4.0)
    await holder.acquire_lease("s", owner="node-a")
    with pytest.raises(SessionBusyError) as refused:
        await PostgresStore(postgres_dsn).acquire_lease("s", owner="node-b")
    assert refused.value.retry_after is not None
    assert 3.0 < refused.value.retry_after <= 4.0


async def test_a_lease_row_locked_by_a_stalled_commit_is_refused_as_busy_at_once(
    postgres_dsn: str,
) -> None:
    # A writer stopped inside its commit keeps the lease row share-locked: a takeover
    # must not wait for it (it would hold one of the taker's few read connections).
    await PostgresStore(postgres_dsn).acquire_lease("s", owner="stalled")
    expire_lease(postgres_dsn, "s")
    with psycopg.connect(postgres_dsn) as stalled:
        stalled.execute("SELECT 1 FROM harness_leases WHERE session_id = 's' FOR SHARE")
        with trio.fail_after(5), pytest.raises(SessionBusyError, match="holds the lease row"):
            await PostgresStore(postgres_dsn).acquire_lease("s", owner="taker")
        stalled.rollback()
    taken = await PostgresStore(postgres_dsn).acquire_lease("s", owner="taker")
    assert taken.epoch == 2


async def test_acquiring_again_after_a_fence_continues_from_the_log(postgres_dsn: str) -> None:
    old_store, new_store = PostgresStore(postgres_dsn), PostgresStore(postgres_dsn)
    await old_store.create("s")
    old = await old_store.acquire_lease("s")
    expire_lease(postgres_dsn, "s")
    async with serving(old_store), serving(new_store):
        new = await new_store.acquire_lease("s")
        await new_store.append("s", [turn_start(0)], lease=new)
        await new_store.flush("s")
        await new_store.release_lease(new)
        await old_store.append("s", [turn_start(1, turn=1)], lease=old)
        with pytest.raises(SessionFencedError):
            await old_store.flush("s")
        again = await old_store.acquire_lease("s")
        await old_store.append("s", [turn_start(1, turn=1)], lease=again)
        await old_store.flush("s")
    assert again.epoch == 3
    assert stored_seqs(postgres_dsn, "s") == [0, 1]


async def test_writers_racing_for_a_free_session_never_share_it(postgres_dsn: str) -> None:
    stores = [PostgresStore(postgres_dsn) for _ in range(4)]
    await stores[0].create("s")
    won: list[int] = []

    async def race(index: int) -> None:
        try:
            await stores[index].acquire_lease("s", owner=f"node-{index}")
        except SessionBusyError:
            return
        won.append(index)

    async with trio.open_nursery() as racers:
        for index in range(len(stores)):
            racers.start_soon(race, index)
    assert len(won) == 1
    assert sql(postgres_dsn, "SELECT owner, epoch FROM harness_leases") == [(f"node-{won[0]}", 1)]


async def test_rows_committed_behind_the_writers_back_refuse_the_whole_append(
    postgres_dsn: str,
) -> None:
    store = PostgresStore(postgres_dsn)
    await store.create("s")
    text = json.dumps({"type": "turn/start", "seq": 1, "time": 0, "data": {"turn": 0}})
    async with serving(store):
        with psycopg.connect(postgres_dsn) as rogue:
            # Seq 1 is inserted but not committed: the store's seq check cannot see it,
            # and its insert of seq 1 waits for this transaction.
            rogue.execute(
                "INSERT INTO harness_events VALUES ('s', 1, %s, %s)",
                (text, event_checksum("s", 1, text)),
            )
            await store.append("s", [turn_start(0), turn_start(1), turn_start(2)])
            await writer_waits_for_a_lock(postgres_dsn)
            rogue.commit()
        with pytest.raises(SessionError, match="another writer committed some of these seqs"):
            await store.flush("s")
    assert stored_seqs(postgres_dsn, "s") == [1]


# Writer failures.


async def test_a_writer_connection_lost_before_a_commit_is_replaced_and_the_batch_written(
    postgres_dsn: str,
) -> None:
    # As when the server ends a transaction left idle while the writer's process was
    # stopped: nothing of the batch was written, so it is written again, checks and all.
    store = PostgresStore(postgres_dsn)
    for session_id in ("s", "t"):
        await store.create(session_id)
    async with serving(store):
        sql(
            postgres_dsn,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'harness writer'",
        )
        await store.append("s", [turn_start(0)])
        await store.flush("s")
        await store.append("t", [turn_start(0)])
        await store.flush()
        assert store.statistics().reconnects == 1
    assert stored_seqs(postgres_dsn, "s") == [0]
    assert stored_seqs(postgres_dsn, "t") == [0]


def end_the_writers_session(dsn: str) -> None:
    """End the writer's server session and wait until it is gone (from another connection)."""
    sql(
        dsn,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = 'harness writer'",
    )
    for _ in range(1000):
        if not sql(dsn, "SELECT 1 FROM pg_stat_activity WHERE application_name = 'harness writer'"):
            return
        time.sleep(0.01)
    raise AssertionError("the writer's server session did not end")


async def test_a_writer_connection_lost_as_its_commit_is_sent_writes_the_batch_once(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As when the writer's process stalls right before its COMMIT (SIGSTOP) and the
    # server ends the transaction left idle: the COMMIT then fails, and whether it took
    # is unknown. It did not: the batch is written on a new connection. (It used to
    # fail, and a node woken from SIGSTOP exited 1 reporting undurable appends.)
    insert_groups = postgres_store._insert_groups
    ended: list[bool] = []

    def then_stall(connection: Any, *args: Any) -> None:
        insert_groups(connection, *args)
        if not ended:
            ended.append(True)
            end_the_writers_session(postgres_dsn)

    monkeypatch.setattr(postgres_store, "_insert_groups", then_stall)
    store = PostgresStore(postgres_dsn)
    for session_id in ("s", "t"):
        await store.create(session_id)
    async with serving(store):
        await store.append("s", [turn_start(0)])
        await store.append("t", [turn_start(0)])
        await store.flush()
        assert store.statistics().reconnects == 1
    assert stored_seqs(postgres_dsn, "s") == [0]
    assert stored_seqs(postgres_dsn, "t") == [0]


async def test_a_commit_that_took_though_its_answer_was_lost_is_not_written_again(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The COMMIT took, but the connection broke before its answer came: the rows are
    # found stored on a new connection, and only the session they lack runs again.
    insert_batch = postgres_store._insert_batch
    batches: list[list[str]] = []

    def answer_lost(connection: psycopg.Connection[Any], groups: list[Any]) -> Any:
        batches.append([group.session_id for group in groups])
        if batches[-1] != ["s", "t"]:
            return insert_batch(connection, groups)
        insert_batch(connection, groups[:1])  # "s" commits, "t" never reached the server
        connection.close()
        raise postgres_store._CommitUnknown(psycopg.OperationalError("connection lost"))

    monkeypatch.setattr(postgres_store, "_insert_batch", answer_lost)
    store = PostgresStore(postgres_dsn)
    for session_id in ("z", "s", "t"):
        await store.create(session_id)
    async with serving(store):
        with PostgresBackend(postgres_dsn).write_locked():
            await store.append("z", [turn_start(0)])
            await trio.testing.wait_all_tasks_blocked()  # the writer is stuck on "z"
            await store.append("s", [turn_start(0)])
            await store.append("t", [turn_start(0)])
        await store.flush()
        assert store.statistics().reconnects == 1
    assert [batch for batch in batches if batch] == [["z"], ["s", "t"], ["t"]]
    assert [stored_seqs(postgres_dsn, sid) for sid in "zst"] == [[0], [0], [0]]


async def test_a_writer_that_cannot_reconnect_fails_the_batch(postgres_dsn: str) -> None:
    store = PostgresStore(postgres_dsn)
    await store.create("s")
    async with serving(store):
        sql(
            postgres_dsn,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'harness writer'",
        )
        store.dsn = "postgresql://harness@127.0.0.1:1/nowhere"  # the reconnect fails
        await store.append("s", [turn_start(0)])
        with pytest.raises(SessionError, match=r"could not commit session 's' seq 0\.\.0"):
            await store.flush("s")
        with pytest.raises(SessionError, match=r"1 session\(s\) hold accepted appends"):
            await store.flush()


async def test_a_renewal_on_a_lost_connection_is_retried_on_a_new_one(postgres_dsn: str) -> None:
    store = PostgresStore(postgres_dsn, lease_ttl=3.0)
    async with serving(store):
        await store.acquire_lease("s", owner="node-a")
        sql(
            postgres_dsn,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'harness writer'",
        )
        await until(lambda: store.statistics().reconnects == 1)  # two renewals: fail, retry
        assert store.statistics().renewal_failures == 1
        assert store.statistics().leases_held == 1
        with pytest.raises(SessionBusyError, match="node-a"):
            await PostgresStore(postgres_dsn).acquire_lease("s", owner="node-b")


async def test_many_concurrent_reads_share_a_few_connections(postgres_dsn: str) -> None:
    store = PostgresStore(postgres_dsn)
    for index in range(20):
        await store.create(f"s{index}")
    peak = 0
    reading = True

    async def sample() -> None:
        nonlocal peak
        while reading:
            ((count,),) = sql(
                postgres_dsn,
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'harness reader'",
            )
            peak = max(peak, int(str(count)))
            await trio.sleep(0.005)

    async with serving(store), trio.open_nursery() as nursery:
        nursery.start_soon(sample)
        async with trio.open_nursery() as readers:
            for round_ in range(10):
                for index in range(20):
                    readers.start_soon(store.load, f"s{(index + round_) % 20}")
        reading = False
    assert 1 <= peak <= MAX_READ_CONNECTIONS
