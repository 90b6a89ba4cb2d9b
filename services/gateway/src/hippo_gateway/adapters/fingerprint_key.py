"""The secret that keys query fingerprints in the audit log (HMAC-SHA256).

Every replica must use the same one, or equal queries recorded by two gateways would not
match. Configured (base64, from a secret): that value, everywhere. Otherwise it is
generated once and kept where the gateway keeps its state:
- embedded: a file under the data dir (mode 0600), created on first start;
- cluster mode: a row in the gateway's PostgreSQL schema, inserted by whichever replica
  starts first (`ON CONFLICT DO NOTHING`) and read back by all, so replicas agree without
  anyone copying a file between pods. Whoever can read that schema can read the key:
  configure it from a secret to keep it out of the database.
"""

from __future__ import annotations

import base64
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hippo_core.files import secret_file

if TYPE_CHECKING:  # cluster mode only: psycopg is not loaded for the embedded default
    from hippo_core.postgres import Database

FILE = "audit-fingerprint.key"
SIZE = 32


def _decode(text: str | bytes) -> bytes:
    return base64.b64decode(text.strip(), validate=True)


def file_key(configured: str, data_dir: Path) -> bytes:
    """The configured key, else the one in `<data_dir>/audit-fingerprint.key`, created on
    first start."""
    if configured:
        return _decode(configured)
    return _decode(
        secret_file(data_dir / FILE, lambda: base64.b64encode(secrets.token_bytes(SIZE)) + b"\n")
    )


def database_key(configured: str, database: Database) -> bytes:
    """The configured key, else the one in the gateway's schema (table `fingerprint_key`,
    see adapters/spool.py's migrations), created by the first replica to start."""
    if configured:
        return _decode(configured)
    candidate = base64.b64encode(secrets.token_bytes(SIZE)).decode()

    def work(conn: Any) -> str:
        # Replicas starting at once: one insert wins, the others wait for it and do
        # nothing; the read (a new snapshot per statement) then sees the winner's key.
        conn.execute(
            "INSERT INTO fingerprint_key (id, key) VALUES (1, %s) ON CONFLICT DO NOTHING",
            (candidate,),
        )
        row = conn.execute("SELECT key FROM fingerprint_key WHERE id = 1").fetchone()
        return str(row[0])

    stored: str = database.run(work, "audit fingerprint key")
    return _decode(stored)
