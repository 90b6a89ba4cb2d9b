"""Fixtures of the audit tests; the harness itself is in audit_harness.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from audit_harness import Backend, PostgresBackend, SqliteBackend


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """Each engine in turn: the same contract holds for the embedded default (SQLite
    files) and cluster mode (a fresh PostgreSQL database)."""
    made: Backend
    if request.param == "sqlite":
        made = SqliteBackend(tmp_path)
    else:
        made = PostgresBackend(
            request.getfixturevalue("postgres_url"), request.getfixturevalue("postgres_server")
        )
    yield made
    made.close()


@pytest.fixture
def postgres(postgres_url: str, postgres_server: object) -> Iterator[PostgresBackend]:
    """Cluster mode alone: one PostgreSQL database, as many replicas as a test makes."""
    from hippo_core.pgserver import PostgresServer

    assert isinstance(postgres_server, PostgresServer)
    made = PostgresBackend(postgres_url, postgres_server)
    yield made
    made.close()
