"""The witness in PostgreSQL (cluster mode): signed checkpoints in an append-only table
beside the log, one row per size.

The log store writes a checkpoint in the very transaction of the batch that was chosen,
under the head lock, to sign it (`insert`): every replica shares one record and each
checkpoint is signed once. `append` is the same insert on its own (idempotent by size).

Trade-off: whoever can rewrite the database (a superuser who disables the triggers) can
also delete checkpoint rows, which a witness file on another volume would have kept
from them. They still cannot forge one without the signing key; export the checkpoints
off the cluster (docs/audit.md, "Cluster mode") to keep that protection.
"""

from __future__ import annotations

from typing import Any

import psycopg

from hippo_audit.domain.models import Checkpoint, WitnessLine
from hippo_core.postgres import Database

_COLUMNS = "id, size, hash, time_us, key_id, signature"


def insert(conn: psycopg.Connection[Any], checkpoint: Checkpoint) -> None:
    """Add a checkpoint inside the caller's transaction."""
    conn.execute(
        "INSERT INTO checkpoints (size, hash, time_us, key_id, signature) "
        "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (size) DO NOTHING",
        (
            checkpoint.size,
            checkpoint.hash,
            checkpoint.time_us,
            checkpoint.key_id,
            checkpoint.signature,
        ),
    )


def _line(row: tuple[Any, ...]) -> WitnessLine:
    number, size, digest, time_us, key_id, signature = row
    if len(digest) != 32 or size < 1:
        return WitnessLine(int(number), None, "bad size or hash")
    checkpoint = Checkpoint(int(size), bytes(digest), int(time_us), str(key_id), bytes(signature))
    return WitnessLine(int(number), checkpoint)


class PostgresWitness:
    """`Witness` over the `checkpoints` table. A record's number is its row id."""

    def __init__(self, database: Database) -> None:
        self._db = database

    def append(self, checkpoint: Checkpoint) -> None:
        with self._db.transaction("audit witness") as conn:
            insert(conn, checkpoint)

    def read(self) -> list[WitnessLine]:
        rows = self._db.read(
            lambda conn: conn.execute(f"SELECT {_COLUMNS} FROM checkpoints ORDER BY id").fetchall(),
            "audit witness",
        )
        return [_line(r) for r in rows]

    def latest(self) -> Checkpoint | None:
        row = self._db.read(
            lambda conn: conn.execute(
                f"SELECT {_COLUMNS} FROM checkpoints ORDER BY id DESC LIMIT 1"
            ).fetchone(),
            "audit witness",
        )
        return None if row is None else _line(row).checkpoint
