"""Shared by the audit tests: a real log on a real engine (SQLite files in a folder, or a
PostgreSQL database), the attacker's raw access to it, and entries."""

from __future__ import annotations

import base64
import os
import shutil
import sqlite3
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import psycopg

from hippo_audit.adapters.postgres_keys import PostgresKeyRing
from hippo_audit.adapters.postgres_log import PostgresLog
from hippo_audit.adapters.postgres_schema import MIGRATIONS, SCHEMA
from hippo_audit.adapters.postgres_witness import PostgresWitness
from hippo_audit.adapters.signing import Ed25519Signer
from hippo_audit.adapters.sqlite_keys import SqliteKeyRing
from hippo_audit.adapters.sqlite_log import SqliteLog
from hippo_audit.adapters.witness import FileWitness
from hippo_audit.domain.log import AuditLog, LogConfig
from hippo_audit.domain.models import NewEntry, Verdict
from hippo_audit.domain.ports import Witness
from hippo_core.pgserver import PostgresServer
from hippo_core.postgres import Database
from hippo_core.settings import DatabaseSettings

FILES = ("audit.sqlite3", "keys.sqlite3", "witness.log", "checkpoint.key")


def make_log(folder: Path, *, checkpoint_every: int = 1000, interval: float = 3600.0) -> AuditLog:
    """An AuditLog over `folder`, laid out as the service lays out its data dir (not opened)."""
    return AuditLog(
        SqliteLog(folder / "audit.sqlite3"),
        SqliteKeyRing(folder / "keys.sqlite3"),
        Ed25519Signer.load("", folder / "checkpoint.key"),
        FileWitness(folder / "witness.log"),
        LogConfig(checkpoint_every=checkpoint_every, checkpoint_interval_seconds=interval),
    )


def copy_log(source: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        if (source / name).exists():
            shutil.copy2(source / name, target / name)


def entry(
    tenant: str = "acme",
    user: str = "alice",
    *,
    session: str = "s1",
    event_type: str = "recall",
    private: dict[str, object] | None = None,
    key: str = "",
) -> NewEntry:
    """A plausible gateway entry; its body carries a unique nonce, so no two bodies match."""
    nonce = uuid.uuid4().hex
    return NewEntry(
        tenant=tenant,
        actor="gateway",
        event_type=event_type,
        user=user,
        session=session,
        memory_ids=(f"m-{nonce[:8]}", f"m-{nonce[8:16]}"),
        body={"nonce": nonce, "candidates": 7, "hits": [{"rank": 1, "fused_score": 0.41}]},
        private=private,
        idempotency_key=key,
    )


def verify_folder(folder: Path, *, chain_only: bool = False) -> Verdict:
    """Verify the log in `folder` as it is on disk, without opening it for writes (a log
    that fails its checkpoints must still be verifiable)."""
    store = SqliteLog(folder / "audit.sqlite3")
    keys = SqliteKeyRing(folder / "keys.sqlite3")
    try:
        log = AuditLog(
            store,
            keys,
            Ed25519Signer.load("", folder / "checkpoint.key"),
            FileWitness(folder / "witness.log"),
        )
        return log.verify_now(chain_only=chain_only)
    finally:
        store.close()
        keys.close()


class Backend(Protocol):
    """One engine under the contract tests: where logs are made, and what an attacker
    (or a test reading raw storage) can do to it. SQL uses `?` placeholders."""

    name: str

    def make_log(self, *, checkpoint_every: int = 1000, interval: float = 3600.0) -> AuditLog:
        """A new AuditLog (a replica, in cluster mode) over the backend's storage."""
        ...

    def witness(self) -> Witness:
        """The witness the backend's logs use."""
        ...

    def attack(self, sql: str, params: Sequence[object] = ()) -> int:
        """Run SQL on the log's tables with the append-only triggers off; rows changed."""
        ...

    def query(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        """Read the raw tables (the triggers stay on)."""
        ...

    def key_bytes_found(self, key: bytes) -> list[str]:
        """The store's files that still hold these bytes (after flushing to disk)."""
        ...

    def close(self) -> None: ...


class SqliteBackend:
    name = "sqlite"

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def make_log(self, *, checkpoint_every: int = 1000, interval: float = 3600.0) -> AuditLog:
        return make_log(self.folder, checkpoint_every=checkpoint_every, interval=interval)

    def witness(self) -> Witness:
        return FileWitness(self.folder / "witness.log")

    def attack(self, sql: str, params: Sequence[object] = ()) -> int:
        conn = sqlite3.connect(self.folder / "audit.sqlite3", isolation_level=None)
        try:
            conn.execute("DROP TRIGGER IF EXISTS entries_are_never_updated")
            conn.execute("DROP TRIGGER IF EXISTS entries_are_never_deleted")
            return conn.execute(sql, tuple(params)).rowcount
        finally:
            conn.close()

    def query(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        name = "keys.sqlite3" if "user_keys" in sql else "audit.sqlite3"
        conn = sqlite3.connect(self.folder / name)
        try:
            return conn.execute(sql, tuple(params)).fetchall()
        finally:
            conn.close()

    def key_bytes_found(self, key: bytes) -> list[str]:
        names = ("keys.sqlite3", "keys.sqlite3-wal")
        return [
            n for n in names if (self.folder / n).exists() and key in (self.folder / n).read_bytes()
        ]

    def close(self) -> None:
        pass


class PostgresBackend:
    """Every log made here is another replica on the same database, signing with the
    one shared key (as cluster mode requires)."""

    name = "postgres"

    def __init__(self, url: str, server: PostgresServer) -> None:
        self.url = url
        self.server = server
        self.signing_key = base64.b64encode(os.urandom(32)).decode()
        self._databases: list[Database] = []

    def database(self) -> Database:
        settings = DatabaseSettings(url=self.url, pool_min_size=1, pool_max_size=4)
        db = Database(settings, schema=SCHEMA, application="audit-test")
        db.open(MIGRATIONS)
        self._databases.append(db)
        return db

    def make_log(self, *, checkpoint_every: int = 1000, interval: float = 3600.0) -> AuditLog:
        db = self.database()
        return AuditLog(
            PostgresLog(db),
            PostgresKeyRing(db),
            Ed25519Signer.load(self.signing_key, Path("/nonexistent/unused.key")),
            PostgresWitness(db),
            LogConfig(checkpoint_every=checkpoint_every, checkpoint_interval_seconds=interval),
        )

    def witness(self) -> Witness:
        return PostgresWitness(self.database())

    def _connect(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(self.url, autocommit=True)
        conn.execute(f"SET search_path = {SCHEMA}")
        return conn

    def attack(self, sql: str, params: Sequence[object] = ()) -> int:
        with self._connect() as conn:
            # A superuser's way round every trigger, for this session.
            conn.execute("SET session_replication_role = replica")
            return conn.execute(sql.replace("?", "%s"), tuple(params)).rowcount

    def query(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        with self._connect() as conn:
            return conn.execute(sql.replace("?", "%s"), tuple(params)).fetchall()

    def key_bytes_found(self, key: bytes) -> list[str]:
        with self._connect() as conn:
            conn.execute("CHECKPOINT")  # shared buffers to the files
            row = conn.execute(
                "SELECT oid FROM pg_database WHERE datname = current_database()"
            ).fetchone()
            assert row is not None
        folder = self.server.data_dir / "base" / str(row[0])
        return [p.name for p in sorted(folder.iterdir()) if p.is_file() and key in p.read_bytes()]

    def close(self) -> None:
        for db in self._databases:
            db.close()
