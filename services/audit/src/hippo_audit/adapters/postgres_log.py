"""The log in PostgreSQL (cluster mode): every replica of the audit service appends to
one chain.

One total order across replicas. A batch's transaction locks the one `head` row FOR
UPDATE; under that lock it checks the head against the last entry, hands the head to
the domain's builder (which looks its idempotency keys up and decides on a checkpoint
inside the same transaction), inserts the entries (and the checkpoint), moves the head
and commits. A replica waiting for the lock then reads the head the previous batch
left: batches serialise, each replica still groups its own queued requests into one
transaction (group commit), and two replicas appending the same idempotency key store
one entry. (Each step after the lock is its own statement: in READ COMMITTED a
statement sees what committed before it began, so nothing read after the lock is stale.)

Append-only: the code only INSERTs entries and triggers refuse UPDATE, DELETE and
TRUNCATE (postgres_schema). Tenancy: every read that returns content has `tenant = %s`;
`rows` (hashes and raw bytes for Verify) and the head read the whole log.

Durability: PostgreSQL's commit (synchronous_commit on, the server's default) is
durable when `append` returns; with a synchronous standby configured, on it too.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator
from typing import Any

import psycopg
from psycopg.adapt import Buffer, Loader

from hippo_audit.adapters import postgres_witness
from hippo_audit.adapters.postgres_schema import APPENDED
from hippo_audit.adapters.rows import COLUMNS, entry_of, entry_row
from hippo_audit.domain.chain import GENESIS, Row
from hippo_audit.domain.models import Batch, Entry, Filter, Tip
from hippo_audit.domain.ports import Build, HeadMismatch
from hippo_core.postgres import Database, Listener, errors

_INSERT = f"INSERT INTO entries ({COLUMNS}) VALUES ({', '.join(['%s'] * 14)})"
_LAST = "SELECT seq, hash FROM entries ORDER BY seq DESC LIMIT 1"
_LOCK_HEAD = "SELECT seq, hash, checkpoint_size, checkpoint_us FROM head WHERE id = 1 FOR UPDATE"
# The `<> ''` repeats the partial unique index's condition, so the planner may use it.
FIND_KEYS = (
    "SELECT e.tenant, e.idempotency_key, e.seq, e.hash FROM entries e "
    "JOIN unnest(%s::text[], %s::text[]) AS k(tenant, idempotency_key) "
    "ON e.tenant = k.tenant AND e.idempotency_key = k.idempotency_key "
    "WHERE e.idempotency_key <> ''"
)
_FETCH = 4096


class _RawText(Loader):
    """Text columns as the bytes the server sent (UTF-8): Verify hashes those, never a
    decoded and re-encoded copy."""

    def load(self, data: Buffer) -> bytes:
        return bytes(data)


class PostgresLog:
    """`LogStore` on the service's PostgreSQL schema. Thread-safe (pooled connections)."""

    shared = True

    def __init__(self, database: Database) -> None:
        self._db = database
        self._listener: Listener | None = None
        self._listening = threading.Lock()

    # -- the writer ----------------------------------------------------------------------

    def append(self, build: Build) -> Batch:
        def work(conn: psycopg.Connection[Any]) -> Batch:
            locked = conn.execute(_LOCK_HEAD).fetchone()
            last = conn.execute(_LAST).fetchone()
            if locked is None:
                raise HeadMismatch("the head row is missing")
            recorded = (int(locked[0]), bytes(locked[1]))
            stored = (0, GENESIS) if last is None else (int(last[0]), bytes(last[1]))
            if recorded != stored:
                raise HeadMismatch(
                    f"the head records entry {recorded[0]} but the log ends at entry "
                    f"{stored[0]}{'' if recorded[0] != stored[0] else ' with another hash'}"
                )
            tip = Tip(recorded[0], recorded[1], int(locked[2]), int(locked[3]))
            batch = build(tip, lambda wanted: _find_keys(conn, wanted))
            seq, digest = recorded
            if batch.entries:
                with conn.cursor() as cursor:
                    cursor.executemany(_INSERT, [entry_row(e) for e in batch.entries])
                seq, digest = batch.entries[-1].seq, batch.entries[-1].hash
            size, signed_us = tip.checkpoint_size or 0, tip.checkpoint_us
            if batch.checkpoint is not None:
                postgres_witness.insert(conn, batch.checkpoint)
                size, signed_us = batch.checkpoint.size, batch.checkpoint.time_us
            if batch.entries or batch.checkpoint is not None:
                conn.execute(
                    "UPDATE head SET seq = %s, hash = %s, checkpoint_size = %s, "
                    "checkpoint_us = %s WHERE id = 1",
                    (seq, digest, size, signed_us),
                )
            if batch.entries:
                self._db.notify(conn, APPENDED, str(seq))
            return batch

        return self._db.run(work, "audit log")

    def wait_for_append(self, timeout: float) -> bool:
        with self._listening:
            if self._listener is None:
                self._listener = self._db.listener(APPENDED)
            listener = self._listener
        return listener.wait(timeout)

    # -- reads ---------------------------------------------------------------------------

    def head(self) -> tuple[int, bytes]:
        row = self._db.read(lambda conn: conn.execute(_LAST).fetchone(), "audit log")
        return (0, GENESIS) if row is None else (int(row[0]), bytes(row[1]))

    def hash_at(self, seq: int) -> bytes | None:
        row = self._db.read(
            lambda conn: conn.execute("SELECT hash FROM entries WHERE seq = %s", (seq,)).fetchone(),
            "audit log",
        )
        return None if row is None else bytes(row[0])

    def tenant_tip(self, tenant: str, from_seq: int, to_seq: int) -> tuple[int, int, bytes]:
        row = self._db.read(
            lambda conn: conn.execute(
                "SELECT count(*), max(seq) FROM entries"
                " WHERE tenant = %s AND seq BETWEEN %s AND %s",
                (tenant, from_seq, to_seq),
            ).fetchone(),
            "audit log",
        )
        if row is None or not row[0]:
            return 0, 0, b""
        return int(row[0]), int(row[1]), self.hash_at(int(row[1])) or b""

    def read(self, where: Filter, after_seq: int, to_seq: int, limit: int) -> list[Entry]:
        sql = [f"SELECT {COLUMNS} FROM entries WHERE tenant = %s AND seq > %s AND seq <= %s"]
        args: list[object] = [where.tenant, after_seq, to_seq]
        if where.user:
            sql.append("AND user_id = %s")
            args.append(where.user)
        if where.session:
            sql.append("AND session_id = %s")
            args.append(where.session)
        if where.event_types:
            sql.append("AND event_type = ANY(%s)")
            args.append(sorted(where.event_types))
        sql.append("ORDER BY seq LIMIT %s")
        args.append(limit)
        query = " ".join(sql)
        rows = self._db.read(lambda conn: conn.execute(query, args).fetchall(), "audit log")
        return [entry_of(r) for r in rows]

    def rows(self, from_seq: int, to_seq: int) -> Iterator[Row]:
        # One snapshot, streamed from a server-side cursor: a long log is never held in
        # memory at once.
        with (
            errors("audit log"),
            self._db.pool.connection() as conn,
            conn.transaction(),
            conn.cursor(name="audit_verify") as cursor,
        ):
            cursor.adapters.register_loader("text", _RawText)
            cursor.itersize = _FETCH
            cursor.execute(
                f"SELECT {COLUMNS} FROM entries WHERE seq >= %s AND seq <= %s ORDER BY seq",
                (from_seq, to_seq),
            )
            yield from cursor

    def checkpoint(self, truncate: bool = False) -> None:
        """Nothing to do: the server manages its write-ahead log."""

    def close(self) -> None:
        with self._listening:
            if self._listener is not None:
                self._listener.close()
                self._listener = None


def _find_keys(
    conn: psycopg.Connection[Any], wanted: Collection[tuple[str, str]]
) -> dict[tuple[str, str], tuple[int, bytes]]:
    pairs = sorted(wanted)
    rows = conn.execute(FIND_KEYS, ([t for t, _ in pairs], [k for _, k in pairs])).fetchall()
    return {(str(r[0]), str(r[1])): (int(r[2]), bytes(r[3])) for r in rows}
