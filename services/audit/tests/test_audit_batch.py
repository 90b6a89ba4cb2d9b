"""Building one group commit on a tip (the part that runs under the store's lock), with
real keys and a real signer; the stores that call it are tested over both engines."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from audit_harness import entry

from hippo_audit.adapters.signing import Ed25519Signer
from hippo_audit.adapters.sqlite_keys import SqliteKeyRing
from hippo_audit.domain import checkpoints
from hippo_audit.domain.batch import AppendJob, Builder, Job, Signing, SignJob
from hippo_audit.domain.chain import GENESIS, entry_hash
from hippo_audit.domain.models import Appended, Tip
from hippo_audit.domain.validation import Limits, check_entries
from hippo_core.errors import Aborted

STORED = {("acme", "k-old"): (7, b"\x07" * 32)}


def find(wanted: Collection[tuple[str, str]]) -> dict[tuple[str, str], tuple[int, bytes]]:
    return {k: STORED[k] for k in wanted if k in STORED}


def builder(tmp_path: Path, jobs: list[Job], every: int = 1000) -> Builder:
    return Builder(
        jobs,
        keys=SqliteKeyRing(tmp_path / "keys.sqlite3"),
        signer=Ed25519Signer.load("", tmp_path / "checkpoint.key"),
        every=every,
        clock=lambda: 1_700_000_000_000_000,
        own_checkpoint=None,
    )


def test_a_batch_links_from_the_tip_it_is_handed_and_starts_afresh_each_call(
    tmp_path: Path,
) -> None:
    """A store may call the builder again (the database aborted the first attempt, and
    meanwhile another replica moved the head): the second batch is built on the second
    tip alone, and the results describe it."""
    job = AppendJob(check_entries([entry(key="k-new"), entry(private={"q": 1})], Limits()))
    build = builder(tmp_path, [job])
    first = build(Tip(0, GENESIS), find)
    assert [e.seq for e in first.entries] == [1, 2] and first.entries[0].prev_hash == GENESIS
    tip = Tip(41, b"\x41" * 32)
    again = build(tip, find)
    assert [e.seq for e in again.entries] == [42, 43]
    assert again.entries[0].prev_hash == tip.hash
    for e in again.entries:
        assert entry_hash(e.prev_hash, e) == e.hash
    assert again.entries[1].prev_hash == again.entries[0].hash
    assert again.entries[1].key_id > 0 and again.entries[1].sealed  # sealed under the lock
    assert build.results == [
        [Appended(42, again.entries[0].hash), Appended(43, again.entries[1].hash)]
    ]


def test_keys_found_under_the_lock_and_earlier_in_the_batch_are_not_appended_again(
    tmp_path: Path,
) -> None:
    jobs: list[Job] = [
        AppendJob(check_entries([entry(key="k-old"), entry(key="k-new")], Limits())),
        AppendJob(check_entries([entry(key="k-new")], Limits())),
    ]
    build = builder(tmp_path, jobs)
    batch = build(Tip(7, b"\x07" * 32), find)
    assert [e.seq for e in batch.entries] == [8]
    new = batch.entries[0].hash
    assert build.results == [
        [Appended(7, b"\x07" * 32, duplicate=True), Appended(8, new)],
        [Appended(8, new, duplicate=True)],
    ]
    assert build.duplicates == 2


def test_expected_prev_hash_is_checked_against_the_head_inside_the_batch(tmp_path: Path) -> None:
    """A request expecting the head an earlier request of the same batch leaves is
    accepted; one expecting the tip it no longer is, refused, and writes nothing."""
    first = AppendJob(check_entries([entry()], Limits()))
    stale = AppendJob(check_entries([entry()], Limits()), expected=GENESIS)
    build = builder(tmp_path, [first, stale])
    batch = build(Tip(0, GENESIS), find)
    assert len(batch.entries) == 1 and isinstance(build.results[1], Aborted)
    chained = AppendJob(check_entries([entry()], Limits()), expected=batch.entries[0].hash)
    build = builder(tmp_path, [first, chained])
    batch = build(Tip(0, GENESIS), find)
    assert [e.seq for e in batch.entries] == [1, 2]


def test_the_batch_that_fills_the_unsigned_tail_signs_the_head_it_leaves(tmp_path: Path) -> None:
    jobs: list[Job] = [AppendJob(check_entries([entry() for _ in range(3)], Limits()))]
    signer = Ed25519Signer.load("", tmp_path / "checkpoint.key")
    build = builder(tmp_path, jobs, every=10)
    assert build(Tip(6, b"\x06" * 32, checkpoint_size=0, checkpoint_us=0), find).checkpoint is None
    batch = build(Tip(8, b"\x08" * 32, checkpoint_size=0, checkpoint_us=0), find)
    cp = batch.checkpoint
    assert cp is not None and (cp.size, cp.hash) == (11, batch.entries[-1].hash)
    assert signer.verify(checkpoints.message(cp.size, cp.hash, cp.time_us), cp.signature)
    assert build.kept


def test_a_timer_signs_only_when_the_latest_checkpoint_is_old_enough(tmp_path: Path) -> None:
    now = 1_700_000_000_000_000
    build = builder(tmp_path, [SignJob(min_age_us=60_000_000)])
    young = Tip(5, b"\x05" * 32, checkpoint_size=3, checkpoint_us=now - 10_000_000)
    assert build(young, find).checkpoint is None
    assert build.results == [Signing(now - 10_000_000, unsigned=True)]
    old = Tip(5, b"\x05" * 32, checkpoint_size=3, checkpoint_us=now - 61_000_000)
    assert build(old, find).checkpoint is not None
    assert build.results == [Signing(now, unsigned=False)]
    signed = Tip(5, b"\x05" * 32, checkpoint_size=5, checkpoint_us=now - 61_000_000)
    assert build(signed, find).checkpoint is None  # nothing unsigned
