"""Cluster mode: several RetrievalService replicas (each its own data dir, pool and
indexes) over one PostgreSQL turn store. Read-your-writes whichever replica answers,
erasure seen everywhere, restarts that resume from their own checkpoint, replicas that
die, a vector collection shared by all and written by one lease holder at a time, and
stateless replicas (both indexes shared collections, nothing on their disk)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from pydantic import SecretStr, ValidationError
from qdrant_client import QdrantClient

from hippo_core.errors import FailedPrecondition, Unavailable
from hippo_core.postgres import Database
from hippo_core.settings import DatabaseSettings
from hippo_retrieval import metrics
from hippo_retrieval.__main__ import domain
from hippo_retrieval.adapters.generations import LocalIndexSet, QdrantServer, SharedIndexSet
from hippo_retrieval.adapters.postgres_store import MIGRATIONS, SCHEMA, PostgresTurnStore
from hippo_retrieval.adapters.qdrant_vectors import QdrantVectorIndex
from hippo_retrieval.adapters.replicas import PostgresReplicas
from hippo_retrieval.adapters.shared_indexes import LeasedIndex
from hippo_retrieval.domain.models import Deletion, Mode, NewTurn, Role, Scope, StoredTurn
from hippo_retrieval.domain.retriever import FusionConfig
from hippo_retrieval.domain.service import ProjectionConfig, RetrievalService
from hippo_retrieval.domain.validation import Limits
from hippo_retrieval.settings import RetrievalSettings

DIM = 8
SCOPE = Scope("t1", "u1")


def unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def turn(text: str, seed: int, session: str = "s1") -> NewTurn:
    return NewTurn(
        memory_id=str(uuid.uuid4()),
        tenant="t1",
        user="u1",
        session=session,
        role=Role.USER,
        text=text,
        time_us=1_700_000_000_000_000 + seed,
        vector=unit(seed),
    )


class Serialised:
    """One qdrant-client local-mode client standing in for a Qdrant server shared by the
    replicas: local mode locks its folder per client and is not thread-safe, a server is
    neither, so every call goes through one lock and `close` is left to the test."""

    def __init__(self, client: QdrantClient) -> None:
        self._client = client
        self._lock = threading.RLock()

    def close(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return attr(*args, **kwargs)

        return call


@dataclass
class Cluster:
    """Replicas over one database, made and closed by the test."""

    url: str
    root: Path
    server: QdrantServer | None = None
    stateless: bool = False  # both indexes shared on `server` (SharedIndexSet)
    fused: bool = False  # stateless, in one collection fused by the server
    closing: list[Callable[[], None]] = field(default_factory=list)

    def replica(
        self,
        name: str,
        *,
        interval: float = 0.5,
        heartbeat: float = 0.2,
        expiry: float = 1.0,
        open_: bool = True,
    ) -> RetrievalService:
        database = Database(
            DatabaseSettings(url=SecretStr(self.url)), schema=SCHEMA, application=name
        )
        database.open(MIGRATIONS)
        lease = None
        if self.server is not None:
            lease = database.lease(f"vector-projector:{self.server.shared_name}")
        indexes: LocalIndexSet | SharedIndexSet
        if self.fused:
            assert self.server is not None
            one = database.lease(f"projector:{self.server.shared_fused_name}")
            indexes = SharedIndexSet(self.server, one, None)
        elif self.stateless:
            assert self.server is not None and lease is not None
            lexical_lease = database.lease(f"lexical-projector:{self.server.shared_lexical_name}")
            indexes = SharedIndexSet(self.server, lease, lexical_lease)
        else:
            indexes = LocalIndexSet(self.root / name, server=self.server, lease=lease)
        service = RetrievalService(
            PostgresTurnStore(database),
            indexes,
            fusion=FusionConfig(),
            projection=ProjectionConfig(commit_interval_s=interval, commit_every=1000),
            limits=Limits(max_turns=64, dimension=DIM),
            threads=2,
            replicas=PostgresReplicas(database, name, heartbeat_s=heartbeat, expiry_s=expiry),
        )
        closed = False

        def close() -> None:
            nonlocal closed
            if not closed:
                closed = True
                try:
                    service.close()
                finally:
                    database.close()

        self.closing.append(close)
        service.stop = close  # type: ignore[attr-defined]
        if open_:
            service.open()
        return service

    def raw(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, options=f"-c search_path={SCHEMA}", autocommit=True) as c:
            cursor = c.execute(sql, params)
            return cursor.fetchall() if cursor.description else []


@pytest.fixture
async def cluster(postgres_url: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    made = Cluster(postgres_url, tmp_path)
    yield made
    for close in reversed(made.closing):
        close()


async def lexical(service: RetrievalService, query: str) -> list[str]:
    hits = (await service.search(SCOPE, query, None, Mode.LEXICAL, 10)).hits
    return [h.turn.memory_id for h in hits]


async def semantic(service: RetrievalService, seed: int) -> list[str]:
    hits = (await service.search(SCOPE, "", unit(seed), Mode.SEMANTIC, 1)).hits
    return [h.turn.memory_id for h in hits]


async def test_a_write_waited_for_on_one_replica_is_found_on_the_other(cluster: Cluster) -> None:
    a, b = cluster.replica("a"), cluster.replica("b", interval=30.0)
    t = turn("the staging database password rotates on fridays", seed=1)
    result = await a.write("t1", [t], wait_searchable=True, timeout=5.0)
    assert result.searchable
    # B commits its BM25 index every 30 s, yet finds the turn at once: the writer asked
    # every replica to hurry and waited until each said it could search it.
    assert await lexical(b, "staging password") == [t.memory_id]
    assert await semantic(b, 1) == [t.memory_id]
    assert b.status().last_seq == a.status().last_seq == 1
    assert metrics.REPLICAS._value.get() == 2


async def test_a_replica_hears_of_other_replicas_writes_at_once(cluster: Cluster) -> None:
    """Not waited for: B still learns of A's write by notification, not at its next poll
    (its projector would sleep 30 s); its vector index, durable per apply, has it."""
    a, b = cluster.replica("a"), cluster.replica("b", interval=30.0)
    t = turn("not waited for", seed=2)
    await a.write("t1", [t], wait_searchable=False, timeout=None)
    end = time.monotonic() + 3.0
    while await semantic(b, 2) != [t.memory_id]:
        assert time.monotonic() < end, "B never heard of the write"
        await asyncio.sleep(0.02)


async def test_a_delete_on_one_replica_is_applied_on_every_replica(cluster: Cluster) -> None:
    a, b = cluster.replica("a"), cluster.replica("b")
    keep, gone = turn("ordinary note", seed=3), turn("canary zebra-4711 phrase", seed=4)
    await a.write("t1", [keep, gone], wait_searchable=True, timeout=5.0)
    assert await lexical(a, "zebra-4711") == [gone.memory_id]
    assert await b.delete("t1", "u1", None, [gone.memory_id], timeout=5.0) == [gone.memory_id]
    assert await lexical(a, "zebra-4711 canary") == []
    assert gone.memory_id not in await semantic(a, 4)
    status = a.status()  # applied in A's own indexes before B's Delete returned
    assert status.lexical_seq == status.vector_seq == status.last_seq


async def test_a_restarted_replica_applies_only_what_it_missed(cluster: Cluster) -> None:
    a, b = cluster.replica("a"), cluster.replica("b")
    first = [turn(f"early note {i}", seed=10 + i) for i in range(5)]
    await a.write("t1", first, wait_searchable=True, timeout=5.0)
    b.stop()  # type: ignore[attr-defined]
    # B left cleanly: nobody waits for it.
    assert cluster.raw("SELECT replica_id FROM replicas") == [("a",)]
    late = [turn(f"latecomer {i}", seed=20 + i) for i in range(3)]
    started = time.monotonic()
    assert (await a.write("t1", late, wait_searchable=True, timeout=5.0)).searchable
    assert time.monotonic() - started < 1.0
    again = cluster.replica("b", open_=False)
    assert again.open() == 3  # its indexes kept seq 5: three changes to apply, not eight
    assert set(await lexical(again, "latecomer")) == {t.memory_id for t in late}
    assert await semantic(again, 11) == [first[1].memory_id]


async def test_a_silent_replica_delays_writers_until_it_expires(cluster: Cluster) -> None:
    """A replica that stops heartbeating (killed, cut off) is waited for at most until it
    expires; one that heartbeats but lags makes a waited-for write time out."""
    a = cluster.replica("a", expiry=1.0)
    # The row a replica leaves when it is killed: far behind, and silent from now on.
    now_us = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
    cluster.raw(f"INSERT INTO replicas VALUES ('b', 0, 0, {now_us})")
    started = time.monotonic()
    assert (await a.write("t1", [turn("one", seed=30)], True, timeout=5.0)).searchable
    assert 0.5 <= time.monotonic() - started < 3.0
    # Lagging but alive (its heartbeat is fresh for the whole call): the wait times out.
    cluster.raw(f"UPDATE replicas SET heartbeat_us = {now_us} + 60000000 WHERE replica_id = 'b'")
    result = await a.write("t1", [turn("two", seed=31)], True, timeout=0.5)
    assert not result.searchable and result.turns[0][1]  # stored, not yet everywhere


# -- a vector collection shared by every replica ------------------------------------------


@pytest.fixture
def shared_qdrant(tmp_path: Path) -> Iterator[QdrantServer]:
    client = QdrantClient(path=str(tmp_path / "qdrant"))
    shared = Serialised(client)
    yield QdrantServer("http://unused", None, "turns", 5.0, connect=lambda: shared)  # type: ignore[arg-type, return-value]
    client.close()


def advisory_locks(cluster: Cluster, expected: int, timeout: float = 5.0) -> int:
    """The advisory locks held, once they are `expected` or `timeout` has passed: leases
    are taken by each replica's projector thread, which with an empty feed runs after
    `open()` has returned."""
    deadline = time.monotonic() + timeout
    while True:
        rows = cluster.raw("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted")
        held = int(rows[0][0])
        if held == expected or time.monotonic() >= deadline:
            return held
        time.sleep(0.05)


def stored(seq: int, seed: int) -> StoredTurn:
    return StoredTurn(
        seq, f"00000000-0000-4000-8000-{seed:012d}", "t1", "u1", "s1", Role.USER, "x",
        1, "", {}, unit(seed),
    )  # fmt: skip


def test_the_shared_index_is_written_only_under_its_lease(
    postgres_url: str, shared_qdrant: QdrantServer
) -> None:
    """One writer at a time; a reader's applied seq is the writer's; a new writer goes on
    from the recorded seq; changes the collection has already applied are not re-applied
    (an older put after the deletion would bring an erased point back)."""
    databases = [
        Database(DatabaseSettings(url=SecretStr(postgres_url)), schema=SCHEMA, application=n)
        for n in ("a", "b")
    ]
    indexes = []
    for db in databases:
        db.open(MIGRATIONS)
        collection = QdrantVectorIndex(shared_qdrant.client(), "turns_shared", DIM)
        indexes.append(LeasedIndex(collection, db.lease("vectors"), retry_s=0.0))
    a, b = indexes
    try:
        assert a.writable() and not b.writable()
        assert metrics.VECTOR_WRITER._value.get() == 1
        with pytest.raises(Unavailable):
            b.apply([stored(1, 1)])
        a.apply([stored(1, 1), stored(2, 2), Deletion(3, "t1", stored(1, 1).memory_id)])
        assert b.applied_seq() == 3 and b.count() == 1
        a.apply([stored(1, 1)])  # already applied: ignored, the point stays erased
        assert a.count() == 1 and a.applied_seq() == 3
        a.shutdown()
        assert metrics.VECTOR_WRITER._value.get() == 0
        assert b.writable()
        assert metrics.VECTOR_WRITER._value.get() == 1
        assert b.applied_seq() == 3  # from the collection's record, not from zero
        b.apply([stored(4, 4)])
        assert b.applied_seq() == 4 and b.count() == 2
    finally:
        for index in indexes:
            index.shutdown()
        for db in databases:
            db.close()


async def test_one_replica_writes_the_shared_collection_the_others_search_it(
    shared_qdrant: QdrantServer, cluster: Cluster
) -> None:
    cluster.server = shared_qdrant
    a, b = cluster.replica("a"), cluster.replica("b")
    assert a.status().vector_backend == b.status().vector_backend == "qdrant"
    assert advisory_locks(cluster, 1) == 1  # one writer
    turns = [turn(f"shared note {i}", seed=40 + i) for i in range(4)]
    await b.write("t1", turns[:2], wait_searchable=True, timeout=5.0)
    await a.write("t1", turns[2:], wait_searchable=True, timeout=5.0)
    for replica in (a, b):
        for i, t in enumerate(turns):
            assert await semantic(replica, 40 + i) == [t.memory_id]
    names = {c.name for c in shared_qdrant.client().get_collections().collections}
    assert names == {"turns_shared", "turns_shared_meta"}
    assert shared_qdrant.client().count("turns_shared", exact=True).count == 4
    # The writer goes: the other takes the lease over and applies what comes next.
    writer = a if a._live and a._live.vectors.writable() else b  # type: ignore[union-attr]
    other = b if writer is a else a
    writer.stop()  # type: ignore[attr-defined]
    late = turn("after the writer left", seed=50)
    assert (await other.write("t1", [late], wait_searchable=True, timeout=8.0)).searchable
    assert await semantic(other, 50) == [late.memory_id]
    assert advisory_locks(cluster, 1) == 1
    # A reindex rebuilds the replica's own BM25 index; the shared collection stays.
    [p async for p in other.reindex()]
    assert other.status().generation == 2
    assert await semantic(other, 41) == [turns[1].memory_id]
    assert shared_qdrant.client().count("turns_shared", exact=True).count == 5


@pytest.mark.parametrize("stateless", [False, True])
async def test_a_replica_starting_behind_the_shared_writer_waits_for_it(
    shared_qdrant: QdrantServer, cluster: Cluster, stateless: bool
) -> None:
    """SERVING only once caught up: a replica that does not write the shared collection
    (stateless: either shared collection) still waits, at start, until its writer has
    applied the feed."""
    cluster.server, cluster.stateless = shared_qdrant, stateless
    a = cluster.replica("a", interval=0.2)
    await a.write("t1", [turn(f"n{i}", seed=60 + i) for i in range(3)], False, None)
    b = cluster.replica("b")  # open() returned: caught up in both of its indexes
    status = b.status()
    assert status.lexical_seq == status.vector_seq == status.last_seq == 3


# -- stateless: both indexes shared, nothing on the replica's disk -------------------------


async def test_stateless_replicas_share_both_indexes_and_write_nothing_locally(
    shared_qdrant: QdrantServer, cluster: Cluster
) -> None:
    cluster.server, cluster.stateless = shared_qdrant, True
    a, b = cluster.replica("a"), cluster.replica("b")
    status = a.status()
    assert (status.lexical_backend, status.vector_backend) == ("qdrant", "qdrant")
    assert advisory_locks(cluster, 2) == 2  # one writer per shared collection
    words = ["apricot", "blueberry", "cranberry", "damson"]
    turns = [turn(f"a note about {w}", seed=70 + i, session=w) for i, w in enumerate(words)]
    await b.write("t1", turns[:2], wait_searchable=True, timeout=5.0)
    await a.write("t1", turns[2:], wait_searchable=True, timeout=5.0)
    for replica in (a, b):
        for i, (w, t) in enumerate(zip(words, turns, strict=True)):
            assert await lexical(replica, w) == [t.memory_id]
            assert await semantic(replica, 70 + i) == [t.memory_id]
    client = shared_qdrant.client()
    names = {c.name for c in client.get_collections().collections}
    assert names == {
        "turns_shared",
        "turns_shared_meta",
        "turns_lexical_shared",
        "turns_lexical_shared_meta",
    }
    # An erasure leaves both vector spaces (no purge rebuild: nothing here to rewrite).
    assert await b.delete("t1", "u1", None, [turns[0].memory_id], timeout=5.0)
    for name in ("turns_shared", "turns_lexical_shared"):
        assert client.count(name, exact=True).count == 3
    assert await lexical(a, "apricot") == []
    assert not a._indexes.purge_pending()  # type: ignore[attr-defined]
    # No replica can rebuild what the others search.
    with pytest.raises(FailedPrecondition, match="stateless"):
        [p async for p in a.reindex()]
    # The writers go: the other replica takes both leases and goes on from the
    # collections' records; a restarted replica resumes from them too.
    a.stop()  # type: ignore[attr-defined]
    late = turn("a note about elderberry", seed=80)
    assert (await b.write("t1", [late], wait_searchable=True, timeout=8.0)).searchable
    assert await lexical(b, "elderberry") == [late.memory_id]
    assert advisory_locks(cluster, 2) == 2
    again = cluster.replica("a")
    assert again.status().lexical_seq == again.status().last_seq
    assert await lexical(again, "elderberry") == [late.memory_id]
    # Nothing under the root but the stand-in server's folder: no replica wrote a file.
    assert {p.relative_to(cluster.root).parts[0] for p in cluster.root.rglob("*")} == {"qdrant"}


async def test_stateless_with_server_side_fusion_one_collection_one_writer(
    shared_qdrant: QdrantServer, cluster: Cluster
) -> None:
    """fusion=server: both vectors of a turn in one shared collection, written by the one
    lease holder; every replica's hybrid search is fused by the server and finds what
    either replica wrote; an erasure leaves it; the lease moves when the writer goes."""
    cluster.server, cluster.fused = shared_qdrant, True
    a, b = cluster.replica("a"), cluster.replica("b")
    assert advisory_locks(cluster, 1) == 1  # one writer for the one collection
    words = ["apricot", "blueberry", "cranberry"]
    turns = [turn(f"a note about {w}", seed=90 + i, session=w) for i, w in enumerate(words)]
    await a.write("t1", turns[:2], wait_searchable=True, timeout=5.0)
    await b.write("t1", turns[2:], wait_searchable=True, timeout=5.0)
    for replica in (a, b):
        for i, (w, t) in enumerate(zip(words, turns, strict=True)):
            result = await replica.search(SCOPE, w, unit(90 + i), Mode.HYBRID, 3)
            assert result.engine_fused and result.hits[0].turn.memory_id == t.memory_id
    client = shared_qdrant.client()
    names = {c.name for c in client.get_collections().collections}
    assert names == {"turns_fused_shared", "turns_fused_shared_meta"}
    assert await b.delete("t1", "u1", None, [turns[0].memory_id], timeout=5.0)
    assert client.count("turns_fused_shared", exact=True).count == 2
    assert await lexical(a, "apricot") == []
    with pytest.raises(FailedPrecondition, match="stateless"):
        [p async for p in a.reindex()]
    writer = a if a._live and a._live.vectors.writable() else b  # type: ignore[union-attr]
    other = b if writer is a else a
    writer.stop()  # type: ignore[attr-defined]
    late = turn("a note about damson", seed=99)
    assert (await other.write("t1", [late], wait_searchable=True, timeout=8.0)).searchable
    found = await other.search(SCOPE, "damson", unit(99), Mode.HYBRID, 1)
    assert [h.turn.memory_id for h in found.hits] == [late.memory_id]
    assert advisory_locks(cluster, 1) == 1
    assert {p.relative_to(cluster.root).parts[0] for p in cluster.root.rglob("*")} == {"qdrant"}


def test_the_service_wiring_picks_stateless_mode_and_makes_no_data_dir(
    postgres_url: str, tmp_path: Path
) -> None:
    """From settings (what the process runs): PostgreSQL, a Qdrant server and
    lexical_index=qdrant make a service over SharedIndexSet, and nothing is created
    under data_dir (the collections are only opened by `open()`, against the server)."""
    data_dir = tmp_path / "data"
    settings = RetrievalSettings(
        data_dir=str(data_dir),
        database=DatabaseSettings(url=SecretStr(postgres_url)),
        qdrant_url="http://127.0.0.1:9",
        lexical_index="qdrant",
        embedding_addr="",
    )
    service, release = domain(settings)
    try:
        assert isinstance(service._indexes, SharedIndexSet)  # type: ignore[attr-defined]
        assert service._indexes.local_files is False  # type: ignore[attr-defined]
        assert not service._indexes.fused  # type: ignore[attr-defined]
    finally:
        release()
    # fusion=server: one collection for both, fused by the server.
    service, release = domain(settings.model_copy(update={"fusion": "server"}))
    try:
        assert service._indexes.fused  # type: ignore[attr-defined]
    finally:
        release()
    assert not data_dir.exists()
    # The same without lexical_index=qdrant keeps a Tantivy index under data_dir.
    service, release = domain(settings.model_copy(update={"lexical_index": "tantivy"}))
    try:
        assert isinstance(service._indexes, LocalIndexSet)  # type: ignore[attr-defined]
    finally:
        release()


# -- settings ------------------------------------------------------------------------------


def test_replica_names_are_stable_per_data_dir(tmp_path: Path) -> None:
    one = RetrievalSettings(data_dir=str(tmp_path / "a"))
    assert one.replica_name() == RetrievalSettings(data_dir=str(tmp_path / "a")).replica_name()
    assert one.replica_name() != RetrievalSettings(data_dir=str(tmp_path / "b")).replica_name()
    assert RetrievalSettings(replica_id="r-1").replica_name() == "r-1"
    with pytest.raises(ValidationError, match="twice"):
        RetrievalSettings(replica_heartbeat_seconds=1.0, replica_expiry_seconds=1.5)


def test_server_side_fusion_needs_both_indexes_on_a_qdrant_server() -> None:
    for missing in ({"lexical_index": "tantivy"}, {"qdrant_url": ""}):
        fields = {"fusion": "server", "lexical_index": "qdrant", "qdrant_url": "http://q:6333"}
        with pytest.raises(ValidationError, match="fusion=server needs"):
            RetrievalSettings(**{**fields, **missing})  # type: ignore[arg-type]
    assert RetrievalSettings(fusion="server", lexical_index="qdrant", qdrant_url="http://q:6333")
