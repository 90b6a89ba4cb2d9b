"""The log on one SQLite file: the audit service's source of truth.

Append-only by construction. The code only ever INSERTs entries (a test checks the
source), and triggers make SQLite itself refuse any UPDATE or DELETE of an entry, so a
bug cannot rewrite history through this adapter. (Someone with the file can drop the
triggers: that is what the hash chain and the signed checkpoints are for.)

Durability: WAL with `synchronous=FULL`, so `append` returns only once its transaction
is fsynced; the writer batches concurrent appends into one transaction (group commit).
Reads use their own connections (one per thread): WAL lets them run beside the writer.

Tenancy: every read that returns content has `tenant = ?` in its SQL. Only `rows` (the
raw material of Verify, which returns hashes and seqs, never content) and the head scan
the whole log.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hippo_audit.domain.chain import GENESIS, ID_SEPARATOR, Row
from hippo_audit.domain.models import Entry, Filter
from hippo_core.errors import FailedPrecondition

SCHEMA_VERSION = 1

_SCHEMA = """
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
"""

# Column order = chain.Row: seq, time_us, key_id, the 9 encoded fields, prev_hash, hash.
_COLUMNS = (
    "seq, time_us, key_id, tenant, actor, event_type, user_id, session_id, memory_ids, "
    "body, sealed, idempotency_key, prev_hash, hash"
)
_INSERT = f"INSERT INTO entries ({_COLUMNS}) VALUES ({', '.join('?' * 14)})"
_FETCH = 4096
# The `!= ''` repeats the partial index's condition: without it SQLite cannot prove the
# index applies and scans the tenant's entries instead (on every append, growing with the
# log: it once cost most of an append's time).
FIND_KEY = (
    "SELECT seq, hash FROM entries "
    "WHERE tenant = ? AND idempotency_key = ? AND idempotency_key != ''"
)


def _entry(row: tuple[Any, ...]) -> Entry:
    ids = str(row[8])
    return Entry(
        seq=int(row[0]),
        time_us=int(row[1]),
        key_id=int(row[2]),
        tenant=str(row[3]),
        actor=str(row[4]),
        event_type=str(row[5]),
        user=str(row[6]),
        session=str(row[7]),
        memory_ids=tuple(ids.split(ID_SEPARATOR)) if ids else (),
        body=str(row[9]),
        sealed=bytes(row[10]),
        idempotency_key=str(row[11]),
        prev_hash=bytes(row[12]),
        hash=bytes(row[13]),
    )


class SqliteLog:
    """`LogStore` on one SQLite file. `append` and `find_key` belong to the one writer
    thread; reads may come from any thread."""

    def __init__(self, path: Path, *, busy_timeout_ms: int = 5000) -> None:
        self._path = Path(path)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._busy_ms = busy_timeout_ms
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        conn = self._connect()
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                # Some filesystems cannot hold a WAL; another mode would silently change
                # the durability and concurrency we promise.
                raise FailedPrecondition(f"audit log: journal_mode WAL not available ({mode})")
            # FULL, not NORMAL: in WAL mode NORMAL may lose the last commits on power loss,
            # and an acknowledged entry must never be lost.
            conn.execute("PRAGMA synchronous = FULL")
            # No checkpoint inside a commit: copying the WAL into the database (and its
            # fsync) would land on whichever append crossed the threshold, a latency spike
            # for that caller. `checkpoint` runs it beside the writer instead.
            conn.execute("PRAGMA wal_autocheckpoint = 0")
            self._migrate(conn)
        except BaseException:
            conn.close()
            raise
        self._writer = conn

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: no implicit transactions; `append` opens BEGIN IMMEDIATE.
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {int(self._busy_ms)}")
        return conn

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version == 0:
                for statement in _statements(_SCHEMA):
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            elif version != SCHEMA_VERSION:
                raise FailedPrecondition(
                    f"audit log: schema version {version} is not supported "
                    f"(this build knows {SCHEMA_VERSION})"
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
            with self._lock:
                self._readers.append(conn)
        return conn

    # -- the writer ----------------------------------------------------------------------

    def append(self, entries: Sequence[Entry]) -> None:
        rows = [
            (
                e.seq,
                e.time_us,
                e.key_id,
                e.tenant,
                e.actor,
                e.event_type,
                e.user,
                e.session,
                ID_SEPARATOR.join(e.memory_ids),
                e.body,
                e.sealed,
                e.idempotency_key,
                e.prev_hash,
                e.hash,
            )
            for e in entries
        ]
        conn = self._writer
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany(_INSERT, rows)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def find_key(self, tenant: str, idempotency_key: str) -> tuple[int, bytes] | None:
        row = self._writer.execute(FIND_KEY, (tenant, idempotency_key)).fetchone()
        return None if row is None else (int(row[0]), bytes(row[1]))

    # -- reads ---------------------------------------------------------------------------

    def head(self) -> tuple[int, bytes]:
        row = (
            self._reader()
            .execute("SELECT seq, hash FROM entries ORDER BY seq DESC LIMIT 1")
            .fetchone()
        )
        return (0, GENESIS) if row is None else (int(row[0]), bytes(row[1]))

    def hash_at(self, seq: int) -> bytes | None:
        row = self._reader().execute("SELECT hash FROM entries WHERE seq = ?", (seq,)).fetchone()
        return None if row is None else bytes(row[0])

    def read(self, where: Filter, after_seq: int, to_seq: int, limit: int) -> list[Entry]:
        sql = [f"SELECT {_COLUMNS} FROM entries WHERE tenant = ? AND seq > ? AND seq <= ?"]
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
        return [_entry(r) for r in self._reader().execute(" ".join(sql), args)]

    def rows(self, from_seq: int, to_seq: int) -> Iterator[Row]:
        # A connection of its own that hands text back as the stored bytes: verification
        # hashes exactly what is on disk, and a byte that is not UTF-8 is a finding, not
        # a crash.
        conn = self._connect()
        conn.text_factory = bytes
        try:
            cursor = conn.execute(
                f"SELECT {_COLUMNS} FROM entries WHERE seq >= ? AND seq <= ? ORDER BY seq",
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


def _statements(script: str) -> list[str]:
    """Split the schema into statements; trigger bodies hold `;` inside BEGIN ... END."""
    out, current = [], ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            out.append(current.strip())
            current = ""
    return out
