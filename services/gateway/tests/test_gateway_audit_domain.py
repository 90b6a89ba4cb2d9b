"""The gateway's audit recording as units: the recorder over the real spool (the core
outbox on both engines) with a double of the audit service that can go down, lose
replies, or refuse; the audit reads; the disclosure note."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from gateway_harness import FakeLog, MakeStore

from hippo_core import outbox
from hippo_core.errors import InvalidArgument, NotFound, Unavailable
from hippo_gateway.adapters import spool, spool_store
from hippo_gateway.domain import audit_events, disclosure
from hippo_gateway.domain.audit_events import AuditEvent, EraseUser
from hippo_gateway.domain.audit_recorder import AuditRecorder, RecorderConfig
from hippo_gateway.domain.audit_trail import AuditTrail, Outcome
from hippo_gateway.domain.models import Hit, Memory, Role

DAY = 86_400_000_000
MAY_1 = 1_714_521_600_000_000  # 2024-05-01T00:00:00Z
FAST = outbox.DrainConfig(retry_min_seconds=0.01, retry_max_seconds=0.05, poll_seconds=0.05)


def recorder(
    log: FakeLog,
    store: outbox.OutboxStore,
    *,
    fail_closed: bool = False,
    seq_wait_seconds: float = 2.0,
) -> AuditRecorder:
    config = RecorderConfig(fail_closed, seq_wait_seconds=seq_wait_seconds)
    return AuditRecorder(log, spool.opener(store, FAST), b"k" * 32, config)


def event(n: int, user: str = "alice") -> AuditEvent:
    return AuditEvent("acme", "recall", user, "s1", (f"m{n}",), body={"n": n})


def waiting(store: outbox.OutboxStore) -> int:
    return store.depth()[0]


async def until(condition: object, timeout: float = 10.0) -> None:
    end = asyncio.get_running_loop().time() + timeout
    while not condition():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < end, "condition not met"
        await asyncio.sleep(0.01)


async def test_an_outage_spools_and_drains_in_order_exactly_once(make_store: MakeStore) -> None:
    log = FakeLog()
    store = make_store()
    rec = recorder(log, store)
    await rec.start()
    log.down = True
    for n in range(20):
        assert await rec.record(event(n)) == 0  # durable in the spool; the caller moves on
    assert waiting(store) == 20 and log.entries == []
    log.down, log.lose_next_reply = False, True
    await until(lambda: waiting(store) == 0)
    assert [e.body["n"] for e in log.entries] == list(range(20))  # type: ignore[union-attr]
    await rec.close()


async def test_the_spool_outlives_the_recorder(make_store: MakeStore) -> None:
    """What a stopped gateway left is delivered by the next one: a restart on the same
    SQLite file, or (PostgreSQL) a process with a new owner id that adopts the rows."""
    log = FakeLog()
    log.down = True
    rec = recorder(log, make_store())
    await rec.start()
    for n in range(3):
        await rec.record(event(n))
    await rec.close()
    log.down = False
    again = make_store()
    rec = recorder(log, again)
    await rec.start()
    await until(lambda: waiting(again) == 0 and len(log.entries) == 3)
    assert [e.body["n"] for e in log.entries] == [0, 1, 2]  # type: ignore[union-attr]
    await rec.close()


async def test_wait_returns_the_seq_once_delivered(make_store: MakeStore) -> None:
    log = FakeLog()
    rec = recorder(log, make_store())
    await rec.start()
    assert await rec.record(event(1), wait=True) == 1
    assert await rec.record(event(2), wait=True) == 2
    await rec.close()


async def test_during_an_outage_callers_do_not_wait_for_a_seq(make_store: MakeStore) -> None:
    """Once a delivery has failed, record(wait=True) answers 0 at once instead of waiting
    seq_wait_seconds (here an hour) on every call; the event is spooled all the same."""
    log = FakeLog()
    log.down = True
    store = make_store()
    rec = recorder(log, store, seq_wait_seconds=3600)
    await rec.start()
    await rec.record(event(1))
    await until(lambda: not rec.reachable)
    assert await asyncio.wait_for(rec.record(event(2), wait=True), timeout=30) == 0
    assert waiting(store) == 2
    log.down = False
    await until(lambda: waiting(store) == 0)
    assert await asyncio.wait_for(rec.record(event(3), wait=True), timeout=30) == 3
    await rec.close()


async def test_fail_closed_records_first_or_refuses(make_store: MakeStore) -> None:
    log = FakeLog()
    store = make_store()
    rec = recorder(log, store, fail_closed=True, seq_wait_seconds=0.2)
    await rec.start()
    log.down = True
    with pytest.raises(Unavailable) as err:
        await rec.record(event(1))
    assert err.value.reason == "AUDIT_UNAVAILABLE"
    assert waiting(store) == 0  # refused means not recorded anywhere
    # Forget is never refused: its entry and the key erasure wait in the spool.
    erase = EraseUser("acme", "alice")
    assert await rec.record_spooled(event(2), erase=erase, wait=True) == 0
    assert waiting(store) == 2
    log.down = False
    assert await rec.record(event(3)) == 3  # after what was spooled before it
    assert log.types() == ["recall", "erase", "recall"]
    await rec.close()


async def test_remembering_records_before_the_write_when_fail_closed(
    make_store: MakeStore,
) -> None:
    log = FakeLog()
    store = make_store()
    rec = recorder(log, store, fail_closed=True)
    await rec.start()
    remembered = audit_events.remember_event("acme", "alice", "s1", ["m1"], 1)
    writes: list[str] = []

    async def failing() -> int:
        writes.append("write")
        assert log.types() == ["remember"]  # recorded before anything was written
        raise Unavailable("retrieval is down")

    with pytest.raises(Unavailable, match="retrieval"):
        await rec.remembering(remembered, failing)
    await until(lambda: waiting(store) == 0 and len(log.entries) == 2)
    assert log.types() == ["remember", "remember_failed"] and writes == ["write"]
    failed = log.entries[1]
    assert isinstance(failed, AuditEvent) and failed.body["ref_event"] == remembered.event_id

    log.down = True
    attempted: list[str] = []

    async def write() -> int:
        attempted.append("write")
        return 1

    with pytest.raises(Unavailable):
        await rec.remembering(audit_events.remember_event("acme", "alice", "s1", ["m2"], 1), write)
    assert attempted == []  # the log is down: nothing was written
    await rec.close()


async def test_an_event_refused_for_good_is_buried_not_blocking(make_store: MakeStore) -> None:
    log = FakeLog()
    store = make_store()
    rec = recorder(log, store)
    bad = event(2)
    log.refuse.add(bad.event_id)
    log.down = True
    for e in (event(1), bad, event(3)):
        await rec.record(e)
    log.down = False
    await rec.start()
    await until(lambda: waiting(store) == 0)
    assert [e.body["n"] for e in log.entries] == [1, 3]  # type: ignore[union-attr]
    assert store.depth()[1] == 1  # set aside with its reason, not dropped
    await rec.close()


async def test_a_key_erasure_is_delivered_alone_in_its_place(make_store: MakeStore) -> None:
    """Events before an erasure go in one Append, the erasure in its own call, the events
    after it in the next Append: the log keeps the order the gateway decided."""
    log = FakeLog()
    log.down = True
    rec = recorder(log, make_store())
    await rec.start()
    await rec.record(event(1))
    await rec.record_spooled(event(2), erase=EraseUser("acme", "alice"))
    await rec.record(event(3))
    log.down = False
    await until(lambda: len(log.entries) == 4)
    assert log.types() == ["recall", "recall", "erase", "recall"]
    await rec.close()


async def test_fingerprints_are_keyed_and_scoped(tmp_path: Path) -> None:
    a = AuditRecorder(FakeLog(), spool.opener(spool_store.sqlite_store(tmp_path / "a")), b"a" * 32)
    b = AuditRecorder(FakeLog(), spool.opener(spool_store.sqlite_store(tmp_path / "b")), b"b" * 32)
    fp = a.fingerprint("acme", "alice", "where do I  live?")
    assert fp == a.fingerprint("acme", "alice", " where do I live? ")  # spacing is not meaning
    assert fp != a.fingerprint("acme", "bob", "where do I live?")
    assert fp != a.fingerprint("globex", "alice", "where do I live?")
    assert fp != b.fingerprint("acme", "alice", "where do I live?")  # needs the secret
    assert len(fp) == 32 and "live" not in fp
    await a.close()
    await b.close()


async def test_page_tokens_are_bound_to_their_scope(make_store: MakeStore) -> None:
    log = FakeLog()
    rec = recorder(log, make_store(), fail_closed=True)
    for n in range(5):
        await rec.record(event(n))
    trail = AuditTrail(log, rec)
    first, token = await trail.entries("acme", "alice", "", 2, "")
    assert [r.seq for r in first] == [1, 2] and token
    second, token2 = await trail.entries("acme", "alice", "", 2, token)
    assert [r.seq for r in second] == [3, 4]
    for tenant, user, session in [
        ("acme", "bob", ""),
        ("globex", "alice", ""),
        ("acme", "alice", "s1"),
    ]:
        with pytest.raises(InvalidArgument, match="another scope") as err:
            await trail.entries(tenant, user, session, 2, token2)
        assert err.value.field == "page_token"
    with pytest.raises(InvalidArgument, match="not a token"):
        await trail.entries("acme", "alice", "", 2, token2[:-3] + "!!!")
    with pytest.raises(NotFound):
        await trail.report("acme", Outcome("bob", "", 1, "accepted"))
    await rec.close()


# -- the disclosure note --------------------------------------------------------------------


def hit(memory_id: str, day: int, score: float, lexical: int, semantic: int) -> Hit:
    memory = Memory(
        memory_id, "alice", "s1", Role.USER, "secret text", MAY_1 + day * DAY, "", {}, 1
    )
    return Hit(memory, score, lexical, semantic, 1.0, 0.5)


class Skip:
    def __init__(self, memory_id: str, reason: str, fused_score: float) -> None:
        self.memory_id, self.reason, self.fused_score = memory_id, reason, fused_score


def context(used: list[Hit], skipped: list[Skip], total: int, lexical: int = 5) -> AuditEvent:
    return audit_events.context_event(
        "acme",
        "alice",
        "s1",
        "f" * 32,
        used=used,
        skipped=skipped,
        candidates=total,
        lexical_candidates=lexical,
        semantic_candidates=total,
    )


def test_the_note_lists_memories_used_with_dates_scores_and_ranks() -> None:
    used = [hit("m-a", 0, 0.4167, 1, 1), hit("m-b", -11, 0.25, 1, 0)]
    note = disclosure.note(context(used, [Skip("m-c", "over_budget", 0.0833)], 6))
    assert note.splitlines() == [
        "Memories used: 2 of 6 candidates (lexical 5, semantic 6).",
        "  1. 2024-05-01, score 0.417 (lexical #1, semantic #1), m-a",
        "  2. 2024-04-20, score 0.250 (lexical #1), m-b",
        "Skipped: m-c (over the token budget, score 0.083).",
    ]
    assert "secret text" not in note  # the note is made from the entry, which has no text


def test_the_note_says_when_nothing_relevant_was_found() -> None:
    assert disclosure.note(context([], [], 0, lexical=0)) == (
        "Nothing relevant found in memory (0 candidates)."
    )
    note = disclosure.note(context([], [Skip("m-w", "in_window", 0.3)], 1))
    assert note.startswith("No memories used: 1 candidates")
    assert "m-w (already in the recent window, score 0.300)" in note


def test_the_note_flags_thin_evidence() -> None:
    thin = disclosure.note(context([hit("m-a", 0, 0.1667, 0, 1)], [], 2, lexical=0))
    assert thin.splitlines()[-1] == (
        "Evidence is thin: only 2 candidates; best score 0.167 is below 0.2; "
        "no stored words match the query (vector similarity only)."
    )
    strong = disclosure.note(context([hit("m-a", 0, 0.4167, 1, 1)], [], 10))
    assert "thin" not in strong


def test_the_note_reports_influence() -> None:
    chat = AuditEvent(
        "acme",
        "chat",
        "alice",
        "s1",
        body={
            "influence_mode": "on",
            "influences": [{"memtok_id": "t1", "layer": 9, "strength": 0.8}],
        },
    )
    off = AuditEvent(
        "acme", "chat", "alice", "s1", body={"influence_mode": "off", "influences": []}
    )
    used = context([hit("m-a", 0, 0.4167, 1, 1)], [], 10)
    assert disclosure.note([used, chat]).splitlines()[-1] == (
        "Influence applied: t1 (layer 9, strength 0.80)."
    )
    assert disclosure.note([used, off]).endswith("Influence: off.")
