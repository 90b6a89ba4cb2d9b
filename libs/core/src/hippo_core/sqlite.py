"""The one way a Hippo service opens a SQLite store (the embedded engine).

Every store gets the same guarantees, so none can drift from the others:
- WAL journal, checked: some filesystems (network mounts) cannot hold a WAL, and another
  mode would silently change the durability and concurrency promised;
- `synchronous=FULL`: in WAL mode NORMAL may lose the last commits on power loss, and an
  acknowledged write must survive;
- `secure_delete=ON`: freed content is zeroed, so erased text does not linger in free
  pages (with `purge_wal` after an erasure, it is gone from the files);
- `busy_timeout`: a second process sharing the file waits for the write lock instead of
  failing at once;
- numbered migrations tracked in `user_version`, applied in one transaction; a file
  written by a newer build (a higher version) is refused rather than guessed at.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from hippo_core.errors import FailedPrecondition

log = logging.getLogger(__name__)
T = TypeVar("T")

# A migration is a script (statements separated by `;`, trigger bodies allowed) or a
# function of the open transaction's connection.
Migration = str | Callable[[sqlite3.Connection], None]


def statements(script: str) -> list[str]:
    """Split a script into statements; trigger bodies hold `;` inside BEGIN ... END."""
    out, current = [], ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            out.append(current.strip())
            current = ""
    if current.strip():
        out.append(current.strip())
    return out


def connect(path: Path, *, busy_timeout_ms: int = 5000) -> sqlite3.Connection:
    """A connection with Hippo's per-connection settings (for extra readers of a store
    that `open_store` already set up). isolation_level=None: no implicit transactions;
    writers open `BEGIN IMMEDIATE` (see `transaction`) so the write lock is taken up front
    instead of failing on upgrade mid-transaction."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    conn.execute("PRAGMA secure_delete = ON")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def open_store(
    path: Path,
    name: str,
    migrations: Sequence[Migration],
    *,
    busy_timeout_ms: int = 5000,
    autocheckpoint: bool = True,
) -> sqlite3.Connection:
    """Open (creating) the store at `path`, configured as the module docstring says, with
    `migrations[i]` applied to bring it to version i + 1. `name` labels errors and logs.

    `autocheckpoint=False` keeps WAL checkpoints off the commit path (the caller runs
    them beside its writer, as the audit log does): a checkpoint would otherwise land,
    with its fsync, on whichever commit crossed the threshold.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = connect(path, busy_timeout_ms=busy_timeout_ms)
    try:
        mode = _journal_wal(conn)
        if str(mode).lower() != "wal":
            raise FailedPrecondition(f"{name}: journal_mode WAL not available (got {mode})")
        conn.execute("PRAGMA synchronous = FULL")
        if not autocheckpoint:
            conn.execute("PRAGMA wal_autocheckpoint = 0")
        migrate(conn, name, migrations)
    except BaseException:
        conn.close()
        raise
    return conn


def _journal_wal(conn: sqlite3.Connection, attempts: int = 5) -> str:
    """Switch to WAL. Two processes opening a new file at once can see "database is
    locked" here: SQLite answers this pragma at once, not through the busy handler. A
    failed attempt changes nothing, so it is retried."""
    for attempt in range(attempts):
        try:
            return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def migrate(conn: sqlite3.Connection, name: str, migrations: Sequence[Migration]) -> int:
    """Apply the migrations the file lacks, all in one transaction; returns the version."""
    known = len(migrations)
    with transaction(conn):
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > known:
            # A newer build wrote this file; guessing its layout could corrupt it.
            raise FailedPrecondition(
                f"{name}: schema version {version} is not supported (this build knows {known})"
            )
        for number in range(version, known):
            step = migrations[number]
            if callable(step):
                step(conn)
            else:
                for statement in statements(step):
                    conn.execute(statement)
        if version != known:
            conn.execute(f"PRAGMA user_version = {known}")
            log.info("%s: schema migrated from version %d to %d", name, version, known)
    return known


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any error. A failed COMMIT can leave the
    transaction open: never leave a shared connection mid-transaction for the next user."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def purge_wal(conn: sqlite3.Connection, name: str) -> bool:
    """After an erasure: the WAL still holds the frames written while the erased text was
    live, and a normal checkpoint only rewinds it without shrinking. TRUNCATE copies the
    zeroed pages into the main file and cuts the WAL to zero bytes. Returns False when a
    reader in another process blocked it (the erasure is committed; the next purge or the
    last close completes the scrub)."""
    busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    if busy:
        log.warning("%s: WAL checkpoint after an erasure was blocked by a reader", name)
        return False
    return True


def chunks(items: Sequence[T], size: int = 500) -> Iterator[Sequence[T]]:
    """Slices of at most `size`: bound parameters per `IN (...)` stay portable to old
    SQLite builds (999) and far below PostgreSQL's 65535."""
    for start in range(0, len(items), size):
        yield items[start : start + size]
