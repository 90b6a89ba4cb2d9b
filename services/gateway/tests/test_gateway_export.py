"""ExportUser and ImportTurns through the public API: the export's parts and order, its
audit entry, tenancy, import validation and idempotency, and the round trip: export,
forget, import gives back the same memories, ids, sessions and Recall results. Real
gateway, embedding, retrieval and audit processes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import grpc
import pytest
from gateway_harness import (
    AUDIT,
    GATEWAY,
    RETRIEVAL,
    audit_process,
    gateway_process,
    key_of,
    retrieval_process,
)

from hippo.memory.v1 import memory_pb2, memory_pb2_grpc
from hippo_core.listen import reserve_port
from hippo_core.testing import ServiceProcess, eventually, wait_for

Stub = memory_pb2_grpc.MemoryServiceStub
T0 = 1_700_000_000  # seconds

CONVERSATIONS = {
    "trip": [
        ("user", "We booked the ferry to Santorini for the second week of July", "Maya"),
        ("assistant", "Great, the ferry leaves Piraeus at seven in the morning", ""),
        ("user", "My sister Ines is allergic to shellfish, remember that for dinners", "Maya"),
    ],
    "work": [
        ("user", "The quarterly report is due on Friday and the charts are broken", "Maya"),
        ("assistant", "The charts break because the CSV export uses semicolons", ""),
    ],
    "garden": [
        ("user", "I planted tomatoes and basil along the south fence", "Maya"),
        ("user", "The basil wilted after the heatwave last weekend", "Maya"),
        ("assistant", "Water basil in the morning and give it afternoon shade", ""),
    ],
}
QUERIES = ["ferry Santorini", "shellfish allergy sister", "charts CSV semicolons", "basil heat"]
ROLES = {"user": memory_pb2.ROLE_USER, "assistant": memory_pb2.ROLE_ASSISTANT}


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def load(stub: Stub, user: str) -> list[str]:
    ids: list[str] = []
    at = T0
    for session, turns in CONVERSATIONS.items():
        message = memory_pb2.RememberRequest(
            scope=memory_pb2.Scope(user_id=user, session_id=session), wait_searchable=True
        )
        for role, text, speaker in turns:
            turn = message.turns.add(role=ROLES[role], text=text)
            turn.time.FromSeconds(at)
            at += 60
            turn.metadata["source"] = "export-test"
            if speaker:
                turn.metadata["speaker"] = speaker
        ids += stub.Remember(message, metadata=key_of("acme"), timeout=15).memory_ids
    return ids


def export(stub: Stub, user: str, tenant: str = "acme") -> list[memory_pb2.ExportUserResponse]:
    request = memory_pb2.ExportUserRequest(user_id=user)
    return list(stub.ExportUser(request, metadata=key_of(tenant), timeout=30))


def recall_ids(stub: Stub, user: str, query: str) -> list[str]:
    request = memory_pb2.RecallRequest(scope=memory_pb2.Scope(user_id=user), query=query, top_k=5)
    reply = stub.Recall(request, metadata=key_of("acme"), timeout=15)
    return [h.memory.memory_id for h in reply.hits]


def listing(stub: Stub, user: str) -> list[memory_pb2.MemoryRecord]:
    request = memory_pb2.ListMemoriesRequest(
        scope=memory_pb2.Scope(user_id=user), order=memory_pb2.LIST_ORDER_OLDEST_FIRST
    )
    return list(stub.ListMemories(request, metadata=key_of("acme"), timeout=10).memories)


def sessions(stub: Stub, user: str) -> list[tuple[str, int, int, int]]:
    reply = stub.ListSessions(
        memory_pb2.ListSessionsRequest(user_id=user), metadata=key_of("acme"), timeout=10
    )
    return [
        (s.session_id, s.turn_count, s.first_time.seconds, s.last_time.seconds)
        for s in reply.sessions
    ]


def batches(
    records: Sequence[memory_pb2.MemoryRecord], size: int
) -> Iterator[memory_pb2.ImportTurnsRequest]:
    for i in range(0, len(records), size):
        yield memory_pb2.ImportTurnsRequest(records=records[i : i + size])


def import_(
    stub: Stub, records: Sequence[memory_pb2.MemoryRecord], size: int = 3
) -> memory_pb2.ImportTurnsResponse:
    reply: memory_pb2.ImportTurnsResponse = stub.ImportTurns(
        batches(records, size), metadata=key_of("acme"), timeout=60
    )
    return reply


def plain(record: memory_pb2.MemoryRecord) -> tuple[object, ...]:
    """What a memory is, apart from the store's sequence number."""
    return (
        record.memory_id,
        record.scope.user_id,
        record.scope.session_id,
        record.role,
        record.text,
        record.time.ToMicroseconds(),
        record.client_id,
        dict(record.metadata),
    )


def test_an_export_holds_header_memories_sessions_footer_in_order(stub: Stub) -> None:
    user = uid("exp")
    ids = load(stub, user)
    items = export(stub, user)
    kinds = [i.WhichOneof("item") for i in items]
    assert kinds == ["header"] + ["memory"] * len(ids) + ["session"] * 3 + ["footer"]
    header = items[0].header
    assert header.format_version == 1 and header.user_id == user and header.time.seconds > 0
    memories = [i.memory for i in items if i.HasField("memory")]
    assert [m.memory_id for m in memories] == ids  # oldest first: the order they were told
    assert [plain(m) for m in memories] == [plain(m) for m in listing(stub, user)]
    exported = [i.session.session for i in items if i.HasField("session")]
    assert [(s.session_id, s.turn_count) for s in exported] == [
        ("garden", 3),
        ("trip", 3),
        ("work", 2),
    ]
    assert (items[-1].footer.memories, items[-1].footer.sessions) == (len(ids), 3)

    # The header's seq is a real entry of the log: this user's "export".
    assert header.audit_seq > 0
    entries = stub.ListAuditEntries(
        memory_pb2.ListAuditEntriesRequest(scope=memory_pb2.Scope(user_id=user), page_size=100),
        metadata=key_of("acme"),
        timeout=10,
    ).entries
    assert [e.event_type for e in entries if e.seq == header.audit_seq] == ["export"]


def test_another_tenant_exports_nothing_of_this_user(stub: Stub) -> None:
    user = uid("exp-tenancy")
    load(stub, user)
    items = export(stub, user, tenant="globex")
    assert [i.WhichOneof("item") for i in items] == ["header", "footer"]
    assert (items[-1].footer.memories, items[-1].footer.sessions) == (0, 0)


def test_export_of_a_bad_user_id_is_refused_naming_the_field(stub: Stub) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        export(stub, "has space")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "user_id" in (caught.value.details() or "")


def test_import_validates_every_record_before_storing_any(stub: Stub) -> None:
    user = uid("imp-bad")
    good = memory_pb2.MemoryRecord(
        memory_id=uid("m"),
        scope=memory_pb2.Scope(user_id=user, session_id="s1"),
        role=memory_pb2.ROLE_USER,
        text="a valid record",
    )
    good.time.FromSeconds(T0)
    cases: list[tuple[memory_pb2.MemoryRecord, str]] = []
    no_time = memory_pb2.MemoryRecord()
    no_time.CopyFrom(good)
    no_time.ClearField("time")
    cases.append((no_time, "records[1].time"))
    no_id = memory_pb2.MemoryRecord()
    no_id.CopyFrom(good)
    no_id.memory_id = ""
    cases.append((no_id, "records[1].memory_id"))
    blank = memory_pb2.MemoryRecord()
    blank.CopyFrom(good)
    blank.text = "   "
    cases.append((blank, "records[1].text"))
    bad_role = memory_pb2.MemoryRecord()
    bad_role.CopyFrom(good)
    bad_role.role = memory_pb2.ROLE_UNSPECIFIED
    cases.append((bad_role, "records[1].role"))
    for bad, field in cases:
        bad.memory_id = bad.memory_id and uid("m")
        with pytest.raises(grpc.RpcError) as caught:
            import_(stub, [good, bad], size=2)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
        assert field in (caught.value.details() or ""), (field, caught.value.details())
    assert listing(stub, user) == []  # the valid record of each batch was not stored either
    with pytest.raises(grpc.RpcError) as caught:
        stub.ImportTurns(
            iter([memory_pb2.ImportTurnsRequest()]), metadata=key_of("acme"), timeout=10
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "records" in (caught.value.details() or "")


@contextmanager
def empty_cluster(embedding: ServiceProcess, root: Path) -> Iterator[Stub]:
    """A gateway, retrieval and audit service of their own, on empty stores."""
    with ExitStack() as stack:
        retrieval = stack.enter_context(retrieval_process(root / "retrieval", reserve_port()))
        audit = stack.enter_context(audit_process(root / "audit"))
        wait_for(retrieval.addr, RETRIEVAL, timeout=60)
        wait_for(audit.addr, AUDIT, timeout=60)
        gateway = stack.enter_context(
            gateway_process(embedding.addr, retrieval.addr, audit.addr, root / "gateway")
        )
        wait_for(gateway.addr, GATEWAY, timeout=60)
        channel = stack.enter_context(grpc.insecure_channel(gateway.addr))
        yield memory_pb2_grpc.MemoryServiceStub(channel)


def test_an_export_imported_into_an_empty_cluster_gives_back_the_same_memory(
    embedding: ServiceProcess, tmp_path: Path
) -> None:
    """The issue's promise, exactly: same memories, ids, sessions and Recall results
    (hits and their order). Both clusters hold only this user, so BM25's corpus
    statistics, and so every score, are the same."""
    user = uid("migrate")
    with empty_cluster(embedding, tmp_path / "a") as a:
        load(a, user)
        before_list = [plain(m) for m in listing(a, user)]
        before_sessions = sessions(a, user)
        before_recall = {q: recall_ids(a, user, q) for q in QUERIES}
        records = [i.memory for i in export(a, user) if i.HasField("memory")]
    assert all(before_recall.values()) and len(records) == len(before_list)
    with empty_cluster(embedding, tmp_path / "b") as b:
        reply = import_(b, records)
        assert (reply.created, reply.deduplicated) == (len(records), 0)
        assert [plain(m) for m in listing(b, user)] == before_list
        assert sessions(b, user) == before_sessions

        def same_recall() -> bool | None:
            return {q: recall_ids(b, user, q) for q in QUERIES} == before_recall or None

        eventually(same_recall, "the same Recall hits, in the same order, after the import")


def test_export_forget_import_in_one_cluster_restores_the_memory(stub: Stub) -> None:
    """Forget, then import the export, in the same cluster: the same memories, ids and
    sessions, and Recall finds the same memories again. (Not necessarily in the same order
    of near ties: until the purge rewrites the index files, BM25's statistics still count
    the erased copies.) Importing again stores nothing."""
    user = uid("roundtrip")
    load(stub, user)
    before_list = [plain(m) for m in listing(stub, user)]
    before_sessions = sessions(stub, user)
    before_recall = {q: sorted(recall_ids(stub, user, q)) for q in QUERIES}
    items = export(stub, user)
    records = [i.memory for i in items if i.HasField("memory")]

    forgot = stub.Forget(
        memory_pb2.ForgetRequest(user_id=user), metadata=key_of("acme"), timeout=30
    )
    assert forgot.memories_deleted == len(records)
    assert listing(stub, user) == [] and sessions(stub, user) == []
    assert all(recall_ids(stub, user, q) == [] for q in QUERIES)

    reply = import_(stub, records)
    assert (reply.created, reply.deduplicated) == (len(records), 0)
    assert [plain(m) for m in listing(stub, user)] == before_list
    assert sessions(stub, user) == before_sessions

    def same_hits() -> bool | None:
        return {q: sorted(recall_ids(stub, user, q)) for q in QUERIES} == before_recall or None

    eventually(same_hits, "Recall finds the same memories after the import")

    # Resumable: the same stream again stores nothing new.
    again = import_(stub, records, size=5)
    assert (again.created, again.deduplicated) == (0, len(records))
    assert [plain(m) for m in listing(stub, user)] == before_list
