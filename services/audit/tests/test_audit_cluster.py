"""Cluster mode: several replicas (AuditLog instances, each with its own writer thread and
connection pool, as separate processes would have) append to one PostgreSQL database.

The invariants: one chain in one total order (seqs unique and contiguous, every link
valid), an idempotency key stored once whichever replicas raced with it, each
checkpoint signed once, erasure seen by every replica at once, and tampering found by
Verify and, where the checkpoints show it, refused at the next open.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import Counter, defaultdict
from typing import Any

import pytest
from audit_harness import PostgresBackend, entry

from hippo_audit.domain.chain import ID_SEPARATOR, entry_hash
from hippo_audit.domain.log import AuditLog
from hippo_audit.domain.models import Appended, Entry, Filter, NewEntry, PrivateState
from hippo_core.errors import FailedPrecondition

REPLICAS = 3


async def _replicas(
    postgres: PostgresBackend, count: int = REPLICAS, **config: Any
) -> list[AuditLog]:
    logs = [postgres.make_log(**config) for _ in range(count)]
    for log in logs:
        await asyncio.to_thread(log.open)
        await log.start()
    return logs


async def test_replicas_appending_at_once_make_one_chain(postgres: PostgresBackend) -> None:
    """Three replicas, eight writers each, 600 appends: every idempotency key is sent by
    all three replicas at about the same time. Seqs are 1..N with no gap or repeat, each
    key is stored once (every replica answers it with the same seq and hash), every
    replica's entries interleave in the one chain, the whole log verifies, and no
    checkpoint was signed twice: the ones `checkpoint_every` triggers are at least that
    many entries apart."""
    every = 40
    logs = await _replicas(postgres, checkpoint_every=every)
    answers: dict[str, list[Appended]] = defaultdict(list)
    keys = [f"k-{i}" for i in range(150)]

    async def writer(r: int, w: int) -> None:
        rng = random.Random(r * 100 + w)
        for i in range(w, len(keys), 8):
            new = entry(user=f"u{i % 5}", key=keys[i], private={"i": i} if i % 3 == 0 else None)
            batch = [NewEntry(**{**new.__dict__, "body": {"key": keys[i], "replica": r}})]
            if rng.random() < 0.5:  # an unkeyed entry of this replica's own beside it
                batch.append(NewEntry(**{**entry().__dict__, "body": {"replica": r, "w": w}}))
            appended = await logs[r].append(batch, None)
            answers[keys[i]].append(appended[0])
            await asyncio.sleep(rng.random() * 0.002)

    await asyncio.gather(*(writer(r, w) for r in range(REPLICAS) for w in range(8)))
    for log in logs:
        await log.close()

    rows = postgres.query("SELECT seq, idempotency_key, body FROM entries ORDER BY seq")
    seqs = [r[0] for r in rows]
    assert seqs == list(range(1, len(rows) + 1)) and len(rows) > len(keys)
    stored_keys = Counter(r[1] for r in rows if r[1])
    assert set(stored_keys) == set(keys) and set(stored_keys.values()) == {1}
    for key, replies in answers.items():
        assert len(replies) == REPLICAS, key
        assert len({(a.seq, a.hash) for a in replies}) == 1, (key, replies)
        assert sum(not a.duplicate for a in replies) == 1, (key, replies)
    writers = [int(r[2].split('"replica":')[1][0]) for r in rows]
    switches = sum(a != b for a, b in itertools.pairwise(writers))
    assert set(writers) == {0, 1, 2} and switches > 50, "the replicas' batches interleave"

    verdict = postgres.make_log().verify_now()
    assert verdict.ok, verdict
    assert verdict.entries_checked == len(rows) and verdict.head_seq == len(rows)
    sizes = [r[0] for r in postgres.query("SELECT size FROM checkpoints ORDER BY id")]
    assert sizes == sorted(set(sizes)) and sizes[-1] == len(rows)
    gaps = [b - a for a, b in itertools.pairwise(sizes[:-1])]
    assert sizes[0] >= every and all(g >= every for g in gaps), sizes
    assert len(sizes) <= len(rows) // every + 1, sizes
    assert verdict.checkpoints_checked == len(sizes)


async def test_timer_checkpoints_are_signed_once_per_interval_across_replicas(
    postgres: PostgresBackend,
) -> None:
    """Every replica's timer fires each interval, but under the head lock a replica signs
    only when the latest checkpoint (anyone's) is an interval old: while entries keep
    coming, checkpoints are an interval apart, not one per replica per interval."""
    interval = 0.3
    logs = await _replicas(postgres, checkpoint_every=10**6, interval=interval)
    loop = asyncio.get_running_loop()
    end = loop.time() + 2.0
    n = 0
    while loop.time() < end:
        await logs[n % REPLICAS].append([entry()], None)
        n += 1
        await asyncio.sleep(0.02)
    for log in logs:
        await log.close()
    times = [r[0] for r in postgres.query("SELECT time_us FROM checkpoints ORDER BY id")]
    assert len(times) >= 4, times  # the timers did sign (plus the final one at close)
    timed = times[:-1]  # the last one may be a close's
    gaps = [(b - a) / 1e6 for a, b in itertools.pairwise(timed)]
    assert all(g >= interval for g in gaps), gaps
    assert len(times) <= 2.0 / interval + 2, times
    assert postgres.make_log().verify_now().ok


async def test_an_erasure_through_one_replica_holds_on_every_other_at_once(
    postgres: PostgresBackend,
) -> None:
    """No replica caches keys: the moment ForgetUser returns on one, a read through
    another finds the private bodies erased."""
    a, b = await _replicas(postgres, 2)
    await a.append([entry(user="alice", private={"note": "hers"})], None)
    page = await b.read(Filter("acme", user="alice"), 0, 0, 10, True)
    assert page.entries[0].private == {"note": "hers"}
    erased = await a.forget_user("acme", "alice", "gateway", "forget-alice")
    assert erased.keys_destroyed == 1
    page = await b.read(Filter("acme", user="alice"), 0, 0, 10, True)
    assert page.entries[0].private_state == PrivateState.ERASED
    again = await b.forget_user("acme", "alice", "gateway", "forget-alice")
    assert (again.seq, again.keys_destroyed) == (erased.seq, 0)  # recorded once
    await b.append([entry(user="alice", private={"note": "new"})], None)  # a new key
    page = await a.read(Filter("acme", user="alice"), 0, 0, 10, True)
    states = [e.private_state for e in page.entries]
    assert states == [PrivateState.ERASED, PrivateState.NONE, PrivateState.READABLE]
    await a.close()
    await b.close()


async def test_a_replica_follows_and_reports_what_another_appended(
    postgres: PostgresBackend,
) -> None:
    """Stream on one replica delivers entries another replica appends (LISTEN/NOTIFY), and
    Head reports the shared head and the latest checkpoint, whoever signed it."""
    a, b = await _replicas(postgres, 2, checkpoint_every=3)
    received: list[int] = []

    async def follower() -> None:
        async for entries in b.follow(Filter("acme", user="alice"), 0, False):
            received.extend(e.entry.seq for e in entries)
            if len(received) == 2:
                return

    task = asyncio.create_task(follower())
    await asyncio.sleep(0.1)
    await a.append([entry(user="alice"), entry(user="bob")], None)
    await a.append([entry(user="alice")], None)
    await asyncio.wait_for(task, timeout=10)
    assert received == [1, 3]
    head = await b.current_head()
    assert (head.seq, head.hash) == (a.head().seq, a.head().hash)
    assert head.checkpoint is not None and head.checkpoint.size == 3
    await a.close()
    await b.close()


async def _filled(postgres: PostgresBackend, n: int = 120, every: int = 25) -> None:
    log = postgres.make_log(checkpoint_every=every)
    log.open()
    await log.start()
    for i in range(n):
        await log.append([entry(user=f"u{i % 3}", private={"i": i} if i % 2 else None)], None)
    await log.close()


def _rehash_from(postgres: PostgresBackend, first: int, *, move_head: bool) -> None:
    """The attacker who covers their tracks: every hash from `first` on recomputed, so
    the chain is whole again (and the head row moved to match, if `move_head`)."""
    columns = (
        "seq, time_us, key_id, tenant, actor, event_type, user_id, session_id, memory_ids, "
        "body, sealed, idempotency_key, prev_hash, hash"
    )
    rows = postgres.query(f"SELECT {columns} FROM entries WHERE seq >= ? ORDER BY seq", [first])
    prev = bytes(rows[0][12])
    for r in rows:
        e = Entry(
            r[0], r[1], r[3], r[4], r[5], r[6], r[7],
            tuple(r[8].split(ID_SEPARATOR)) if r[8] else (),
            r[9], bytes(r[10]), r[2], r[11], prev, b"",
        )  # fmt: skip
        digest = entry_hash(prev, e)
        postgres.attack(
            "UPDATE entries SET prev_hash = ?, hash = ? WHERE seq = ?", [prev, digest, r[0]]
        )
        prev = digest
    if move_head:
        postgres.attack("UPDATE head SET hash = ? WHERE id = 1", [prev])


async def test_an_edited_middle_entry_is_found_by_verify(postgres: PostgresBackend) -> None:
    """A superuser disables the triggers and changes entry 60's body: Verify names it."""
    await _filled(postgres)
    assert postgres.attack("UPDATE entries SET body = '{\"forged\":true}' WHERE seq = 60") == 1
    verdict = postgres.make_log().verify_now()
    assert not verdict.ok and verdict.first_bad_seq == 60
    assert verdict.reason.startswith("hash mismatch")


async def test_a_rewritten_middle_is_found_and_refused_at_the_next_open(
    postgres: PostgresBackend,
) -> None:
    """Entry 60 changed and every later hash recomputed, the head row too: the chain alone
    looks whole, but the checkpoints signed before disagree. Verify names the first
    checkpoint after the edit, and a replica opened now refuses writes."""
    await _filled(postgres)
    postgres.attack("UPDATE entries SET body = '{\"forged\":true}' WHERE seq = 60")
    _rehash_from(postgres, 60, move_head=True)
    assert postgres.make_log().verify_now(chain_only=True).ok, "the chain alone cannot tell"
    log = postgres.make_log()
    log.open()
    await log.start()
    verdict = await log.verify(0, 0, chain_only=False)
    assert not verdict.ok and verdict.first_bad_seq == 75
    assert verdict.reason.startswith("rewritten") and "after entry 50" in verdict.reason
    head = log.head()
    assert not head.writable and "rewritten" in head.problem
    with pytest.raises(FailedPrecondition) as err:
        await log.append([entry()], None)
    assert err.value.reason == "LOG_DISAGREES_WITH_CHECKPOINT"
    await log.close()
    assert postgres.query("SELECT max(seq) FROM entries") == [(120,)]


async def test_a_running_replica_refuses_to_extend_a_log_cut_behind_its_back(
    postgres: PostgresBackend,
) -> None:
    """Entries deleted (or rehashed) while replicas run: the head row no longer matches the
    last entry, so the next batch is refused instead of linking onto the altered log."""
    a, b = await _replicas(postgres, 2)
    for _ in range(10):
        await a.append([entry()], None)
    postgres.attack("DELETE FROM entries WHERE seq > 7")
    with pytest.raises(FailedPrecondition) as err:
        await b.append([entry()], None)
    assert err.value.reason == "LOG_DISAGREES_WITH_CHECKPOINT"
    assert "the log ends at entry 7" in b.head().problem and not b.head().writable
    await a.close()
    await b.close()
    # The head row keeps the evidence: a replica started later refuses at its first batch
    # too, although no checkpoint covered the entries that were cut.
    (c,) = await _replicas(postgres, 1)
    with pytest.raises(FailedPrecondition):
        await c.append([entry()], None)
    await c.close()
    assert postgres.query("SELECT max(seq) FROM entries") == [(7,)]


async def test_the_database_refuses_to_rewrite_entries_or_checkpoints(
    postgres: PostgresBackend,
) -> None:
    """The triggers refuse UPDATE, DELETE and TRUNCATE of both append-only tables, for
    any role that has not switched them off."""
    await _filled(postgres, n=30, every=10)
    for sql in (
        "UPDATE entries SET actor = 'x' WHERE seq = 3",
        "DELETE FROM entries WHERE seq = 30",
        "TRUNCATE entries",
        "UPDATE checkpoints SET size = 1",
        "DELETE FROM checkpoints",
        "TRUNCATE checkpoints",
    ):
        with pytest.raises(Exception, match="append-only") as err:
            postgres.query(sql)
        assert type(err.value).__module__.startswith("psycopg"), sql
    assert postgres.query("SELECT count(*) FROM entries") == [(30,)]
    assert postgres.query("SELECT count(*) FROM checkpoints") == [(3,)]
