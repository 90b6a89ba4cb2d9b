"""Shared fixtures: the session store on both engines (`stores`: SQLite and PostgreSQL,
several instances = several replicas), the real injection service (CountTokens with
Gemma's tokenizer, and its TGI HTTP API; session scope: the model loads once), a TGI
double, and a way to start summariser processes against them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import grpc
import psycopg
import pytest
from pydantic import SecretStr
from tgi_double import TgiDouble

from hippo.injection.v1 import injection_pb2, injection_pb2_grpc
from hippo.memory.v1 import memory_pb2
from hippo.summariser.v1 import summariser_pb2 as pb
from hippo.summariser.v1 import summariser_pb2_grpc
from hippo_core.listen import reserve_port
from hippo_core.outbox import OutboxStore, PostgresOutbox, SqliteOutbox
from hippo_core.postgres import Database
from hippo_core.settings import DatabaseSettings
from hippo_core.testing import ServiceProcess, service_process, wait_for
from hippo_summariser.adapters import postgres_store
from hippo_summariser.adapters.postgres_store import PostgresSessionStore
from hippo_summariser.adapters.sqlite_store import SqliteSessionStore
from hippo_summariser.domain import audit

ROOT = Path(__file__).resolve().parents[3]
# The injection service's default model cache (converted once per checkout: `make model`).
MODEL_DIR = ROOT / "var" / "injection" / "model"
INJECTION = "hippo.injection.v1.InjectionService"
SUMMARISER = "hippo.summariser.v1.SummariserService"
PREFIX = "HIPPO_SUMMARISER_"


Store = SqliteSessionStore | PostgresSessionStore


class Stores:
    """Session stores on one engine and one database: each `make()` is another replica
    (another owner; for PostgreSQL, another connection pool)."""

    def __init__(self, engine: str, folder: Path, url: str = "") -> None:
        self.engine = engine
        self.folder = folder
        self.path = folder / "sessions.sqlite3"
        self.url = url
        self._databases: dict[str, Database] = {}
        self._closers: list[Callable[[], None]] = []

    def make(self, owner: str = "") -> Store:
        if self.engine == "sqlite":
            sqlite = SqliteSessionStore(self.path, owner=owner)
            self._closers.append(sqlite.close)
            return sqlite
        database = Database(
            DatabaseSettings(url=SecretStr(self.url)),
            schema=postgres_store.SCHEMA,
            application="summariser-test",
        )
        database.open(postgres_store.MIGRATIONS)
        store = PostgresSessionStore(database, owner=owner)
        self._databases[store.owner] = database
        self._closers.append(store.close)
        return store

    def outbox(self, store: Store) -> OutboxStore:
        """The core outbox store over `store`'s audit table, as that replica drains it."""
        made: OutboxStore
        if isinstance(store, SqliteSessionStore):
            made = SqliteOutbox(self.path, audit.TABLE)
        else:
            made = PostgresOutbox(self._databases[store.owner], audit.TABLE, store.owner)
        self._closers.append(made.close)
        return made

    def holds(self, needle: str) -> bool:
        """Whether `needle` is anywhere in the store: the raw bytes of the SQLite files, or
        every row of every table of the PostgreSQL schema."""
        if self.engine == "sqlite":
            data = b"".join(p.read_bytes() for p in sorted(self.folder.iterdir()) if p.is_file())
            return needle.encode() in data
        with psycopg.connect(self.url, autocommit=True) as conn:
            tables = [
                str(r[0])
                for r in conn.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                    (postgres_store.SCHEMA,),
                )
            ]
            assert "turns" in tables and "sessions" in tables
            for table in tables:
                rows = conn.execute(
                    f'SELECT t::text FROM {postgres_store.SCHEMA}."{table}" t'
                ).fetchall()
                if any(needle in str(r[0]) for r in rows):
                    return True
        return False

    def close(self) -> None:
        for close in reversed(self._closers):
            close()
        for database in self._databases.values():
            database.close()


@pytest.fixture(params=["sqlite", "postgres"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    """The contract fixture: every test that takes it runs on both engines."""
    folder = tmp_path / "data"
    folder.mkdir()
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else ""
    made = Stores(request.param, folder, url)
    yield made
    made.close()


def engine_settings(engine: str, request: pytest.FixtureRequest) -> dict[str, str]:
    """Extra settings of a summariser process on `engine` (a fresh database for
    PostgreSQL; SQLite needs none: the data dir holds the file)."""
    if engine == "sqlite":
        return {}
    return {"database__url": request.getfixturevalue("postgres_url")}


@dataclass
class Injection:
    process: ServiceProcess
    http: str

    @property
    def addr(self) -> str:
        return self.process.addr

    def count(self, text: str) -> int:
        """Tokens of `text` without <bos>, straight from CountTokens."""
        with grpc.insecure_channel(self.addr) as channel:
            reply = injection_pb2_grpc.InjectionServiceStub(channel).CountTokens(
                injection_pb2.CountTokensRequest(text=text), timeout=10
            )
        return int(reply.tokens) - 1


@pytest.fixture(scope="session")
def injection() -> Iterator[Injection]:
    http_port = reserve_port()
    env = {
        "HIPPO_INJECTION_MODEL_DIR": str(MODEL_DIR),
        "HIPPO_INJECTION_HTTP_PORT": str(http_port),
    }
    with service_process("hippo_injection", "HIPPO_INJECTION_", env) as proc:
        wait_for(proc.addr, INJECTION, timeout=300)
        yield Injection(proc, f"http://127.0.0.1:{http_port}")


@pytest.fixture
def tgi() -> Iterator[TgiDouble]:
    double = TgiDouble()
    double.start()
    yield double
    double.released.set()
    double.stop()


def summariser(
    data_dir: Path, injection_addr: str, llm_url: str, **settings: str
) -> AbstractContextManager[ServiceProcess]:
    """A summariser process; `settings` are extra HIPPO_SUMMARISER_* values (lower case)."""
    env = {
        f"{PREFIX}DATA_DIR": str(data_dir),
        f"{PREFIX}INJECTION_ADDR": injection_addr,
        f"{PREFIX}LLM_URL": llm_url,
        f"{PREFIX}AUDIT_ADDR": "",  # tests that want an audit log pass audit_addr=...
        # Small budgets so a few turns make merges; quick retries.
        f"{PREFIX}WINDOW_TOKENS": "96",
        f"{PREFIX}SUMMARY_TOKENS": "192",
        f"{PREFIX}BACKOFF_INITIAL_SECONDS": "0.2",
        f"{PREFIX}BACKOFF_MAX_SECONDS": "1",
        **{f"{PREFIX}{k.upper()}": v for k, v in settings.items()},
    }
    return service_process("hippo_summariser", PREFIX, env)


def ready(proc: ServiceProcess) -> ServiceProcess:
    wait_for(proc.addr, SUMMARISER, timeout=60)
    return proc


def stub(proc: ServiceProcess) -> summariser_pb2_grpc.SummariserServiceStub:
    return summariser_pb2_grpc.SummariserServiceStub(grpc.insecure_channel(proc.addr))


def exchange(i: int, *, prefix: str = "") -> list[pb.SessionTurn]:
    """One user/assistant exchange with facts a summary must keep (a name, numbers, an id)."""
    return [
        pb.SessionTurn(
            memory_id=f"{prefix}q{i}",
            role=memory_pb2.ROLE_USER,
            text=f"On trip {i} I met Rosa{i} and paid {100 + i} euros.",
            time_us=1_683_504_000_000_000 + i,
            speaker="Ada",
        ),
        pb.SessionTurn(
            memory_id=f"{prefix}a{i}",
            role=memory_pb2.ROLE_ASSISTANT,
            text=f"Noted, booking ref ZX-{7000 + i}.",
            time_us=1_683_504_000_000_000 + i,
            speaker="Bot",
        ),
    ]


def append(
    s: summariser_pb2_grpc.SummariserServiceStub,
    turns: list[pb.SessionTurn],
    *,
    tenant: str = "acme",
    user: str = "u1",
    session: str = "s1",
) -> pb.AppendResponse:
    return s.Append(
        pb.AppendRequest(tenant=tenant, user_id=user, session_id=session, turns=turns), timeout=30
    )


def get(
    s: summariser_pb2_grpc.SummariserServiceStub,
    *,
    tenant: str = "acme",
    user: str = "u1",
    session: str = "s1",
) -> pb.GetSessionResponse:
    return s.GetSession(
        pb.GetSessionRequest(tenant=tenant, user_id=user, session_id=session), timeout=10
    )


def flush(
    s: summariser_pb2_grpc.SummariserServiceStub,
    timeout: float = 60,
    *,
    tenant: str = "acme",
    user: str = "u1",
    session: str = "s1",
) -> pb.GetSessionResponse:
    reply = s.Flush(
        pb.FlushRequest(tenant=tenant, user_id=user, session_id=session), timeout=timeout
    )
    return reply.session


def pytest_configure(config: pytest.Config) -> None:
    # text-generation 0.7 (2023) calls pydantic v1's .dict(); harmless, and not ours.
    config.addinivalue_line(
        "filterwarnings", "ignore:The `dict` method is deprecated:DeprecationWarning"
    )
