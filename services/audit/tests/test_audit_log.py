"""The log's use cases over real SQLite files, a real witness file and real keys."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from audit_harness import entry, make_log

from hippo_audit.adapters import sqlite_log
from hippo_audit.domain.log import AuditLog
from hippo_audit.domain.models import Entry, Filter, NewEntry, PrivateState
from hippo_core.errors import Aborted, FailedPrecondition, InvalidArgument


@pytest.fixture
async def log(tmp_path: Path) -> AsyncIterator[AuditLog]:
    opened = make_log(tmp_path, checkpoint_every=10)
    opened.open()
    await opened.start()
    yield opened
    await opened.close()


async def test_group_commit_keeps_each_writers_order_and_shares_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """32 concurrent writers, 25 appends each: seqs are contiguous, every writer's entries
    appear in the order it appended them, the chain verifies, and the appends were
    committed in fewer transactions than there were appends (they shared fsyncs)."""
    commits: list[int] = []
    real = sqlite_log.SqliteLog.append

    def counting(self: sqlite_log.SqliteLog, entries: Sequence[Entry]) -> None:
        commits.append(len(entries))
        real(self, entries)

    monkeypatch.setattr(sqlite_log.SqliteLog, "append", counting)
    log = make_log(tmp_path)
    log.open()
    await log.start()
    acked: dict[int, list[int]] = {w: [] for w in range(32)}

    async def writer(w: int) -> None:
        for i in range(25):
            new = entry(user=f"w{w}", event_type="remember")
            new = NewEntry(**{**new.__dict__, "body": {"writer": w, "i": i}})
            [appended] = await log.append([new], None)
            acked[w].append(appended.seq)

    await asyncio.gather(*(writer(w) for w in range(32)))
    everything = await log.read(Filter("acme"), 0, 0, 1000, False)
    seqs = [e.entry.seq for e in everything.entries]
    assert seqs == list(range(1, 801))
    for w in range(32):
        mine = [e for e in everything.entries if e.entry.user == f"w{w}"]
        assert [e.entry.seq for e in mine] == acked[w]
        assert [e.entry.body for e in mine] == [f'{{"i":{i},"writer":{w}}}' for i in range(25)]
    assert sum(commits) == 800 and len(commits) < 800 and max(commits) > 1
    assert log.verify_now().ok
    await log.close()


async def test_expected_prev_hash_refuses_a_fork(log: AuditLog) -> None:
    [first] = await log.append([entry()], None)
    [second] = await log.append([entry()], first.hash)
    assert second.seq == first.seq + 1
    with pytest.raises(Aborted, match="another writer appended first") as err:
        await log.append([entry(), entry()], first.hash)  # the head is `second` now
    assert err.value.reason == "HEAD_MOVED"
    assert log.head().seq == second.seq  # nothing of the refused request was written


async def test_an_idempotency_key_appends_once(log: AuditLog) -> None:
    [a] = await log.append([entry(key="k-1")], None)
    [b, c] = await log.append([entry(key="k-1"), entry(key="k-2")], None)
    assert b.duplicate and (b.seq, b.hash) == (a.seq, a.hash)
    assert not c.duplicate and c.seq == a.seq + 1
    # keys are per tenant: another tenant's "k-1" is its own entry
    [d] = await log.append([entry(tenant="globex", key="k-1")], None)
    assert not d.duplicate and d.seq == c.seq + 1
    [e, f] = await log.append([entry(key="k-3"), entry(key="k-3")], None)  # within one batch
    assert f.duplicate and f.seq == e.seq
    assert log.head().seq == e.seq


@pytest.mark.parametrize(
    ("new", "field"),
    [
        (NewEntry("", "gateway", "recall"), "entries[0].tenant"),
        (NewEntry("acme", "", "recall"), "entries[0].actor"),
        (NewEntry("acme", "gateway", "Recall!"), "entries[0].event_type"),
        (NewEntry("acme", "gateway", "recall", user="a\nb"), "entries[0].user_id"),
        (NewEntry("acme", "gateway", "recall", memory_ids=("",)), "entries[0].memory_ids[0]"),
        (NewEntry("acme", "gateway", "recall", body={"x": float("nan")}), "entries[0].body"),
        (NewEntry("acme", "gateway", "recall", body={"x": "y" * 70_000}), "entries[0].body"),
        (NewEntry("acme", "gateway", "recall", private={"q": "x"}), "entries[0].user_id"),
    ],
)
async def test_bad_entries_name_the_field(log: AuditLog, new: NewEntry, field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        await log.append([entry(), new], None)
    assert err.value.field == field.replace("entries[0]", "entries[1]")
    assert log.head().seq == 0  # the good entry of the request was not written either


async def test_an_append_holds_1_to_max_entries(log: AuditLog) -> None:
    for entries in ([], [entry() for _ in range(1001)]):
        with pytest.raises(InvalidArgument, match=r"must hold 1\.\.1000 entries") as err:
            await log.append(entries, None)
        assert err.value.field == "entries"


async def test_reads_are_confined_to_the_tenant_and_filtered(log: AuditLog) -> None:
    await log.append(
        [
            entry("acme", "alice", session="s1"),
            entry("acme", "alice", session="s2", event_type="remember"),
            entry("acme", "bob", session="s1"),
            entry("globex", "alice", session="s1"),
        ],
        None,
    )

    async def seqs(where: Filter) -> list[int]:
        page = await log.read(where, 0, 0, 100, False)
        return [e.entry.seq for e in page.entries]

    assert await seqs(Filter("acme")) == [1, 2, 3]
    assert await seqs(Filter("globex")) == [4]
    assert await seqs(Filter("initech")) == []
    assert await seqs(Filter("acme", user="alice")) == [1, 2]
    assert await seqs(Filter("acme", user="alice", session="s2")) == [2]
    assert await seqs(Filter("acme", event_types=frozenset({"remember"}))) == [2]
    page = await log.read(Filter("acme"), 0, 0, 2, False)
    assert [e.entry.seq for e in page.entries] == [1, 2] and page.next_after_seq == 2
    rest = await log.read(Filter("acme"), page.next_after_seq, 0, 2, False)
    assert [e.entry.seq for e in rest.entries] == [3] and rest.next_after_seq == 0


async def test_forgetting_a_user_makes_private_bodies_unreadable_and_the_chain_verifies(
    tmp_path: Path,
) -> None:
    """The ciphertext stays (the chain covers it); the key is gone from the keys file too."""
    log = make_log(tmp_path)
    log.open()
    await log.start()
    await log.append(
        [
            entry(user="alice", private={"query_fingerprint": "f1", "note": "hers"}),
            entry(user="bob", private={"note": "his"}),
            entry(user="alice"),
        ],
        None,
    )
    page = await log.read(Filter("acme", user="alice"), 0, 0, 10, True)
    assert [e.private_state for e in page.entries] == [PrivateState.READABLE, PrivateState.NONE]
    assert page.entries[0].private == {"query_fingerprint": "f1", "note": "hers"}
    with sqlite3.connect(tmp_path / "keys.sqlite3") as conn:
        [(alice_key,)] = conn.execute("SELECT key FROM user_keys WHERE user_id = 'alice'")
    sealed_before = page.entries[0].entry.sealed

    erased = await log.forget_user("acme", "alice", "gateway", "forget-1")
    assert erased.keys_destroyed == 1 and erased.seq == 4
    again = await log.forget_user("acme", "alice", "gateway", "forget-1")
    assert again.keys_destroyed == 0 and again.seq == 4  # the retry appended nothing

    page = await log.read(Filter("acme", user="alice"), 0, 0, 10, True)
    first = page.entries[0]
    assert first.private_state == PrivateState.ERASED and first.private is None
    assert first.entry.sealed == sealed_before  # the entry itself was not touched
    assert page.entries[-1].entry.event_type == "erase"
    assert page.entries[-1].entry.body == '{"keys_destroyed":1}'
    bob = await log.read(Filter("acme", user="bob"), 0, 0, 10, True)
    assert bob.entries[0].private == {"note": "his"}  # other users keep theirs
    verdict = log.verify_now()
    assert verdict.ok and verdict.entries_checked == 4
    await log.close()
    for name in ("keys.sqlite3", "keys.sqlite3-wal"):
        path = tmp_path / name
        assert not path.exists() or alice_key not in path.read_bytes(), name

    # A user seen again gets a new key; the old entries stay unreadable.
    log = make_log(tmp_path)
    log.open()
    await log.start()
    await log.append([entry(user="alice", private={"note": "new"})], None)
    page = await log.read(Filter("acme", user="alice"), 0, 0, 10, True)
    states = [e.private_state for e in page.entries]
    assert states[0] == PrivateState.ERASED and states[-1] == PrivateState.READABLE
    await log.close()


async def test_checkpoints_every_n_entries_and_at_close(tmp_path: Path) -> None:
    log = make_log(tmp_path, checkpoint_every=10)
    log.open()
    await log.start()
    for _ in range(25):
        await log.append([entry()], None)
    assert log.head().checkpoint is not None and log.head().checkpoint.size == 20
    await log.close()
    reopened = make_log(tmp_path, checkpoint_every=10)
    reopened.open()
    head = reopened.head()
    assert head.checkpoint is not None and head.checkpoint.size == 25 and head.writable
    verdict = reopened.verify_now()
    assert verdict.ok and verdict.checkpoints_checked == 3  # 10, 20 and the final 25


async def test_a_truncated_log_refuses_writes_after_restart(tmp_path: Path) -> None:
    """Appending to a log that lost signed entries would bury the evidence."""
    log = make_log(tmp_path, checkpoint_every=5)
    log.open()
    await log.start()
    for _ in range(12):
        await log.append([entry()], None)
    await log.close()
    with sqlite3.connect(tmp_path / "audit.sqlite3") as conn:
        conn.execute("DROP TRIGGER entries_are_never_deleted")
        conn.execute("DELETE FROM entries WHERE seq > 8")
    log = make_log(tmp_path, checkpoint_every=5)
    log.open()
    await log.start()
    head = log.head()
    assert not head.writable and "truncated below checkpoint" in head.problem
    with pytest.raises(FailedPrecondition) as err:
        await log.append([entry()], None)
    assert err.value.reason == "LOG_DISAGREES_WITH_CHECKPOINT"
    verdict = await log.verify(0, 0, chain_only=False)
    assert not verdict.ok and verdict.first_bad_seq == 9
    assert (await log.verify(0, 0, chain_only=True)).ok  # the prefix alone is a valid chain
    await log.close()


async def test_the_database_refuses_updates_and_deletes(tmp_path: Path) -> None:
    log = make_log(tmp_path)
    log.open()
    await log.start()
    await log.append([entry()], None)
    await log.close()
    with sqlite3.connect(tmp_path / "audit.sqlite3") as conn:
        for sql in ("UPDATE entries SET actor = 'x'", "DELETE FROM entries"):
            with pytest.raises(sqlite3.IntegrityError, match="append-only"):
                conn.execute(sql)


async def test_follow_sends_the_backlog_then_new_entries(log: AuditLog) -> None:
    await log.append([entry(user="alice"), entry(user="bob")], None)
    received: list[int] = []

    async def follower() -> None:
        async for entries in log.follow(Filter("acme", user="alice"), 0, False):
            received.extend(e.entry.seq for e in entries)
            if len(received) == 3:
                return

    task = asyncio.create_task(follower())
    await asyncio.sleep(0.05)
    await log.append([entry(user="bob"), entry(user="alice")], None)
    await log.append([entry(tenant="globex", user="alice"), entry(user="alice")], None)
    await asyncio.wait_for(task, timeout=10)
    assert received == [1, 4, 6]


async def test_the_idempotency_lookup_is_an_index_search(log: AuditLog, tmp_path: Path) -> None:
    """Every keyed append looks its key up: a scan of the tenant's entries would make
    appends slower as the log grows."""
    await log.append([entry(key="k")], None)
    with sqlite3.connect(tmp_path / "audit.sqlite3") as conn:
        plan = conn.execute(f"EXPLAIN QUERY PLAN {sqlite_log.FIND_KEY}", ("acme", "k")).fetchall()
    assert "USING INDEX entries_by_key" in plan[0][3], plan
