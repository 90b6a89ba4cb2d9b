"""A real cluster for the gateway's tests: embedding, retrieval and gateway processes on
loopback (session scope: the model loads once), and stubs that carry an API key. And for
the audit recorder's unit tests: the spool's stores on both engines, and a double of the
audit service."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from pydantic import SecretStr

from hippo.memory.v1 import memory_pb2_grpc
from hippo_core import outbox
from hippo_core.errors import InvalidArgument, Unavailable
from hippo_core.listen import reserve_port
from hippo_core.postgres import Database
from hippo_core.settings import DatabaseSettings
from hippo_core.testing import ServiceProcess, service_process, wait_for
from hippo_gateway.adapters import spool_store
from hippo_gateway.domain.audit_events import (
    AuditEvent,
    AuditItem,
    AuditRecord,
    EraseUser,
    Verification,
)

KEYS = {"key-acme": "acme", "key-globex": "globex", "key-initech": "initech"}
# The tenants' keys above are admins (every RPC; the audit tests read the whole log); these
# carry narrower roles, for the role tests.
ROLE_KEYS = {
    "key-acme-app": {"tenant": "acme"},  # the default: read, write, erase
    "key-acme-reader": {"tenant": "acme", "roles": ["read"]},
    "key-acme-auditor": {"tenant": "acme", "roles": ["audit-read"]},
    "key-globex-app": {"tenant": "globex"},
    # Tenants of their own for the quota tests (no other test stores turns there).
    "key-rated": {"tenant": "rated"},
    "key-quotas": {"tenant": "quotas"},
}
EMBEDDING = "hippo.embedding.v1.EmbeddingService"
RETRIEVAL = "hippo.retrieval.v1.RetrievalService"
GATEWAY = "hippo.memory.v1.MemoryService"
AUDIT = "hippo.audit.v1.AuditService"


def retrieval_process(
    data_dir: Path, port: int | None = None
) -> AbstractContextManager[ServiceProcess]:
    env = {"HIPPO_RETRIEVAL_DATA_DIR": str(data_dir)}
    if port is not None:
        env["HIPPO_RETRIEVAL_PORT"] = str(port)
    return service_process("hippo_retrieval", "HIPPO_RETRIEVAL_", env)


def audit_process(
    data_dir: Path, port: int | None = None
) -> AbstractContextManager[ServiceProcess]:
    env = {"HIPPO_AUDIT_DATA_DIR": str(data_dir), "HIPPO_AUDIT_GRACE_SECONDS": "2"}
    if port is not None:
        env["HIPPO_AUDIT_PORT"] = str(port)
    return service_process("hippo_audit", "HIPPO_AUDIT_", env)


def gateway_process(
    embedding: str,
    retrieval: str,
    audit: str = "",
    data_dir: Path | None = None,
    **extra: str,
) -> AbstractContextManager[ServiceProcess]:
    """`audit` empty: no audit log. `data_dir` (the audit spool) defaults to a fresh one."""
    env = {
        "HIPPO_GATEWAY_API_KEYS": json.dumps(
            {**{k: {"tenant": t, "roles": ["admin"]} for k, t in KEYS.items()}, **ROLE_KEYS}
        ),
        "HIPPO_GATEWAY_EMBEDDING_ADDR": embedding,
        "HIPPO_GATEWAY_RETRIEVAL_ADDR": retrieval,
        "HIPPO_GATEWAY_CLIENT__TIMEOUT_SECONDS": "5",
        "HIPPO_GATEWAY_SUMMARISER_ADDR": "",  # recall tests: no bounded sessions
        "HIPPO_GATEWAY_INJECTION_ADDR": "",  # nor an LLM host (and so no memtoks)
        "HIPPO_GATEWAY_AUDIT_ADDR": audit,
        "HIPPO_GATEWAY_DATA_DIR": str(data_dir or tempfile.mkdtemp(prefix="gateway-")),
        **{f"HIPPO_GATEWAY_{name.upper()}": value for name, value in extra.items()},
    }
    return service_process("hippo_gateway", "HIPPO_GATEWAY_", env)


@dataclass
class Cluster:
    embedding: ServiceProcess
    retrieval: ServiceProcess
    gateway: ServiceProcess
    retrieval_dir: Path
    audit: ServiceProcess


@pytest.fixture(scope="session")
def embedding() -> Iterator[ServiceProcess]:
    with service_process("hippo_embedding", "HIPPO_EMBEDDING_") as proc:
        wait_for(proc.addr, EMBEDDING, timeout=120)
        yield proc


@pytest.fixture(scope="session")
def cluster(
    embedding: ServiceProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    data_dir = tmp_path_factory.mktemp("retrieval")
    with ExitStack() as stack:
        retrieval = stack.enter_context(retrieval_process(data_dir, reserve_port()))
        audit = stack.enter_context(audit_process(tmp_path_factory.mktemp("audit")))
        wait_for(retrieval.addr, RETRIEVAL, timeout=60)
        wait_for(audit.addr, AUDIT, timeout=60)
        gateway = stack.enter_context(
            gateway_process(
                embedding.addr, retrieval.addr, audit.addr, tmp_path_factory.mktemp("gateway")
            )
        )
        wait_for(gateway.addr, GATEWAY, timeout=60)
        yield Cluster(embedding, retrieval, gateway, data_dir, audit)


@pytest.fixture
def stub(cluster: Cluster) -> Iterator[memory_pb2_grpc.MemoryServiceStub]:
    with grpc.insecure_channel(cluster.gateway.addr) as channel:
        yield memory_pb2_grpc.MemoryServiceStub(channel)


def key_of(tenant: str) -> tuple[tuple[str, str], ...]:
    key = next(k for k, t in KEYS.items() if t == tenant)
    return (("x-api-key", key),)


# -- the audit spool on both engines, and a double of the audit service -----------------------

MakeStore = Callable[[], outbox.OutboxStore]


def gateway_database(url: str) -> Database:
    """The gateway's schema on `url`, migrated as a gateway replica does at start."""
    database = Database(
        DatabaseSettings(url=SecretStr(url)), schema="hippo_gateway", application="test"
    )
    database.open(spool_store.POSTGRES_MIGRATIONS)
    return database


@pytest.fixture(params=["sqlite", "postgres"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MakeStore]:
    """A factory of spool stores, as the gateway opens them: each call is another process
    on the same spool (a restart on the same SQLite file; another replica, with its own
    owner id and connections, on the same PostgreSQL schema). The recorder closes them."""
    databases: list[Database] = []
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else ""

    def make() -> outbox.OutboxStore:
        if not url:
            return spool_store.sqlite_store(tmp_path / "gateway")
        databases.append(gateway_database(url))
        return spool_store.postgres_store(databases[-1], outbox.new_owner())

    yield make
    for database in databases:
        database.close()


class FakeLog:
    """The audit service's contract in memory: appends in order, one entry per event_id.
    `delivered` lists every event id each successful Append carried (duplicates
    included), so a test can tell "appended once" from "delivered once"."""

    def __init__(self) -> None:
        self.entries: list[AuditItem] = []
        self.seq_of: dict[str, int] = {}
        self.delivered: list[str] = []
        self.down = False
        self.lose_next_reply = False  # append, then fail as if the reply were lost
        self.refuse: set[str] = set()  # event ids refused with INVALID_ARGUMENT

    def _add(self, item: AuditItem) -> int:
        self.delivered.append(item.event_id)
        if item.event_id not in self.seq_of:
            self.entries.append(item)
            self.seq_of[item.event_id] = len(self.entries)
        return self.seq_of[item.event_id]

    async def append(self, events: Sequence[AuditEvent]) -> list[int]:
        if self.down:
            raise Unavailable("audit: connection refused")
        if any(e.event_id in self.refuse for e in events):
            raise InvalidArgument("entries[0].body", "refused")
        seqs = [self._add(e) for e in events]
        if self.lose_next_reply:
            self.lose_next_reply = False
            raise Unavailable("audit: the reply was lost")
        return seqs

    async def erase_user(self, erase: EraseUser) -> int:
        if self.down:
            raise Unavailable("audit: connection refused")
        return self._add(erase)

    async def read(
        self, tenant: str, user: str, session: str, after_seq: int, to_seq: int, limit: int
    ) -> tuple[list[AuditRecord], int]:
        out = [
            AuditRecord(
                i,
                0,
                e.actor,
                e.event_type,
                e.user,
                e.session,
                e.memory_ids,
                e.body,
                e.private,
                "readable",
                "",
                "",
            )
            for i, e in enumerate(self.entries, start=1)
            if isinstance(e, AuditEvent)
            and e.tenant == tenant
            and e.user == user
            and (not session or e.session == session)
            and i > after_seq
            and (not to_seq or i <= to_seq)
        ]
        return out[:limit], out[limit - 1].seq if len(out) > limit else 0

    async def verify(self, from_seq: int, to_seq: int, tenant: str = "") -> Verification:
        mine = [
            i
            for i, e in enumerate(self.entries, start=1)
            if isinstance(e, AuditEvent) and e.tenant == tenant
        ]
        return Verification(
            True,
            len(self.entries),
            0,
            "",
            len(self.entries),
            "00",
            tenant_entries=len(mine),
            tenant_head_seq=mine[-1] if mine else 0,
            tenant_head_hash="01" if mine else "",
        )

    def types(self) -> list[str]:
        return [e.event_type if isinstance(e, AuditEvent) else "erase" for e in self.entries]
