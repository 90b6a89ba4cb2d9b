"""Per-user encryption keys in PostgreSQL (cluster mode): the `user_keys` table, shared
by every replica.

No key is cached between calls: a user forgotten through one replica must be
unreadable through every other at once. A group commit seals with one query (and one
insert per user new to it); a page of reads opens with one. A new key commits before
the batch that uses it (its own transaction), as in the SQLite ring: a crash cannot
leave an entry sealed under a key that was never stored.

Erasure: `destroy` deletes the user's rows, then rewrites the table (`VACUUM FULL`,
outside any transaction): a plain VACUUM frees the dead row but can leave its bytes in
the page's free space, where a file-level reader would still find the key. The rewrite
takes the table's exclusive lock for as long as it copies the (small) table; it waits
at most `lock_timeout` for it, and if it cannot run, the next erasure's rewrite removes
this one's bytes too. What stays elsewhere (WAL, standbys, backups): docs/audit.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import psycopg
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from hippo_audit import metrics
from hippo_audit.adapters import aead
from hippo_audit.domain.models import Opened, ToOpen, ToSeal
from hippo_core.postgres import Database

log = logging.getLogger(__name__)

_CURRENT = (
    "SELECT DISTINCT ON (k.tenant, k.user_id) k.tenant, k.user_id, k.key_id, k.key "
    "FROM user_keys k JOIN unnest(%s::text[], %s::text[]) AS u(tenant, user_id) "
    "ON k.tenant = u.tenant AND k.user_id = u.user_id "
    "ORDER BY k.tenant, k.user_id, k.key_id DESC"
)
_BY_ID = (
    "SELECT k.key_id, k.tenant, k.user_id, k.key FROM user_keys k "
    "JOIN unnest(%s::bigint[], %s::text[], %s::text[]) AS w(key_id, tenant, user_id) "
    "ON k.key_id = w.key_id AND k.tenant = w.tenant AND k.user_id = w.user_id"
)
SCRUB_LOCK_TIMEOUT_S = 2.0


class PostgresKeyRing:
    """`KeyRing` over `user_keys`. Thread-safe (pooled connections)."""

    def __init__(self, database: Database) -> None:
        self._db = database

    def seal(self, items: Sequence[ToSeal]) -> list[tuple[int, bytes]]:
        if not items:
            return []
        users = sorted({(i.tenant, i.user) for i in items})

        def work(conn: psycopg.Connection[Any]) -> dict[tuple[str, str], tuple[int, bytes]]:
            rows = conn.execute(_CURRENT, ([t for t, _ in users], [u for _, u in users]))
            found = {(str(r[0]), str(r[1])): (int(r[2]), bytes(r[3])) for r in rows}
            for tenant, user in users:
                if (tenant, user) not in found:
                    key = aead.new_key()
                    row = conn.execute(
                        "INSERT INTO user_keys (tenant, user_id, key, created_us) "
                        "VALUES (%s, %s, %s, %s) RETURNING key_id",
                        (tenant, user, key, time.time_ns() // 1000),
                    ).fetchone()
                    assert row is not None
                    found[(tenant, user)] = (int(row[0]), key)
            return found

        keys = self._db.run(work, "audit keys")
        ciphers = {who: (key_id, AESGCM(key)) for who, (key_id, key) in keys.items()}
        out = []
        for item in items:
            key_id, cipher = ciphers[(item.tenant, item.user)]
            out.append((key_id, aead.seal(cipher, item.plaintext, item.aad)))
        return out

    def open(self, items: Sequence[ToOpen]) -> list[Opened]:
        if not items:
            return []
        wanted = sorted({(i.key_id, i.tenant, i.user) for i in items})
        args = ([w[0] for w in wanted], [w[1] for w in wanted], [w[2] for w in wanted])
        rows = self._db.read(lambda conn: conn.execute(_BY_ID, args).fetchall(), "audit keys")
        ciphers = {(int(r[0]), str(r[1]), str(r[2])): AESGCM(bytes(r[3])) for r in rows}
        return [
            aead.unseal(ciphers.get((i.key_id, i.tenant, i.user)), i.sealed, i.aad) for i in items
        ]

    def destroy(self, tenant: str, user: str) -> int:
        destroyed: int = self._db.run(
            lambda conn: (
                conn.execute(
                    "DELETE FROM user_keys WHERE tenant = %s AND user_id = %s", (tenant, user)
                ).rowcount
            ),
            "audit keys",
        )
        if destroyed:
            self.scrub()
        return destroyed

    def scrub(self) -> bool:
        """Rewrite the key table, so deleted keys' bytes leave its files. False when it
        could not run now (logged and counted; the erasure itself is committed)."""
        if self._db.vacuum("user_keys", full=True, lock_timeout_s=SCRUB_LOCK_TIMEOUT_S):
            return True
        metrics.KEY_SCRUB_FAILURES.inc()
        return False

    def close(self) -> None:
        """The database is the caller's (shared by the log, the witness and the keys)."""
