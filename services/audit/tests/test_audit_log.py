"""The log's use cases, the contract both engines keep: over real SQLite files, a real
witness file and real keys (the embedded default), and over a real PostgreSQL database
(cluster mode)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from audit_harness import Backend, PostgresBackend, entry, make_log

from hippo_audit.adapters import postgres_log, sqlite_log
from hippo_audit.domain.log import AuditLog
from hippo_audit.domain.models import Batch, Checkpoint, Filter, NewEntry, PrivateState
from hippo_audit.domain.ports import Build
from hippo_core.errors import Aborted, FailedPrecondition, InvalidArgument


@pytest.fixture
async def log(backend: Backend) -> AsyncIterator[AuditLog]:
    opened = backend.make_log(checkpoint_every=10)
    opened.open()
    await opened.start()
    yield opened
    await opened.close()


async def test_group_commit_keeps_each_writers_order_and_shares_commits(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """32 concurrent writers, 25 appends each: seqs are contiguous, every writer's entries
    appear in the order it appended them, the chain verifies, and the appends were
    committed in fewer transactions than there were appends (they shared fsyncs)."""
    commits: list[int] = []
    store = sqlite_log.SqliteLog if backend.name == "sqlite" else postgres_log.PostgresLog
    real = store.append

    def counting(self: Any, build: Build) -> Batch:
        batch = real(self, build)
        commits.append(len(batch.entries))
        return batch

    monkeypatch.setattr(store, "append", counting)
    log = backend.make_log()
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
    commits = [c for c in commits if c]  # the checkpoint-only batch at open writes none
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


async def test_verify_for_a_tenant_counts_its_entries_and_names_its_last(log: AuditLog) -> None:
    """The whole chain is checked; the tenant's view counts only its own entries in the
    range and ends at its own last entry (the log's size and head stay the admin's)."""
    tenants = ["acme", "globex", "acme", "globex", "globex"]
    await log.append([entry(t) for t in tenants], None)
    whole = await log.verify(0, 0, False)
    acme = await log.verify(0, 0, False, "acme")
    assert whole.ok and acme.ok and whole.head_seq == acme.head_seq == 5
    assert (acme.tenant_entries, acme.tenant_head_seq) == (2, 3)
    page = await log.read(Filter("acme"), 2, 3, 1, False)
    assert acme.tenant_head_hash == page.entries[0].entry.hash
    assert (await log.verify(4, 5, False, "acme")).tenant_entries == 0
    assert (await log.verify(4, 5, False, "acme")).tenant_head_hash == b""
    assert (await log.verify(1, 4, False, "globex")).tenant_head_seq == 4
    assert whole.tenant_entries == 0  # no tenant asked about


async def test_forgetting_a_user_makes_private_bodies_unreadable_and_the_chain_verifies(
    backend: Backend,
) -> None:
    """The ciphertext stays (the chain covers it); the key's bytes are gone from the
    store's files too (SQLite: the keys file and its WAL; PostgreSQL: every file of the
    database, the key table rewritten after the erasure)."""
    log = backend.make_log()
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
    [(alice_key,)] = backend.query("SELECT key FROM user_keys WHERE user_id = 'alice'")
    alice_key = bytes(alice_key)
    assert backend.key_bytes_found(alice_key), "the check can see a key that is there"
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
    assert backend.key_bytes_found(alice_key) == []

    # A user seen again gets a new key; the old entries stay unreadable.
    log = backend.make_log()
    log.open()
    await log.start()
    await log.append([entry(user="alice", private={"note": "new"})], None)
    page = await log.read(Filter("acme", user="alice"), 0, 0, 10, True)
    states = [e.private_state for e in page.entries]
    assert states[0] == PrivateState.ERASED and states[-1] == PrivateState.READABLE
    await log.close()


async def test_checkpoints_every_n_entries_and_at_close(backend: Backend) -> None:
    log = backend.make_log(checkpoint_every=10)
    log.open()
    await log.start()
    for _ in range(25):
        await log.append([entry()], None)
    assert log.head().checkpoint is not None and log.head().checkpoint.size == 20
    await log.close()
    reopened = backend.make_log(checkpoint_every=10)
    reopened.open()
    head = reopened.head()
    assert head.checkpoint is not None and head.checkpoint.size == 25 and head.writable
    verdict = reopened.verify_now()
    assert verdict.ok and verdict.checkpoints_checked == 3  # 10, 20 and the final 25
    await reopened.start()
    await reopened.close()  # nothing unsigned: no fourth checkpoint
    assert backend.make_log().verify_now().checkpoints_checked == 3


async def test_a_truncated_log_refuses_writes_after_restart(backend: Backend) -> None:
    """Appending to a log that lost signed entries would bury the evidence."""
    log = backend.make_log(checkpoint_every=5)
    log.open()
    await log.start()
    for _ in range(12):
        await log.append([entry()], None)
    await log.close()
    assert backend.attack("DELETE FROM entries WHERE seq > 8") == 4
    log = backend.make_log(checkpoint_every=5)
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


async def test_the_database_refuses_updates_and_deletes(backend: Backend) -> None:
    log = backend.make_log()
    log.open()
    await log.start()
    await log.append([entry()], None)
    await log.close()
    for sql in ("UPDATE entries SET actor = 'x'", "DELETE FROM entries"):
        with pytest.raises((sqlite3.IntegrityError, psycopg.Error), match="append-only"):
            backend.query(sql)
    assert backend.query("SELECT actor FROM entries") == [("gateway",)]


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


async def test_the_idempotency_lookup_is_an_index_search(tmp_path: Path) -> None:
    """Every keyed append looks its key up: a scan of the tenant's entries would make
    appends slower as the log grows."""
    log = make_log(tmp_path)
    log.open()
    await log.start()
    await log.append([entry(key="k")], None)
    await log.close()
    with sqlite3.connect(tmp_path / "audit.sqlite3") as conn:
        plan = conn.execute(f"EXPLAIN QUERY PLAN {sqlite_log.FIND_KEY}", ("acme", "k")).fetchall()
    assert "USING INDEX entries_by_key" in plan[0][3], plan


async def test_the_postgres_idempotency_lookup_can_use_the_key_index(
    postgres: PostgresBackend,
) -> None:
    """The batch lookup's condition implies the partial unique index's, so PostgreSQL can
    answer it from the index (sequential scans off: a tiny table would not need it)."""
    log = postgres.make_log()
    log.open()
    await log.start()
    await log.append([entry(key="k")], None)
    await log.close()
    with psycopg.connect(postgres.url) as conn:
        conn.execute("SET search_path = hippo_audit")
        conn.execute("SET enable_seqscan = off")
        plan = conn.execute(f"EXPLAIN {postgres_log.FIND_KEYS}", (["acme"], ["k"])).fetchall()
    assert "entries_by_key" in " ".join(r[0] for r in plan), plan


async def test_files_written_before_numbered_migrations_still_open(tmp_path: Path) -> None:
    """Keys files were written without a schema version (user_version 0) and logs at
    version 1: both open as they are, entries and private bodies intact."""
    log = make_log(tmp_path)
    log.open()
    await log.start()
    await log.append([entry(private={"note": "kept"})], None)
    await log.close()
    with sqlite3.connect(tmp_path / "keys.sqlite3") as conn:
        conn.execute("PRAGMA user_version = 0")  # as every keys file before this build
    log = make_log(tmp_path)
    log.open()
    await log.start()
    page = await log.read(Filter("acme"), 0, 0, 10, True)
    assert page.entries[0].private == {"note": "kept"}
    await log.close()
    for name, version in (("keys.sqlite3", 1), ("audit.sqlite3", 1)):
        with sqlite3.connect(tmp_path / name) as conn:
            assert conn.execute("PRAGMA user_version").fetchone() == (version,), name
    assert make_log(tmp_path).verify_now().ok


async def test_the_witness_keeps_checkpoints_in_order(backend: Backend) -> None:
    """Both witnesses (the file; the table beside the log) hand back what was appended,
    in order; `latest` is the last one."""
    log = backend.make_log(checkpoint_every=2)
    log.open()
    await log.start()
    for _ in range(5):
        await log.append([entry()], None)
    await log.close()
    verdict = backend.make_log().verify_now()
    assert verdict.ok and verdict.checkpoints_checked == 3  # 2, 4 and 5 (at close)
    assert verdict.latest_checkpoint is not None and verdict.latest_checkpoint.size == 5
    witness = backend.witness()
    lines = witness.read()
    assert [line.checkpoint.size for line in lines if line.checkpoint] == [2, 4, 5]
    assert witness.latest() == lines[-1].checkpoint
    later = Checkpoint(9, b"\x01" * 32, 123, "k" * 16, b"\x02" * 64)
    witness.append(later)
    assert witness.latest() == later and len(witness.read()) == 4


async def test_a_running_log_refuses_to_extend_a_log_cut_behind_its_back(
    backend: Backend,
) -> None:
    """Entries deleted while the log runs (unsigned ones: no checkpoint shows the cut):
    the next batch finds the head it left gone and refuses, instead of numbering new
    entries into the gap, which would hide the cut."""
    log = backend.make_log()
    log.open()
    await log.start()
    for _ in range(10):
        await log.append([entry()], None)
    assert backend.attack("DELETE FROM entries WHERE seq > 7") == 3
    with pytest.raises(FailedPrecondition) as err:
        await log.append([entry()], None)
    assert err.value.reason == "LOG_DISAGREES_WITH_CHECKPOINT"
    assert "ends at entry 7" in log.head().problem and not log.head().writable
    await log.close()
    assert backend.query("SELECT max(seq) FROM entries") == [(7,)]  # nothing was added
