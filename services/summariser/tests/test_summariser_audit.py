"""Merges recorded in the audit log: the event queued by the merge's own transaction, the
core outbox draining it (both engines), files of older schemas, and the real audit
service over gRPC (down, then back: nothing lost, nothing twice)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path

import grpc
import pytest
from summariser_harness import (
    Injection,
    Store,
    Stores,
    append,
    engine_settings,
    exchange,
    flush,
    ready,
    stub,
    summariser,
)
from tgi_double import TgiDouble

from hippo.audit.v1 import audit_pb2, audit_pb2_grpc
from hippo_core import outbox as core_outbox
from hippo_core.errors import InvalidArgument, Unavailable
from hippo_core.listen import reserve_port
from hippo_core.outbox import DrainConfig, Outbox, OutboxStore, SqliteOutbox
from hippo_core.testing import ServiceProcess, service_process, wait_for
from hippo_summariser.adapters import sqlite_store
from hippo_summariser.adapters.sqlite_store import SqliteSessionStore
from hippo_summariser.domain import audit
from hippo_summariser.domain.models import MergeEvent, MergeOutcome, Role, SessionKey, TurnIn

A = SessionKey("acme", "u1", "s1")
AUDIT = "hippo.audit.v1.AuditService"


def outcome(summary: str) -> MergeOutcome:
    return MergeOutcome(summary, len(summary.split()), 4, 2, 3, 1, True, 0)


def event(ids: Sequence[str], event_id: str) -> MergeEvent:
    return MergeEvent(A, 0, tuple(ids), 3, 4, 2, 3, 0.5, 0.75, 2, True, 1.5, event_id, 7)


def fill(store: Store, n: int) -> list[int]:
    """Append n turns; merge them one per commit, each queueing an event. Returns versions."""
    roles = (Role.USER, Role.ASSISTANT)
    session, _ = store.append(
        A, [TurnIn(f"m{i}", roles[i % 2], f"t{i}", i, "Ada", 3) for i in range(n)], 1
    )
    assert store.claim(A, 30).held
    versions = []
    for i, turn in enumerate(session.window):
        rev = store.load(A).summary_rev  # type: ignore[union-attr]
        version = store.commit_merge(
            A, rev, [turn.seq], outcome(f"s{i}"), 2, event([turn.memory_id], f"e{i}")
        )
        assert version is not None
        versions.append(version)
    return versions


def queued(box: OutboxStore) -> list[MergeEvent]:
    return [audit.decode(item) for _, item, _ in box.peek(100)]


def test_a_merge_queues_its_event_in_the_same_commit_and_a_refused_merge_none(
    stores: Stores,
) -> None:
    store = stores.make()
    session, _ = store.append(A, [TurnIn("m0", Role.USER, "hi", 1, "Ada", 3)], 1)
    seq = session.window[0].seq
    assert store.claim(A, 30).held
    refused = store.commit_merge(
        A, session.summary_rev + 5, [seq], outcome("x"), 2, event(["m0"], "no")
    )
    assert refused is None
    box = stores.outbox(store)
    assert box.peek(10) == [] and box.depth()[:2] == (0, 0)
    version = store.commit_merge(
        A, session.summary_rev, [seq], outcome("x"), 2, event(["m0"], "e0")
    )
    assert version is not None
    [(outbox_id, text, _)] = box.peek(10)
    [event_queued] = queued(box)
    assert event_queued.event_id == "e0" and event_queued.version == version  # the commit's
    assert event_queued.merged_memory_ids == ("m0",) and event_queued.key == A
    assert event_queued.retention == 0.75 and event_queued.llm_calls == 2
    assert event_queued.repaired
    assert "hi" not in text  # ids and figures, never text
    box.bury(outbox_id, "refused")
    assert box.peek(10) == [] and box.depth()[:2] == (0, 1)


def _old_file(path: Path, scripts: Sequence[str], version: int) -> None:
    """A file as an older build left it (its own schema scripts, its user_version)."""
    conn = sqlite3.connect(path)
    for script in scripts:
        conn.executescript(script)
    conn.execute(
        "INSERT INTO sessions (tenant, user_id, session_id, version, summary, updated_us) "
        "VALUES ('acme', 'u1', 's1', 3, 'an old summary', 1)"
    )
    conn.execute(f"PRAGMA user_version = {version}")
    conn.commit()
    conn.close()


def test_files_of_schema_1_and_2_open_and_keep_their_sessions_and_queued_events(
    tmp_path: Path,
) -> None:
    one, two = tmp_path / "one.sqlite3", tmp_path / "two.sqlite3"
    _old_file(one, [sqlite_store._TABLES], 1)
    _old_file(two, [sqlite_store._TABLES, sqlite_store._OUTBOX], 2)
    conn = sqlite3.connect(two)  # a merge event schema 2's build queued, undelivered
    conn.execute(
        "INSERT INTO audit_outbox (event, created_us) VALUES (?, 5)",
        (audit.encode(event(["m0"], "from-schema-2")),),
    )
    conn.commit()
    conn.close()
    for path in (one, two):
        store = SqliteSessionStore(path)
        loaded = store.load(A)
        assert loaded is not None and loaded.summary == "an old summary" and loaded.version == 3
        version = sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0]
        assert version == len(sqlite_store.MIGRATIONS)
        box = SqliteOutbox(path, audit.TABLE)
        assert [e.event_id for e in queued(box)] == (["from-schema-2"] if path == two else [])
        box.close()
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


async def test_the_outbox_waits_out_an_outage_then_delivers_in_order_once(
    stores: Stores,
) -> None:
    store = stores.make()
    fill(store, 7)
    sink = Sink()
    sink.refuse = {"e3"}
    box = Outbox(
        audit.OUTBOX,
        stores.outbox(store),
        deliver=audit.deliverer(sink),
        encode=audit.encode,
        decode=audit.decode,
        config=DrainConfig(batch=3, retry_min_seconds=0.01, retry_max_seconds=0.02),
    )
    await box.start()
    assert not await box.drained(0.3)  # down: nothing leaves the outbox
    assert box.depth() == 7 and sink.appended == []
    failures = core_outbox.FAILURES.labels(audit.OUTBOX, "UNAVAILABLE")._value.get()
    assert failures >= 2
    sink.up = True
    box.notify()
    assert await box.drained(5)
    # In order, each once; the refused one set aside with its reason, not lost.
    assert sink.appended == ["e0", "e1", "e2", "e4", "e5", "e6"]
    assert box.depth() == 0
    assert core_outbox.DEAD.labels(audit.OUTBOX)._value.get() == 1
    await box.close()


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


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_merges_reach_the_real_audit_log_after_it_comes_back(
    engine: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    injection: Injection,
    tgi: TgiDouble,
) -> None:
    audit_port = reserve_port()
    addr = f"127.0.0.1:{audit_port}"
    with summariser(
        tmp_path / "sum",
        injection.addr,
        tgi.url,
        audit_addr=addr,
        audit_retry_max_seconds="0.5",
        **engine_settings(engine, request),
    ) as proc:
        s = stub(ready(proc))
        for i in range(8):
            append(s, exchange(i), user="ada", session="trip")
        state = flush(s, tenant="acme", user="ada", session="trip")
        assert state.merge_stats.merges >= 2  # merged while the audit log was down
        with audit_process(tmp_path / "audit", audit_port) as audit_proc:
            wait_for(audit_proc.addr, AUDIT, timeout=60)
            entries: list[audit_pb2.Entry] = []
            for _ in range(100):
                entries = merge_entries(addr)
                if len(entries) >= state.merge_stats.merges:
                    break
                time.sleep(0.1)
            time.sleep(0.3)  # a duplicate delivery would show by now
            entries = merge_entries(addr)
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
