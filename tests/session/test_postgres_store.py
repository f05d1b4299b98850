"""`PostgresStore` specifics: schema versions, leases, fencing, damaged rows, lost connections.

The contract it shares with the other stores is in `test_store_contract.py`.
A second store object with its own owner plays a second node; a lease is
made to look abandoned by expiring it in the database, as a stalled or dead
owner's would.
"""

from __future__ import annotations

import json
import zlib

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
    UnknownSessionError,
)
from actors.session.postgres_schema import SCHEMA_VERSION, SchemaVersionError
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
        "UPDATE harness_sessions SET lease_expires = clock_timestamp() - interval '1 second' "
        "WHERE id = %s",
        session_id,
    )


def insert_raw(dsn: str, session_id: str, seq: int, text: str, checksum: int | None = None) -> None:
    sql(
        dsn,
        "INSERT INTO harness_events VALUES (%s, %s, 0, %s, %s)",
        session_id,
        seq,
        zlib.crc32(text.encode()) if checksum is None else checksum,
        text,
    )


def epochs(dsn: str, session_id: str) -> list[tuple[int, int]]:
    rows = sql(
        dsn, "SELECT seq, epoch FROM harness_events WHERE session_id = %s ORDER BY seq", session_id
    )
    return [(int(str(seq)), int(str(epoch))) for seq, epoch in rows]


# Schema.


async def test_the_schema_is_created_on_first_use(postgres_dsn: str) -> None:
    assert await PostgresStore(postgres_dsn).list_sessions() == []
    assert sql(postgres_dsn, "SELECT version FROM harness_schema") == [(SCHEMA_VERSION,)]
    tables = sql(
        postgres_dsn, "SELECT tablename FROM pg_tables WHERE starts_with(tablename, 'harness_')"
    )
    assert sorted(name for (name,) in tables) == [
        "harness_events",
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


async def test_events_are_stored_as_exact_json_with_checksum_and_epoch(postgres_dsn: str) -> None:
    store = PostgresStore(postgres_dsn)
    async with serving(store):
        await store.create("s")
        await store.append("s", [turn_start(0)])
        await store.flush()
        lease = store.lease("s")
    assert lease is not None
    ((epoch, checksum, text),) = sql(
        postgres_dsn, "SELECT epoch, checksum, event FROM harness_events WHERE session_id = 's'"
    )
    assert json.loads(str(text)) == {"type": "turn/start", "seq": 0, "time": 0, "data": {"turn": 0}}
    assert checksum == zlib.crc32(str(text).encode())
    assert epoch == lease.epoch == 1


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
    first = PostgresStore(postgres_dsn, owner="node-a")
    second = PostgresStore(postgres_dsn, owner="node-b")
    async with serving(first), serving(second):
        await first.create("s")
        await first.acquire_lease("s")
        busy = r"session 's' is being written by 'node-a' \(lease epoch 1, expires in"
        with pytest.raises(SessionBusyError, match=busy):
            await second.acquire_lease("s")
        with pytest.raises(SessionBusyError, match=busy):
            await second.append("s", [turn_start(0)])
        await first.append("s", [turn_start(0)])
    assert epochs(postgres_dsn, "s") == [(0, 1)]


async def test_acquiring_a_lease_needs_a_known_session_and_a_running_writer(
    postgres_dsn: str,
) -> None:
    store = PostgresStore(postgres_dsn)
    await store.create("s")
    with pytest.raises(SessionError, match="is not running"):
        await store.acquire_lease("s")
    async with serving(store):
        with pytest.raises(UnknownSessionError, match="session 'nope' is not in"):
            await store.acquire_lease("nope")
        assert await store.acquire_lease("s") is await store.acquire_lease("s")


async def test_the_writer_renews_its_leases(postgres_dsn: str) -> None:
    holder = PostgresStore(postgres_dsn, owner="node-a", lease_seconds=0.3)
    other = PostgresStore(postgres_dsn, owner="node-b")
    async with serving(holder), serving(other):
        await holder.create("s")
        await holder.acquire_lease("s")
        await trio.sleep(1.0)  # over three lease lengths, in real time: the database's clock
        with pytest.raises(SessionBusyError, match="node-a"):
            await other.acquire_lease("s")


async def test_releasing_a_lease_lets_another_writer_take_it_at_once(postgres_dsn: str) -> None:
    first = PostgresStore(postgres_dsn, owner="node-a")
    second = PostgresStore(postgres_dsn, owner="node-b")
    async with serving(first), serving(second):
        await first.create("s")
        await first.append("s", [turn_start(0)])
        await first.release_lease("s")
        assert first.lease("s") is None
        lease = await second.acquire_lease("s")
        assert lease.epoch == 2
        await second.append("s", [turn_start(1, turn=1)])
    assert epochs(postgres_dsn, "s") == [(0, 1), (1, 2)]


async def test_stopping_the_writer_releases_its_leases(postgres_dsn: str) -> None:
    first = PostgresStore(postgres_dsn, owner="node-a")
    async with serving(first):
        await first.create("s")
        await first.append("s", [turn_start(0)])
    assert sql(postgres_dsn, "SELECT owner FROM harness_sessions") == [(None,)]
    assert first.statistics().leases_held == 0


async def test_an_expired_lease_is_taken_over_and_the_old_writer_is_fenced(
    postgres_dsn: str,
) -> None:
    old = PostgresStore(postgres_dsn, owner="node-a")
    new = PostgresStore(postgres_dsn, owner="node-b")
    async with serving(old), serving(new):
        await old.create("s")
        await old.append("s", [turn_start(0)])
        await old.flush("s")
        expire_lease(postgres_dsn, "s")
        await new.append("s", [turn_start(1, turn=1)])  # takeover on first touch
        await new.flush("s")

        await old.append("s", [turn_start(1, turn=1)])  # the stale writer's late write
        fenced = r"session 's': .*owner 'node-a'\) lost epoch 1 .*'node-b' holds it at epoch 2"
        with pytest.raises(SessionFencedError, match=fenced):
            await old.flush("s")
        with pytest.raises(SessionFencedError, match=fenced):
            await old.append("s", [turn_start(2, turn=2)])
        assert old.lease("s") is None
        assert old.statistics().fenced_appends == 1
        assert old.running
    assert epochs(postgres_dsn, "s") == [(0, 1), (1, 2)]


async def test_a_batch_with_one_fenced_session_commits_the_others(postgres_dsn: str) -> None:
    old = PostgresStore(postgres_dsn, owner="node-a")
    new = PostgresStore(postgres_dsn, owner="node-b")
    backend = PostgresBackend(postgres_dsn)
    async with serving(old), serving(new):
        for session_id in ("z", "a", "b", "c"):
            await old.create(session_id)
            await old.acquire_lease(session_id)
        expire_lease(postgres_dsn, "b")
        await new.acquire_lease("b")

        async def flush_everything() -> None:
            with pytest.raises(SessionFencedError, match=r"session 'b' seq 0\.\.0 refused"):
                await old.flush()

        async with trio.open_nursery() as nursery:
            with backend.write_locked():
                await old.append("z", [turn_start(0)])
                await trio.testing.wait_all_tasks_blocked()  # the writer is stuck on "z"
                for session_id in ("a", "b", "c"):
                    await old.append(session_id, [turn_start(0)])
                nursery.start_soon(flush_everything)
                await trio.testing.wait_all_tasks_blocked()
        await old.flush("a")
        await old.flush("c")
        with pytest.raises(SessionFencedError, match="session 'b'"):
            await old.flush("b")
        assert old.statistics().largest_batch == 2  # "a" and "c" in one commit
        assert old.running
    assert [backend.stored_rows(session_id) for session_id in "abc"] == [1, 0, 1]


async def test_the_renewal_fences_a_session_whose_lease_was_taken(postgres_dsn: str) -> None:
    old = PostgresStore(postgres_dsn, owner="node-a", lease_seconds=0.3)
    new = PostgresStore(postgres_dsn, owner="node-b")
    async with serving(old), serving(new):
        await old.create("s")
        await old.acquire_lease("s")
        expire_lease(postgres_dsn, "s")
        await new.acquire_lease("s")
        await trio.sleep(0.5)  # past one renewal of the old writer
        assert old.lease("s") is None
        assert old.statistics().fenced_sessions == 1
        with pytest.raises(SessionFencedError, match="'node-b' holds it at epoch 2"):
            await old.append("s", [turn_start(0)])


async def test_acquiring_again_after_a_fence_continues_from_the_log(postgres_dsn: str) -> None:
    old = PostgresStore(postgres_dsn, owner="node-a")
    new = PostgresStore(postgres_dsn, owner="node-b")
    async with serving(old), serving(new):
        await old.create("s")
        await old.acquire_lease("s")
        expire_lease(postgres_dsn, "s")
        await new.append("s", [turn_start(0)])
        await new.release_lease("s")
        await old.append("s", [turn_start(0)])
        with pytest.raises(SessionFencedError):
            await old.flush("s")
        lease = await old.acquire_lease("s")
        await old.append("s", [turn_start(1, turn=1)])
        await old.flush("s")
    assert lease.epoch == 3
    assert epochs(postgres_dsn, "s") == [(0, 2), (1, 3)]


async def test_two_writers_racing_for_a_free_session_never_share_it(postgres_dsn: str) -> None:
    stores = [PostgresStore(postgres_dsn, owner=f"node-{i}") for i in range(4)]
    won: list[str] = []

    async def race(store: PostgresStore) -> None:
        try:
            await store.append("s", [turn_start(0)])
            await store.flush("s")
        except SessionBusyError:
            return
        won.append(store.owner)

    async with trio.open_nursery() as nursery:
        for store in stores:
            await nursery.start(store.serve)
        await stores[0].create("s")
        async with trio.open_nursery() as racers:
            for store in stores:
                racers.start_soon(race, store)
        nursery.cancel_scope.cancel()
    assert len(won) == 1
    assert epochs(postgres_dsn, "s") == [(0, 1)]


async def test_rows_written_behind_the_writers_back_fence_the_whole_append(
    postgres_dsn: str,
) -> None:
    store = PostgresStore(postgres_dsn, owner="node-a")
    async with serving(store):
        await store.create("s")
        await store.acquire_lease("s")
        insert_raw(postgres_dsn, "s", 1, '{"type":"turn/start","seq":1,"time":0,"data":{"turn":0}}')
        await store.append("s", [turn_start(0), turn_start(1), turn_start(2)])
        with pytest.raises(SessionFencedError, match="bypassed the lease"):
            await store.flush("s")
    assert [seq for seq, _ in epochs(postgres_dsn, "s")] == [1]


# Writer failures.


async def test_a_lost_writer_connection_fails_serve_and_every_later_flush(
    postgres_dsn: str,
) -> None:
    store = PostgresStore(postgres_dsn, owner="victim")
    await store.create("s")

    async def kill_writer_then_append() -> None:
        await store.acquire_lease("s")
        sql(
            postgres_dsn,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'harness writer victim'",
        )
        await store.append("s", [turn_start(0)])
        await store.flush()

    with pytest.RaisesGroup(
        pytest.RaisesExc(SessionError, match=r"could not commit session 's' seq 0\.\.0"),
        pytest.RaisesExc(SessionError, match=r"1 accepted append\(s\) are not durable"),
    ):
        async with serving(store):
            await kill_writer_then_append()
    assert not store.running
    assert store.statistics().failed_appends == 1
    with pytest.raises(SessionError, match=r"1 accepted append\(s\) are not durable"):
        await store.flush()
