"""The PostgreSQL store's versioned schema: created on first use, migrated forward, never back.

`ensure_schema` runs once per store object on its first connection. Under a
transaction-scoped advisory lock (so concurrent first uses on several nodes
run one at a time) it reads `harness_schema.version`, applies every
migration the database has not seen yet, and refuses a database whose
version is newer than this code knows.

Tables (all prefixed `harness_`, so the store can share a database):
- `harness_sessions`: one row per session, in creation order (`position`).
- `harness_events`: one row per event under the primary key
  `(session_id, seq)`: the event's exact JSON text and its checksum
  (`actors/session/checksum.py`).
- `harness_leases`: the single-writer lease of each session that ever had
  one (`actors/session/lease.py`): `owner` (NULL once released), `epoch`
  (grows at every acquisition, never reused) and `expires_at`, judged by
  the database's clock so the nodes' clocks may disagree.
- `harness_nodes` (version 2): the node processes of a cluster, one row per
  live node with its endpoint, incarnation and last heartbeat
  (`supervision/cluster/membership.py`).
"""

from __future__ import annotations

import psycopg

from actors.session.errors import SessionError

SCHEMA_VERSION = 2
"""The newest schema version this code knows."""

_LOCK_KEY = 0x6861726E657373  # "harness": serialises schema set-up across processes.

_MIGRATIONS: dict[int, str] = {
    1: """
        CREATE TABLE harness_sessions (
            position bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
            id text PRIMARY KEY
        );
        CREATE TABLE harness_events (
            session_id text NOT NULL REFERENCES harness_sessions (id),
            seq bigint NOT NULL CHECK (seq >= 0),
            event text NOT NULL,
            checksum bigint NOT NULL,
            PRIMARY KEY (session_id, seq)
        );
        CREATE TABLE harness_leases (
            session_id text PRIMARY KEY,
            owner text,
            epoch bigint NOT NULL,
            expires_at timestamptz NOT NULL
        );
    """,
    2: """
        CREATE TABLE harness_nodes (
            node_id text PRIMARY KEY,
            endpoint text NOT NULL,
            incarnation text NOT NULL,
            heartbeat_at timestamptz NOT NULL
        );
    """,
}
"""Version → the DDL that brings the previous version to it (version 1 from nothing)."""


class SchemaVersionError(SessionError):
    """The database's session schema is newer than this code knows; nothing was changed."""


def ensure_schema(connection: psycopg.Connection[tuple[object, ...]], label: str) -> None:
    """Bring the database's schema to `SCHEMA_VERSION`, or refuse a newer one.

    Blocking; runs in one transaction, so a failure leaves the schema as it was.

    Raises:
        SchemaVersionError: the database holds a newer schema version.
        psycopg.Error: the database refused a statement.
    """
    with connection.transaction():
        connection.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        connection.execute(
            "CREATE TABLE IF NOT EXISTS harness_schema ("
            " singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),"
            " version integer NOT NULL)"
        )
        row = connection.execute("SELECT version FROM harness_schema").fetchone()
        found = 0 if row is None else int(str(row[0]))
        if found > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{label}: the database's session schema is version {found}, newer than "
                f"this harness knows (up to {SCHEMA_VERSION}); upgrade harness to use it"
            )
        for version in range(found + 1, SCHEMA_VERSION + 1):
            connection.execute(_MIGRATIONS[version].encode())
        if row is None:
            connection.execute(
                "INSERT INTO harness_schema (version) VALUES (%s)", (SCHEMA_VERSION,)
            )
        elif found < SCHEMA_VERSION:
            connection.execute("UPDATE harness_schema SET version = %s", (SCHEMA_VERSION,))
