"""Per-user encryption keys for private bodies (AES-256-GCM), in their own SQLite file.

Erasure by key destruction ("crypto-shredding"): a private body is stored only as
ciphertext under its user's key, and the hash chain covers the ciphertext. Forgetting a
user deletes their keys; the entries stay, every hash still verifies, and nothing can
decrypt the bodies again.

For that to hold on disk, a destroyed key must not survive in the file: `secure_delete`
zeroes the deleted cells (hippo_core.sqlite sets it), and a truncating WAL checkpoint
removes the copies in the WAL. The keys live in a file apart from the log so that
backups of the log never carry them (a restored backup of the keys would undo erasures).
Key ids only grow: a user forgotten and then seen again gets a new key, and old entries
stay unreadable.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from hippo_audit.adapters import aead
from hippo_audit.domain.models import Opened, ToOpen, ToSeal
from hippo_core import sqlite as hippo_sqlite

# Version 1 is the schema files written before migrations were numbered (user_version
# 0 with these tables): IF NOT EXISTS lets those files pass through it unchanged.
MIGRATIONS: list[hippo_sqlite.Migration] = [
    """
CREATE TABLE IF NOT EXISTS user_keys (
    key_id     INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant     TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    key        BLOB NOT NULL,
    created_us INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS user_keys_by_user ON user_keys (tenant, user_id, key_id);
""",
]


class SqliteKeyRing:
    """`KeyRing`. One connection behind one lock: key traffic is small (a lookup per new
    user, cached after: this process is the file's only user), and a single connection
    lets the truncating checkpoint after an erasure complete (no reader holds an old
    snapshot)."""

    def __init__(self, path: Path) -> None:
        path = Path(path)
        fresh = not path.exists()
        self._lock = threading.Lock()
        # A key must be durable before any entry sealed with it is (synchronous=FULL):
        # else a crash could erase content nobody asked to erase.
        self._conn = hippo_sqlite.open_store(path, "audit keys", MIGRATIONS)
        if fresh:
            os.chmod(path, 0o600)  # keys: readable by the service's user only
        self._current: dict[tuple[str, str], tuple[int, AESGCM]] = {}
        self._by_id: dict[int, AESGCM] = {}

    def seal(self, items: Sequence[ToSeal]) -> list[tuple[int, bytes]]:
        out = []
        for item in items:
            key_id, cipher = self._current_key(item.tenant, item.user)
            out.append((key_id, aead.seal(cipher, item.plaintext, item.aad)))
        return out

    def _current_key(self, tenant: str, user: str) -> tuple[int, AESGCM]:
        with self._lock:
            found = self._current.get((tenant, user))
            if found is not None:
                return found
            row = self._conn.execute(
                "SELECT key_id, key FROM user_keys WHERE tenant = ? AND user_id = ? "
                "ORDER BY key_id DESC LIMIT 1",
                (tenant, user),
            ).fetchone()
            if row is None:
                key = aead.new_key()
                cursor = self._conn.execute(
                    "INSERT INTO user_keys (tenant, user_id, key, created_us) VALUES (?, ?, ?, ?)",
                    (tenant, user, key, time.time_ns() // 1000),
                )
                row = (cursor.lastrowid, key)
            found = (int(row[0]), AESGCM(bytes(row[1])))
            self._current[(tenant, user)] = found
            self._by_id[found[0]] = found[1]
            return found

    def open(self, items: Sequence[ToOpen]) -> list[Opened]:
        return [aead.unseal(self._cipher(i), i.sealed, i.aad) for i in items]

    def _cipher(self, item: ToOpen) -> AESGCM | None:
        with self._lock:
            cipher = self._by_id.get(item.key_id)
            if cipher is None:
                row = self._conn.execute(
                    "SELECT key FROM user_keys WHERE key_id = ? AND tenant = ? AND user_id = ?",
                    (item.key_id, item.tenant, item.user),
                ).fetchone()
                if row is None:
                    return None
                cipher = self._by_id[item.key_id] = AESGCM(bytes(row[0]))
            return cipher

    def destroy(self, tenant: str, user: str) -> int:
        with self._lock:
            ids = [
                int(r[0])
                for r in self._conn.execute(
                    "SELECT key_id FROM user_keys WHERE tenant = ? AND user_id = ?", (tenant, user)
                )
            ]
            if ids:
                with hippo_sqlite.transaction(self._conn) as conn:
                    conn.execute(
                        "DELETE FROM user_keys WHERE tenant = ? AND user_id = ?", (tenant, user)
                    )
                hippo_sqlite.purge_wal(self._conn, "audit keys")
            self._current.pop((tenant, user), None)
            for key_id in ids:
                self._by_id.pop(key_id, None)
            return len(ids)

    def close(self) -> None:
        with self._lock:
            self._conn.close()
