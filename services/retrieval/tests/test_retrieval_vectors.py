"""One contract for both VectorIndex adapters, run against real storage.

`edge`: EdgeVectorIndex, Qdrant's engine in-process, in tmp_path. `qdrant`:
QdrantVectorIndex over qdrant-client's local mode (`QdrantClient(path=...)`), which speaks
the server's client API but filters in Python, so the data here stays small (< 300 points).
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt
import pytest
from fakes import memory_id
from hypothesis import given, settings
from hypothesis import strategies as st
from qdrant_client import QdrantClient

from hippo_retrieval.adapters.edge_graph import GraphBuildCancelled
from hippo_retrieval.adapters.edge_vectors import EdgeVectorIndex, ShardLockedError
from hippo_retrieval.adapters.generations import LocalIndexSet, QdrantServer
from hippo_retrieval.adapters.hybrid_collection import OneCollection, QdrantHybridIndex
from hippo_retrieval.adapters.qdrant_vectors import QdrantVectorIndex
from hippo_retrieval.domain.models import (
    Candidate,
    Change,
    Deletion,
    Role,
    Scope,
    StoredTurn,
    Vector,
    metadata_term,
)

pytestmark = pytest.mark.filterwarnings(
    "ignore:Payload indexes have no effect in the local Qdrant:UserWarning"
)

DIM = 32
T0 = 1_700_000_000_000_000  # µs


class Index(Protocol):
    """The VectorIndex port plus what the tests inspect."""

    def apply(self, changes: Sequence[Change]) -> None: ...
    def applied_seq(self) -> int: ...
    def search(self, scope: Scope, vector: Vector, limit: int) -> list[Candidate]: ...
    def count(self) -> int: ...
    def close(self) -> None: ...


@dataclass
class Backend:
    name: str
    open: Callable[[], Index]  # opens the index at this backend's location (again)
    wipe: Callable[[], None]  # drops the vector data but keeps the applied_seq record


def _edge(root: Path, dimension: int = DIM) -> Backend:
    path = root / "vectors"
    return Backend(
        "edge",
        lambda: EdgeVectorIndex(path, dimension=dimension),
        lambda: shutil.rmtree(path),
    )


def _qdrant(root: Path, dimension: int = DIM) -> Backend:
    path = str(root / "qdrant")

    def wipe() -> None:
        client = QdrantClient(path=path)
        client.delete_collection("hippo_turns")  # hippo_turns_meta stays
        client.close()

    return Backend(
        "qdrant",
        lambda: QdrantVectorIndex(QdrantClient(path=path), dimension=dimension),
        wipe,
    )


class _BothSides:
    """The vector port of a collection that holds BM25 too (hybrid_collection.py), each
    apply handed to both sides in the projector's order."""

    def __init__(self, path: str, dimension: int) -> None:
        index = QdrantHybridIndex(QdrantClient(path=path), "fused", dimension)
        self._pair = OneCollection(index, index)

    def apply(self, changes: Sequence[Change]) -> None:
        self._pair.lexical.apply(changes)
        self._pair.vectors.apply(changes)

    def applied_seq(self) -> int:
        return self._pair.vectors.applied_seq()

    def search(self, scope: Scope, vector: Vector, limit: int) -> list[Candidate]:
        return self._pair.vectors.search(scope, vector, limit)

    def count(self) -> int:
        return self._pair.vectors.count()

    def close(self) -> None:
        self._pair.close()


def _fused(root: Path, dimension: int = DIM) -> Backend:
    path = str(root / "qdrant")

    def wipe() -> None:
        client = QdrantClient(path=path)
        client.delete_collection("fused")  # fused_meta stays
        client.close()

    return Backend("fused", lambda: _BothSides(path, dimension), wipe)


MAKERS = {"edge": _edge, "qdrant": _qdrant, "fused": _fused}


@pytest.fixture(params=sorted(MAKERS))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return MAKERS[request.param](tmp_path)


@pytest.fixture
def index(backend: Backend) -> Iterator[Index]:
    opened = backend.open()
    yield opened
    opened.close()


def unit(rows: npt.ArrayLike) -> npt.NDArray[np.float32]:
    arr = np.asarray(rows, dtype=np.float32)
    out: npt.NDArray[np.float32] = (arr / np.linalg.norm(arr, axis=-1, keepdims=True)).astype(
        np.float32
    )
    return out


def random_units(n: int, seed: int = 7, dim: int = DIM) -> npt.NDArray[np.float32]:
    return unit(np.random.default_rng(seed).normal(size=(n, dim)))


_seq = itertools.count(1)


def turn(
    vector: Vector | None,
    *,
    tenant: str = "acme",
    user: str = "u1",
    session: str = "s1",
    role: Role = Role.USER,
    time_us: int = T0,
    n: int | None = None,
    seq: int | None = None,
) -> StoredTurn:
    n = next(_seq) if n is None else n
    return StoredTurn(
        seq=next(_seq) if seq is None else seq,
        memory_id=memory_id(tenant, user, session, client_id=f"c{n}"),
        tenant=tenant,
        user=user,
        session=session,
        role=role,
        text="never stored in the vector index",
        time_us=time_us,
        client_id=f"c{n}",
        metadata={},
        vector=vector,
    )


def with_seqs(changes: Sequence[Change]) -> list[Change]:
    """The same changes renumbered 1..n, as the turn store's feed would give them."""
    out: list[Change] = []
    for i, c in enumerate(changes, start=1):
        if isinstance(c, StoredTurn):
            out.append(StoredTurn(**{**c.__dict__, "seq": i}))
        else:
            out.append(Deletion(seq=i, tenant=c.tenant, memory_id=c.memory_id))
    return out


def in_scope(t: StoredTurn, scope: Scope) -> bool:
    return (
        t.tenant == scope.tenant
        and t.user == scope.user
        and (scope.session is None or t.session == scope.session)
        and (not scope.roles or t.role in scope.roles)
        and (scope.start_us is None or t.time_us >= scope.start_us)
        and (scope.end_us is None or t.time_us < scope.end_us)
    )


def ids(hits: Sequence[Candidate]) -> list[str]:
    return [h.memory_id for h in hits]


# --- nearest neighbours ---------------------------------------------------------------


def test_own_vector_ranks_first_and_order_matches_brute_force(index: Index) -> None:
    rows = random_units(200)
    turns = [turn(rows[i], user="u1" if i % 4 else "u2", n=i) for i in range(len(rows))]
    index.apply(turns)
    scope = Scope("acme", "u1")
    mine = [t for t in turns if in_scope(t, scope)]
    matrix = np.stack([t.vector for t in mine if t.vector is not None])
    for probe in (mine[0], mine[17], mine[-1]):
        assert probe.vector is not None
        hits = index.search(scope, probe.vector, 10)
        assert hits[0].memory_id == probe.memory_id
        assert hits[0].score == pytest.approx(1.0, abs=1e-5)
        cosine = matrix @ probe.vector
        order = np.argsort(-cosine)[:10]
        assert ids(hits) == [mine[i].memory_id for i in order]
        assert [h.score for h in hits] == pytest.approx([float(cosine[i]) for i in order], abs=1e-5)


def test_scores_are_cosine_for_vectors_that_are_not_unit(index: Index) -> None:
    a = turn(np.array([3.0, 4.0] + [0.0] * (DIM - 2), dtype=np.float32))
    b = turn(np.array([0.0, 2.0] + [0.0] * (DIM - 2), dtype=np.float32))
    index.apply([a, b])
    query = np.array([10.0, 0.0] + [0.0] * (DIM - 2), dtype=np.float32)
    hits = index.search(Scope("acme", "u1"), query, 5)
    assert ids(hits) == [a.memory_id, b.memory_id]
    assert [h.score for h in hits] == pytest.approx([0.6, 0.0], abs=1e-5)


def test_limit_and_degenerate_queries(index: Index) -> None:
    rows = random_units(5)
    index.apply([turn(r) for r in rows])
    assert len(index.search(Scope("acme", "u1"), rows[0], 3)) == 3
    assert index.search(Scope("acme", "u1"), rows[0], 0) == []
    assert index.search(Scope("acme", "u1"), np.zeros(DIM, dtype=np.float32), 3) == []
    with pytest.raises(ValueError):
        index.search(Scope("acme", "u1"), np.ones(DIM + 1, dtype=np.float32), 3)
    with pytest.raises(ValueError):
        index.search(Scope("", "u1"), rows[0], 3)
    with pytest.raises(ValueError):
        index.search(Scope("acme", ""), rows[0], 3)


# --- tenancy ---------------------------------------------------------------------------

TENANTS = ("acme", "globex", "initech")
USERS = ("alice", "bob")
SESSIONS = ("s1", "s2")
ROLES = (Role.USER, Role.ASSISTANT, Role.TOOL)
POOL = random_units(6, seed=11)  # few vectors, so every one is stored by many owners

owners = st.tuples(
    st.sampled_from(TENANTS),
    st.sampled_from(USERS),
    st.sampled_from(SESSIONS),
    st.sampled_from(ROLES),
    st.integers(0, len(POOL) - 1),  # which vector
    st.integers(0, 9),  # time, in steps
)
scopes = st.builds(
    Scope,
    tenant=st.sampled_from(TENANTS),
    user=st.sampled_from(USERS),
    session=st.none() | st.sampled_from(SESSIONS),
    start_us=st.none() | st.integers(0, 9).map(lambda k: T0 + k),
    end_us=st.none() | st.integers(1, 10).map(lambda k: T0 + k),
    roles=st.frozensets(st.sampled_from(ROLES), max_size=2),
)


@pytest.mark.parametrize("name", sorted(MAKERS))
@settings(max_examples=15, deadline=None)
@given(
    stored=st.lists(owners, min_size=1, max_size=40),
    queries=st.lists(st.tuples(scopes, st.integers(0, len(POOL) - 1)), min_size=1, max_size=6),
)
def test_no_search_leaves_its_tenant_and_user(
    name: str,
    stored: list[tuple[str, str, str, Role, int, int]],
    queries: list[tuple[Scope, int]],
) -> None:
    """Every owner stores the same few vectors; a search returns exactly the in-scope
    points (limit above the total), never another tenant's or user's, even at score 1."""
    with tempfile.TemporaryDirectory() as root:
        index = MAKERS[name](Path(root)).open()
        try:
            turns = [
                turn(POOL[v], tenant=t, user=u, session=s, role=r, time_us=T0 + k, n=i)
                for i, (t, u, s, r, v, k) in enumerate(stored)
            ]
            index.apply(with_seqs(turns))
            for scope, v in queries:
                hits = index.search(scope, POOL[v], 100)
                expected = {t.memory_id for t in turns if in_scope(t, scope)}
                assert set(ids(hits)) == expected
                assert len(hits) == len(expected)
                scores = [h.score for h in hits]
                assert scores == sorted(scores, reverse=True)
        finally:
            index.close()


def test_a_foreign_write_or_deletion_cannot_touch_a_point(index: Index) -> None:
    rows = random_units(2)
    mine = turn(rows[0], tenant="acme")
    # Another tenant's change carrying the same memory_id (ids derive from the tenant,
    # so this only happens through a bug or a forged feed): it must not take the point.
    forged = StoredTurn(**{**turn(rows[1], tenant="globex").__dict__, "memory_id": mine.memory_id})
    index.apply([mine, forged, Deletion(seq=next(_seq), tenant="globex", memory_id=mine.memory_id)])
    hits = index.search(Scope("acme", "u1"), rows[0], 5)
    assert ids(hits) == [mine.memory_id]
    assert hits[0].score == pytest.approx(1.0, abs=1e-5)  # still acme's vector
    assert index.search(Scope("globex", "u1"), rows[1], 5) == []


# --- scope filters ---------------------------------------------------------------------


def test_session_role_and_time_filters(index: Index) -> None:
    rows = random_units(6)
    a = turn(rows[0], session="s1", role=Role.USER, time_us=T0)
    b = turn(rows[1], session="s1", role=Role.ASSISTANT, time_us=T0 + 10)
    c = turn(rows[2], session="s2", role=Role.TOOL, time_us=T0 + 20)
    d = turn(rows[3], session="s2", role=Role.USER, time_us=T0 + 30)
    index.apply([a, b, c, d])
    q = rows[0]

    def found(**kw: object) -> set[str]:
        return set(ids(index.search(Scope("acme", "u1", **kw), q, 10)))  # type: ignore[arg-type]

    assert found() == {a.memory_id, b.memory_id, c.memory_id, d.memory_id}
    assert found(session="s2") == {c.memory_id, d.memory_id}
    assert found(session="nope") == set()
    assert found(roles=frozenset({Role.USER})) == {a.memory_id, d.memory_id}
    assert found(roles=frozenset({Role.ASSISTANT, Role.TOOL})) == {b.memory_id, c.memory_id}
    assert found(roles=frozenset({Role.SYSTEM})) == set()
    assert found(start_us=T0 + 10) == {b.memory_id, c.memory_id, d.memory_id}  # inclusive
    assert found(end_us=T0 + 20) == {a.memory_id, b.memory_id}  # exclusive
    assert found(start_us=T0 + 10, end_us=T0 + 30, session="s2") == {c.memory_id}
    assert found(start_us=T0 + 1, end_us=T0 + 10) == set()
    assert found(session="s1", roles=frozenset({Role.USER})) == {a.memory_id}


# --- writes, deletions, idempotence ----------------------------------------------------


def test_deletion_removes(index: Index) -> None:
    rows = random_units(3)
    turns = [turn(r) for r in rows]
    index.apply(turns)
    gone = turns[1]
    index.apply([Deletion(seq=next(_seq), tenant="acme", memory_id=gone.memory_id)])
    assert index.count() == 2
    assert gone.memory_id not in ids(index.search(Scope("acme", "u1"), rows[1], 10))
    # Deleting what is not there (again, or never stored) is fine.
    index.apply([Deletion(seq=next(_seq), tenant="acme", memory_id=gone.memory_id)])
    index.apply([Deletion(seq=next(_seq), tenant="acme", memory_id=memory_id("x", "y", "z"))])
    assert index.count() == 2


def test_changes_apply_in_order_within_a_batch(index: Index) -> None:
    rows = random_units(2)
    first = turn(rows[0])
    second = turn(rows[1])
    index.apply(
        [
            first,
            Deletion(seq=next(_seq), tenant="acme", memory_id=first.memory_id),  # ends deleted
            Deletion(seq=next(_seq), tenant="acme", memory_id=second.memory_id),
            StoredTurn(**{**second.__dict__, "seq": next(_seq)}),  # ends written
        ]
    )
    assert ids(index.search(Scope("acme", "u1"), rows[0], 10)) == [second.memory_id]


def test_reapplying_is_idempotent(index: Index) -> None:
    rows = random_units(20)
    changes = with_seqs([turn(r, user=("u1", "u2")[i % 2]) for i, r in enumerate(rows)])
    index.apply(changes)
    before = index.search(Scope("acme", "u1"), rows[0], 20)
    index.apply(changes)
    index.apply(changes[5:12])
    assert index.count() == 20
    assert index.applied_seq() == 20
    after = index.search(Scope("acme", "u1"), rows[0], 20)
    assert ids(after) == ids(before)
    assert [h.score for h in after] == pytest.approx([h.score for h in before])


def test_a_turn_without_a_vector_is_skipped_but_counted_as_applied(index: Index) -> None:
    rows = random_units(1)
    with_vector = turn(rows[0], seq=1)
    without = turn(None, seq=2)
    zero = turn(np.zeros(DIM, dtype=np.float32), seq=3)  # no direction: skipped as well
    index.apply([with_vector, without, zero])
    assert index.count() == 1
    assert ids(index.search(Scope("acme", "u1"), rows[0], 10)) == [with_vector.memory_id]
    assert index.applied_seq() == 3


def test_a_wrong_dimension_fails_the_whole_batch(index: Index) -> None:
    good = turn(random_units(1)[0], seq=1)
    bad = turn(np.ones(DIM + 1, dtype=np.float32), seq=2)
    with pytest.raises(ValueError, match="shape"):
        index.apply([good, bad])
    assert index.count() == 0
    assert index.applied_seq() == 0


# --- applied_seq, reopening ------------------------------------------------------------


def test_applied_seq_persists_across_reopen(backend: Backend) -> None:
    rows = random_units(4)
    first = backend.open()
    assert first.applied_seq() == 0
    first.apply([turn(rows[0], seq=3), turn(rows[1], seq=7)])
    assert first.applied_seq() == 7
    first.apply([turn(rows[2], seq=5)])  # an older seq never moves it back
    assert first.applied_seq() == 7
    first.close()
    first.close()  # idempotent

    second = backend.open()
    try:
        assert second.applied_seq() == 7
        assert second.count() == 3
        assert len(second.search(Scope("acme", "u1"), rows[0], 10)) == 3
        second.apply([Deletion(seq=9, tenant="acme", memory_id=memory_id("a", "b", "c"))])
        assert second.applied_seq() == 9  # a deletion of nothing still advances it
    finally:
        second.close()
    third = backend.open()
    try:
        assert third.applied_seq() == 9
    finally:
        third.close()


def test_new_vector_data_resets_a_stale_applied_seq(backend: Backend) -> None:
    """If the vectors are lost but the seq record survives, the new store starts at 0
    (so the projector rebuilds it) instead of trusting the old seq."""
    first = backend.open()
    first.apply([turn(random_units(1)[0], seq=4)])
    first.close()
    backend.wipe()
    second = backend.open()
    try:
        assert second.applied_seq() == 0
        assert second.count() == 0
    finally:
        second.close()


def test_a_closed_index_refuses_work(index: Index) -> None:
    index.close()
    with pytest.raises(RuntimeError, match="closed"):
        index.apply([turn(random_units(1)[0])])
    with pytest.raises(RuntimeError, match="closed"):
        index.search(Scope("acme", "u1"), random_units(1)[0], 3)


def test_reopening_with_another_dimension_fails(backend: Backend, tmp_path: Path) -> None:
    backend.open().close()
    other = MAKERS[backend.name](tmp_path, dimension=DIM * 2)
    with pytest.raises(Exception, match=r"(?i)size|dim"):
        other.open()


def test_default_dimension_is_384(tmp_path: Path) -> None:
    index = EdgeVectorIndex(tmp_path / "v")
    try:
        row = random_units(1, dim=384)[0]
        index.apply([turn(row)])
        assert index.search(Scope("acme", "u1"), row, 1)[0].score == pytest.approx(1, abs=1e-5)
    finally:
        index.close()


def test_a_second_edge_index_on_the_same_path_fails_on_the_wal_lock(tmp_path: Path) -> None:
    """The engine locks its WAL; the adapter turns the engine's bare
    `Exception("... failed to open WAL ...: Can't init WAL: Kind(WouldBlock)")` into
    ShardLockedError. Once the owner closes, the path opens again."""
    path = tmp_path / "vectors"
    owner = EdgeVectorIndex(path, dimension=DIM)
    owner.apply([turn(random_units(1)[0], seq=1)])
    with pytest.raises(ShardLockedError, match="WAL"):
        EdgeVectorIndex(path, dimension=DIM)
    assert owner.count() == 1  # the failed second open did not disturb the owner
    owner.close()
    again = EdgeVectorIndex(path, dimension=DIM)
    try:
        assert again.count() == 1
        assert again.applied_seq() == 1
    finally:
        again.close()


def test_the_edge_sidecar_sits_next_to_the_shard(tmp_path: Path) -> None:
    index = EdgeVectorIndex(tmp_path / "vectors", dimension=DIM)
    index.apply([turn(random_units(1)[0], seq=12)])
    index.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vectors", "vectors.applied.json"]
    assert (tmp_path / "vectors.applied.json").read_text() == '{"applied_seq": 12}'


def test_concurrent_searches_and_applies(index: Index) -> None:
    """Searches racing applies neither fail nor see a torn state. (Without the lock
    around searches, qdrant-client's local mode raised IndexError here.)"""
    rows = random_units(120, seed=3)
    index.apply([turn(r, seq=1) for r in rows[:20]])
    errors: list[BaseException] = []

    def search() -> None:
        try:
            for i in range(30):
                hits = index.search(Scope("acme", "u1"), rows[i % 20], 5)
                assert len(hits) == 5
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=search) for _ in range(4)]
    for t in threads:
        t.start()
    for k in range(20, 120, 10):
        index.apply([turn(r, seq=k) for r in rows[k : k + 10]])
    for t in threads:
        t.join()
    assert errors == []
    assert index.count() == 120
    assert index.applied_seq() == 110


def test_a_server_that_does_not_answer_fails_fast(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        QdrantServer("http://127.0.0.1:9", None, "c", 0)
    indexes = LocalIndexSet(tmp_path, server=QdrantServer("http://127.0.0.1:9", None, "c", 1.0))
    started = time.monotonic()
    with pytest.raises(Exception):  # noqa: B017 - whatever the transport raises
        indexes.open(1, 4)  # port 9 (discard): refused at once
    assert time.monotonic() - started < 10


def test_metadata_filters_match_the_filter_terms_all_of_them(index: Index) -> None:
    rows = random_units(4)
    a = replace(turn(rows[0]), filter_terms=(metadata_term("agent_id", "chef"),
                                             metadata_term("speaker", "Maya")))  # fmt: skip
    b = replace(turn(rows[1]), filter_terms=(metadata_term("agent_id", "chef"),))
    c = replace(turn(rows[2]), filter_terms=(metadata_term("agent_id", "tutor"),))
    d = turn(rows[3])  # no declared metadata
    index.apply([a, b, c, d])

    def found(*pairs: tuple[str, str]) -> set[str]:
        scope = Scope("acme", "u1", metadata=tuple(sorted(pairs)))
        return set(ids(index.search(scope, rows[0], 10)))

    assert found() == {a.memory_id, b.memory_id, c.memory_id, d.memory_id}
    assert found(("agent_id", "chef")) == {a.memory_id, b.memory_id}
    assert found(("agent_id", "chef"), ("speaker", "Maya")) == {a.memory_id}
    assert found(("agent_id", "chef"), ("speaker", "Bot")) == set()
    assert found(("speaker", "chef")) == set()  # a value under another key is not a match


def test_edge_graph_is_built_in_a_child_and_search_is_unchanged(tmp_path: Path) -> None:
    """build_graph puts every point in the HNSW graph (qdrant-edge's optimize, run in a
    child process), and the index then searches, scopes and writes as before."""
    index = EdgeVectorIndex(tmp_path / "vectors", dimension=DIM)
    rows = random_units(3000, seed=11)
    turns = [
        turn(r, seq=i + 1, user=f"u{i % 2}", tenant="acme" if i % 3 else "other")
        for i, r in enumerate(rows)
    ]
    try:
        index.apply(turns)
        before = index.graph_state()
        assert (before.points, before.in_graph) == (3000, 0)
        queries = [(t.tenant, t.user, rows[i]) for i, t in enumerate(turns[:50])]
        expected = [index.search(Scope(tn, u), q, 10) for tn, u, q in queries]

        index.build_graph(lambda: False)

        after = index.graph_state()
        assert (after.points, after.in_graph, after.outside) == (3000, 3000, 0)
        assert index.applied_seq() == 3000
        for (tn, u, q), hits in zip(queries, expected, strict=True):
            again = index.search(Scope(tn, u), q, 10)
            assert again[0].memory_id == hits[0].memory_id  # the point itself, first
            assert {h.memory_id for h in again} <= {
                t.memory_id for t in turns if (t.tenant, t.user) == (tn, u)
            }
        extra = turn(random_units(1, seed=99)[0], seq=3001)
        index.apply([extra])  # writable again; the new point waits outside the graph
        assert index.graph_state().outside == 1
        assert index.search(Scope("acme", "u1"), extra.vector, 1)[0].memory_id == extra.memory_id
    finally:
        index.close()


def test_a_cancelled_graph_build_raises_and_leaves_the_index_usable(tmp_path: Path) -> None:
    index = EdgeVectorIndex(tmp_path / "vectors", dimension=DIM)
    rows = random_units(500, seed=5)
    try:
        index.apply([turn(r, seq=i + 1) for i, r in enumerate(rows)])
        with pytest.raises(GraphBuildCancelled):
            index.build_graph(lambda: True)
        assert index.count() == 500
        assert index.search(Scope("acme", "u1"), rows[7], 1)[0].score == pytest.approx(1, abs=1e-5)
    finally:
        index.close()
