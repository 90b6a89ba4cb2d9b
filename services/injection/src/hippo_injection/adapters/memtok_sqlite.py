"""The memtok item store in SQLite (the embedded default): the source of truth, opened
through `hippo_core.sqlite` (WAL checked, synchronous=FULL, secure_delete, busy_timeout,
numbered migrations). One writer: this process, which also owns the key index.

Every read and write is scoped by tenant and user in SQL. A write's change number is the
meta row `key_seq`, bumped in the write's own transaction, so a crash between a write and
the key index's update is seen at the next open (the index then rebuilds). No change
feed: with one writer the index never needs another's changes."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from pathlib import Path
from sqlite3 import Connection

from hippo_core import sqlite as hippo_sqlite
from hippo_injection.adapters.memtok_rows import (
    COLUMNS,
    NAMES,
    UPDATED,
    from_row,
    states_rows,
    to_row,
)
from hippo_injection.adapters.states_codec import unpack_states
from hippo_injection.domain.memtok.models import Changes, Memtok
from hippo_injection.domain.types import MemoryStates

NAME = "memtok store"

# Version 1 is the schema the store had before it was versioned: a file written then has
# user_version 0 and these tables already, so every statement must be IF NOT EXISTS.
MIGRATIONS: list[hippo_sqlite.Migration] = [
    """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS memtoks (
  id TEXT PRIMARY KEY,
  tenant TEXT NOT NULL,
  user_id TEXT NOT NULL,
  word TEXT NOT NULL,
  source_words TEXT NOT NULL,
  key BLOB NOT NULL,
  value BLOB NOT NULL,
  packing TEXT NOT NULL,
  scale REAL NOT NULL,
  layer INTEGER NOT NULL,
  model_id TEXT NOT NULL,
  count INTEGER NOT NULL,
  keep REAL NOT NULL,
  rank_max REAL NOT NULL,
  surprise REAL NOT NULL,
  emphasis REAL NOT NULL,
  stakes REAL NOT NULL,
  conditional INTEGER NOT NULL,
  source TEXT NOT NULL,
  created_us INTEGER NOT NULL,
  last_seen_us INTEGER NOT NULL,
  grace_until_us INTEGER NOT NULL,
  resurface_at_us INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS memtoks_user ON memtoks (tenant, user_id);
CREATE TABLE IF NOT EXISTS user_modes (
  tenant TEXT NOT NULL, user_id TEXT NOT NULL, mode TEXT NOT NULL,
  PRIMARY KEY (tenant, user_id)
);
""",
    # 2: attendable states (memtok_rows.py), read apart from the rows.
    "ALTER TABLE memtoks ADD COLUMN states BLOB;",
]

_UPSERT = (
    f"INSERT INTO memtoks ({COLUMNS}) VALUES ({','.join('?' * len(NAMES))}) "
    f"ON CONFLICT(id) DO UPDATE SET {UPDATED} "
    "WHERE memtoks.tenant = excluded.tenant AND memtoks.user_id = excluded.user_id"
)


def _bump(conn: Connection) -> int:
    """The next change number, inside the caller's write transaction."""
    row = conn.execute("SELECT value FROM meta WHERE name = 'key_seq'").fetchone()
    seq = (int(row[0]) if row else 0) + 1
    conn.execute(
        "INSERT INTO meta (name, value) VALUES ('key_seq', ?) "
        "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
        (str(seq),),
    )
    return seq


class SqliteMemtokStore:
    shared = False

    def __init__(self, path: Path) -> None:
        self._lock = threading.Lock()
        self._db = hippo_sqlite.open_store(Path(path), NAME, MIGRATIONS)

    def meta(self) -> dict[str, str]:
        with self._lock:
            rows = self._db.execute("SELECT name, value FROM meta").fetchall()
        return {str(k): str(v) for k, v in rows}

    def set_meta(self, values: dict[str, str]) -> None:
        with self._lock, hippo_sqlite.transaction(self._db) as conn:
            conn.executemany(
                "INSERT INTO meta (name, value) VALUES (?, ?) "
                "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                list(values.items()),
            )

    def claim_meta(self, values: dict[str, str]) -> dict[str, str]:
        with self._lock, hippo_sqlite.transaction(self._db) as conn:
            conn.executemany(
                "INSERT INTO meta (name, value) VALUES (?, ?) ON CONFLICT(name) DO NOTHING",
                list(values.items()),
            )
        return self.meta()

    def head(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE name = 'key_seq'").fetchone()
        return int(row[0]) if row else 0

    def changes(self, after: int, upto: int) -> Changes | None:
        return None

    def trim_changes(self, before_us: int) -> int:
        return 0

    def get(self, tenant: str, user: str, ids: Sequence[str]) -> list[Memtok]:
        found: dict[str, Memtok] = {}
        with self._lock:
            for chunk in hippo_sqlite.chunks(ids):
                marks = ",".join("?" * len(chunk))
                rows = self._db.execute(
                    f"SELECT {COLUMNS} FROM memtoks WHERE tenant = ? AND user_id = ? "
                    f"AND id IN ({marks})",
                    (tenant, user, *chunk),
                ).fetchall()
                found.update((str(r[0]), from_row(r)) for r in rows)
        return [found[i] for i in ids if i in found]

    def by_user(self, tenant: str, user: str) -> list[Memtok]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT {COLUMNS} FROM memtoks WHERE tenant = ? AND user_id = ? ORDER BY id",
                (tenant, user),
            ).fetchall()
        return [from_row(r) for r in rows]

    def users(self) -> list[tuple[str, str]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT DISTINCT tenant, user_id FROM memtoks ORDER BY tenant, user_id"
            ).fetchall()
        return [(str(t), str(u)) for t, u in rows]

    def put(self, items: Sequence[Memtok]) -> int:
        rows = [to_row(m) for m in items]
        if not rows:
            return 0
        with self._lock, hippo_sqlite.transaction(self._db) as conn:
            seq = _bump(conn)
            conn.executemany(_UPSERT, rows)
            conn.executemany(
                "UPDATE memtoks SET states = ? WHERE id = ? AND tenant = ? AND user_id = ?",
                states_rows(items),
            )
        return seq

    def states(self, tenant: str, user: str, ids: Sequence[str]) -> dict[str, MemoryStates]:
        found: dict[str, MemoryStates] = {}
        with self._lock:
            for chunk in hippo_sqlite.chunks(ids):
                marks = ",".join("?" * len(chunk))
                rows = self._db.execute(
                    "SELECT id, states FROM memtoks WHERE tenant = ? AND user_id = ? "
                    f"AND id IN ({marks}) AND states IS NOT NULL",
                    (tenant, user, *chunk),
                ).fetchall()
                found.update((str(i), unpack_states(bytes(b))) for i, b in rows)
        return found

    def delete(self, tenant: str, user: str, ids: Sequence[str]) -> int:
        if not ids:
            return 0
        with self._lock, hippo_sqlite.transaction(self._db) as conn:
            seq = _bump(conn)
            conn.executemany(
                "DELETE FROM memtoks WHERE tenant = ? AND user_id = ? AND id = ?",
                [(tenant, user, i) for i in ids],
            )
        return seq

    def erase(self, tenant: str, user: str) -> tuple[list[str], int]:
        scope = (tenant, user)
        with self._lock:
            with hippo_sqlite.transaction(self._db) as conn:
                ids = [
                    str(r[0])
                    for r in conn.execute(
                        "SELECT id FROM memtoks WHERE tenant = ? AND user_id = ? ORDER BY id", scope
                    )
                ]
                seq = _bump(conn) if ids else 0
                conn.execute("DELETE FROM memtoks WHERE tenant = ? AND user_id = ?", scope)
                conn.execute("DELETE FROM user_modes WHERE tenant = ? AND user_id = ?", scope)
            # secure_delete zeroed the freed pages; the WAL still holds the frames written
            # while the words were live, until this checkpoint copies and truncates it.
            hippo_sqlite.purge_wal(self._db, NAME)
        return ids, seq

    def count(self, tenant: str, user: str) -> int:
        with self._lock:
            (n,) = self._db.execute(
                "SELECT COUNT(*) FROM memtoks WHERE tenant = ? AND user_id = ?", (tenant, user)
            ).fetchone()
        return int(n)

    def writing(self, tenant: str, user: str) -> contextlib.AbstractContextManager[None]:
        # One process writes the file, its model queue one call at a time: nothing to wait for.
        return contextlib.nullcontext()

    def owns_upkeep(self) -> bool:
        return True

    def user_mode(self, tenant: str, user: str) -> str | None:
        with self._lock:
            row = self._db.execute(
                "SELECT mode FROM user_modes WHERE tenant = ? AND user_id = ?", (tenant, user)
            ).fetchone()
        return None if row is None else str(row[0])

    def set_user_mode(self, tenant: str, user: str, mode: str | None) -> None:
        with self._lock, hippo_sqlite.transaction(self._db) as conn:
            if mode is None:
                conn.execute(
                    "DELETE FROM user_modes WHERE tenant = ? AND user_id = ?", (tenant, user)
                )
            else:
                conn.execute(
                    "INSERT INTO user_modes (tenant, user_id, mode) VALUES (?, ?, ?) "
                    "ON CONFLICT(tenant, user_id) DO UPDATE SET mode = excluded.mode",
                    (tenant, user, mode),
                )

    def close(self) -> None:
        with self._lock:
            self._db.close()
