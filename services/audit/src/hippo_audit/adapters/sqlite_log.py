"""The log on one SQLite file: the audit service's source of truth (embedded default).

Append-only by construction. The code only ever INSERTs entries (a test checks the
source), and triggers make SQLite itself refuse any UPDATE or DELETE of an entry, so a
bug cannot rewrite history through this adapter. (Someone with the file can drop the
triggers: that is what the hash chain and the signed checkpoints are for.)

Durability: WAL with `synchronous=FULL` (hippo_core.sqlite), so `append` returns only
once its transaction is fsynced; the writer batches concurrent appends into one
transaction (group commit). The batch is built inside `BEGIN IMMEDIATE` on the head read
there: SQLite's write lock is the append lock of the port. Reads use their own
connections (one per thread): WAL lets them run beside the writer.

Tenancy: every read that returns content has `tenant = ?` in its SQL. Only `rows` (the
raw material of Verify, which returns hashes and seqs, never content) and the head scan
the whole log.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Collection, Iterator
from pathlib import Path

from hippo_audit.adapters.rows import COLUMNS, entry_of, entry_row
from hippo_audit.domain.chain import GENESIS, Row
from hippo_audit.domain.models import Batch, Entry, Filter, Tip
from hippo_audit.domain.ports import Build, HeadMismatch
from hippo_core import sqlite as hippo_sqlite

# Version 1 is the layout every file written so far has (user_version 1): never edit it;
# a change is a new migration appended here.
MIGRATIONS: list[hippo_sqlite.Migration] = [
    """
CREATE TABLE entries (
    seq             INTEGER PRIMARY KEY,
    time_us         INTEGER NOT NULL,
    key_id          INTEGER NOT NULL,
    tenant          TEXT NOT NULL,
    actor           TEXT NOT NULL,
    event_type      TEXT NOT NULL,
    user_id         TEXT NOT NULL,
    session_id      TEXT NOT NULL,
    memory_ids      TEXT NOT NULL,
    body            TEXT NOT NULL,
    sealed          BLOB NOT NULL,
    idempotency_key TEXT NOT NULL,
    prev_hash       BLOB NOT NULL,
    hash            BLOB NOT NULL
);
CREATE INDEX entries_by_tenant ON entries (tenant, seq);
CREATE INDEX entries_by_user ON entries (tenant, user_id, seq);
CREATE INDEX entries_by_session ON entries (tenant, user_id, session_id, seq);
CREATE UNIQUE INDEX entries_by_key ON entries (tenant, idempotency_key)
    WHERE idempotency_key != '';
CREATE TRIGGER entries_are_never_updated BEFORE UPDATE ON entries
    BEGIN SELECT RAISE(ABORT, 'audit entries are append-only'); END;
CREATE TRIGGER entries_are_never_deleted BEFORE DELETE ON entries
    BEGIN SELECT RAISE(ABORT, 'audit entries are append-only'); END;
""",
]

_INSERT = f"INSERT INTO entries ({COLUMNS}) VALUES ({', '.join('?' * 14)})"
_HEAD = "SELECT seq, hash FROM entries ORDER BY seq DESC LIMIT 1"
_FETCH = 4096
# The `!= ''` repeats the partial index's condition: without it SQLite cannot prove the
# index applies and scans the tenant's entries instead (on every append, growing with the
# log: it once cost most of an append's time).
FIND_KEY = (
    "SELECT seq, hash FROM entries "
    "WHERE tenant = ? AND idempotency_key = ? AND idempotency_key != ''"
)


class SqliteLog:
    """`LogStore` on one SQLite file. `append` belongs to the one writer thread; reads
    may come from any thread. One process writes the file: `shared` is False."""

    shared = False

    def __init__(self, path: Path, *, busy_timeout_ms: int = 5000) -> None:
        self._path = Path(path)
        self._busy_ms = busy_timeout_ms
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._head: tuple[int, bytes] | None = None  # as the last append left it
        # No checkpoint inside a commit: copying the WAL into the database (and its
        # fsync) would land on whichever append crossed the threshold, a latency spike
        # for that caller. `checkpoint` runs it beside the writer instead.
        self._writer = hippo_sqlite.open_store(
            self._path,
            "audit log",
            MIGRATIONS,
            busy_timeout_ms=busy_timeout_ms,
            autocheckpoint=False,
        )

    def _connect(self) -> sqlite3.Connection:
        return hippo_sqlite.connect(self._path, busy_timeout_ms=self._busy_ms)

    def _reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
            with self._lock:
                self._readers.append(conn)
        return conn

    # -- the writer ----------------------------------------------------------------------

    def append(self, build: Build) -> Batch:
        with hippo_sqlite.transaction(self._writer) as conn:
            row = conn.execute(_HEAD).fetchone()
            stored = (0, GENESIS) if row is None else (int(row[0]), bytes(row[1]))
            # This process is the file's one writer, so the head it left is exact: a
            # different last entry means rows were cut or added behind its back.
            if self._head is not None and stored != self._head:
                raise HeadMismatch(
                    f"the writer left entry {self._head[0]} as the head but the log ends at "
                    f"entry {stored[0]}{'' if stored[0] != self._head[0] else ' with another hash'}"
                )
            batch = build(Tip(*stored), self._find_keys)
            if batch.entries:
                conn.executemany(_INSERT, [entry_row(e) for e in batch.entries])
        if batch.entries:
            stored = (batch.entries[-1].seq, batch.entries[-1].hash)
        self._head = stored
        return batch

    def _find_keys(
        self, wanted: Collection[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[int, bytes]]:
        found = {}
        for tenant, key in wanted:
            row = self._writer.execute(FIND_KEY, (tenant, key)).fetchone()
            if row is not None:
                found[(tenant, key)] = (int(row[0]), bytes(row[1]))
        return found

    def wait_for_append(self, timeout: float) -> bool:
        # Never called (`shared` is False): this process is the only writer.
        return False

    # -- reads ---------------------------------------------------------------------------

    def head(self) -> tuple[int, bytes]:
        row = self._reader().execute(_HEAD).fetchone()
        return (0, GENESIS) if row is None else (int(row[0]), bytes(row[1]))

    def hash_at(self, seq: int) -> bytes | None:
        row = self._reader().execute("SELECT hash FROM entries WHERE seq = ?", (seq,)).fetchone()
        return None if row is None else bytes(row[0])

    def tenant_tip(self, tenant: str, from_seq: int, to_seq: int) -> tuple[int, int, bytes]:
        count, last = (
            self._reader()
            .execute(
                "SELECT COUNT(*), MAX(seq) FROM entries WHERE tenant = ? AND seq BETWEEN ? AND ?",
                (tenant, from_seq, to_seq),
            )
            .fetchone()
        )
        if not count:
            return 0, 0, b""
        return int(count), int(last), self.hash_at(int(last)) or b""

    def read(self, where: Filter, after_seq: int, to_seq: int, limit: int) -> list[Entry]:
        sql = [f"SELECT {COLUMNS} FROM entries WHERE tenant = ? AND seq > ? AND seq <= ?"]
        args: list[object] = [where.tenant, after_seq, to_seq]
        if where.user:
            sql.append("AND user_id = ?")
            args.append(where.user)
        if where.session:
            sql.append("AND session_id = ?")
            args.append(where.session)
        if where.event_types:
            kinds = sorted(where.event_types)
            sql.append(f"AND event_type IN ({', '.join('?' * len(kinds))})")
            args.extend(kinds)
        sql.append("ORDER BY seq LIMIT ?")
        args.append(limit)
        return [entry_of(r) for r in self._reader().execute(" ".join(sql), args)]

    def rows(self, from_seq: int, to_seq: int) -> Iterator[Row]:
        # A connection of its own that hands text back as the stored bytes: verification
        # hashes exactly what is on disk, and a byte that is not UTF-8 is a finding, not
        # a crash.
        conn = self._connect()
        conn.text_factory = bytes
        try:
            cursor = conn.execute(
                f"SELECT {COLUMNS} FROM entries WHERE seq >= ? AND seq <= ? ORDER BY seq",
                (from_seq, to_seq),
            )
            while batch := cursor.fetchmany(_FETCH):
                yield from batch
        finally:
            conn.close()

    def checkpoint(self, truncate: bool = False) -> None:
        """Copy committed WAL frames into the database file (PASSIVE: beside the writer,
        never blocking it), or at close TRUNCATE: everything, and an empty WAL."""
        mode = "TRUNCATE" if truncate else "PASSIVE"
        self._reader().execute(f"PRAGMA wal_checkpoint({mode})").fetchone()

    def close(self) -> None:
        self.checkpoint(truncate=True)
        with self._lock:
            readers, self._readers = self._readers, []
        for conn in readers:
            conn.close()
        self._writer.close()
