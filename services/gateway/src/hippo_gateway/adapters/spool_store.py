"""Where the audit spool's items wait: the core outbox's table (`hippo_core.outbox`).

- Embedded (the default): a SQLite file under the gateway's data dir. An event is
  committed there (WAL, `synchronous=FULL`: fsynced) before the call that caused it is
  answered, and deleted only once the audit service has acknowledged it; a crash or a
  down audit service loses nothing, and a restart delivers what was left, in order.
- Cluster mode (`database.url` set): a table in the gateway's PostgreSQL schema, written
  by every replica; each replica delivers its own rows (its owner id), and the rows of a
  replica that stopped are adopted by another. Nothing waits on a pod's disk, so deleting
  a gateway pod loses nothing.

Items the audit service refuses for good stay in the table with `dead` set to the reason,
where an operator finds them (`hippo_outbox_dead{outbox="gateway_audit"}`).

Items hold ids, counts and scores in public bodies, and in private ones what the audit
service seals under the user's key (query fingerprints; with influence on, the words of
memtoks). Once a user's key erasure is delivered, `scrub` clears what the deleted rows
left behind: SQLite zeroes freed pages (`secure_delete`) and the WAL is cut to nothing;
PostgreSQL's table is vacuumed (see docs/audit.md for what remains in its WAL).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hippo_core import outbox
from hippo_core import sqlite as hippo_sqlite

if TYPE_CHECKING:  # cluster mode only: psycopg is not loaded for the embedded default
    from hippo_core.postgres import Database

log = logging.getLogger(__name__)

TABLE = "audit_spool"
FILE = "audit-spool.sqlite3"

SQLITE_MIGRATIONS: list[hippo_sqlite.Migration] = [
    # 1: the layout of the spool before the core outbox, as it was created then (files of
    # that version have user_version 0 and these tables already: IF NOT EXISTS).
    """
CREATE TABLE IF NOT EXISTS spool (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    item       TEXT NOT NULL,
    spooled_us INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS dead (
    id         INTEGER PRIMARY KEY,
    item       TEXT NOT NULL,
    spooled_us INTEGER NOT NULL,
    reason     TEXT NOT NULL,
    buried_us  INTEGER NOT NULL
);
""",
    # 2: the core outbox's table. Waiting items keep their ids (so their order), dead ones
    # their reason; the two id sets never overlap (a dead row kept its spool id, which
    # AUTOINCREMENT never hands out again), and new ids continue after the largest.
    outbox.sqlite_schema(TABLE)
    + f"""
INSERT INTO {TABLE} (id, item, created_us, dead)
    SELECT id, item, spooled_us, NULL FROM spool;
INSERT INTO {TABLE} (id, item, created_us, dead)
    SELECT id, item, spooled_us, reason FROM dead;
DROP TABLE spool;
DROP TABLE dead;
""",
]

# The gateway's PostgreSQL schema: the spool, and the fingerprint key every replica shares
# (adapters/fingerprint_key.py).
POSTGRES_MIGRATIONS: list[str] = [
    outbox.postgres_schema(TABLE)
    + """
CREATE TABLE fingerprint_key (
    id  smallint PRIMARY KEY CHECK (id = 1),
    key text NOT NULL
);
""",
]

Scrub = Callable[[], None]


def sqlite_store(data_dir: Path) -> outbox.SqliteOutbox:
    return outbox.SqliteOutbox(data_dir / FILE, TABLE, migrations=SQLITE_MIGRATIONS)


def postgres_store(database: Database, owner: str) -> outbox.PostgresOutbox:
    """This process's rows of the spool table (`database` opened with POSTGRES_MIGRATIONS)."""
    return outbox.PostgresOutbox(database, TABLE, owner)


def sqlite_scrub(data_dir: Path) -> Scrub:
    """Cut the spool file's WAL, which still holds the frames of delivered items."""

    def scrub() -> None:
        with contextlib.closing(hippo_sqlite.connect(data_dir / FILE)) as conn:
            hippo_sqlite.purge_wal(conn, "audit spool")

    return scrub


def postgres_scrub(database: Database) -> Scrub:
    """VACUUM the spool table: the rows of delivered items stop lingering as dead tuples
    until autovacuum gets to them."""

    def scrub() -> None:
        database.vacuum(TABLE)

    return scrub
