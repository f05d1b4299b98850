"""Fixtures shared across test packages."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import settings

from tests.postgres import PostgresServer, running_postgres


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the whole run, started on first use and stopped by PID."""
    with running_postgres() as server:
        yield server


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> str:
    """A DSN confined to a new, empty schema of the shared server."""
    return postgres_server.new_schema()


# Hypothesis's per-example deadline (200 ms) measures the machine, not the code: on a loaded
# CI machine a parser example can take longer and fail a property that holds. Tests that
# need a time bound state it themselves.
settings.register_profile("harness", deadline=None)
settings.load_profile("harness")
