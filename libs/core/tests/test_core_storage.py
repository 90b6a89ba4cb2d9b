"""The shared storage plumbing: the SQLite opener, the PostgreSQL pool with migrations,
leases and notifications, and the reserved loopback ports."""

from __future__ import annotations

import multiprocessing
import socket
import sqlite3
import threading
import time
from pathlib import Path

import psycopg
import pytest
from pydantic import SecretStr

from hippo_core import sqlite as hippo_sqlite
from hippo_core.errors import DeadlineExceeded, FailedPrecondition, Unavailable
from hippo_core.listen import reserve_port, reserve_ports
from hippo_core.pgserver import PostgresServer
from hippo_core.postgres import Breaking, Database, describe, engine
from hippo_core.settings import DatabaseSettings

MIGRATIONS = [
    "CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT NOT NULL);",
    "ALTER TABLE notes ADD COLUMN tag TEXT NOT NULL DEFAULT '';",
]

# -- SQLite ------------------------------------------------------------------------------


def test_sqlite_store_gets_every_guarantee(tmp_path: Path) -> None:
    conn = hippo_sqlite.open_store(tmp_path / "s.sqlite3", "notes", MIGRATIONS)
    pragma = lambda name: conn.execute(f"PRAGMA {name}").fetchone()[0]  # noqa: E731
    assert pragma("journal_mode") == "wal"
    assert pragma("synchronous") == 2  # FULL
    assert pragma("secure_delete") == 1
    assert pragma("busy_timeout") == 5000
    assert pragma("user_version") == 2
    conn.execute("INSERT INTO notes (text, tag) VALUES ('a', 'b')")
    conn.close()


def test_sqlite_migrates_an_older_file_and_refuses_a_newer_one(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    hippo_sqlite.open_store(path, "notes", MIGRATIONS[:1]).close()
    conn = hippo_sqlite.open_store(path, "notes", MIGRATIONS)
    assert [r[1] for r in conn.execute("PRAGMA table_info(notes)")] == ["id", "text", "tag"]
    conn.close()
    with pytest.raises(FailedPrecondition, match="schema version 2 is not supported"):
        hippo_sqlite.open_store(path, "notes", MIGRATIONS[:1])


def test_sqlite_failed_migration_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    with pytest.raises(sqlite3.OperationalError):
        hippo_sqlite.open_store(path, "notes", [*MIGRATIONS, "CREATE TABLE notes (x);"])
    conn = hippo_sqlite.open_store(path, "notes", MIGRATIONS)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 2
    conn.close()


def _open_and_close(path: str, results: multiprocessing.SimpleQueue[str]) -> None:
    try:
        hippo_sqlite.open_store(Path(path), "notes", MIGRATIONS).close()
    except Exception as exc:
        results.put(repr(exc))
        return
    results.put("ok")


def test_processes_opening_a_new_file_at_once_all_open_it(tmp_path: Path) -> None:
    """Replicas (or a restart racing a second process) may create a file together: SQLite
    answers a concurrent switch to WAL with "database is locked" at once, not through the
    busy handler, so the open retries. (Without the retry about one open in eighty
    failed here.)"""
    context = multiprocessing.get_context("fork")
    results: multiprocessing.SimpleQueue[str] = context.SimpleQueue()
    for round_ in range(100):
        path = str(tmp_path / f"s{round_}.sqlite3")
        procs = [context.Process(target=_open_and_close, args=(path, results)) for _ in range(3)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        outcomes = [results.get() for _ in procs]
        assert outcomes == ["ok"] * 3, outcomes


def test_statements_keep_trigger_bodies_whole() -> None:
    script = (
        "CREATE TABLE t (x);\n"
        "CREATE TRIGGER no BEFORE DELETE ON t\n"
        "    BEGIN SELECT RAISE(ABORT, 'no'); END;\n"
    )
    assert len(hippo_sqlite.statements(script)) == 2


def test_purge_wal_leaves_an_empty_wal_after_an_erasure(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    conn = hippo_sqlite.open_store(path, "notes", MIGRATIONS)
    with hippo_sqlite.transaction(conn):
        conn.execute("INSERT INTO notes (text) VALUES ('canary-7q3x')")
    with hippo_sqlite.transaction(conn):
        conn.execute("DELETE FROM notes")
    assert hippo_sqlite.purge_wal(conn, "notes")
    assert Path(f"{path}-wal").stat().st_size == 0
    assert b"canary-7q3x" not in path.read_bytes()
    conn.close()


# -- PostgreSQL ----------------------------------------------------------------------------


def _db(url: str, **kw: object) -> Database:
    return Database(
        DatabaseSettings(url=SecretStr(url), **kw), schema="hippo_test", application="t"
    )  # type: ignore[arg-type]


def test_engine_is_sqlite_without_a_url() -> None:
    assert not engine(DatabaseSettings(), schema="x", application="t").cluster


def test_describe_never_shows_the_password() -> None:
    where = describe("postgresql://u:s3cret@db.example:6543/hippo")
    assert where == "db.example:6543/hippo" and "s3cret" not in where


def test_postgres_migrations_apply_in_the_service_schema(postgres_url: str) -> None:
    db = _db(postgres_url)
    assert db.open(MIGRATIONS) == 2
    with db.transaction() as conn:
        conn.execute("INSERT INTO notes (id, text, tag) VALUES (1, 'a', 'b')")
    # search_path: the bare name is the service schema's table.
    with psycopg.connect(postgres_url) as raw:
        assert raw.execute("SELECT text FROM hippo_test.notes").fetchone() == ("a",)
        assert raw.execute("SELECT count(*) FROM hippo_test.schema_migrations").fetchone() == (2,)
    db.close()
    # A rolling upgrade runs the previous build beside the new one: migrations only add,
    # so the older build still starts on the newer schema...
    older = _db(postgres_url)
    assert older.open(MIGRATIONS[:1]) == 1
    older.close()
    # ...until a migration marked Breaking changes what it relies on.
    newest = _db(postgres_url)
    assert newest.open([*MIGRATIONS, Breaking("ALTER TABLE notes DROP COLUMN tag;")]) == 3
    newest.close()
    stale = _db(postgres_url)
    with pytest.raises(FailedPrecondition, match="version 3 changed what builds before it"):
        stale.open(MIGRATIONS)
    stale.close()


def _migrate_in_a_process(url: str, results: multiprocessing.Queue[object]) -> None:
    db = _db(url)
    try:
        results.put(db.open(MIGRATIONS))
    except Exception as exc:  # reported to the test, which fails on it
        results.put(repr(exc))
    finally:
        db.close()


def test_replicas_starting_at_once_against_an_empty_database_both_come_up(
    postgres_url: str,
) -> None:
    """Four processes migrate one empty database at the same moment: the advisory lock
    serialises them, one applies, the others find the work done; nobody fails."""
    ctx = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[object] = ctx.Queue()
    procs = [
        ctx.Process(target=_migrate_in_a_process, args=(postgres_url, results)) for _ in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert sorted(str(results.get(timeout=5)) for _ in procs) == ["2"] * 4
    with psycopg.connect(postgres_url) as raw:
        assert raw.execute("SELECT count(*) FROM hippo_test.schema_migrations").fetchone() == (2,)


def test_statement_timeout_is_deadline_exceeded(postgres_url: str) -> None:
    db = _db(postgres_url, statement_timeout_seconds=0.2)
    db.open()
    with pytest.raises(DeadlineExceeded), db.transaction() as conn:
        conn.execute("SELECT pg_sleep(2)")
    db.close()


def test_a_database_that_is_down_is_unavailable(tmp_path: Path) -> None:
    server = PostgresServer(tmp_path / "data", reserve_port(), durable=False).start()
    db = _db(server.url(), pool_timeout_seconds=1, connect_timeout_seconds=1)
    db.open()
    server.stop()
    with pytest.raises(Unavailable), db.transaction() as conn:
        conn.execute("SELECT 1")
    server.start()
    # Back by itself, without a restart of ours: the pool reconnects (with its own
    # backoff), and a caller that retries UNAVAILABLE gets through within seconds.
    end = time.monotonic() + 20
    while True:
        try:
            with db.transaction() as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
            break
        except Unavailable:
            assert time.monotonic() < end, "the pool never reconnected"
            time.sleep(0.2)
    db.close()
    server.stop()


def test_unreachable_database_fails_open_with_unavailable() -> None:
    db = _db(f"postgresql://hippo@127.0.0.1:{reserve_port()}/x", connect_timeout_seconds=1)
    with pytest.raises(Unavailable, match="not reachable"):
        db.open(timeout=1)
    db.close()


def test_a_lease_is_held_by_one_and_freed_when_its_holder_goes(postgres_url: str) -> None:
    a, b = _db(postgres_url), _db(postgres_url)
    a.open()
    b.open()
    first, second = a.lease("projector"), b.lease("projector")
    assert first.acquire() and first.held()
    assert not second.acquire()
    first.release()  # as if its process died: the connection ends
    assert second.acquire()
    assert not first.acquire()
    second.release()
    a.close()
    b.close()


def test_a_listener_hears_commits_and_not_rollbacks(postgres_url: str) -> None:
    db = _db(postgres_url)
    db.open(["CREATE TABLE t (x int);"])
    listener = db.listener("changes")
    assert not listener.wait(0.05)  # connects and listens
    heard: list[bool] = []
    thread = threading.Thread(target=lambda: heard.append(listener.wait(5)))
    thread.start()
    try:
        with db.transaction() as conn:
            conn.execute("INSERT INTO t VALUES (1)")
            db.notify(conn, "changes")
            raise RuntimeError("rolled back")
    except RuntimeError:
        pass
    with db.transaction() as conn:
        db.notify(conn, "changes")
    thread.join(10)
    assert heard == [True]
    listener.close()
    db.close()


# -- ports -------------------------------------------------------------------------------


def _reserve_in_a_process(directory: str, out: multiprocessing.Queue[list[int]]) -> None:
    out.put(reserve_ports(20, directory=Path(directory)))
    threading.Event().wait(3)  # stay alive: the reservation holds while we do


def test_reserved_ports_are_below_the_ephemeral_range_and_never_shared(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue[list[int]] = ctx.Queue()
    procs = [ctx.Process(target=_reserve_in_a_process, args=(str(tmp_path), out)) for _ in range(3)]
    for p in procs:
        p.start()
    ports = [port for _ in procs for port in out.get(timeout=30)]
    mine = reserve_ports(20, directory=tmp_path)
    for p in procs:
        p.join(10)
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert len(set(ports + mine)) == 80
    assert all(20000 <= p < low for p in ports + mine)
    for port in mine:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_ports_of_exited_processes_are_reclaimed(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue[list[int]] = ctx.Queue()
    proc = ctx.Process(target=_reserve_in_a_process, args=(str(tmp_path), out))
    proc.start()
    out.get(timeout=30)
    proc.join(10)
    registry = tmp_path / "hippo-reserved-ports.json"
    reserve_port(directory=tmp_path)  # the registry is pruned on the next reservation
    assert str(proc.pid) not in registry.read_text()


def test_vacuum_after_an_erasure_leaves_no_bytes_of_the_row(postgres_url: str) -> None:
    """A deleted row's text stays in the table's file as a dead tuple; once vacuumed
    (FULL rewrites the table) no file of the table holds it."""
    db = _db(postgres_url)
    db.open(["CREATE TABLE notes (id int PRIMARY KEY, text text NOT NULL);"])
    with db.transaction() as conn:
        conn.execute("INSERT INTO notes VALUES (1, 'canary-k2v9'), (2, 'kept')")
    with db.transaction() as conn:
        conn.execute("DELETE FROM notes WHERE id = 1")

    def files() -> list[Path]:
        with db.transaction() as conn:
            conn.execute("CHECKPOINT")  # dirty pages reach the files; unlinks happen
            row = conn.execute(
                "SELECT current_setting('data_directory'), pg_relation_filepath('notes')"
            ).fetchone()
        assert row is not None
        return [Path(row[0]) / row[1]]

    before = files()
    assert b"canary-k2v9" in before[0].read_bytes()  # the erased text lingers
    assert db.vacuum("notes", full=True)
    after = files()
    assert after != before and not before[0].exists()
    assert b"canary-k2v9" not in after[0].read_bytes()
    with db.transaction() as conn:
        assert conn.execute("SELECT text FROM notes").fetchall() == [("kept",)]
    db.close()
