"""The memtok item store and reply buffer in PostgreSQL (cluster mode): every replica of
the injection service reads and writes them; each keeps its own key index (a projection
under its data dir) and catches up with the others' writes through the change feed.

Tables (schema `hippo_injection`): `memtoks`, `meta`, `user_modes` as in SQLite (vectors
as bytea, packed the same way); `reply_buffer`; the change feed `feed` (one row per item
ever written: tenant, memtok id, the seq of its last change, when) and its one-row head
`feed_head` (the last seq; `floor`, the highest seq whose record was trimmed).

Seqs in commit order: every write transaction starts with `UPDATE feed_head SET seq =
seq + 1 RETURNING seq`. The row lock it takes is held to commit, so writers pass through
it one at a time and commit in seq order: a reader that sees seq N sees every change up
to N. A writer takes the head before any other row, so two writers never wait on each
other the other way round (no deadlock). Writes are short (a few rows); memtok writes
come one per model call (seconds apart per replica), far below what one row serialises.

The feed says which items changed, not how: a replica reads each item as it is now (a
LEFT JOIN: gone when absent), so replaying a change is harmless and the feed keeps one
row per item. Rows of deleted items are tombstones, trimmed after a retention (they
hold a tenant and a random-looking id, no words); an index behind the trimmed part
rebuilds from the items.

Erasure deletes the user's rows in one transaction, then runs VACUUM on the tables it
touched (outside the transaction): see docs/memtok.md for what remains in WAL and backups.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg

from hippo_core.postgres import Database
from hippo_injection.adapters.memtok_rows import (
    COLUMNS,
    NAMES,
    UPDATED,
    from_row,
    states_rows,
    to_row,
)
from hippo_injection.adapters.states_codec import unpack_states
from hippo_injection.domain.memtok.models import Changes, Memtok, Observation
from hippo_injection.domain.types import MemoryStates

log = logging.getLogger(__name__)

SCHEMA = "hippo_injection"
NAME = "memtok store"

MIGRATIONS: list[str] = [
    """
CREATE TABLE meta (name text PRIMARY KEY, value text NOT NULL);
CREATE TABLE memtoks (
  id text PRIMARY KEY,
  tenant text NOT NULL,
  user_id text NOT NULL,
  word text NOT NULL,
  source_words text NOT NULL,
  key bytea NOT NULL,
  value bytea NOT NULL,
  packing text NOT NULL,
  scale double precision NOT NULL,
  layer integer NOT NULL,
  model_id text NOT NULL,
  count integer NOT NULL,
  keep double precision NOT NULL,
  rank_max double precision NOT NULL,
  surprise double precision NOT NULL,
  emphasis double precision NOT NULL,
  stakes double precision NOT NULL,
  conditional boolean NOT NULL,
  source text NOT NULL,
  created_us bigint NOT NULL,
  last_seen_us bigint NOT NULL,
  grace_until_us bigint NOT NULL,
  resurface_at_us bigint NOT NULL
);
CREATE INDEX memtoks_user ON memtoks (tenant, user_id);
CREATE TABLE user_modes (
  tenant text NOT NULL, user_id text NOT NULL, mode text NOT NULL,
  PRIMARY KEY (tenant, user_id)
);
CREATE TABLE reply_buffer (
  tenant text NOT NULL,
  user_id text NOT NULL,
  position integer NOT NULL,
  word text NOT NULL,
  source_words text NOT NULL,
  rank double precision NOT NULL,
  surprise double precision NOT NULL,
  attention double precision NOT NULL,
  emphasis double precision NOT NULL,
  stakes double precision NOT NULL,
  conditional boolean NOT NULL,
  at_us bigint NOT NULL,
  PRIMARY KEY (tenant, user_id, position)
);
CREATE TABLE feed_head (
  one boolean PRIMARY KEY DEFAULT true CHECK (one),
  seq bigint NOT NULL,
  floor bigint NOT NULL
);
INSERT INTO feed_head (seq, floor) VALUES (0, 0);
CREATE TABLE feed (
  tenant text NOT NULL,
  memtok_id text NOT NULL,
  seq bigint NOT NULL,
  changed_us bigint NOT NULL,
  PRIMARY KEY (tenant, memtok_id)
);
CREATE INDEX feed_seq ON feed (seq);
CREATE INDEX feed_changed ON feed (changed_us);
""",
    # 2: attendable states (memtok_rows.py), read apart from the rows.
    "ALTER TABLE memtoks ADD COLUMN states bytea;",
]

_UPSERT = (
    f"INSERT INTO memtoks ({COLUMNS}) VALUES ({','.join(['%s'] * len(NAMES))}) "
    f"ON CONFLICT (id) DO UPDATE SET {UPDATED} "
    "WHERE memtoks.tenant = excluded.tenant AND memtoks.user_id = excluded.user_id"
)
_MEMTOK_COLUMNS = ", ".join(f"m.{n}" for n in NAMES)
# What erasure leaves as dead tuples: VACUUM makes their space reusable at once instead of
# whenever autovacuum's thresholds are crossed.
_ERASED_TABLES = ("memtoks", "feed", "user_modes", "reply_buffer")


def _bump(conn: psycopg.Connection[Any]) -> int:
    """The next seq; the head's row lock serialises this transaction until it ends."""
    row = conn.execute("UPDATE feed_head SET seq = seq + 1 RETURNING seq").fetchone()
    assert row is not None
    return int(row[0])


def _record(conn: psycopg.Connection[Any], seq: int, tenant_ids: Sequence[tuple[str, str]]) -> None:
    """The feed's row of each item written or deleted moves to `seq`."""
    stamp = time.time_ns() // 1000
    with conn.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO feed (tenant, memtok_id, seq, changed_us) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (tenant, memtok_id) DO UPDATE SET seq = excluded.seq, "
            "changed_us = excluded.changed_us",
            [(tenant, memtok_id, seq, stamp) for tenant, memtok_id in tenant_ids],
        )


class PostgresMemtokStore:
    """`ItemStore` in the service's PostgreSQL schema. Opens (and migrates) `database`,
    and closes it with itself."""

    shared = True

    def __init__(self, database: Database) -> None:
        self._db = database
        self._db.open(MIGRATIONS)
        # Timed upkeep (consolidation, resurfacing, trimming) by one replica at a time;
        # freed when its holder dies.
        self._upkeep = database.lease("memtok-upkeep")
        self._held = threading.local()

    def meta(self) -> dict[str, str]:
        rows = self._db.read(lambda c: c.execute("SELECT name, value FROM meta").fetchall(), NAME)
        return {str(k): str(v) for k, v in rows}

    def set_meta(self, values: dict[str, str]) -> None:
        def work(conn: psycopg.Connection[Any]) -> None:
            with conn.cursor() as cursor:
                cursor.executemany(
                    "INSERT INTO meta (name, value) VALUES (%s, %s) "
                    "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                    list(values.items()),
                )

        self._db.run(work, NAME)

    def claim_meta(self, values: dict[str, str]) -> dict[str, str]:
        def work(conn: psycopg.Connection[Any]) -> None:
            with conn.cursor() as cursor:
                cursor.executemany(
                    "INSERT INTO meta (name, value) VALUES (%s, %s) ON CONFLICT (name) DO NOTHING",
                    list(values.items()),
                )

        self._db.run(work, NAME)
        return self.meta()

    def head(self) -> int:
        row = self._db.read(lambda c: c.execute("SELECT seq FROM feed_head").fetchone(), NAME)
        return int(row[0]) if row else 0

    def changes(self, after: int, upto: int) -> Changes | None:
        with self._db.transaction(NAME) as conn:
            # One snapshot for the floor and the rows: a trim committing in between
            # cannot hide a tombstone this read was owed.
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            row = conn.execute("SELECT floor FROM feed_head").fetchone()
            if row is None or after < int(row[0]):
                return None
            rows = conn.execute(
                f"SELECT f.tenant, f.memtok_id, m.id IS NOT NULL, {_MEMTOK_COLUMNS} FROM feed f "
                "LEFT JOIN memtoks m ON m.id = f.memtok_id AND m.tenant = f.tenant "
                "WHERE f.seq > %s AND f.seq <= %s ORDER BY f.seq",
                (after, upto),
            ).fetchall()
        out = Changes()
        for r in rows:
            if r[2]:
                out.live.append(from_row(r[3:]))
            else:
                out.gone.append((str(r[0]), str(r[1])))
        return out

    def trim_changes(self, before_us: int) -> int:
        def work(conn: psycopg.Connection[Any]) -> int:
            # The head first, as every writer takes it (no lock-order deadlock).
            conn.execute("SELECT seq FROM feed_head FOR UPDATE")
            rows = conn.execute(
                "DELETE FROM feed f WHERE f.changed_us < %s AND NOT EXISTS "
                "(SELECT 1 FROM memtoks m WHERE m.id = f.memtok_id AND m.tenant = f.tenant) "
                "RETURNING f.seq",
                (before_us,),
            ).fetchall()
            if rows:
                conn.execute(
                    "UPDATE feed_head SET floor = greatest(floor, %s)",
                    (max(int(r[0]) for r in rows),),
                )
            return len(rows)

        return self._db.run(work, NAME)

    def get(self, tenant: str, user: str, ids: Sequence[str]) -> list[Memtok]:
        if not ids:
            return []
        rows = self._db.read(
            lambda c: c.execute(
                f"SELECT {COLUMNS} FROM memtoks WHERE tenant = %s AND user_id = %s "
                "AND id = ANY(%s)",
                (tenant, user, list(ids)),
            ).fetchall(),
            NAME,
        )
        found = {str(r[0]): from_row(r) for r in rows}
        return [found[i] for i in ids if i in found]

    def by_user(self, tenant: str, user: str) -> list[Memtok]:
        rows = self._db.read(
            lambda c: c.execute(
                f"SELECT {COLUMNS} FROM memtoks WHERE tenant = %s AND user_id = %s ORDER BY id",
                (tenant, user),
            ).fetchall(),
            NAME,
        )
        return [from_row(r) for r in rows]

    def users(self) -> list[tuple[str, str]]:
        rows = self._db.read(
            lambda c: c.execute(
                "SELECT DISTINCT tenant, user_id FROM memtoks ORDER BY tenant, user_id"
            ).fetchall(),
            NAME,
        )
        return [(str(t), str(u)) for t, u in rows]

    def put(self, items: Sequence[Memtok]) -> int:
        rows = [to_row(m) for m in items]
        if not rows:
            return 0

        def work(conn: psycopg.Connection[Any]) -> int:
            seq = _bump(conn)
            with conn.cursor() as cursor:
                cursor.executemany(_UPSERT, rows)
                states = states_rows(items)
                if states:
                    cursor.executemany(
                        "UPDATE memtoks SET states = %s "
                        "WHERE id = %s AND tenant = %s AND user_id = %s",
                        states,
                    )
            _record(conn, seq, [(m.tenant, m.id) for m in items])
            return seq

        return self._db.run(work, NAME)

    def states(self, tenant: str, user: str, ids: Sequence[str]) -> dict[str, MemoryStates]:
        if not ids:
            return {}
        rows = self._db.read(
            lambda c: c.execute(
                "SELECT id, states FROM memtoks WHERE tenant = %s AND user_id = %s "
                "AND id = ANY(%s) AND states IS NOT NULL",
                (tenant, user, list(ids)),
            ).fetchall(),
            NAME,
        )
        return {str(i): unpack_states(bytes(b)) for i, b in rows}

    def delete(self, tenant: str, user: str, ids: Sequence[str]) -> int:
        if not ids:
            return 0

        def work(conn: psycopg.Connection[Any]) -> int:
            seq = _bump(conn)
            gone = conn.execute(
                "DELETE FROM memtoks WHERE tenant = %s AND user_id = %s AND id = ANY(%s) "
                "RETURNING id",
                (tenant, user, list(ids)),
            ).fetchall()
            _record(conn, seq, [(tenant, str(r[0])) for r in gone])
            return seq

        return self._db.run(work, NAME)

    def erase(self, tenant: str, user: str) -> tuple[list[str], int]:
        scope = (tenant, user)

        def work(conn: psycopg.Connection[Any]) -> tuple[list[str], int, int]:
            seq = _bump(conn)
            rows = conn.execute(
                "DELETE FROM memtoks WHERE tenant = %s AND user_id = %s RETURNING id", scope
            ).fetchall()
            ids = sorted(str(r[0]) for r in rows)
            _record(conn, seq, [(tenant, i) for i in ids])
            other = 0
            for table in ("user_modes", "reply_buffer"):
                cursor = conn.execute(
                    f"DELETE FROM {table} WHERE tenant = %s AND user_id = %s", scope
                )
                other += max(cursor.rowcount, 0)
            return ids, seq, other

        ids, seq, other = self._db.run(work, NAME)
        if ids or other:
            self._vacuum()
        return ids, seq

    def _vacuum(self) -> None:
        """VACUUM after an erasure. The erasure is committed whatever happens here: a
        failure is logged (by Database.vacuum) and autovacuum gets there later."""
        self._db.vacuum(*_ERASED_TABLES)

    def count(self, tenant: str, user: str) -> int:
        row = self._db.read(
            lambda c: c.execute(
                "SELECT count(*) FROM memtoks WHERE tenant = %s AND user_id = %s", (tenant, user)
            ).fetchone(),
            NAME,
        )
        return int(row[0]) if row else 0

    @contextlib.contextmanager
    def writing(self, tenant: str, user: str) -> Iterator[None]:
        held: set[tuple[str, str]] | None = getattr(self._held, "scopes", None)
        if held is None:
            held = self._held.scopes = set()
        if (tenant, user) in held:  # re-entrant: promote admits under its own hold
            yield
            return
        # A transaction-scoped advisory lock on a connection of its own, held while the
        # caller reads and writes on others: released at its end, or when the connection
        # dies with its replica.
        with self._db.transaction(f"{NAME} user lock") as conn:
            conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                (f"memtok:{tenant}\x1f{user}",),
            )
            held.add((tenant, user))
            try:
                yield
            finally:
                held.discard((tenant, user))

    def owns_upkeep(self) -> bool:
        return self._upkeep.acquire()

    def user_mode(self, tenant: str, user: str) -> str | None:
        row = self._db.read(
            lambda c: c.execute(
                "SELECT mode FROM user_modes WHERE tenant = %s AND user_id = %s", (tenant, user)
            ).fetchone(),
            NAME,
        )
        return None if row is None else str(row[0])

    def set_user_mode(self, tenant: str, user: str, mode: str | None) -> None:
        def work(conn: psycopg.Connection[Any]) -> None:
            if mode is None:
                conn.execute(
                    "DELETE FROM user_modes WHERE tenant = %s AND user_id = %s", (tenant, user)
                )
            else:
                conn.execute(
                    "INSERT INTO user_modes (tenant, user_id, mode) VALUES (%s, %s, %s) "
                    "ON CONFLICT (tenant, user_id) DO UPDATE SET mode = excluded.mode",
                    (tenant, user, mode),
                )

        self._db.run(work, NAME)

    def close(self) -> None:
        self._upkeep.release()
        self._db.close()


_OBSERVATION = "word, source_words, rank, surprise, attention, emphasis, stakes, conditional, at_us"


def _observation(row: Sequence[Any]) -> tuple[Observation, int]:
    return (
        Observation(
            word=str(row[0]),
            source_words=str(row[1]),
            rank=float(row[2]),
            surprise=float(row[3]),
            attention=float(row[4]),
            emphasis=float(row[5]),
            stakes=float(row[6]),
            conditional=bool(row[7]),
        ),
        int(row[8]),
    )


class PostgresReplyBuffer:
    """`ReplyBuffer` in the same schema: the reply a user got from one replica is
    promoted by whichever replica serves the next query. Writes of one user run under
    the store's `writing` hold."""

    def __init__(self, database: Database) -> None:
        self._db = database

    def replace(self, tenant: str, user: str, entries: Sequence[tuple[Observation, int]]) -> None:
        rows = [
            (tenant, user, i, o.word, o.source_words, o.rank, o.surprise, o.attention,
             o.emphasis, o.stakes, o.conditional, at)
            for i, (o, at) in enumerate(entries)
        ]  # fmt: skip

        def work(conn: psycopg.Connection[Any]) -> None:
            conn.execute(
                "DELETE FROM reply_buffer WHERE tenant = %s AND user_id = %s", (tenant, user)
            )
            if rows:
                with conn.cursor() as cursor:
                    cursor.executemany(
                        f"INSERT INTO reply_buffer (tenant, user_id, position, {_OBSERVATION}) "
                        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                        rows,
                    )

        self._db.run(work, "reply buffer")

    def take(self, tenant: str, user: str) -> list[tuple[Observation, int]]:
        rows = self._db.run(
            lambda c: c.execute(
                f"DELETE FROM reply_buffer WHERE tenant = %s AND user_id = %s "
                f"RETURNING position, {_OBSERVATION}",
                (tenant, user),
            ).fetchall(),
            "reply buffer",
        )
        return [_observation(r[1:]) for r in sorted(rows, key=lambda r: int(r[0]))]

    def peek(self, tenant: str, user: str) -> list[tuple[Observation, int]]:
        rows = self._db.read(
            lambda c: c.execute(
                f"SELECT {_OBSERVATION} FROM reply_buffer WHERE tenant = %s AND user_id = %s "
                "ORDER BY position",
                (tenant, user),
            ).fetchall(),
            "reply buffer",
        )
        return [_observation(r) for r in rows]

    def drop(self, tenant: str, user: str) -> None:
        self._db.run(
            lambda c: c.execute(
                "DELETE FROM reply_buffer WHERE tenant = %s AND user_id = %s", (tenant, user)
            ),
            "reply buffer",
        )
