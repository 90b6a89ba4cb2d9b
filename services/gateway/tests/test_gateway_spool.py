"""The audit spool's storage: a spool left by the version before the core outbox is
migrated and delivered; gateway replicas on one PostgreSQL each deliver their own events
and adopt a stopped one's; the fingerprint key is shared by replicas; a spooled event
keeps its caller's trace."""

from __future__ import annotations

import asyncio
import base64
import os
import sqlite3
import stat
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidTag
from gateway_harness import FakeLog, MakeStore, gateway_database
from opentelemetry import trace
from prometheus_client import REGISTRY

from hippo_core import outbox, tracing
from hippo_gateway.adapters import fingerprint_key, spool, spool_store
from hippo_gateway.domain.audit_events import (
    AuditEvent,
    AuditRecord,
    EraseUser,
    Verification,
)
from hippo_gateway.domain.audit_recorder import AuditRecorder

KEY = b"k" * 32
FAST = outbox.DrainConfig(retry_min_seconds=0.01, retry_max_seconds=0.05, poll_seconds=0.05)

# The spool exactly as the gateway wrote it before the core outbox (user_version 0).
OLD_LAYOUT = """
CREATE TABLE IF NOT EXISTS spool (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    item       TEXT NOT NULL,
    spooled_us INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS dead (
    id         INTEGER PRIMARY KEY,
    item       TEXT NOT NULL,
    spooled_us INTEGER NOT NULL,
    reason     TEXT NOT NULL,
    buried_us  INTEGER NOT NULL
);
"""


def old_event(event_id: str, n: int) -> str:
    """An event as the previous version's spool stored it."""
    return (
        f'{{"event": {{"actor": "gateway", "body": {{"n": {n}}}, "event_id": "{event_id}", '
        f'"event_type": "recall", "memory_ids": ["m{n}"], "private": null, "session": "s1", '
        '"tenant": "acme", "trace_parent": "", "user": "alice"}}'
    )


OLD_ERASE = (
    '{"erase": {"actor": "gateway", "event_id": "x4", "tenant": "acme", '
    '"trace_parent": "", "user": "alice"}}'
)


async def until(condition: object, timeout: float = 15.0) -> None:
    end = asyncio.get_running_loop().time() + timeout
    while not condition():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < end, "condition not met"
        await asyncio.sleep(0.02)


def event(replica: str, n: int) -> AuditEvent:
    return AuditEvent("acme", "recall", "alice", "s1", (f"{replica}{n}",), body={"n": n})


async def test_a_spool_left_by_the_previous_version_is_migrated_and_delivered(
    tmp_path: Path,
) -> None:
    """Upgrading a gateway whose spool still holds events: they are delivered in their
    order after the upgrade, the dead item keeps its reason, and new items come after."""
    path = tmp_path / spool_store.FILE
    old = sqlite3.connect(path)
    old.execute("PRAGMA journal_mode = WAL")
    old.executescript(OLD_LAYOUT)
    items = [old_event("e1", 1), old_event("e2", 2), old_event("e3", 3), OLD_ERASE]
    items.append(old_event("e5", 5))
    with old:
        old.executemany(
            "INSERT INTO spool (item, spooled_us) VALUES (?, ?)", [(i, 1000) for i in items]
        )
        # The previous version buried e3 (refused for good): moved to `dead`, keeping its id.
        old.execute(
            "INSERT INTO dead SELECT id, item, spooled_us, 'entries[0].body: refused', 2000 "
            "FROM spool WHERE id = 3"
        )
        old.execute("DELETE FROM spool WHERE id = 3")
    old.close()

    log = FakeLog()
    store = spool_store.sqlite_store(tmp_path)
    rec = AuditRecorder(log, spool.opener(store, FAST), KEY)
    await rec.start()
    await until(lambda: len(log.entries) == 4)
    assert [e.event_id for e in log.entries] == ["e1", "e2", "x4", "e5"]
    assert isinstance(log.entries[2], EraseUser)  # delivered through ForgetUser, in its place
    await until(lambda: store.depth() == (0, 1, 0))
    await rec.close()

    check = sqlite3.connect(path)
    assert check.execute("PRAGMA user_version").fetchone()[0] == len(spool_store.SQLITE_MIGRATIONS)
    tables = {r[0] for r in check.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "spool" not in tables and "dead" not in tables
    assert check.execute(f"SELECT id, dead FROM {spool_store.TABLE}").fetchall() == [
        (3, "entries[0].body: refused")
    ]
    check.close()
    again = spool_store.sqlite_store(tmp_path)
    again.put(["{}"])
    assert again.peek(1)[0][0] == 6  # after every id the previous version handed out
    again.close()


class Replica:
    """One gateway replica's view of the shared audit service: notes who delivered what."""

    def __init__(self, log: FakeLog, name: str, by: dict[str, list[str]]) -> None:
        self._log, self._name, self._by = log, name, by

    async def append(self, events: Sequence[AuditEvent]) -> list[int]:
        seqs = await self._log.append(events)
        for e in events:
            self._by.setdefault(e.event_id, []).append(self._name)
        return seqs

    async def erase_user(self, erase: EraseUser) -> int:
        return await self._log.erase_user(erase)

    async def read(
        self, tenant: str, user: str, session: str, after_seq: int, to_seq: int, limit: int
    ) -> tuple[list[AuditRecord], int]:
        return await self._log.read(tenant, user, session, after_seq, to_seq, limit)

    async def verify(self, from_seq: int, to_seq: int, tenant: str = "") -> Verification:
        return await self._log.verify(from_seq, to_seq, tenant)


def adopted() -> float:
    value = REGISTRY.get_sample_value("hippo_outbox_adopted_total", {"outbox": spool.NAME})
    return value or 0.0


async def test_replicas_deliver_their_own_events_and_adopt_a_stopped_ones(
    postgres_url: str,
) -> None:
    """Two gateway replicas on one PostgreSQL: each delivers the events it recorded; the
    events of a replica that stopped before delivering them are adopted and delivered by
    the other, in their order, and every event is appended exactly once."""
    log = FakeLog()
    by: dict[str, list[str]] = {}
    databases = [gateway_database(postgres_url) for _ in range(2)]
    stores = [spool_store.postgres_store(db, outbox.new_owner()) for db in databases]
    a = AuditRecorder(Replica(log, "a", by), spool.opener(stores[0], FAST), KEY)
    b = AuditRecorder(Replica(log, "b", by), spool.opener(stores[1], FAST), KEY)
    await a.start()
    await b.start()
    recorded = []
    for n in range(5):
        for replica, rec in (("a", a), ("b", b)):
            recorded.append(event(replica, n))
            assert await rec.record(recorded[-1], wait=True) > 0
    assert all(by[e.event_id] == [e.memory_ids[0][0]] for e in recorded)  # their own

    log.down = True
    stranded = [event("a", n) for n in range(5, 10)]
    for e in stranded:
        await a.record(e)
    assert stores[0].depth()[0] == 5
    await a.close()  # replica a stops with its events undelivered (its lease goes too)
    late = event("b", 5)
    await b.record(late)
    before = adopted()
    log.down = False
    await until(lambda: all(e.event_id in log.seq_of for e in [*stranded, late]))
    assert [by[e.event_id] for e in stranded] == [["b"]] * 5
    assert adopted() - before == 5
    delivered = [e.event_id for e in log.entries if e.event_id in {s.event_id for s in stranded}]
    assert delivered == [e.event_id for e in stranded]  # in the order a recorded them
    everything = [e.event_id for e in [*recorded, *stranded, late]]
    assert sorted(log.delivered) == sorted(everything)  # each appended exactly once
    await until(lambda: stores[1].depth() == (0, 0, 0))
    await b.close()
    for database in databases:
        database.close()


def test_replicas_share_one_generated_fingerprint_key(postgres_url: str) -> None:
    """Replicas starting at once with no key configured all end up with the same one,
    kept in the gateway's schema; a configured key wins."""

    def start() -> bytes:
        database = gateway_database(postgres_url)
        try:
            return fingerprint_key.database_key("", database)
        finally:
            database.close()

    with ThreadPoolExecutor(4) as pool:
        keys = list(pool.map(lambda _: start(), range(4)))
    assert len(set(keys)) == 1 and len(keys[0]) == 32
    assert start() == keys[0]  # a later start reads it back
    configured = base64.b64encode(b"c" * 32).decode()
    database = gateway_database(postgres_url)
    assert fingerprint_key.database_key(configured, database) == b"c" * 32
    count = database.read(
        lambda conn: conn.execute("SELECT count(*) FROM fingerprint_key").fetchone()
    )
    assert count == (1,)
    database.close()


def test_the_embedded_fingerprint_key_is_a_private_file_kept_across_starts(
    tmp_path: Path,
) -> None:
    first = fingerprint_key.file_key("", tmp_path)
    assert fingerprint_key.file_key("", tmp_path) == first and len(first) == 32
    mode = os.stat(tmp_path / fingerprint_key.FILE).st_mode
    assert stat.S_IMODE(mode) == 0o600
    configured = base64.b64encode(b"c" * 32).decode()
    assert fingerprint_key.file_key(configured, tmp_path) == b"c" * 32


async def test_a_spooled_event_keeps_its_callers_trace(tmp_path: Path) -> None:
    """The delivery, later and batched, can rejoin the trace of the call that decided
    the event: its traceparent is taken on the caller's path and kept in the spool."""
    tracing.configure("test")
    log = FakeLog()
    log.down = True
    rec = AuditRecorder(log, spool.opener(spool_store.sqlite_store(tmp_path), FAST), KEY)
    await rec.start()
    with trace.get_tracer("test").start_as_current_span("remember"):
        origin = tracing.traceparent()
        await rec.record(event("a", 1))
    await rec.record(event("a", 2))  # outside any span
    log.down = False
    await until(lambda: len(log.entries) == 2)
    assert origin.startswith("00-")
    assert [e.trace_parent for e in log.entries] == [origin, ""]
    await rec.close()


async def test_an_erasure_scrubs_the_embedded_spools_wal(tmp_path: Path) -> None:
    """Once a user's key erasure is delivered, the spool's WAL (which still holds the
    frames of the user's delivered items) is cut to nothing."""
    log = FakeLog()
    store = spool_store.sqlite_store(tmp_path)
    scrub = spool_store.sqlite_scrub(tmp_path)
    rec = AuditRecorder(log, spool.opener(store, FAST, scrub), KEY)
    await rec.start()
    assert await rec.record(event("a", 1), wait=True) == 1
    wal = tmp_path / f"{spool_store.FILE}-wal"
    assert wal.stat().st_size > 0
    assert await rec.record_spooled(event("a", 2), erase=EraseUser("acme", "alice"), wait=True)
    await until(lambda: wal.stat().st_size == 0)
    await rec.close()


async def test_an_erasure_vacuums_the_spool_table_in_postgresql(postgres_url: str) -> None:
    """Cluster mode: once a user's key erasure is delivered, the spool table is vacuumed,
    so the deleted rows of the user's items do not wait for autovacuum."""
    database = gateway_database(postgres_url)

    def vacuums() -> int:
        row = database.read(
            lambda conn: conn.execute(
                "SELECT vacuum_count FROM pg_stat_user_tables "
                "WHERE schemaname = 'hippo_gateway' AND relname = %s",
                (spool_store.TABLE,),
            ).fetchone()
        )
        return int(row[0])

    before = vacuums()
    store = spool_store.postgres_store(database, outbox.new_owner())
    scrub = spool_store.postgres_scrub(database)
    rec = AuditRecorder(FakeLog(), spool.opener(store, FAST, scrub), KEY)
    await rec.start()
    assert await rec.record(event("a", 1), wait=True) == 1
    assert vacuums() == before  # an ordinary delivery does not vacuum
    assert await rec.record_spooled(event("a", 2), erase=EraseUser("acme", "alice"), wait=True)
    await until(lambda: vacuums() > before)
    await rec.close()
    database.close()


async def test_private_bodies_are_sealed_in_the_spool(tmp_path: Path) -> None:
    """A spooled event's private words (a note, a memtok's words) are in neither the
    spool file nor its WAL while the audit service is down; once it is back the event
    is delivered with them intact; an item spooled before sealing still loads."""
    log = FakeLog()
    log.down = True
    store = spool_store.sqlite_store(tmp_path)
    rec = AuditRecorder(log, spool.opener(store, FAST, seal_key=KEY), KEY)
    await rec.start()
    words = "the walrus code is 7QX-secret"
    noted = AuditEvent("acme", "outcome", "alice", "s1", (), body={"n": 1}, private={"note": words})
    await rec.record(noted)
    files = _spool_bytes(tmp_path)
    assert all(b"walrus" not in data for data in files.values()), files.keys()
    assert any(b"private_sealed" in data for data in files.values())
    log.down = False
    await until(lambda: len(log.entries) == 1)
    assert log.entries[0].private == {"note": words}
    await rec.close()

    sealer = spool.Sealer(KEY)
    assert spool.load(spool.dump(noted, sealer), sealer) == noted
    assert spool.load(spool.dump(noted)) == noted  # spooled by a version that did not seal
    with pytest.raises(InvalidTag):  # a wrong key never yields someone else's words
        spool.load(spool.dump(noted, sealer), spool.Sealer(b"o" * 32))


def _spool_bytes(data_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in data_dir.glob(f"{spool_store.FILE}*")}


async def test_sealed_private_bodies_on_both_engines(make_store: MakeStore) -> None:
    """The spool's rows hold the sealed body, never the words, in SQLite and in
    PostgreSQL alike, and the audit service still receives the words intact."""
    log = FakeLog()
    log.down = True
    store = make_store()
    rec = AuditRecorder(log, spool.opener(store, FAST, seal_key=KEY), KEY)
    await rec.start()
    words = "the walrus code is 9QX-secret"
    await rec.record(
        AuditEvent("acme", "outcome", "alice", "s1", (), body={"n": 1}, private={"note": words})
    )
    rows = await asyncio.to_thread(store.peek, 10)
    assert rows and all("walrus" not in item and "private_sealed" in item for _, item, _ in rows)
    log.down = False
    await until(lambda: len(log.entries) == 1)
    assert log.entries[0].private == {"note": words}
    await rec.close()
