"""The retrieval service as a real process, through gRPC with the generated stubs."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import grpc
import numpy as np
import pytest

from hippo.memory.v1 import memory_pb2
from hippo.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc
from hippo_core.testing import ServiceProcess, service_process, wait_for

FULL_NAME = "hippo.retrieval.v1.RetrievalService"
DIM = 8
PREFIX = "HIPPO_RETRIEVAL_"


def vec(seed: int) -> bytes:
    v = np.random.default_rng(seed).normal(size=DIM).astype(np.float32)
    return (v / np.linalg.norm(v)).astype("<f4").tobytes()


def new_turn(
    text: str, seed: int, *, user: str = "u1", session: str = "s1"
) -> retrieval_pb2.NewTurn:
    return retrieval_pb2.NewTurn(
        memory_id=str(uuid.uuid4()),
        user_id=user,
        session_id=session,
        role=memory_pb2.ROLE_USER,
        text=text,
        time_us=1_700_000_000_000_000 + seed,
        client_id=f"c{seed}",
        metadata={"speaker": "Ada"},
        vector=vec(seed),
    )


def start(data_dir: Path) -> AbstractContextManager[ServiceProcess]:
    env = {f"{PREFIX}DATA_DIR": str(data_dir), f"{PREFIX}DIMENSION": str(DIM)}
    return service_process("hippo_retrieval", PREFIX, env)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    env = {
        f"{PREFIX}DATA_DIR": str(tmp_path_factory.mktemp("retrieval")),
        f"{PREFIX}DIMENSION": str(DIM),
        f"{PREFIX}NEIGHBOUR_WEIGHT": "0",  # scores below are plain weighted RRF
    }
    with service_process("hippo_retrieval", PREFIX, env) as proc:
        wait_for(proc.addr, FULL_NAME, timeout=60)
        yield proc


@pytest.fixture
def stub(server: ServiceProcess) -> Iterator[retrieval_pb2_grpc.RetrievalServiceStub]:
    with grpc.insecure_channel(server.addr) as channel:
        yield retrieval_pb2_grpc.RetrievalServiceStub(channel)


def search(
    stub,
    tenant: str,
    query: str,
    *,
    seed: int | None = None,
    mode: int = 0,
    user: str = "u1",
    top_k: int = 10,
):  # type: ignore[no-untyped-def]
    return stub.Search(
        retrieval_pb2.SearchRequest(
            tenant=tenant,
            user_id=user,
            query=query,
            vector=vec(seed) if seed is not None else b"",
            mode=mode,
            top_k=top_k,
        ),
        timeout=5,
    )


def test_write_then_search_round_trips_every_field(stub) -> None:  # type: ignore[no-untyped-def]
    turns = [
        new_turn("ERR_CONNECTION_REFUSED when handleSubmit( runs", 1),
        new_turn("lunch was pasta", 2),
    ]
    reply = stub.Write(
        retrieval_pb2.WriteRequest(tenant="acme", turns=turns, wait_searchable=True), timeout=5
    )
    assert list(reply.created) == [True, True] and reply.searchable
    assert [r.sequence for r in reply.records] == [1, 2]
    again = stub.Write(retrieval_pb2.WriteRequest(tenant="acme", turns=turns), timeout=5)
    assert list(again.created) == [False, False]  # the first write wins
    hits = search(
        stub, "acme", "ERR_CONNECTION_REFUSED", seed=1, mode=memory_pb2.RECALL_MODE_HYBRID
    ).hits
    top = hits[0]
    assert top.memory.memory_id == turns[0].memory_id
    assert top.lexical_rank == 1 and top.semantic_rank == 1
    # k = 5, weights 1.5 and 1; five content words: the short-turn step leaves it alone.
    assert top.fused_score == pytest.approx(1.5 / 6 + 1 / 6)
    assert top.semantic_score == pytest.approx(1.0, abs=1e-5) and top.lexical_score > 0
    m = top.memory
    assert (m.scope.user_id, m.scope.session_id, m.role, m.client_id) == (
        "u1",
        "s1",
        memory_pb2.ROLE_USER,
        "c1",
    )
    assert (
        dict(m.metadata) == {"speaker": "Ada"} and m.time.ToMicroseconds() == 1_700_000_000_000_001
    )
    assert search(stub, "other-tenant", "ERR_CONNECTION_REFUSED", seed=1).hits == []


@pytest.mark.parametrize(
    "query",
    [
        "handleSubmit(",
        "ERR_CONNECTION_REFUSED:",
        'say "hello',
        "AND OR NOT",
        "*",
        "~",
        "🦛🦛",
        "x" * 10_240,
        "user_id:u2",
    ],
)
def test_user_text_never_breaks_the_query(stub, query: str) -> None:  # type: ignore[no-untyped-def]
    reply = search(stub, "acme", query, mode=memory_pb2.RECALL_MODE_LEXICAL)
    assert all(h.memory.scope.user_id == "u1" for h in reply.hits)


def test_bad_requests_get_invalid_argument_naming_the_field(stub) -> None:  # type: ignore[no-untyped-def]
    bad_role = new_turn("x", 3)
    bad_role.role = memory_pb2.ROLE_UNSPECIFIED
    short = new_turn("x", 4)
    short.vector = b"\x00" * 12
    ragged = new_turn("x", 5)
    ragged.vector = b"\x00" * 13
    cases = [
        (retrieval_pb2.WriteRequest(tenant="", turns=[new_turn("x", 3)]), "tenant: is required"),
        (retrieval_pb2.WriteRequest(tenant="acme", turns=[bad_role]), "turns[0].role"),
        (retrieval_pb2.WriteRequest(tenant="acme", turns=[short]), "turns[0].vector: must hold 8"),
        (
            retrieval_pb2.WriteRequest(tenant="acme", turns=[ragged]),
            "turns[0].vector: must be packed",
        ),
        (retrieval_pb2.WriteRequest(tenant="acme"), "turns: must hold 1.."),
    ]
    for request, message in cases:
        with pytest.raises(grpc.RpcError) as err:
            stub.Write(request, timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        search(stub, "acme", "q", top_k=101, mode=memory_pb2.RECALL_MODE_LEXICAL)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "top_k" in err.value.details()


def test_query_repairs_reach_bm25_and_bad_ones_are_refused(stub) -> None:  # type: ignore[no-untyped-def]
    turns = [new_turn("the pride festival was loud", 90, user="u-spell")]
    stub.Write(
        retrieval_pb2.WriteRequest(tenant="acme", turns=turns, wait_searchable=True), timeout=5
    )

    def asked(repairs: dict[str, str]) -> retrieval_pb2.SearchResponse:
        return stub.Search(
            retrieval_pb2.SearchRequest(
                tenant="acme",
                user_id="u-spell",
                query="fstivl",
                mode=memory_pb2.RECALL_MODE_LEXICAL,
                top_k=5,
                query_repairs=repairs,
            ),
            timeout=5,
        )

    # Two slips: the index's own typo repair finds nothing; the caller's repair does.
    assert list(asked({}).hits) == []
    assert [h.memory.memory_id for h in asked({"fstivl": "festival"}).hits] == [turns[0].memory_id]
    cases = [
        ({f"w{chr(97 + i // 26)}{chr(97 + i % 26)}": "word" for i in range(33)}, "at most 32"),
        ({"fesetival": "Festival"}, "query_repairs['fesetival']: words must be 1..64"),
        ({"fesetival": ""}, "query_repairs['fesetival']"),
        ({"caf\u00e9": "cafe"}, "lower-case letters a-z"),
        ({"x" * 65: "festival"}, "query_repairs["),
    ]
    for repairs, message in cases:
        with pytest.raises(grpc.RpcError) as err:
            asked(repairs)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in err.value.details()


def test_get_returns_records_in_order_inside_the_scope(stub) -> None:  # type: ignore[no-untyped-def]
    turns = [new_turn(f"get me {i}", 40 + i, user="u7") for i in range(3)]
    stub.Write(retrieval_pb2.WriteRequest(tenant="acme", turns=turns), timeout=5)
    ids = [turns[2].memory_id, "absent", turns[0].memory_id]
    reply = stub.Get(
        retrieval_pb2.GetRequest(tenant="acme", user_id="u7", memory_ids=ids), timeout=5
    )
    assert [r.text for r in reply.records] == ["get me 2", "get me 0"]
    other = stub.Get(
        retrieval_pb2.GetRequest(tenant="acme", user_id="u1", memory_ids=ids), timeout=5
    )
    assert list(other.records) == []  # another user's ids are absent, not an error
    with pytest.raises(grpc.RpcError) as err:
        stub.Get(retrieval_pb2.GetRequest(tenant="acme", user_id="u7"), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "memory_ids: must hold 1..1000" in err.value.details()


def test_list_pages_by_cursor_and_lists_sessions_and_users(stub) -> None:  # type: ignore[no-untyped-def]
    turns = [new_turn(f"list me {i}", 60 + i, user="u-list", session=f"s{i % 2}") for i in range(5)]
    stub.Write(retrieval_pb2.WriteRequest(tenant="listing", turns=turns), timeout=5)
    request = retrieval_pb2.ListRequest(
        tenant="listing", user_id="u-list", newest_first=True, limit=2
    )
    texts: list[str] = []
    pages = 0
    while True:
        reply = stub.List(request, timeout=5)
        texts += [r.text for r in reply.records]
        pages += 1
        if not reply.HasField("next"):
            break
        request.after.CopyFrom(reply.next)
    assert texts == [f"list me {i}" for i in reversed(range(5))] and pages == 3
    only = stub.List(
        retrieval_pb2.ListRequest(
            tenant="listing",
            user_id="u-list",
            session_id="s1",
            start_us=1_700_000_000_000_062,
            limit=10,
        ),
        timeout=5,
    )
    assert [r.text for r in only.records] == ["list me 3"] and not only.HasField("next")
    sessions = stub.ListSessions(
        retrieval_pb2.ListSessionsRequest(tenant="listing", user_id="u-list", limit=1), timeout=5
    )
    assert [(s.session_id, s.turns) for s in sessions.sessions] == [("s0", 3)]
    assert sessions.next == "s0"
    users = stub.ListUsers(retrieval_pb2.ListUsersRequest(tenant="listing", limit=5), timeout=5)
    assert [(u.user_id, u.turns, u.sessions) for u in users.users] == [("u-list", 5, 2)]
    assert users.next == ""
    cases = [
        (
            stub.List,
            retrieval_pb2.ListRequest(tenant="listing", user_id="u-list"),
            "limit: must be 1..1000",
        ),
        (
            stub.List,
            retrieval_pb2.ListRequest(tenant="", user_id="u", limit=1),
            "tenant: is required",
        ),
        (
            stub.ListSessions,
            retrieval_pb2.ListSessionsRequest(tenant="listing", limit=1),
            "user_id: is required",
        ),
        (
            stub.ListUsers,
            retrieval_pb2.ListUsersRequest(tenant="listing", limit=1001),
            "limit: must be 1..1000",
        ),
    ]
    for call, bad, message in cases:
        with pytest.raises(grpc.RpcError) as err:
            call(bad, timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in err.value.details()


def test_delete_and_status(stub) -> None:  # type: ignore[no-untyped-def]
    turns = [new_turn(f"gone-{i} canary", 10 + i, user="u9", session=f"s{i % 2}") for i in range(4)]
    stub.Write(
        retrieval_pb2.WriteRequest(tenant="acme", turns=turns, wait_searchable=True), timeout=5
    )
    one = stub.Delete(
        retrieval_pb2.DeleteRequest(tenant="acme", user_id="u9", memory_ids=[turns[0].memory_id]),
        timeout=5,
    )
    assert list(one.memory_ids) == [turns[0].memory_id]
    session = stub.Delete(
        retrieval_pb2.DeleteRequest(tenant="acme", user_id="u9", session_id="s1"), timeout=5
    )
    assert set(session.memory_ids) == {turns[1].memory_id, turns[3].memory_id}
    assert (
        search(stub, "acme", "canary", user="u9", seed=12, mode=memory_pb2.RECALL_MODE_HYBRID)
        .hits[0]
        .memory.memory_id
        == turns[2].memory_id
    )
    rest = stub.Delete(retrieval_pb2.DeleteRequest(tenant="acme", user_id="u9"), timeout=5)
    assert list(rest.memory_ids) == [turns[2].memory_id]
    assert search(stub, "acme", "canary", user="u9", seed=12).hits == []
    again = stub.Delete(retrieval_pb2.DeleteRequest(tenant="acme", user_id="u9"), timeout=5)
    assert list(again.memory_ids) == []  # idempotent
    status = stub.Status(retrieval_pb2.StatusRequest(), timeout=5)
    assert status.lexical_seq == status.vector_seq == status.last_seq > 0
    assert status.vector_backend == "edge" and status.dimension == DIM


def test_reindex_streams_progress_and_keeps_results(stub) -> None:  # type: ignore[no-untyped-def]
    before = search(stub, "acme", "pasta lunch", seed=2).hits
    reports = list(stub.Reindex(retrieval_pb2.ReindexRequest(), timeout=30))
    assert reports and reports[-1].done and reports[-1].applied > 0
    after = search(stub, "acme", "pasta lunch", seed=2).hits
    assert [h.memory.memory_id for h in after] == [h.memory.memory_id for h in before]


def test_acknowledged_writes_survive_sigkill(tmp_path: Path) -> None:
    """Every turn whose Write returned OK is, after kill -9 and a restart, searchable in
    both indexes exactly once; a retried Write stores nothing twice."""
    acknowledged: list[retrieval_pb2.NewTurn] = []
    with start(tmp_path) as proc:
        wait_for(proc.addr, FULL_NAME, timeout=60)
        with grpc.insecure_channel(proc.addr) as channel:
            stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
            for batch in range(20):
                turns = [new_turn(f"token{batch}x{i} durable", 100 * batch + i) for i in range(5)]
                stub.Write(retrieval_pb2.WriteRequest(tenant="acme", turns=turns), timeout=5)
                acknowledged.extend(turns)
        os.kill(proc.process.pid, signal.SIGKILL)  # no chance to commit the BM25 index
        proc.process.wait()
    with start(tmp_path) as again:
        wait_for(again.addr, FULL_NAME, timeout=60)
        with grpc.insecure_channel(again.addr) as channel:
            stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
            status = stub.Status(retrieval_pb2.StatusRequest(), timeout=5)
            assert status.turns == len(acknowledged) == 100
            assert status.lexical_seq == status.vector_seq == status.last_seq
            for turn in acknowledged:
                token = turn.text.split()[0]
                lexical = search(stub, "acme", token, mode=memory_pb2.RECALL_MODE_LEXICAL).hits
                ids = [h.memory.memory_id for h in lexical]
                # first, once; the next turn of its batch may follow (it quotes this one)
                assert ids[0] == turn.memory_id and ids.count(turn.memory_id) == 1, [
                    (h.memory.text, h.lexical_score, h.fused_score) for h in lexical
                ] + [turn.text]
                assert len(ids) <= 2
                seed = int(turn.client_id[1:])
                semantic = search(
                    stub, "acme", "", seed=seed, mode=memory_pb2.RECALL_MODE_SEMANTIC, top_k=1
                ).hits
                assert semantic[0].memory.memory_id == turn.memory_id
            retry = stub.Write(
                retrieval_pb2.WriteRequest(tenant="acme", turns=acknowledged[:50]), timeout=5
            )
            assert not any(retry.created)
            assert stub.Status(retrieval_pb2.StatusRequest(), timeout=5).turns == 100
        assert again.terminate() == 0


def test_two_processes_in_cluster_mode_share_the_store(tmp_path: Path, postgres_url: str) -> None:
    """The wiring of cluster mode (`DATABASE__URL` set): two replica processes, one
    PostgreSQL. A write waited for through one is found through the other at once; a
    delete through the other is gone from both; both report the same feed."""
    envs = [
        {
            f"{PREFIX}DATA_DIR": str(tmp_path / name),
            f"{PREFIX}DIMENSION": str(DIM),
            f"{PREFIX}DATABASE__URL": postgres_url,
            f"{PREFIX}COMMIT_INTERVAL_SECONDS": "30",  # only the writer's wait can explain a hit
        }
        for name in ("a", "b")
    ]
    with (
        service_process("hippo_retrieval", PREFIX, envs[0]) as a,
        service_process("hippo_retrieval", PREFIX, envs[1]) as b,
    ):
        wait_for(a.addr, FULL_NAME, timeout=60)
        wait_for(b.addr, FULL_NAME, timeout=60)
        with grpc.insecure_channel(a.addr) as ca, grpc.insecure_channel(b.addr) as cb:
            stub_a = retrieval_pb2_grpc.RetrievalServiceStub(ca)
            stub_b = retrieval_pb2_grpc.RetrievalServiceStub(cb)
            turns = [new_turn("quokka sightings near the ferry", 900)]
            reply = stub_a.Write(
                retrieval_pb2.WriteRequest(tenant="acme", turns=turns, wait_searchable=True),
                timeout=10,
            )
            assert reply.searchable
            lexical = memory_pb2.RECALL_MODE_LEXICAL
            hits = search(stub_b, "acme", "quokka", mode=lexical).hits
            assert [h.memory.memory_id for h in hits] == [turns[0].memory_id]
            erased = stub_b.Delete(
                retrieval_pb2.DeleteRequest(tenant="acme", user_id="u1"), timeout=10
            )
            assert list(erased.memory_ids) == [turns[0].memory_id]
            assert search(stub_a, "acme", "quokka", mode=lexical).hits == []
            status_a = stub_a.Status(retrieval_pb2.StatusRequest(), timeout=5)
            status_b = stub_b.Status(retrieval_pb2.StatusRequest(), timeout=5)
            assert status_a.last_seq == status_b.last_seq == 2
            assert status_a.turns == status_b.turns == 0
            assert status_a.lexical_seq == status_a.last_seq  # the erasure applied on A too
        assert not (tmp_path / "a" / "turns.sqlite3").exists()  # the store is PostgreSQL
        assert a.terminate() == 0 and b.terminate() == 0


def test_update_metadata_re_indexes_the_turn_and_keeps_its_text(stub) -> None:  # type: ignore[no-untyped-def]
    """A changed speaker is what BM25 now finds the turn by (the lexical document quotes
    it), a filter finds the new value, not the old; the text, ids and time never change."""
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    turn = new_turn("we planted tomatoes by the fence", 7)
    stub.Write(
        retrieval_pb2.WriteRequest(tenant=tenant, turns=[turn], wait_searchable=True), timeout=5
    )

    def found(query: str, **metadata: str) -> list[str]:
        request = retrieval_pb2.SearchRequest(
            tenant=tenant, user_id="u1", query=query, mode=memory_pb2.RECALL_MODE_LEXICAL,
            top_k=5, metadata=metadata,
        )  # fmt: skip
        return [h.memory.memory_id for h in stub.Search(request, timeout=5).hits]

    assert found("Ada tomatoes") == [turn.memory_id] and found("Grace") == []
    assert found("tomatoes", speaker="Ada") == [turn.memory_id]
    reply = stub.UpdateMetadata(
        retrieval_pb2.UpdateMetadataRequest(
            tenant=tenant,
            user_id="u1",
            memory_id=turn.memory_id,
            set={"speaker": "Grace", "topic": "garden"},
            remove=["absent-key"],
            vector=vec(8),
        ),
        timeout=5,
    )
    assert reply.changed and dict(reply.record.metadata) == {"speaker": "Grace", "topic": "garden"}
    assert reply.record.text == turn.text and reply.record.time.ToMicroseconds() == turn.time_us
    for _ in range(100):  # re-indexed through the feed, within the commit interval
        if found("Grace"):
            break
        time.sleep(0.05)
    assert found("Grace") == [turn.memory_id]
    assert found("tomatoes", speaker="Grace") == [turn.memory_id]
    assert found("tomatoes", speaker="Ada") == []
    semantic = retrieval_pb2.SearchRequest(
        tenant=tenant, user_id="u1", vector=vec(8), mode=memory_pb2.RECALL_MODE_SEMANTIC, top_k=1
    )
    hit = stub.Search(semantic, timeout=5).hits[0]
    assert hit.memory.memory_id == turn.memory_id and hit.semantic_score > 0.999  # the new vector

    same = stub.UpdateMetadata(
        retrieval_pb2.UpdateMetadataRequest(
            tenant=tenant, user_id="u1", memory_id=turn.memory_id, set={"speaker": "Grace"}
        ),
        timeout=5,
    )
    assert not same.changed
    for request in (
        retrieval_pb2.UpdateMetadataRequest(tenant=tenant, user_id="u2", memory_id=turn.memory_id),
        retrieval_pb2.UpdateMetadataRequest(tenant="other", user_id="u1", memory_id=turn.memory_id),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            stub.UpdateMetadata(request, timeout=5)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
