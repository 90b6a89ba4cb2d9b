"""pytest fixtures every Hippo test suite shares (registered as the `hippo` plugin).

`postgres_server`: one throwaway PostgreSQL for the whole test session, started on first
use (tests that never ask for it start nothing). `postgres_url`: a new, empty database on
it for one test. The server runs without fsync: a test may kill a process, not the
machine. With no PostgreSQL binaries the fixture fails with the fix (`make postgres`):
a store test must never be skipped silently.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from hippo_core.listen import reserve_port
from hippo_core.pgserver import PostgresServer

_names = itertools.count(1)


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    server = PostgresServer(
        Path(tmp_path_factory.mktemp("postgres")) / "data", reserve_port(), durable=False
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """The URL of a fresh database, for this test alone."""
    return postgres_server.create_database(f"t{os.getpid()}_{next(_names)}")
