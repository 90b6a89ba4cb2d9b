"""Per-user encryption keys for private bodies (AES-256-GCM), in their own SQLite file.

Erasure by key destruction ("crypto-shredding"): a private body is stored only as
ciphertext under its user's key, and the hash chain covers the ciphertext. Forgetting a
user deletes their keys; the entries stay, every hash still verifies, and nothing can
decrypt the bodies again.

For that to hold on disk, a destroyed key must not survive in the file: `secure_delete`
zeroes the deleted cells, and a truncating WAL checkpoint removes the copies in the WAL.
The keys live in a file apart from the log so that backups of the log never carry them
(a restored backup of the keys would undo erasures). Key ids only grow: a user forgotten
and then seen again gets a new key, and old entries stay unreadable.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from hippo_core.errors import FailedPrecondition

log = logging.getLogger(__name__)

_NONCE = 12  # bytes: AES-GCM's standard nonce, random per encryption
_SCHEMA = """
CREATE TABLE IF NOT EXISTS user_keys (
    key_id     INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant     TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    key        BLOB NOT NULL,
    created_us INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS user_keys_by_user ON user_keys (tenant, user_id, key_id);
"""


class SqliteKeyRing:
    """`KeyRing`. One connection behind one lock: key traffic is small (a lookup per new
    user, cached after), and a single connection lets the truncating checkpoint after an
    erasure complete (no reader holds an old snapshot)."""

    def __init__(self, path: Path) -> None:
        self._path = Path(path)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        fresh = not self._path.exists()
        self._lock = threading.Lock()
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        if fresh:
            os.chmod(self._path, 0o600)  # keys: readable by the service's user only
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            conn.close()
            raise FailedPrecondition(f"audit keys: journal_mode WAL not available ({mode})")
        # A key must be durable before any entry sealed with it is: else a crash could
        # erase content nobody asked to erase.
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA secure_delete = ON")
        conn.executescript(_SCHEMA)
        self._conn = conn
        self._current: dict[tuple[str, str], tuple[int, AESGCM]] = {}
        self._by_id: dict[int, AESGCM] = {}

    def seal(self, tenant: str, user: str, plaintext: bytes, aad: bytes) -> tuple[int, bytes]:
        key_id, cipher = self._current_key(tenant, user)
        nonce = os.urandom(_NONCE)
        return key_id, nonce + cipher.encrypt(nonce, plaintext, aad)

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
                key = AESGCM.generate_key(bit_length=256)
                cursor = self._conn.execute(
                    "INSERT INTO user_keys (tenant, user_id, key, created_us) VALUES (?, ?, ?, ?)",
                    (tenant, user, key, time.time_ns() // 1000),
                )
                row = (cursor.lastrowid, key)
            found = (int(row[0]), AESGCM(bytes(row[1])))
            self._current[(tenant, user)] = found
            self._by_id[found[0]] = found[1]
            return found

    def open(self, tenant: str, user: str, key_id: int, sealed: bytes, aad: bytes) -> bytes | None:
        with self._lock:
            cipher = self._by_id.get(key_id)
            if cipher is None:
                row = self._conn.execute(
                    "SELECT key FROM user_keys WHERE key_id = ? AND tenant = ? AND user_id = ?",
                    (key_id, tenant, user),
                ).fetchone()
                if row is None:
                    return None
                cipher = self._by_id[key_id] = AESGCM(bytes(row[0]))
        try:
            return cipher.decrypt(sealed[:_NONCE], sealed[_NONCE:], aad)
        except InvalidTag as exc:
            raise ValueError("the private body does not authenticate") from exc

    def destroy(self, tenant: str, user: str) -> int:
        with self._lock:
            ids = [
                int(r[0])
                for r in self._conn.execute(
                    "SELECT key_id FROM user_keys WHERE tenant = ? AND user_id = ?", (tenant, user)
                )
            ]
            if ids:
                self._conn.execute(
                    "DELETE FROM user_keys WHERE tenant = ? AND user_id = ?", (tenant, user)
                )
                busy = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
                if busy:
                    log.warning("audit keys: the WAL could not be truncated after an erasure")
            self._current.pop((tenant, user), None)
            for key_id in ids:
                self._by_id.pop(key_id, None)
            return len(ids)

    def close(self) -> None:
        with self._lock:
            self._conn.close()
