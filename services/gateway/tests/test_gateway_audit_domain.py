"""The gateway's audit recording as units: the disclosure note, and the recorder over a real
SQLite spool with a double of the audit service that can go down, lose replies, or refuse."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from hippo_core.errors import InvalidArgument, NotFound, Unavailable
from hippo_gateway.adapters.spool import SqliteSpool
from hippo_gateway.domain import audit, disclosure
from hippo_gateway.domain.audit import (
    AuditEvent,
    AuditRecord,
    AuditRecorder,
    AuditTrail,
    EraseUser,
    Outcome,
    RecorderConfig,
    Verification,
)
from hippo_gateway.domain.models import Hit, Memory, Role

DAY = 86_400_000_000
MAY_1 = 1_714_521_600_000_000  # 2024-05-01T00:00:00Z


class FakeLog:
    """The audit service's contract in memory: appends in order, one entry per event_id."""

    def __init__(self) -> None:
        self.entries: list[AuditEvent | EraseUser] = []
        self.seq_of: dict[str, int] = {}
        self.down = False
        self.lose_next_reply = False  # append, then fail as if the reply were lost
        self.refuse: set[str] = set()  # event ids refused with INVALID_ARGUMENT

    def _add(self, item: AuditEvent | EraseUser) -> int:
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

    async def verify(self, from_seq: int, to_seq: int) -> Verification:
        return Verification(True, len(self.entries), 0, "", len(self.entries), "00")

    def types(self) -> list[str]:
        return [e.event_type if isinstance(e, AuditEvent) else "erase" for e in self.entries]


@pytest.fixture
async def spool(tmp_path: Path) -> AsyncIterator[SqliteSpool]:
    opened = SqliteSpool(tmp_path / "spool.sqlite3")
    yield opened
    opened.close()


def recorder(log: FakeLog, spool: SqliteSpool, *, fail_closed: bool = False) -> AuditRecorder:
    config = RecorderConfig(
        fail_closed, seq_wait_seconds=2.0, retry_min_seconds=0.01, retry_max_seconds=0.05
    )
    return AuditRecorder(log, spool, b"k" * 32, config)


def event(n: int, user: str = "alice") -> AuditEvent:
    return AuditEvent("acme", "recall", user, "s1", (f"m{n}",), body={"n": n})


async def until(condition: object, timeout: float = 10.0) -> None:
    end = asyncio.get_running_loop().time() + timeout
    while not condition():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < end, "condition not met"
        await asyncio.sleep(0.01)


async def test_an_outage_spools_and_drains_in_order_exactly_once(spool: SqliteSpool) -> None:
    log = FakeLog()
    rec = recorder(log, spool)
    await rec.start()
    log.down = True
    for n in range(20):
        assert await rec.record(event(n)) == 0  # durable locally; the caller moves on
    assert spool.depth() == 20 and log.entries == []
    log.down, log.lose_next_reply = False, True
    await until(lambda: spool.depth() == 0)
    assert [e.body["n"] for e in log.entries] == list(range(20))  # type: ignore[union-attr]
    await rec.close()


async def test_the_spool_outlives_the_recorder(tmp_path: Path) -> None:
    log = FakeLog()
    log.down = True
    first = SqliteSpool(tmp_path / "spool.sqlite3")
    rec = recorder(log, first)
    await rec.start()
    for n in range(3):
        await rec.record(event(n))
    await rec.close()
    first.close()
    log.down = False
    again = SqliteSpool(tmp_path / "spool.sqlite3")
    rec = recorder(log, again)
    await rec.start()
    await until(lambda: again.depth() == 0)
    assert [e.body["n"] for e in log.entries] == [0, 1, 2]  # type: ignore[union-attr]
    await rec.close()
    again.close()


async def test_wait_returns_the_seq_once_delivered(spool: SqliteSpool) -> None:
    log = FakeLog()
    rec = recorder(log, spool)
    await rec.start()
    assert await rec.record(event(1), wait=True) == 1
    assert await rec.record(event(2), wait=True) == 2
    await rec.close()


async def test_during_an_outage_callers_do_not_wait_for_a_seq(spool: SqliteSpool) -> None:
    """Once a delivery has failed, record(wait=True) answers 0 at once instead of waiting
    seq_wait_seconds (here an hour) on every call; the event is spooled all the same."""
    log = FakeLog()
    log.down = True
    config = RecorderConfig(seq_wait_seconds=3600, retry_min_seconds=0.01, retry_max_seconds=0.05)
    rec = AuditRecorder(log, spool, b"k" * 32, config)
    await rec.start()
    await rec.record(event(1))
    await until(lambda: log.down and not rec._reachable)
    assert await asyncio.wait_for(rec.record(event(2), wait=True), timeout=30) == 0
    assert spool.depth() == 2
    log.down = False
    await until(lambda: spool.depth() == 0)
    assert await asyncio.wait_for(rec.record(event(3), wait=True), timeout=30) == 3
    await rec.close()


async def test_fail_closed_records_first_or_refuses(spool: SqliteSpool) -> None:
    log = FakeLog()
    rec = recorder(log, spool, fail_closed=True)
    await rec.start()
    log.down = True
    with pytest.raises(Unavailable) as err:
        await rec.record(event(1))
    assert err.value.reason == "AUDIT_UNAVAILABLE"
    assert spool.depth() == 0  # refused means not recorded anywhere
    # Forget is never refused: its entry and the key erasure wait in the spool.
    erase = EraseUser("acme", "alice")
    assert await rec.record_spooled(event(2), erase=erase, wait=True) == 0
    assert spool.depth() == 2
    log.down = False
    assert await rec.record(event(3)) == 3  # after what was spooled before it
    assert log.types() == ["recall", "erase", "recall"]
    await rec.close()


async def test_remembering_records_before_the_write_when_fail_closed(spool: SqliteSpool) -> None:
    log = FakeLog()
    rec = recorder(log, spool, fail_closed=True)
    await rec.start()
    remembered = audit.remember_event("acme", "alice", "s1", ["m1"], 1)
    writes: list[str] = []

    async def failing() -> int:
        writes.append("write")
        assert log.types() == ["remember"]  # recorded before anything was written
        raise Unavailable("retrieval is down")

    with pytest.raises(Unavailable, match="retrieval"):
        await rec.remembering(remembered, failing)
    await until(lambda: spool.depth() == 0)
    assert log.types() == ["remember", "remember_failed"] and writes == ["write"]
    failed = log.entries[1]
    assert isinstance(failed, AuditEvent) and failed.body["ref_event"] == remembered.event_id

    log.down = True
    attempted: list[str] = []

    async def write() -> int:
        attempted.append("write")
        return 1

    with pytest.raises(Unavailable):
        await rec.remembering(audit.remember_event("acme", "alice", "s1", ["m2"], 1), write)
    assert attempted == []  # the log is down: nothing was written
    await rec.close()


async def test_an_event_refused_for_good_is_buried_not_blocking(spool: SqliteSpool) -> None:
    log = FakeLog()
    rec = recorder(log, spool)
    bad = event(2)
    log.refuse.add(bad.event_id)
    log.down = True
    for e in (event(1), bad, event(3)):
        await rec.record(e)
    log.down = False
    await rec.start()
    await until(lambda: spool.depth() == 0)
    assert [e.body["n"] for e in log.entries] == [1, 3]  # type: ignore[union-attr]
    assert spool.dead() == 1
    await rec.close()


def test_fingerprints_are_keyed_and_scoped() -> None:
    a = AuditRecorder(FakeLog(), None, b"a" * 32)  # type: ignore[arg-type]
    b = AuditRecorder(FakeLog(), None, b"b" * 32)  # type: ignore[arg-type]
    fp = a.fingerprint("acme", "alice", "where do I  live?")
    assert fp == a.fingerprint("acme", "alice", " where do I live? ")  # spacing is not meaning
    assert fp != a.fingerprint("acme", "bob", "where do I live?")
    assert fp != a.fingerprint("globex", "alice", "where do I live?")
    assert fp != b.fingerprint("acme", "alice", "where do I live?")  # needs the secret
    assert len(fp) == 32 and "live" not in fp


async def test_page_tokens_are_bound_to_their_scope(spool: SqliteSpool) -> None:
    log = FakeLog()
    rec = recorder(log, spool, fail_closed=True)
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
    return audit.context_event(
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
