"""The one way a Hippo service uses PostgreSQL (cluster mode): pool, schema, migrations,
errors, leases and change notifications.

- **One schema per service** in one database (`hippo_retrieval`, `hippo_audit`, ...): every
  pooled connection has it as its `search_path`, so a store's SQL names bare tables, and
  services never read each other's tables.
- **Numbered migrations** in `<schema>.schema_migrations`, applied at start in one
  transaction under a transaction-scoped advisory lock: replicas starting at once
  serialise there, the first applies, the others find the work done. Migrations only add
  by default, so an older build still runs on a newer schema (a rolling upgrade runs
  both); one marked `Breaking` makes older builds refuse to start.
- **Deadlines**: `connect_timeout`, a pool checkout timeout and a `statement_timeout` on
  every connection: no call waits on the database forever.
- **Errors** are mapped once (`errors`): a lost connection or a database that cannot be
  reached is UNAVAILABLE (the caller's retry applies), a statement cut by its timeout is
  DEADLINE_EXCEEDED; serialization failures and deadlocks are retried by `run` and only
  surface as ABORTED if they keep happening.
- **Leases** (`Lease`): a session-level advisory lock on a connection of its own, for work
  one replica at a time must do (a shared projection's writer, the outbox of a dead
  replica). PostgreSQL releases it when that connection ends, so a replica that dies
  hands its work on without anyone cleaning up.
- **Notifications** (`Listener`): LISTEN on a connection of its own, so replicas learn of
  each other's commits at once instead of polling.

Secrets: the URL is a SecretStr in settings and never logged; logs name host and
database only.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
import psycopg_pool
from psycopg import errors as pg_errors
from psycopg import sql

from hippo_core.errors import Aborted, DeadlineExceeded, FailedPrecondition, Unavailable
from hippo_core.settings import DatabaseSettings

log = logging.getLogger(__name__)
T = TypeVar("T")

# A migration is a script (run as one multi-statement string) or a function of the open
# transaction's connection.
Migration = str | Callable[[psycopg.Connection[Any]], None]


@dataclass(frozen=True)
class Breaking:
    """A migration older builds cannot run on (see `Database.migrate`)."""

    step: Migration


_RETRIED = (pg_errors.SerializationFailure, pg_errors.DeadlockDetected)


def describe(url: str) -> str:
    """host:port/database of a URL, for logs and errors (never the password)."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "(unparseable database url)"
    return f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"


@contextlib.contextmanager
def errors(what: str) -> Iterator[None]:
    """Map psycopg's errors to Hippo's (see the module docstring). `what` names the store."""
    try:
        yield
    except pg_errors.QueryCanceled as exc:
        raise DeadlineExceeded(f"{what}: the database statement timed out") from exc
    except _RETRIED:
        raise
    except psycopg_pool.PoolTimeout as exc:
        raise Unavailable(f"{what}: no database connection available") from exc
    except psycopg.OperationalError as exc:
        raise Unavailable(f"{what}: the database is unavailable") from exc


def lock_key(name: str) -> sql.Composed:
    """An advisory-lock key derived from a name by the server (64-bit hash)."""
    return sql.SQL("hashtextextended({}, 0)").format(sql.Literal(name))


class Database:
    """A pool of connections inside one service's schema. Thread-safe: stores call it from
    worker threads."""

    def __init__(self, settings: DatabaseSettings, *, schema: str, application: str) -> None:
        url = settings.url.get_secret_value()
        if not url:
            raise FailedPrecondition("database.url is empty: no PostgreSQL configured")
        self.schema = settings.schema_name or schema
        self.where = describe(url)
        self._settings = settings
        self._url = url
        timeout_ms = int(settings.statement_timeout_seconds * 1000)
        self._kwargs: dict[str, Any] = {
            "connect_timeout": max(1, round(settings.connect_timeout_seconds)),
            "application_name": application,
            # search_path and the statement deadline travel in the startup packet: set on
            # every connection before the pool hands it out.
            "options": f"-c search_path={self.schema} -c statement_timeout={timeout_ms}",
        }
        self.pool = psycopg_pool.ConnectionPool(
            url,
            min_size=settings.pool_min_size,
            max_size=settings.pool_max_size,
            timeout=settings.pool_timeout_seconds,
            kwargs=self._kwargs,
            # A connection broken while it sat in the pool (a database restart) is
            # replaced on checkout instead of failing the caller's first statement.
            check=psycopg_pool.ConnectionPool.check_connection,
            name=f"{application}-{self.schema}",
            open=False,
        )

    def open(
        self, migrations: Sequence[Migration | Breaking] = (), *, timeout: float | None = None
    ) -> int:
        """Open the pool (waiting for the first connection) and migrate; the version."""
        wait = timeout if timeout is not None else self._settings.connect_timeout_seconds * 3
        with errors(f"database {self.where}"):
            try:
                self.pool.open(wait=True, timeout=wait)
            except psycopg_pool.PoolTimeout as exc:
                raise Unavailable(
                    f"database {self.where}: not reachable within {wait:.0f} s"
                ) from exc
            return self.migrate(migrations)

    def migrate(self, migrations: Sequence[Migration | Breaking]) -> int:
        """Apply what the schema lacks; returns the version this build knows.

        Rolling upgrades run old and new replicas side by side, so a migration is
        expand-only by default: it adds, and an older build keeps working on the newer
        schema (it starts, with a warning). A migration wrapped in `Breaking` changes
        something older builds rely on: from then on they refuse to start (roll back by
        restoring the database, not by redeploying the old version)."""
        known = len(migrations)
        schema = sql.Identifier(self.schema)
        with self.pool.connection() as conn, conn.transaction():
            conn.execute(
                sql.SQL("SELECT pg_advisory_xact_lock({})").format(
                    lock_key(f"hippo:migrate:{self.schema}")
                )
            )
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(schema))
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {}.schema_migrations ("
                    "version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now(), "
                    "breaking boolean NOT NULL DEFAULT false)"
                ).format(schema)
            )
            row = conn.execute(
                sql.SQL(
                    "SELECT coalesce(max(version), 0), "
                    "coalesce(max(version) FILTER (WHERE breaking), 0) FROM {}.schema_migrations"
                ).format(schema)
            ).fetchone()
            version, floor = (int(row[0]), int(row[1])) if row else (0, 0)
            if floor > known:
                raise FailedPrecondition(
                    f"database schema {self.schema} is at version {version}, and version "
                    f"{floor} changed what builds before it rely on; this build knows {known}: "
                    "deploy the newer release"
                )
            if version > known:
                log.warning(
                    "schema %s is at version %d, newer than this build's %d; its later "
                    "migrations only add, so this build runs on it",
                    self.schema,
                    version,
                    known,
                )
            for number in range(version, known):
                step = migrations[number]
                breaking = isinstance(step, Breaking)
                action = step.step if isinstance(step, Breaking) else step
                if callable(action):
                    action(conn)
                else:  # bytes: psycopg runs a multi-statement script
                    conn.execute(action.encode())
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {}.schema_migrations (version, breaking) VALUES (%s, %s)"
                    ).format(schema),
                    (number + 1, breaking),
                )
            if version < known:
                log.info("schema %s migrated from version %d to %d", self.schema, version, known)
        return known

    @contextlib.contextmanager
    def transaction(self, what: str = "") -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection inside one transaction: committed when the block ends,
        rolled back if it raises. Errors are mapped (see `errors`)."""
        with errors(what or self.schema), self.pool.connection() as conn, conn.transaction():
            yield conn

    def run(
        self, work: Callable[[psycopg.Connection[Any]], T], what: str = "", attempts: int = 5
    ) -> T:
        """`work(conn)` in one transaction, retried when PostgreSQL aborts it for a
        serialization failure or a deadlock (nothing of the failed attempt was kept)."""
        for attempt in range(attempts):
            try:
                with self.transaction(what) as conn:
                    return work(conn)
            except _RETRIED:
                time.sleep(0.01 * 2**attempt)
        raise Aborted(f"{what or self.schema}: concurrent writers kept conflicting; retry")

    def read(self, work: Callable[[psycopg.Connection[Any]], T], what: str = "") -> T:
        """`work(conn)` in a read-only transaction (one snapshot for all its statements)."""
        with errors(what or self.schema), self.pool.connection() as conn, conn.transaction():
            conn.execute("SET TRANSACTION READ ONLY")
            return work(conn)

    def connect(self, *, autocommit: bool = True) -> psycopg.Connection[Any]:
        """A connection of its own, outside the pool (leases, listeners)."""
        with errors(f"database {self.where}"):
            return psycopg.connect(self._url, autocommit=autocommit, **self._kwargs)

    def vacuum(self, *tables: str, full: bool = False, lock_timeout_s: float = 2.0) -> bool:
        """After an erasure: VACUUM the tables (outside any transaction, as it must run),
        so deleted rows do not linger as dead tuples until autovacuum. `full` rewrites
        the table: a plain VACUUM frees the space but can leave the bytes in it. Waits at
        most `lock_timeout_s` for a lock (FULL needs an exclusive one); False when it
        could not run: the erasure stands, the next vacuum completes the scrub."""
        statement = "VACUUM (FULL) {}" if full else "VACUUM {}"
        try:
            with contextlib.closing(self.connect()) as conn:
                conn.execute(f"SET lock_timeout = '{int(lock_timeout_s * 1000)}ms'")
                for table in tables:
                    conn.execute(sql.SQL(statement).format(sql.Identifier(table)))
        except (psycopg.Error, Unavailable) as exc:
            log.warning("vacuum of %s after an erasure did not run: %s", ", ".join(tables), exc)
            return False
        return True

    def lease(self, name: str) -> Lease:
        return Lease(self, name)

    def listener(self, channel: str) -> Listener:
        return Listener(self, channel)

    def notify(self, conn: psycopg.Connection[Any], channel: str, payload: str = "") -> None:
        """Queue a notification in `conn`'s transaction: delivered to listeners at commit
        (never for a rolled-back write)."""
        conn.execute("SELECT pg_notify(%s, %s)", (self._channel(channel), payload))

    def _channel(self, channel: str) -> str:
        return f"{self.schema}.{channel}"

    def close(self) -> None:
        self.pool.close()


class Lease:
    """One replica at a time: a session-level advisory lock held on a connection of its
    own. `acquire()` tries without waiting; `held()` checks the connection (and so the
    lock) is still there; `release()` lets go. If this process dies or its connection
    breaks, PostgreSQL releases the lock and another replica's `acquire()` succeeds."""

    def __init__(self, database: Database, name: str) -> None:
        self._database = database
        self.name = name
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()

    def acquire(self) -> bool:
        with self._lock:
            if self._conn is not None and self._alive():
                return True
            self._drop()
            try:
                conn = self._database.connect()
            except Unavailable:
                return False
            try:
                row = conn.execute(
                    sql.SQL("SELECT pg_try_advisory_lock({})").format(
                        lock_key(f"{self._database.schema}:{self.name}")
                    )
                ).fetchone()
            except psycopg.Error:
                conn.close()
                return False
            if not (row and row[0]):
                conn.close()
                return False
            self._conn = conn
            log.info("lease %s acquired", self.name)
            return True

    def held(self) -> bool:
        with self._lock:
            if self._conn is None:
                return False
            if self._alive():
                return True
            self._drop()
            log.warning("lease %s lost (its connection ended)", self.name)
            return False

    def _alive(self) -> bool:
        assert self._conn is not None
        try:
            self._conn.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                # Unlock before closing: the server frees a dead session's locks only once
                # its backend has exited, and another replica would wait for that.
                self._conn.execute("SELECT pg_advisory_unlock_all()")
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None

    def release(self) -> None:
        with self._lock:
            self._drop()


class Listener:
    """LISTEN on a connection of its own. `wait(timeout)` returns True when a notification
    arrived (or the connection broke, so the caller should re-read to be safe), False on
    timeout. Reconnects by itself."""

    def __init__(self, database: Database, channel: str) -> None:
        self._database = database
        self._channel = database._channel(channel)
        self._conn: psycopg.Connection[Any] | None = None

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            conn = self._database.connect()
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
            self._conn = conn
        return self._conn

    def wait(self, timeout: float) -> bool:
        try:
            conn = self._connection()
            # Notifications queued meanwhile wake the next call at once: a caller re-reads
            # the state anyway, so one extra wake-up per burst is harmless.
            heard = list(conn.notifies(timeout=timeout, stop_after=1))
            return bool(heard)
        except (psycopg.Error, Unavailable):
            self.close()
            time.sleep(min(timeout, 1.0))
            return True

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None


@dataclass(frozen=True)
class Engine:
    """Which engine a stateful service's stores use: the embedded default (SQLite files
    under the data dir) or PostgreSQL (cluster mode), chosen by `database.url`."""

    database: Database | None

    @property
    def cluster(self) -> bool:
        return self.database is not None


def engine(settings: DatabaseSettings, *, schema: str, application: str) -> Engine:
    """The engine `settings` ask for: PostgreSQL when a URL is set, else SQLite."""
    if not settings.url.get_secret_value():
        return Engine(None)
    return Engine(Database(settings, schema=schema, application=application))
