"""The retrieval use cases over the real stores (SQLite, Tantivy or BM25 in qdrant-edge,
qdrant-edge) in tmp_path: write-to-searchable, delete everywhere, status, and the online
reindex. The `service` fixture runs each test with both lexical indexes."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from qdrant_client import QdrantClient

from hippo_core.errors import FailedPrecondition, InvalidArgument
from hippo_retrieval.adapters.generations import LocalIndexSet, QdrantServer
from hippo_retrieval.adapters.sqlite_store import SqliteTurnStore
from hippo_retrieval.domain.models import Mode, NewTurn, Role, Scope
from hippo_retrieval.domain.retriever import FusionConfig
from hippo_retrieval.domain.service import ProjectionConfig, RetrievalService
from hippo_retrieval.domain.validation import Limits

DIM = 8
RNG = np.random.default_rng(7)


def unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def turn(text: str, *, user: str = "u1", session: str = "s1", seed: int = 0) -> NewTurn:
    return NewTurn(
        memory_id=str(uuid.uuid4()),
        tenant="t1",
        user=user,
        session=session,
        role=Role.USER,
        text=text,
        time_us=1_700_000_000_000_000,
        vector=unit(seed),
    )


class Shared(QdrantClient):
    """Local mode locks its folder per client (a server has no such lock): every
    generation shares this one, closed by the test that made it."""

    def close(self, grpc_grace: float | None = None, **kwargs: object) -> None:
        pass


def local_server(path: Path) -> tuple[QdrantServer, Shared]:
    """A Qdrant "server" over qdrant-client's local mode (the same client API)."""
    shared = Shared(path=str(path))
    return QdrantServer("http://unused", None, "turns", 5.0, connect=lambda: shared), shared


def make(
    root: Path,
    interval: float = 0.5,
    lexical: str = "tantivy",
    server: QdrantServer | None = None,
) -> RetrievalService:
    """lexical "fused": BM25 and vectors in one collection of `server`, fused there."""
    fused = lexical == "fused"
    indexes = LocalIndexSet(
        root, server=server, lexical="qdrant" if fused else lexical, fused=fused
    )
    return RetrievalService(
        SqliteTurnStore(root / "turns.sqlite3"),
        indexes,
        fusion=FusionConfig(),
        projection=ProjectionConfig(commit_interval_s=interval, commit_every=1000),
        limits=Limits(max_turns=64, dimension=DIM),
        threads=2,
    )


@pytest.fixture(params=["tantivy", "qdrant", "fused"])
async def service(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[RetrievalService]:
    server, shared = local_server(tmp_path / "qdrant") if request.param == "fused" else (None, None)
    svc = make(tmp_path, lexical=request.param, server=server)
    svc.open()
    yield svc
    svc.close()
    if shared is not None:
        QdrantClient.close(shared)


async def test_a_write_waited_for_is_searchable_in_both_indexes(service: RetrievalService) -> None:
    t = turn("the deploy key rotates every 90 days", seed=1)
    result = await service.write("t1", [t], wait_searchable=True, timeout=2.0)
    assert result.searchable and result.turns[0][1] is True
    assert result.turns[0][0].position == 1
    scope = Scope("t1", "u1")
    lexical = await service.search(scope, "deploy key", None, Mode.LEXICAL, 5)
    semantic = await service.search(scope, "", unit(1), Mode.SEMANTIC, 5)
    assert [h.turn.memory_id for h in lexical.hits] == [t.memory_id]
    assert [h.turn.memory_id for h in semantic.hits] == [t.memory_id]
    status = service.status()
    assert status.lexical_seq == status.vector_seq == status.last_seq == 1
    assert status.turns == 1
    assert (status.lexical_backend, status.vector_backend) in {
        ("tantivy", "edge"),
        ("qdrant", "edge"),
        ("qdrant", "qdrant"),  # one server collection holds both ("fused")
    }


async def test_without_waiting_a_write_is_searchable_within_the_commit_interval(
    service: RetrievalService,
) -> None:
    t = turn("quarterly invoices are filed on the fifth")
    await service.write("t1", [t], wait_searchable=False, timeout=None)
    loop = asyncio.get_running_loop()
    end = loop.time() + 1.0  # the bound: searchable within 1 s
    while loop.time() < end:
        hits = (await service.search(Scope("t1", "u1"), "invoices", None, Mode.LEXICAL, 5)).hits
        if hits:
            break
        await asyncio.sleep(0.02)
    assert [h.turn.memory_id for h in hits] == [t.memory_id]


async def test_positions_count_per_session(service: RetrievalService) -> None:
    a = await service.write("t1", [turn("a"), turn("b")], False, None)
    b = await service.write("t1", [turn("c", session="s2"), turn("d")], False, None)
    assert [t.position for t, _ in a.turns] == [1, 2]
    assert [t.position for t, _ in b.turns] == [1, 3]


async def test_delete_erases_from_every_mode(service: RetrievalService) -> None:
    keep, canary = turn("ordinary note", seed=2), turn("canary zebra-4711 phrase", seed=3)
    await service.write("t1", [keep, canary], wait_searchable=True, timeout=2.0)
    erased = await service.delete("t1", "u1", None, [canary.memory_id], timeout=2.0)
    assert erased == [canary.memory_id]
    scope = Scope("t1", "u1")
    for mode, query, vector in (
        (Mode.LEXICAL, "zebra-4711 canary", None),
        (Mode.SEMANTIC, "", unit(3)),
        (Mode.HYBRID, "zebra-4711 canary", unit(3)),
    ):
        hits = (await service.search(scope, query, vector, mode, 10)).hits
        assert canary.memory_id not in {h.turn.memory_id for h in hits}, mode
    status = service.status()
    assert status.lexical_seq == status.vector_seq == status.last_seq  # applied, not just hidden


async def test_turns_are_indexed_in_context_and_erasure_rewrites_the_context(
    service: RetrievalService,
) -> None:
    """BM25 finds a turn by the words of the turn before it, its speaker and its date; once
    that previous turn is erased, its words are gone from the next turn's document too."""
    first = NewTurn(
        str(uuid.uuid4()), "t1", "u1", "s1", Role.USER, "Did you finish the marathon?",
        1_683_504_000_000_000, metadata={"speaker": "Ada"}, vector=unit(1),
    )  # fmt: skip
    second = NewTurn(
        str(uuid.uuid4()), "t1", "u1", "s1", Role.ASSISTANT, "Yes! In four hours.",
        1_683_504_000_000_000, metadata={"speaker": "Bo", "attachment": "a medal"},
        vector=unit(2),
    )  # fmt: skip
    await service.write("t1", [first, second], wait_searchable=True, timeout=2.0)
    scope = Scope("t1", "u1")

    async def lexical(query: str) -> list[str]:
        hits = (await service.search(scope, query, None, Mode.LEXICAL, 10)).hits
        return [h.turn.memory_id for h in hits]

    assert set(await lexical("marathon")) == {first.memory_id, second.memory_id}
    assert await lexical("Bo medal") == [second.memory_id]
    assert set(await lexical("May 2023")) == {first.memory_id, second.memory_id}
    assert await lexical("what did Bo say") == [second.memory_id]  # stop words dropped
    await service.delete("t1", "u1", None, [first.memory_id], timeout=2.0)
    assert await lexical("marathon") == []  # not even through the next turn's context
    assert await lexical("four hours") == [second.memory_id]


async def test_bad_requests_name_the_field(service: RetrievalService) -> None:
    with pytest.raises(InvalidArgument, match=r"turns\[0\]\.vector: must hold 8"):
        bad = turn("x")
        object.__setattr__(bad, "vector", np.ones(3, np.float32))
        await service.write("t1", [bad], False, None)
    with pytest.raises(InvalidArgument, match=r"turns\[0\]\.text: must not contain NUL"):
        await service.write("t1", [turn("a\x00b")], False, None)
    with pytest.raises(InvalidArgument, match="user_id: must not contain NUL"):
        await service.search(Scope("t1", "u\x00"), "q", None, Mode.LEXICAL, 5)
    with pytest.raises(InvalidArgument, match="tenant: is required"):
        await service.write("", [turn("x")], False, None)
    with pytest.raises(InvalidArgument, match=r"turns: must hold 1\.\.64"):
        await service.write("t1", [turn(str(i)) for i in range(65)], False, None)
    with pytest.raises(InvalidArgument, match="vector: is required in hybrid"):
        await service.search(Scope("t1", "u1"), "q", None, Mode.HYBRID, 5)
    with pytest.raises(InvalidArgument, match="user_id: is required"):
        await service.search(Scope("t1", ""), "q", None, Mode.LEXICAL, 5)
    with pytest.raises(InvalidArgument, match="vector: holds NaN"):
        await service.search(
            Scope("t1", "u1"), "q", np.full(DIM, np.nan, np.float32), Mode.SEMANTIC, 5
        )
    assert service.status().last_seq == 0  # nothing was half written


async def test_reindex_rebuilds_while_searches_and_writes_continue(tmp_path: Path) -> None:
    service = make(tmp_path)
    service.open()
    try:
        turns = [turn(f"note number {i} about topic{i % 7}", seed=i) for i in range(300)]
        for start in range(0, len(turns), 50):
            await service.write("t1", turns[start : start + 50], True, timeout=5.0)
        scope = Scope("t1", "u1")
        before = await service.search(scope, "topic5", None, Mode.LEXICAL, 100)

        stop = asyncio.Event()
        late: list[NewTurn] = []

        async def keep_busy() -> None:
            i = 0
            while not stop.is_set():
                t = turn(f"late write {i} topic3", seed=1000 + i)
                await service.write("t1", [t], False, None)
                late.append(t)
                await service.search(scope, "topic3", unit(5), Mode.HYBRID, 20)
                i += 1
                await asyncio.sleep(0.005)

        busy = asyncio.create_task(keep_busy())
        reports = [p async for p in service.reindex()]
        stop.set()
        await busy
        assert reports[-1].done and reports[-1].applied >= 300
        assert all(not r.done for r in reports[:-1])
        assert service.status().generation == 2
        assert not (tmp_path / "indexes" / "g000001").exists()  # the old one is gone
        assert (tmp_path / "indexes" / "CURRENT").read_text().strip() == "2"

        await service.write(  # a vector of its own: seed 0 would tie with turns[0]
            "t1", [turn("after the switch", seed=99_999)], wait_searchable=True, timeout=2.0
        )
        after = await service.search(scope, "topic5", None, Mode.LEXICAL, 100)
        assert len(before.hits) >= 43  # i % 7 == 5 for 43 of 0..299 (and their successors)
        late_ids = {t.memory_id for t in late}  # the first late write quotes turn 299 (topic5)
        assert {h.turn.memory_id for h in after.hits} - late_ids == {
            h.turn.memory_id for h in before.hits
        }
        for t in turns[::15]:  # every old turn is still found by its own vector
            hits = (await service.search(scope, "", t.vector, Mode.SEMANTIC, 1)).hits
            assert hits[0].turn.memory_id == t.memory_id
        assert 0 < len(late) <= 100, len(late)
        every = await service.search(scope, "late write", None, Mode.LEXICAL, 100)
        assert {t.memory_id for t in late} <= {h.turn.memory_id for h in every.hits}
    finally:
        service.close()
    reopened = make(tmp_path)  # restarts on the new generation, nothing to catch up
    try:
        assert reopened.open() == 0
        assert reopened.status().generation == 2
    finally:
        reopened.close()


async def test_one_reindex_at_a_time(service: RetrievalService) -> None:
    await service.write("t1", [turn(f"t{i}") for i in range(50)], False, None)
    first = service.reindex()
    await first.__anext__()  # running now
    with pytest.raises(FailedPrecondition, match="already running"):
        await service.reindex().__anext__()
    async for _ in first:
        pass
    assert service.status().generation == 2


async def test_open_catches_up_what_the_indexes_missed(tmp_path: Path) -> None:
    make(tmp_path).close()  # indexes exist, empty
    store = SqliteTurnStore(tmp_path / "turns.sqlite3")  # a write the indexes never saw
    t = turn("written while the indexes were behind", seed=9)
    store.append([t])
    store.close()
    again = make(tmp_path)
    try:
        assert again.open() == 1
        hits = (await again.search(Scope("t1", "u1"), "behind", unit(9), Mode.HYBRID, 5)).hits
        assert [h.turn.memory_id for h in hits] == [t.memory_id]
        assert set(hits[0].fused.ranks) == {"lexical", "semantic"}
    finally:
        again.close()


@pytest.mark.parametrize("lexical", ["tantivy", "qdrant", "fused"])
async def test_the_service_over_a_qdrant_server_backend(tmp_path: Path, lexical: str) -> None:
    """The server path of the index generations (collections `<prefix>_g<n>`, and
    `<prefix>_lexical_g<n>` with BM25 on the server too, or one `<prefix>_fused_g<n>`
    holding both, fused by the server), run over qdrant-client's local mode, which
    speaks the same client API as a server."""
    server, shared = local_server(tmp_path / "qdrant")
    service = make(tmp_path, lexical=lexical, server=server)
    service.open()
    try:
        assert service.status().vector_backend == "qdrant"
        assert service.status().lexical_backend == ("qdrant" if lexical == "fused" else lexical)
        t = turn("kept on the server", seed=4)
        await service.write("t1", [t], wait_searchable=True, timeout=5.0)
        result = await service.search(Scope("t1", "u1"), "server", unit(4), Mode.HYBRID, 5)
        assert [h.turn.memory_id for h in result.hits] == [t.memory_id]
        # The server's fusion does not say what each retriever ranked.
        fused = lexical == "fused"
        assert result.engine_fused == fused
        assert set(result.hits[0].fused.ranks) == (set() if fused else {"lexical", "semantic"})
        [p async for p in service.reindex()]
        assert service.status().generation == 2
        again = await service.search(Scope("t1", "u1"), "server", unit(4), Mode.HYBRID, 5)
        assert [h.turn.memory_id for h in again.hits] == [t.memory_id]
    finally:
        service.close()
    try:
        names = {c.name for c in shared.get_collections().collections}
    finally:
        QdrantClient.close(shared)
    expected = {
        "tantivy": {"turns_g2", "turns_g2_meta"},  # generation 1 was dropped
        "qdrant": {"turns_g2", "turns_g2_meta", "turns_lexical_g2", "turns_lexical_g2_meta"},
        "fused": {"turns_fused_g2", "turns_fused_g2_meta"},
    }
    assert names == expected[lexical]


async def test_indexes_ahead_of_a_restored_store_are_rebuilt(tmp_path: Path) -> None:
    """A turn store restored from a backup ends at a lower seq than the indexes applied:
    they are rebuilt from it at open, so turns the backup lacks are not found and the
    seqs the store hands out next are indexed (not skipped as already applied)."""
    import shutil

    svc = make(tmp_path)
    svc.open()
    kept = turn("the boat is called Osprey", seed=1)
    await svc.write("t1", [kept], wait_searchable=True, timeout=2.0)
    svc.close()
    backup = tmp_path.parent / "backup.sqlite3"
    shutil.copy(tmp_path / "turns.sqlite3", backup)
    svc = make(tmp_path)
    svc.open()
    lost = turn("the boat's engine is a Yanmar", seed=2)
    await svc.write("t1", [lost], wait_searchable=True, timeout=2.0)
    svc.close()
    shutil.copy(backup, tmp_path / "turns.sqlite3")  # the restore (the WAL was checkpointed)
    svc = make(tmp_path)
    svc.open()
    scope = Scope("t1", "u1")
    found = await svc.search(scope, "boat", None, Mode.LEXICAL, 5)
    assert [h.turn.memory_id for h in found.hits] == [kept.memory_id]
    after = turn("the boat sleeps in Porto", seed=3)
    result = await svc.write("t1", [after], wait_searchable=True, timeout=2.0)
    assert result.turns[0][0].seq == 2 and result.searchable
    found = await svc.search(scope, "Porto", None, Mode.LEXICAL, 5)
    assert [h.turn.memory_id for h in found.hits] == [after.memory_id]
    svc.close()


def test_server_collections_are_created_with_the_configured_layout(tmp_path: Path) -> None:
    """shard_number and replication_factor reach the server's create_collection for the
    data collections (the one-point `_meta` companions get one shard, as many copies)."""
    created: list[tuple[str, int, int]] = []

    class Spy(QdrantClient):
        def close(self, grpc_grace: float | None = None, **kwargs: object) -> None:
            pass

        def create_collection(self, collection_name: str, **kwargs: object) -> bool:  # type: ignore[override]
            created.append(
                (collection_name, kwargs["shard_number"], kwargs["replication_factor"])  # type: ignore[arg-type]
            )
            return super().create_collection(collection_name, **kwargs)  # type: ignore[arg-type]

    spy = Spy(path=str(tmp_path / "qdrant"))
    server = QdrantServer(
        "http://unused", None, "turns", 5.0, connect=lambda: spy, shards=6, replication=2
    )
    try:
        server.vector_collection("turns_g1", DIM).close()
        server.lexical_collection("turns_lexical_g1").close()
    finally:
        QdrantClient.close(spy)
    assert sorted(created) == [
        ("turns_g1", 6, 2),
        ("turns_g1_meta", 1, 2),
        ("turns_lexical_g1", 6, 2),
        ("turns_lexical_g1_meta", 1, 2),
    ]
    with pytest.raises(ValueError, match="at least 1"):
        QdrantServer("http://unused", None, "turns", 5.0, shards=0)
