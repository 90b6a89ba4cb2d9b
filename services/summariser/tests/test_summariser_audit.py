"""Merges recorded in the audit log: the outbox in the store, its drainer, and the real
audit service over gRPC (down, then back: nothing lost, nothing twice)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path

import grpc
from summariser_harness import Injection, append, exchange, flush, ready, stub, summariser
from tgi_double import TgiDouble

from hippo.audit.v1 import audit_pb2, audit_pb2_grpc
from hippo_core.errors import InvalidArgument, Unavailable
from hippo_core.listen import reserve_port
from hippo_core.testing import ServiceProcess, service_process, wait_for
from hippo_summariser.adapters import sqlite_store
from hippo_summariser.adapters.sqlite_store import SqliteSessionStore
from hippo_summariser.domain.audit import AuditOutbox, OutboxConfig
from hippo_summariser.domain.models import MergeEvent, MergeOutcome, Role, SessionKey, TurnIn

A = SessionKey("acme", "u1", "s1")
AUDIT = "hippo.audit.v1.AuditService"


def outcome(summary: str) -> MergeOutcome:
    return MergeOutcome(summary, len(summary.split()), 4, 2, 3, 1, True, 0)


def event(ids: Sequence[str], event_id: str) -> MergeEvent:
    return MergeEvent(A, 0, tuple(ids), 3, 4, 2, 3, 0.5, 0.75, 2, True, 1.5, event_id, 7)


def fill(store: SqliteSessionStore, n: int) -> list[int]:
    """Append n turns; merge them one per commit, each queueing an event. Returns versions."""
    roles = (Role.USER, Role.ASSISTANT)
    session, _ = store.append(
        A, [TurnIn(f"m{i}", roles[i % 2], f"t{i}", i, "Ada", 3) for i in range(n)], 1
    )
    versions = []
    for i, turn in enumerate(session.window):
        rev = store.load(A).summary_rev  # type: ignore[union-attr]
        version = store.commit_merge(
            A, rev, [turn.seq], outcome(f"s{i}"), 2, event([turn.memory_id], f"e{i}")
        )
        assert version is not None
        versions.append(version)
    return versions


def test_a_merge_queues_its_event_in_the_same_commit_and_a_refused_merge_none(
    tmp_path: Path,
) -> None:
    store = SqliteSessionStore(tmp_path / "s.sqlite3")
    session, _ = store.append(A, [TurnIn("m0", Role.USER, "hi", 1, "Ada", 3)], 1)
    seq = session.window[0].seq
    assert (
        store.commit_merge(A, session.summary_rev + 5, [seq], outcome("x"), 2, event(["m0"], "no"))
        is None
    )
    assert store.outbox_peek(10) == [] and store.outbox_depth() == (0, 0)
    version = store.commit_merge(
        A, session.summary_rev, [seq], outcome("x"), 2, event(["m0"], "e0")
    )
    assert version is not None
    store.close()
    reopened = SqliteSessionStore(tmp_path / "s.sqlite3")  # durable with the merge
    [(outbox_id, queued)] = reopened.outbox_peek(10)
    assert queued.event_id == "e0" and queued.version == version  # the commit's version
    assert queued.merged_memory_ids == ("m0",) and queued.key == A
    assert queued.retention == 0.75 and queued.llm_calls == 2 and queued.repaired
    reopened.outbox_bury(outbox_id, "refused")
    assert reopened.outbox_peek(10) == [] and reopened.outbox_depth() == (0, 1)
    reopened.close()


def test_a_version_1_store_gains_the_outbox_and_keeps_its_sessions(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript(sqlite_store._TABLES)
    conn.execute(
        "INSERT INTO sessions (tenant, user_id, session_id, version, summary, updated_us) "
        "VALUES ('acme', 'u1', 's1', 3, 'an old summary', 1)"
    )
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    store = SqliteSessionStore(path)
    loaded = store.load(A)
    assert loaded is not None and loaded.summary == "an old summary" and loaded.version == 3
    assert store.outbox_depth() == (0, 0)
    store.close()


class Sink:
    """The audit log as the drainer sees it: can be down, refuses event ids in `refuse`."""

    def __init__(self) -> None:
        self.up = False
        self.refuse: set[str] = set()
        self.appended: list[str] = []

    async def append(self, events: Sequence[MergeEvent]) -> None:
        if not self.up:
            raise Unavailable("audit: connection refused")
        if any(e.event_id in self.refuse for e in events):
            raise InvalidArgument("body", "too large")
        self.appended.extend(e.event_id for e in events)


async def test_the_outbox_waits_out_an_outage_then_delivers_in_order_once(tmp_path: Path) -> None:
    store = SqliteSessionStore(tmp_path / "s.sqlite3")
    fill(store, 7)
    sink = Sink()
    sink.refuse = {"e3"}
    outbox = AuditOutbox(
        store, sink, OutboxConfig(batch=3, retry_min_seconds=0.01, retry_max_seconds=0.02)
    )
    outbox.start()
    assert not await outbox.drained(0.3)  # down: nothing leaves the outbox
    assert store.outbox_depth() == (7, 0) and sink.appended == []
    sink.up = True
    outbox.notify()
    assert await outbox.drained(5)
    # In order, each once; the refused one set aside with its reason, not lost.
    assert sink.appended == ["e0", "e1", "e2", "e4", "e5", "e6"]
    assert store.outbox_depth() == (0, 1)
    await outbox.close()
    store.close()


def audit_process(data_dir: Path, port: int) -> AbstractContextManager[ServiceProcess]:
    env = {
        "HIPPO_AUDIT_DATA_DIR": str(data_dir),
        "HIPPO_AUDIT_PORT": str(port),
        "HIPPO_AUDIT_GRACE_SECONDS": "2",
    }
    return service_process("hippo_audit", "HIPPO_AUDIT_", env)


def merge_entries(addr: str) -> list[audit_pb2.Entry]:
    with grpc.insecure_channel(addr) as channel:
        reply = audit_pb2_grpc.AuditServiceStub(channel).Read(
            audit_pb2.ReadRequest(tenant="acme", user_id="ada", limit=1000), timeout=10
        )
    return [e for e in reply.entries if e.event_type == "merge"]


def test_merges_reach_the_real_audit_log_after_it_comes_back(
    tmp_path: Path, injection: Injection, tgi: TgiDouble
) -> None:
    audit_port = reserve_port()
    addr = f"127.0.0.1:{audit_port}"
    with summariser(
        tmp_path / "sum", injection.addr, tgi.url, audit_addr=addr, audit_retry_max_seconds="0.5"
    ) as proc:
        s = stub(ready(proc))
        for i in range(8):
            append(s, exchange(i), user="ada", session="trip")
        state = flush(s, tenant="acme", user="ada", session="trip")
        assert state.merge_stats.merges >= 2  # merged while the audit log was down
        with audit_process(tmp_path / "audit", audit_port) as audit:
            wait_for(audit.addr, AUDIT, timeout=60)
            entries: list[audit_pb2.Entry] = []
            for _ in range(100):
                entries = merge_entries(addr)
                if len(entries) >= state.merge_stats.merges:
                    break
                time.sleep(0.1)
            assert len(entries) == state.merge_stats.merges  # each merge once
            merged = [m for e in entries for m in e.memory_ids]
            assert merged == [t.memory_id for i in range(8) for t in exchange(i)][: len(merged)]
            assert len(merged) == state.merge_stats.turns_merged
            for e in entries:
                assert e.actor == "summariser" and e.session_id == "trip"
                body = dict(e.body)
                assert 0.0 <= body["retention"] <= 1.0 and body["facts"] >= 1
                assert "Rosa" not in str(e.body)  # figures and ids, never text
            versions = [dict(e.body)["version"] for e in entries]
            assert versions == sorted(versions)
