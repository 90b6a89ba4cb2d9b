"""The memtok item store in SQLite (WAL, synchronous=FULL): the source of truth.

Value vectors are stored compactly: float16 normally, int8 with one float32 scale for
items compressed before deletion. Key vectors are float32 (they are also the index's
source on a rebuild). Every read and write is scoped by tenant and user in SQL.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hippo_injection.domain.memtok.models import Memtok, Packing, Source, Vector

_SCHEMA = """
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
"""

_COLUMNS = (
    "id, tenant, user_id, word, source_words, key, value, packing, scale, layer, model_id, "
    "count, keep, rank_max, surprise, emphasis, stakes, conditional, source, created_us, "
    "last_seen_us, grace_until_us, resurface_at_us"
)


def pack(value: Vector, packing: Packing) -> tuple[bytes, float]:
    v = np.asarray(value, dtype=np.float32)
    if packing is Packing.FLOAT16:
        return v.astype("<f2").tobytes(), 1.0
    peak = float(np.abs(v).max()) if v.size else 0.0
    scale = peak / 127.0 if peak > 0 else 1.0
    return np.clip(np.round(v / scale), -127, 127).astype(np.int8).tobytes(), scale


def unpack(blob: bytes, packing: Packing, scale: float) -> Vector:
    if packing is Packing.FLOAT16:
        return np.frombuffer(blob, dtype="<f2").astype(np.float32)
    return (np.frombuffer(blob, dtype=np.int8).astype(np.float32) * scale).astype(np.float32)


class SqliteMemtokStore:
    def __init__(self, path: Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    def meta(self) -> dict[str, str]:
        with self._lock:
            rows = self._db.execute("SELECT name, value FROM meta").fetchall()
        return {str(k): str(v) for k, v in rows}

    def set_meta(self, values: dict[str, str]) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    "INSERT INTO meta (name, value) VALUES (?, ?) "
                    "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                    list(values.items()),
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    @staticmethod
    def _row(row: tuple[object, ...]) -> Memtok:
        packing = Packing(str(row[7]))
        return Memtok(
            id=str(row[0]),
            tenant=str(row[1]),
            user=str(row[2]),
            word=str(row[3]),
            source_words=str(row[4]),
            key=np.frombuffer(row[5], dtype="<f4").astype(np.float32),  # type: ignore[call-overload]
            value=unpack(row[6], packing, float(row[8])),  # type: ignore[arg-type]
            packing=packing,
            layer=int(row[9]),  # type: ignore[call-overload]
            model_id=str(row[10]),
            count=int(row[11]),  # type: ignore[call-overload]
            keep=float(row[12]),  # type: ignore[arg-type]
            rank_max=float(row[13]),  # type: ignore[arg-type]
            surprise=float(row[14]),  # type: ignore[arg-type]
            emphasis=float(row[15]),  # type: ignore[arg-type]
            stakes=float(row[16]),  # type: ignore[arg-type]
            conditional=bool(row[17]),
            source=Source(str(row[18])),
            created_us=int(row[19]),  # type: ignore[call-overload]
            last_seen_us=int(row[20]),  # type: ignore[call-overload]
            grace_until_us=int(row[21]),  # type: ignore[call-overload]
            resurface_at_us=int(row[22]),  # type: ignore[call-overload]
        )

    def get(self, tenant: str, user: str, ids: Sequence[str]) -> list[Memtok]:
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM memtoks WHERE tenant = ? AND user_id = ? "
                f"AND id IN ({marks})",
                (tenant, user, *ids),
            ).fetchall()
        found = {str(r[0]): self._row(r) for r in rows}
        return [found[i] for i in ids if i in found]

    def by_user(self, tenant: str, user: str) -> list[Memtok]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM memtoks WHERE tenant = ? AND user_id = ? ORDER BY id",
                (tenant, user),
            ).fetchall()
        return [self._row(r) for r in rows]

    def users(self) -> list[tuple[str, str]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT DISTINCT tenant, user_id FROM memtoks ORDER BY tenant, user_id"
            ).fetchall()
        return [(str(t), str(u)) for t, u in rows]

    def put(self, items: Sequence[Memtok]) -> None:
        rows = []
        for m in items:
            value, scale = pack(m.value, m.packing)
            rows.append(
                (
                    m.id, m.tenant, m.user, m.word, m.source_words,
                    np.asarray(m.key, dtype="<f4").tobytes(), value, m.packing.value, scale,
                    m.layer, m.model_id, m.count, m.keep, m.rank_max, m.surprise, m.emphasis,
                    m.stakes, int(m.conditional), m.source.value, m.created_us,
                    m.last_seen_us, m.grace_until_us, m.resurface_at_us,
                )
            )  # fmt: skip
        if not rows:
            return
        marks = ",".join("?" * 23)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    f"INSERT OR REPLACE INTO memtoks ({_COLUMNS}) VALUES ({marks})", rows
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def delete(self, tenant: str, user: str, ids: Sequence[str]) -> None:
        if not ids:
            return
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    "DELETE FROM memtoks WHERE tenant = ? AND user_id = ? AND id = ?",
                    [(tenant, user, i) for i in ids],
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def count(self, tenant: str, user: str) -> int:
        with self._lock:
            (n,) = self._db.execute(
                "SELECT COUNT(*) FROM memtoks WHERE tenant = ? AND user_id = ?", (tenant, user)
            ).fetchone()
        return int(n)

    def user_mode(self, tenant: str, user: str) -> str | None:
        with self._lock:
            row = self._db.execute(
                "SELECT mode FROM user_modes WHERE tenant = ? AND user_id = ?", (tenant, user)
            ).fetchone()
        return None if row is None else str(row[0])

    def set_user_mode(self, tenant: str, user: str, mode: str | None) -> None:
        with self._lock:
            if mode is None:
                self._db.execute(
                    "DELETE FROM user_modes WHERE tenant = ? AND user_id = ?", (tenant, user)
                )
            else:
                self._db.execute(
                    "INSERT INTO user_modes (tenant, user_id, mode) VALUES (?, ?, ?) "
                    "ON CONFLICT(tenant, user_id) DO UPDATE SET mode = excluded.mode",
                    (tenant, user, mode),
                )

    def close(self) -> None:
        with self._lock:
            self._db.close()
