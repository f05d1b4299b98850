"""Fixtures shared across test packages."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.postgres import PostgresServer, PostgresUnavailable


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the whole run, started on first use and stopped by PID."""
    try:
        server = PostgresServer.start()
    except PostgresUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> str:
    """A DSN confined to a new, empty schema of the shared server."""
    return postgres_server.new_schema()
