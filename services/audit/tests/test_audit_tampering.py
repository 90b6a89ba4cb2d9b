"""Tampering with a real log file is detected, at the entry that was tampered with.

The attacker has the files: they drop the append-only triggers, edit rows with SQL or
bytes of the database file with a "hex editor", and may recompute hashes. They do not
have the signing key. Verification runs on the file as the attacker left it.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import sqlite3
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from audit_harness import copy_log, entry, make_log, verify_folder

from hippo_audit.adapters.signing import Ed25519Signer
from hippo_audit.adapters.sqlite_keys import SqliteKeyRing
from hippo_audit.adapters.sqlite_log import SqliteLog
from hippo_audit.adapters.witness import FileWitness, decode, encode
from hippo_audit.domain import checkpoints
from hippo_audit.domain.chain import ID_SEPARATOR, entry_hash
from hippo_audit.domain.log import AuditLog, LogConfig
from hippo_audit.domain.models import Checkpoint, Entry, Filter
from hippo_core.errors import FailedPrecondition

N = 120  # entries in the pristine log
EVERY = 25  # checkpoints at 25, 50, 75, 100, and 120 (at close)
COLUMNS = [
    *("seq", "time_us", "key_id", "tenant", "actor", "event_type", "user_id", "session_id"),
    *("memory_ids", "body", "sealed", "idempotency_key", "prev_hash", "hash"),
]

Rows = dict[int, tuple[object, ...]]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("pristine")

    async def build() -> None:
        log = make_log(folder, checkpoint_every=EVERY)
        log.open()
        await log.start()
        rng = random.Random(7)
        for i in range(N):
            private = {"fingerprint": uuid.uuid4().hex} if rng.random() < 0.5 else None
            new = entry(
                rng.choice(["acme", "globex"]),
                rng.choice(["alice", "bob", "carol"]),
                private=private,
                key=f"key-{i}" if rng.random() < 0.3 else "",
            )
            await log.append([new], None)
        await log.close()

    asyncio.run(build())
    wal = folder / "audit.sqlite3-wal"
    assert not wal.exists() or wal.stat().st_size == 0, "raw edits need a checkpointed file"
    assert verify_folder(folder).ok
    return folder


def rows_of(db: Path) -> Rows:
    conn = sqlite3.connect(db)
    conn.text_factory = bytes
    try:
        return {r[0]: r for r in conn.execute(f"SELECT {', '.join(COLUMNS)} FROM entries")}
    finally:
        conn.close()


def attacker(db: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("DROP TRIGGER IF EXISTS entries_are_never_updated")
    conn.execute("DROP TRIGGER IF EXISTS entries_are_never_deleted")
    return conn


# Each tampering edits the log in `db` and returns the seq Verify must name.


def flip_byte(db: Path, rng: random.Random, rows: Rows) -> int:
    """One bit of the file flipped inside a stored value (body, ciphertext, either hash)."""
    seq = rng.randint(1, N)
    row = rows[seq]
    values = [v for v in (row[9], row[10], row[12], row[13]) if v]
    value = rng.choice(values)
    assert isinstance(value, bytes)
    data = bytearray(db.read_bytes())
    spots, at = [], data.find(value)
    while at != -1:
        spots.append(at)
        at = data.find(value, at + 1)
    assert spots, "the value is in the file"
    offset = rng.choice(spots) + rng.randrange(len(value))
    data[offset] ^= 1 << rng.randrange(8)
    db.write_bytes(bytes(data))
    changed = sorted(s for s, r in rows_of(db).items() if r != rows[s])
    assert changed, "the flipped byte belongs to a stored entry"
    return changed[0]


def change_field(db: Path, rng: random.Random, rows: Rows) -> int:
    """One field of one entry set to another value of its type, with SQL."""
    seq = rng.randint(1, N)
    index = rng.randrange(1, len(COLUMNS))
    old = rows[seq][index]
    new: object
    if isinstance(old, int):
        new = old + rng.randint(1, 10**6)
    elif COLUMNS[index] in ("sealed", "prev_hash", "hash"):
        assert isinstance(old, bytes)
        new = rng.randbytes(max(1, len(old)))
    else:
        assert isinstance(old, bytes)
        new = (
            (old.decode() + "-" + uuid.uuid4().hex[:6])
            if COLUMNS[index] != "body"
            else ('{"forged":true}')
        )
    with attacker(db) as conn:
        conn.execute(f"UPDATE entries SET {COLUMNS[index]} = ? WHERE seq = ?", (new, seq))
    return seq


def delete_entry(db: Path, rng: random.Random, rows: Rows) -> int:
    seq = rng.randint(1, N)
    with attacker(db) as conn:
        conn.execute("DELETE FROM entries WHERE seq = ?", (seq,))
    return seq


def swap_entries(db: Path, rng: random.Random, rows: Rows) -> int:
    """Two entries exchange places (each keeps everything but its seq)."""
    i, j = sorted(rng.sample(range(1, N + 1), 2))
    insert = f"INSERT INTO entries ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * 14)})"
    with attacker(db) as conn:
        conn.execute("DELETE FROM entries WHERE seq IN (?, ?)", (i, j))
        conn.execute(insert, (i, *_as_stored(rows[j])[1:]))
        conn.execute(insert, (j, *_as_stored(rows[i])[1:]))
    return i


def _as_stored(row: tuple[object, ...]) -> tuple[object, ...]:
    """A row read as bytes, with its text columns back to text (as SQLite typed them)."""
    text = {3, 4, 5, 6, 7, 8, 9, 11}
    return tuple(v.decode() if i in text and isinstance(v, bytes) else v for i, v in enumerate(row))


def truncate_tail(db: Path, rng: random.Random, rows: Rows) -> int:
    keep = rng.randint(0, N - 1)
    with attacker(db) as conn:
        conn.execute("DELETE FROM entries WHERE seq > ?", (keep,))
    return keep + 1


TAMPERINGS: dict[str, Callable[[Path, random.Random, Rows], int]] = {
    "flip a byte": flip_byte,
    "change a field": change_field,
    "delete an entry": delete_entry,
    "swap two entries": swap_entries,
    "truncate the tail": truncate_tail,
}


def test_1000_random_tamperings_are_all_detected_at_the_right_seq(
    pristine: Path, tmp_path: Path
) -> None:
    """200 trials of each kind, each on a fresh copy of the files: Verify (chain and
    checkpoints) fails every time, naming exactly the first entry that was altered."""
    rng = random.Random(20240611)
    rows = rows_of(pristine / "audit.sqlite3")
    kinds = list(TAMPERINGS)
    detected: Counter[str] = Counter()
    for trial in range(1000):
        kind = kinds[trial % len(kinds)]
        folder = tmp_path / f"trial-{trial}"
        copy_log(pristine, folder)
        expected = TAMPERINGS[kind](folder / "audit.sqlite3", rng, rows)
        verdict = verify_folder(folder)
        assert not verdict.ok, (trial, kind, expected)
        assert verdict.first_bad_seq == expected, (trial, kind, verdict)
        detected[kind] += 1
        shutil.rmtree(folder)
    assert detected == dict.fromkeys(kinds, 200)


def _rehash_from(db: Path, first: int) -> None:
    """The clever attacker: recompute every hash from `first` on, so the chain is whole."""
    conn = attacker(db)
    conn.text_factory = bytes
    stored = {r[0]: r for r in conn.execute(f"SELECT {', '.join(COLUMNS)} FROM entries")}
    prev = stored[first][12]
    for seq in range(first, max(stored) + 1):
        r = stored[seq]
        texts = [bytes(v).decode() for v in r[3:10]]  # type: ignore[call-overload]
        e = Entry(
            seq,
            int(r[1]),  # type: ignore[call-overload]
            *texts[:5],
            tuple(texts[5].split(ID_SEPARATOR)) if texts[5] else (),
            texts[6],
            bytes(r[10]),  # type: ignore[call-overload]
            int(r[2]),  # type: ignore[call-overload]
            bytes(r[11]).decode(),  # type: ignore[call-overload]
            prev,
            b"",
        )
        digest = entry_hash(prev, e)
        conn.execute(
            "UPDATE entries SET prev_hash = ?, hash = ? WHERE seq = ?", (prev, digest, seq)
        )
        prev = digest
    conn.close()


def test_a_rewritten_history_with_recomputed_hashes_is_caught_by_the_checkpoints(
    pristine: Path, tmp_path: Path
) -> None:
    copy_log(pristine, tmp_path)
    with attacker(tmp_path / "audit.sqlite3") as conn:
        conn.execute("UPDATE entries SET body = '{\"forged\":true}' WHERE seq = 60")
    _rehash_from(tmp_path / "audit.sqlite3", 60)
    assert verify_folder(tmp_path, chain_only=True).ok, "the chain alone cannot tell"
    verdict = verify_folder(tmp_path)
    assert not verdict.ok and verdict.first_bad_seq == 75  # the first checkpoint after 60
    assert verdict.reason.startswith("rewritten") and "after entry 50" in verdict.reason


def test_a_rollback_to_an_older_copy_is_detected(tmp_path: Path) -> None:
    """Restoring yesterday's database (the witness kept today's checkpoints)."""
    live, old = tmp_path / "live", tmp_path / "old"

    async def grow(count: int) -> None:
        log = make_log(live, checkpoint_every=10)
        log.open()
        await log.start()
        for _ in range(count):
            await log.append([entry()], None)
        await log.close()

    asyncio.run(grow(40))
    copy_log(live, old)
    asyncio.run(grow(25))
    shutil.copy2(old / "audit.sqlite3", live / "audit.sqlite3")
    verdict = verify_folder(live)
    assert not verdict.ok and verdict.first_bad_seq == 41
    assert verdict.reason.startswith("truncated below checkpoint")
    assert verify_folder(live, chain_only=True).ok


def test_a_forged_or_damaged_witness_is_reported(pristine: Path, tmp_path: Path) -> None:
    copy_log(pristine, tmp_path)
    witness = tmp_path / "witness.log"
    lines = witness.read_bytes().splitlines(keepends=True)
    # A checkpoint re-signed with another key, claiming a shorter log (to hide a cut).
    cp = decode(2, lines[1]).checkpoint
    assert cp is not None
    other = Ed25519Signer.load("", tmp_path / "other.key")
    forged = Checkpoint(
        cp.size,
        cp.hash,
        cp.time_us,
        checkpoints.key_id(other.public_key),
        other.sign(checkpoints.message(cp.size, cp.hash, cp.time_us)),
    )
    witness.write_bytes(b"".join([lines[0], encode(forged), *lines[2:]]))
    verdict = verify_folder(tmp_path)
    assert not verdict.ok and verdict.first_bad_seq == 50
    assert "not validly signed" in verdict.reason
    witness.write_bytes(b"".join([lines[0], b"{not json}\n", *lines[2:]]))
    verdict = verify_folder(tmp_path)
    assert not verdict.ok and verdict.reason == "witness: line 2 is malformed (JSONDecodeError)"


def test_a_torn_last_witness_line_is_cut_at_open(tmp_path: Path) -> None:
    """A crash mid-append leaves half a line; it is dropped, the rest still verifies."""

    async def grow() -> None:
        log = make_log(tmp_path, checkpoint_every=5)
        log.open()
        await log.start()
        for _ in range(12):
            await log.append([entry()], None)
        await log.close()

    asyncio.run(grow())
    witness = tmp_path / "witness.log"
    witness.write_bytes(witness.read_bytes() + b'{"hash": "ab')
    FileWitness(witness)
    assert witness.read_bytes().endswith(b"}\n")
    assert verify_folder(tmp_path).ok


def _log_over(folder: Path, start_verify_entries: int) -> AuditLog:
    return AuditLog(
        SqliteLog(folder / "audit.sqlite3"),
        SqliteKeyRing(folder / "keys.sqlite3"),
        Ed25519Signer.load("", folder / "checkpoint.key"),
        FileWitness(folder / "witness.log"),
        LogConfig(checkpoint_every=EVERY, start_verify_entries=start_verify_entries),
    )


def test_an_entry_edited_in_place_makes_the_next_start_refuse_writes(
    pristine: Path, tmp_path: Path
) -> None:
    """A middle entry's body edited with its stored hash left alone agrees with every
    checkpoint (none signs entry 60): the chain recomputed at open finds it, and the log
    serves reads and Verify but appends nothing on top of the edit, until an operator
    acts. Within the bound only: a start that checks just the newest 10 entries misses it
    (Verify still finds it)."""
    copy_log(pristine, tmp_path)
    with attacker(tmp_path / "audit.sqlite3") as conn:
        conn.execute("UPDATE entries SET body = ? WHERE seq = 60", ('{"forged":true}',))

    async def scenario() -> None:
        log = _log_over(tmp_path, start_verify_entries=1_000_000)
        log.open()
        await log.start()
        try:
            head = log.head()
            assert not head.writable and head.problem.startswith("entry 60: hash mismatch")
            with pytest.raises(FailedPrecondition) as err:
                await log.append([entry()], None)
            assert err.value.reason == "LOG_CHAIN_BROKEN" and "moves it aside" in err.value.message
            with pytest.raises(FailedPrecondition):
                await log.forget_user("acme", "alice", "gateway")
            page = await log.read(Filter("acme"), 0, 0, 1000, include_private=False)
            assert page.entries  # reads still served
            verdict = await log.verify(0, 0, chain_only=False)
            assert not verdict.ok and verdict.first_bad_seq == 60
            assert verdict.head_seq == N  # nothing was appended
        finally:
            await log.close()
        tail_only = _log_over(tmp_path, start_verify_entries=10)
        tail_only.open()
        await tail_only.start()
        assert tail_only.head().writable
        await tail_only.close()

    asyncio.run(scenario())
    assert verify_folder(tmp_path).first_bad_seq == 60
