"""The turn store contract, run against both engines: SQLite (the embedded default) and
PostgreSQL (cluster mode). Durable, idempotent, all-or-nothing, tenant-scoped, truly
erasing, and a change feed whose seq order is commit order even with several writers."""

from __future__ import annotations

import itertools
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from fakes import memory_id
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from hippo_core.errors import FailedPrecondition, InvalidArgument
from hippo_core.pgserver import PostgresServer
from hippo_core.postgres import Database
from hippo_core.settings import DatabaseSettings
from hippo_retrieval.adapters import postgres_store, sqlite_store
from hippo_retrieval.adapters.postgres_store import MIGRATIONS, SCHEMA, PostgresTurnStore
from hippo_retrieval.adapters.sqlite_store import SqliteTurnStore
from hippo_retrieval.domain.models import Cursor, Deletion, NewTurn, Role, Scope, StoredTurn

Store = SqliteTurnStore | PostgresTurnStore


def _turn(
    n: int,
    *,
    tenant: str = "t1",
    user: str = "u1",
    session: str = "s1",
    text: str | None = None,
    client_id: str | None = None,
    **extra: Any,
) -> NewTurn:
    cid = client_id if client_id is not None else f"c{n}"
    return NewTurn(
        memory_id=memory_id(tenant, user, session, client_id=cid),
        tenant=tenant,
        user=user,
        session=session,
        role=Role.USER if n % 2 == 0 else Role.ASSISTANT,
        text=text if text is not None else f"turn {n}",
        time_us=1_700_000_000_000_000 + n,
        client_id=cid,
        **extra,
    )


_schemas = itertools.count(1)


def postgres_database(url: str, schema: str = "") -> Database:
    db = Database(
        DatabaseSettings(url=SecretStr(url), schema_name=schema), schema=SCHEMA, application="test"
    )
    db.open(MIGRATIONS)
    return db


@dataclass
class Engine:
    """One engine's stores. `open()` opens the same store again (for PostgreSQL: another
    replica, with a pool of its own); `fresh()` opens an empty one beside it."""

    name: str
    location: str  # the SQLite file, or the PostgreSQL URL
    integrity_error: type[Exception]
    raw: Callable[[str], list[tuple[Any, ...]]]
    _open: Callable[[str], Store]
    _closing: list[Callable[[], None]] = field(default_factory=list)

    def open(self) -> Store:
        return self._open("")

    def fresh(self) -> Store:
        return self._open(f"fresh{next(_schemas)}")

    def close_all(self) -> None:
        for close in reversed(self._closing):
            close()


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "sqlite":
        path = tmp_path / "nested" / "dir" / "turns.db"

        def open_sqlite(fresh: str) -> Store:
            store = SqliteTurnStore(path.with_name(f"{fresh}.db") if fresh else path)
            made._closing.append(store.close)
            return store

        def raw_sqlite(sql: str) -> list[tuple[Any, ...]]:
            conn = sqlite3.connect(path)
            try:
                return conn.execute(sql).fetchall()
            finally:
                conn.close()

        made = Engine("sqlite", str(path), sqlite3.IntegrityError, raw_sqlite, open_sqlite)
    else:
        url: str = request.getfixturevalue("postgres_url")

        def open_postgres(schema: str) -> Store:
            db = postgres_database(url, schema)
            store = PostgresTurnStore(db)
            made._closing += [db.close, store.close]
            return store

        def raw_postgres(sql: str) -> list[tuple[Any, ...]]:
            with psycopg.connect(url, options=f"-c search_path={SCHEMA}") as conn:
                return conn.execute(sql).fetchall()

        made = Engine("postgres", url, psycopg.IntegrityError, raw_postgres, open_postgres)
    yield made
    made.close_all()


@pytest.fixture
def store(engine: Engine) -> Store:
    return engine.open()


# -- setup -------------------------------------------------------------------------------


def test_sqlite_opens_with_the_promised_settings(tmp_path: Path) -> None:
    db = tmp_path / "nested" / "dir" / "turns.db"
    store = SqliteTurnStore(db)
    try:
        assert db.exists()  # parent directories were created
        conn = sqlite3.connect(db)
        assert conn.execute("PRAGMA journal_mode").fetchall() == [("wal",)]
        assert conn.execute("PRAGMA user_version").fetchall() == [(len(sqlite_store.MIGRATIONS),)]
        conn.close()
        conn = store._conn  # the pragmas below are per connection
        assert conn.execute("PRAGMA synchronous").fetchone() == (2,)  # FULL
        assert conn.execute("PRAGMA secure_delete").fetchone() == (1,)
        assert conn.execute("PRAGMA foreign_keys").fetchone() == (1,)
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] > 0
    finally:
        store.close()


# The layout the previous builds wrote, verbatim (their own opener, user_version 1).
_V1_FILE = """
CREATE TABLE changes (seq INTEGER PRIMARY KEY AUTOINCREMENT,
    op TEXT NOT NULL CHECK (op IN ('put', 'delete', 'touch')), tenant TEXT NOT NULL,
    memory_id TEXT NOT NULL);
CREATE TABLE turns (seq INTEGER PRIMARY KEY AUTOINCREMENT, memory_id TEXT NOT NULL,
    tenant TEXT NOT NULL, user_id TEXT NOT NULL, session_id TEXT NOT NULL, role TEXT NOT NULL,
    text TEXT NOT NULL, time_us INTEGER NOT NULL, client_id TEXT NOT NULL,
    metadata TEXT NOT NULL, vector BLOB, position INTEGER NOT NULL, UNIQUE (tenant, memory_id));
CREATE TABLE sessions (tenant TEXT NOT NULL, user_id TEXT NOT NULL, session_id TEXT NOT NULL,
    last_position INTEGER NOT NULL, PRIMARY KEY (tenant, user_id, session_id)) WITHOUT ROWID;
CREATE INDEX turns_by_session ON turns (tenant, user_id, session_id, position);
CREATE INDEX turns_by_time ON turns (tenant, user_id, time_us);
INSERT INTO changes (op, tenant, memory_id) VALUES ('put', 't1', 'm1');
INSERT INTO turns VALUES (1, 'm1', 't1', 'u1', 's1', 'user', 'written by the old build',
    5, 'c1', '{}', NULL, 1);
INSERT INTO sessions VALUES ('t1', 'u1', 's1', 1);
PRAGMA user_version = 1;
"""


def test_a_file_written_by_the_previous_build_still_opens(tmp_path: Path) -> None:
    path = tmp_path / "turns.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.executescript(_V1_FILE)
    conn.close()
    store = SqliteTurnStore(path)
    try:
        assert [t.text for t in store.get("t1", "u1", ["m1"])] == ["written by the old build"]
        assert store.last_seq() == 1
        # Migration 4 counted its content words (written, old, build) for the short-turn step.
        assert store.locate("t1", "u1", ["m1"])["m1"].terms == 3
        ((turn, created),) = store.append([_turn(2)])
        assert created and turn.seq == 2 and turn.position == 2
    finally:
        store.close()


def test_a_newer_schema_is_refused(engine: Engine) -> None:
    """SQLite: any newer version. PostgreSQL: a newer version that only adds is run on
    (old and new replicas side by side in a rolling upgrade), a breaking one refused."""
    engine.open().close()
    if engine.name == "sqlite":
        conn = sqlite3.connect(engine.location)
        conn.execute("PRAGMA user_version = 99")
        conn.close()
    else:
        table = f"{SCHEMA}.schema_migrations"
        with psycopg.connect(engine.location) as conn:
            conn.execute(f"INSERT INTO {table} (version) VALUES (98)")
        assert engine.open().last_seq() == 0
        with psycopg.connect(engine.location) as conn:
            conn.execute(f"INSERT INTO {table} (version, breaking) VALUES (99, true)")
    with pytest.raises(FailedPrecondition):
        engine.open()


def test_use_after_close_is_refused(store: Store) -> None:
    store.close()
    store.close()  # idempotent
    with pytest.raises(FailedPrecondition):
        store.last_seq()


def test_postgres_replicas_migrating_at_once_all_come_up(postgres_url: str) -> None:
    """Replicas starting together against an empty database: the migration runs once."""
    results: list[object] = []

    def start() -> None:
        try:
            db = postgres_database(postgres_url)
            results.append(PostgresTurnStore(db).last_seq())
            db.close()
        except Exception as exc:
            results.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [0, 0, 0, 0]


def test_nul_characters_find_nothing_instead_of_failing(store: Store) -> None:
    """PostgreSQL text cannot hold U+0000 (the domain refuses it on writes); reads for
    such values answer like reads for any value that is not stored."""
    a = _turn(0)
    store.append([a])
    assert store.get("t1", "u1", ["x\x00y", a.memory_id]) == store.get("t1", "u1", [a.memory_id])
    assert store.get("t1\x00", "u1", [a.memory_id]) == []
    assert store.locate("t1", "u\x00", [a.memory_id]) == {}
    assert store.delete("t1", "u1", memory_ids=["x\x00"]) == []
    assert store.delete("t1", "u1", session="s\x00") == []
    assert store.count("t1", "u1") == 1


# -- append / get ------------------------------------------------------------------------


def test_round_trip_keeps_every_field(store: Store) -> None:
    vec = np.array([0.25, -1.5, 3.0e-7, 1.0], dtype=np.float32)
    a = _turn(0, metadata={"z": "last", "a": "first", "ü": "ñ"}, vector=vec)
    b = _turn(1)
    results = store.append([a, b])
    assert [created for _, created in results] == [True, True]

    got = store.get("t1", "u1", [b.memory_id, a.memory_id])
    assert [t.memory_id for t in got] == [b.memory_id, a.memory_id]  # order as asked
    ga, gb = got[1], got[0]
    assert (ga.tenant, ga.user, ga.session, ga.role, ga.text, ga.time_us, ga.client_id) == (
        "t1",
        "u1",
        "s1",
        Role.USER,
        "turn 0",
        a.time_us,
        "c0",
    )
    assert dict(ga.metadata) == {"a": "first", "z": "last", "ü": "ñ"}
    assert ga.vector is not None
    assert ga.vector.dtype == np.float32
    np.testing.assert_array_equal(ga.vector, vec)
    ga.vector[0] = 9.0  # callers own their copy
    assert store.get("t1", "u1", [a.memory_id])[0].vector[0] == np.float32(0.25)  # type: ignore[index]
    assert gb.vector is None
    assert dict(gb.metadata) == {}
    assert gb.role is Role.ASSISTANT
    assert (results[0][0].seq, results[0][0].memory_id) == (ga.seq, ga.memory_id)
    assert ga.seq < gb.seq


def test_metadata_is_stored_as_sorted_json(engine: Engine, store: Store) -> None:
    store.append([_turn(0, metadata={"b": "2", "a": "1"})])
    assert engine.raw("SELECT metadata FROM turns") == [('{"a": "1", "b": "2"}',)]


def test_vector_is_stored_as_little_endian_float32(engine: Engine, store: Store) -> None:
    store.append([_turn(0, vector=np.array([1.0, 2.0], dtype=np.float64))])
    [(blob,)] = engine.raw("SELECT vector FROM turns")
    assert blob == np.array([1.0, 2.0], dtype="<f4").tobytes()


def test_get_skips_missing_and_repeats(store: Store) -> None:
    a = _turn(0)
    store.append([a])
    got = store.get("t1", "u1", ["nope", a.memory_id, a.memory_id])
    assert [t.memory_id for t in got] == [a.memory_id]
    assert store.get("t1", "u1", []) == []


def test_get_handles_more_ids_than_one_sql_statement_binds(store: Store) -> None:
    turns = [_turn(n) for n in range(1200)]
    store.append(turns)
    asked = [t.memory_id for t in reversed(turns)]
    assert [t.memory_id for t in store.get("t1", "u1", asked)] == asked


def test_append_is_idempotent(store: Store) -> None:
    turns = [_turn(0), _turn(1)]
    first = store.append(turns)
    seq = store.last_seq()
    # a retry with edited text must still not write: the stored turn wins
    retry = [_turn(0, text="changed"), _turn(1)]
    second = store.append(retry)
    assert [created for _, created in second] == [False, False]
    assert [t for t, _ in second] == [t for t, _ in first]  # the stored turns, unchanged
    assert second[0][0].text == "turn 0"
    assert store.last_seq() == seq
    assert store.count("t1", "u1") == 2
    assert len(store.changes(0, 100)) == 2


def test_duplicates_within_one_batch_are_written_once(store: Store) -> None:
    a = _turn(0)
    out = store.append([a, _turn(1), a])
    assert [created for _, created in out] == [True, True, False]
    assert out[2][0].seq == out[0][0].seq
    assert store.count("t1", "u1") == 2
    assert store.last_seq() == 2


def test_same_id_in_another_tenant_is_a_different_turn(store: Store) -> None:
    a = _turn(0, tenant="t1")
    b = NewTurn(**{**a.__dict__, "tenant": "t2", "text": "other tenant"})
    out = store.append([a, b])
    assert [created for _, created in out] == [True, True]
    assert store.get("t1", "u1", [a.memory_id])[0].text == "turn 0"
    assert store.get("t2", "u1", [a.memory_id])[0].text == "other tenant"


def test_reusing_another_users_id_is_refused_and_writes_nothing(store: Store) -> None:
    a = _turn(0, user="alice", text="alice's secret")
    store.append([a])
    seq = store.last_seq()
    forged = NewTurn(**{**a.__dict__, "user": "bob", "text": "bob"})
    with pytest.raises(InvalidArgument) as err:
        store.append([_turn(1, user="bob"), forged])
    assert err.value.field == "memory_id"
    assert "secret" not in err.value.message
    assert store.count("t1", "bob") == 0
    assert store.last_seq() == seq


def test_a_failure_mid_batch_leaves_nothing(engine: Engine, store: Store) -> None:
    store.append([_turn(0)])
    seq = store.last_seq()
    bad = _turn(3, text="x")
    object.__setattr__(bad, "client_id", None)  # violates NOT NULL inside the transaction
    with pytest.raises(engine.integrity_error):
        store.append([_turn(1), _turn(2), bad, _turn(4)])
    assert store.count("t1", "u1") == 1
    assert store.last_seq() == seq
    assert len(store.changes(0, 100)) == 1
    assert engine.raw("SELECT COUNT(*) FROM changes") == [(1,)]
    # the connection is usable afterwards (not stuck inside the aborted transaction)
    assert [c for _, c in store.append([_turn(1), _turn(2)])] == [True, True]
    assert store.last_seq() == seq + 2


def test_an_exception_after_some_inserts_rolls_back(
    engine: Engine, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = 0
    if engine.name == "sqlite":  # one insert per turn: the third one fails
        real = SqliteTurnStore._insert

        def flaky_sqlite(*args: Any) -> StoredTurn:
            nonlocal calls
            calls += 1
            if calls == 3:
                raise OSError("disk went away")
            return real(*args)

        monkeypatch.setattr(SqliteTurnStore, "_insert", staticmethod(flaky_sqlite))
    else:  # one pipelined insert of the batch: it goes through, then the work fails
        real_all = PostgresTurnStore._insert_all

        def flaky_postgres(*args: Any) -> None:
            nonlocal calls
            calls += 1
            real_all(*args)
            raise OSError("the process went away")

        monkeypatch.setattr(PostgresTurnStore, "_insert_all", staticmethod(flaky_postgres))
    with pytest.raises(OSError):
        store.append([_turn(n) for n in range(5)])
    assert calls >= 1
    monkeypatch.undo()
    assert store.count("t1", "u1") == 0
    assert store.last_seq() == 0
    assert store.changes(0, 10) == []


def test_bad_vector_shape_is_refused_before_writing(store: Store) -> None:
    with pytest.raises(InvalidArgument):
        store.append([_turn(0), _turn(1, vector=np.zeros((2, 2), dtype=np.float32))])
    assert store.count("t1", "u1") == 0


# -- sequence and change feed ------------------------------------------------------------


def test_seq_strictly_increases_across_puts_and_deletes(store: Store) -> None:
    seen: list[int] = []
    for n in range(3):
        seen += [t.seq for t, _ in store.append([_turn(2 * n), _turn(2 * n + 1)])]
        store.delete("t1", "u1", memory_ids=[_turn(2 * n).memory_id])
        seen.append(store.last_seq())
    assert seen == sorted(seen)
    assert len(set(seen)) == len(seen)
    # each delete takes one seq for the erasure and one for touching the next turn of
    # the session (whose BM25 document quoted the erased one)
    assert seen == [1, 2, 4, 5, 6, 8, 9, 10, 12]
    # every seq appears once in the raw log, shared by both kinds
    feed = store.changes(0, 100)
    assert [c.seq for c in feed] == sorted({c.seq for c in feed})


def test_change_feed_order_and_content(store: Store) -> None:
    a, b, c = _turn(0), _turn(1), _turn(2)
    store.append([a, b])  # seq 1, 2
    store.delete("t1", "u1", memory_ids=[a.memory_id])  # seq 3, and 4 touches b
    store.append([c])  # seq 5

    feed = store.changes(0, 100)
    assert [type(x) for x in feed] == [StoredTurn, Deletion, StoredTurn, StoredTurn]
    assert isinstance(feed[0], StoredTurn)
    assert (feed[0].seq, feed[0].memory_id, feed[0].text) == (2, b.memory_id, "turn 1")
    assert feed[1] == Deletion(seq=3, tenant="t1", memory_id=a.memory_id)
    assert isinstance(feed[2], StoredTurn)  # the touch: b's current row at the touch's seq
    assert (feed[2].seq, feed[2].memory_id, feed[2].position) == (4, b.memory_id, 2)
    assert isinstance(feed[3], StoredTurn)
    assert (feed[3].seq, feed[3].memory_id) == (5, c.memory_id)
    # the erased turn's put is not returned: no text of it leaves the store
    assert not any(isinstance(x, StoredTurn) and x.memory_id == a.memory_id for x in feed)
    # c's previous turn in the session is b now that a is gone; b has none
    previous = store.previous([feed[3], feed[2]])
    assert {k: v.memory_id for k, v in previous.items()} == {c.memory_id: b.memory_id}

    assert [x.seq for x in store.changes(2, 100)] == [3, 4, 5]
    assert store.changes(5, 100) == []
    # limit counts returned entries, skipping superseded puts
    assert [x.seq for x in store.changes(0, 1)] == [2]
    assert [x.seq for x in store.changes(0, 2)] == [2, 3]
    with pytest.raises(InvalidArgument):
        store.changes(0, 0)


def test_paging_the_feed_reaches_every_change(store: Store) -> None:
    store.append([_turn(n) for n in range(25)])
    store.delete("t1", "u1", memory_ids=[_turn(n).memory_id for n in range(0, 25, 3)])
    pages: list[int] = []
    after = 0
    while page := store.changes(after, 4):
        pages += [c.seq for c in page]
        after = page[-1].seq
    assert pages == [c.seq for c in store.changes(0, 1000)]
    assert pages[-1] == store.last_seq()


# -- delete ------------------------------------------------------------------------------


def test_delete_by_session(store: Store) -> None:
    s1 = [_turn(n, session="s1") for n in range(3)]
    s2 = [_turn(n, session="s2") for n in range(2)]
    store.append(s1 + s2)
    erased = store.delete("t1", "u1", session="s1")
    assert erased == [t.memory_id for t in s1]
    assert store.get("t1", "u1", [t.memory_id for t in s1]) == []
    assert len(store.get("t1", "u1", [t.memory_id for t in s2])) == 2
    assert store.delete("t1", "u1", session="s1") == []  # nothing left: no new changes
    assert store.last_seq() == 8


def test_delete_by_ids(store: Store) -> None:
    turns = [_turn(n) for n in range(4)]
    store.append(turns)
    erased = store.delete(
        "t1", "u1", memory_ids=[turns[2].memory_id, "missing", turns[0].memory_id]
    )
    assert erased == [turns[0].memory_id, turns[2].memory_id]  # write order
    assert [t.memory_id for t in store.get("t1", "u1", [t.memory_id for t in turns])] == [
        turns[1].memory_id,
        turns[3].memory_id,
    ]


def test_delete_by_ids_within_a_session(store: Store) -> None:
    a, b = _turn(0, session="s1"), _turn(0, session="s2")
    store.append([a, b])
    assert store.delete("t1", "u1", session="s1", memory_ids=[a.memory_id, b.memory_id]) == [
        a.memory_id
    ]
    assert store.count("t1", "u1") == 1


def test_delete_whole_user(store: Store) -> None:
    mine = [_turn(n, session=f"s{n % 3}") for n in range(6)]
    theirs = [_turn(n, user="u2") for n in range(2)]
    store.append(mine + theirs)
    assert sorted(store.delete("t1", "u1")) == sorted(t.memory_id for t in mine)
    assert store.count("t1", "u1") == 0
    assert store.count("t1", "u2") == 2
    deletions = [c for c in store.changes(0, 100) if isinstance(c, Deletion)]
    assert sorted(d.memory_id for d in deletions) == sorted(t.memory_id for t in mine)


def test_a_deleted_id_can_be_written_again(store: Store) -> None:
    a = _turn(0)
    first = store.append([a])[0][0]
    store.delete("t1", "u1", memory_ids=[a.memory_id])
    ((again, created),) = store.append([a])
    assert created
    assert again.seq > first.seq
    assert [type(c) for c in store.changes(0, 10)] == [Deletion, StoredTurn]


def test_other_scopes_are_untouched_by_get_and_delete(store: Store) -> None:
    # same texts and client ids everywhere: only the scope tells them apart
    scopes = [("t1", "u1"), ("t1", "u2"), ("t2", "u1")]
    ids = {}
    for tenant, user in scopes:
        turns = [_turn(n, tenant=tenant, user=user, text="same text") for n in range(3)]
        store.append(turns)
        ids[(tenant, user)] = [t.memory_id for t in turns]
    every = [i for v in ids.values() for i in v]
    for tenant, user in scopes:
        got = store.get(tenant, user, every)
        assert {t.memory_id for t in got} == set(ids[(tenant, user)])
        assert {(t.tenant, t.user) for t in got} == {(tenant, user)}
    assert store.delete("t2", "u1", memory_ids=ids[("t1", "u1")]) == []
    assert store.delete("t1", "u2", memory_ids=ids[("t1", "u1")]) == []
    assert store.delete("t3", "u1") == []
    assert all(store.count(t, u) == 3 for t, u in scopes)


_TENANTS = st.sampled_from(["t1", "t2", "t3"])
_USERS = st.sampled_from(["u1", "u2"])
_SESSIONS = st.sampled_from(["s1", "s2"])
_TEXTS = st.sampled_from(["hello", "same words", ""])
_CLIENT_IDS = st.sampled_from(["a", "b", "c"])

_new_turns = st.lists(st.tuples(_TENANTS, _USERS, _SESSIONS, _TEXTS, _CLIENT_IDS), max_size=25)
_deletes = st.lists(
    st.tuples(
        _TENANTS,
        _USERS,
        st.none() | _SESSIONS,
        st.lists(st.tuples(_USERS, _SESSIONS, _CLIENT_IDS), max_size=4),
    ),
    max_size=5,
)


def _id(user: str, session: str, client: str) -> str:
    # The same raw id in every tenant: isolation must come from the tenant, not the id.
    return f"{user}/{session}/{client}"


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(writes=_new_turns, deletes=_deletes)
def test_no_read_or_delete_crosses_its_scope(
    engine: Engine,
    writes: list[tuple[str, str, str, str, str]],
    deletes: list[tuple[str, str, str | None, list[tuple[str, str, str]]]],
) -> None:
    model: dict[tuple[str, str], tuple[str, str, str]] = {}  # (tenant, id) -> user, sess, text
    store = engine.fresh()
    try:
        batch = []
        for tenant, user, session, text, client in writes:
            mid = _id(user, session, client)
            batch.append(NewTurn(mid, tenant, user, session, Role.USER, text, 1, client_id=client))
            model.setdefault((tenant, mid), (user, session, text))
        store.append(batch)
        all_ids = sorted({_id(u, s, c) for u in ["u1", "u2"] for s in ["s1", "s2"] for c in "abc"})

        def check() -> None:
            for tenant in ["t1", "t2", "t3"]:
                for user in ["u1", "u2"]:
                    got = store.get(tenant, user, all_ids)
                    expect = {
                        mid: v for (t, mid), v in model.items() if t == tenant and v[0] == user
                    }
                    assert {g.memory_id: (g.user, g.session, g.text) for g in got} == expect
                    assert all(g.tenant == tenant for g in got)
                    assert store.count(tenant, user) == len(expect)

        check()
        for tenant, user, only_session, targets in deletes:
            listed = [_id(*t) for t in targets]
            erased = store.delete(tenant, user, session=only_session, memory_ids=listed)
            expect = sorted(
                mid
                for (t, mid), (u, s, _) in model.items()
                if t == tenant
                and u == user
                and (only_session is None or s == only_session)
                and (not listed or mid in listed)
            )
            assert sorted(erased) == expect
            for mid in erased:
                del model[(tenant, mid)]
            check()
    finally:
        store.close()


# -- concurrent writers (replicas) -------------------------------------------------------


def test_concurrent_writers_never_let_a_reader_skip_a_change(engine: Engine) -> None:
    """Two store instances (for PostgreSQL: two replicas, two pools) written by four
    threads at once, while a reader follows the feed as a projector does (`after` = the
    last seq it saw). Every committed change is seen exactly once, in order, and seqs
    are gapless: a lower seq never commits after a higher one was readable. Positions in
    a session both replicas write stay unique and consecutive."""
    replicas = [engine.open(), engine.open()]
    reader = engine.open()
    acknowledged: list[StoredTurn] = []
    lock = threading.Lock()
    writers_done = threading.Event()
    failures: list[BaseException] = []

    def write(store: Store, w: int) -> None:
        try:
            for n in range(20):
                batch = [
                    _turn(2 * n, session="shared", client_id=f"w{w}-{n}-a"),
                    _turn(2 * n + 1, session=f"own{w}", client_id=f"w{w}-{n}-b"),
                ]
                out = store.append(batch)
                with lock:
                    acknowledged.extend(t for t, _ in out)
        except BaseException as exc:
            failures.append(exc)

    seen: list[int] = []

    def follow() -> None:
        after = 0
        try:
            while True:
                finished = writers_done.is_set()
                page = reader.changes(after, 7)
                seen.extend(c.seq for c in page)
                if page:
                    after = page[-1].seq
                elif finished:
                    return
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=write, args=(replicas[w % 2], w)) for w in range(4)]
    follower = threading.Thread(target=follow)
    follower.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writers_done.set()
    follower.join()
    assert failures == []
    total = 4 * 20 * 2
    assert sorted(t.seq for t in acknowledged) == list(range(1, total + 1))
    assert seen == list(range(1, total + 1))
    shared = sorted(t.position for t in acknowledged if t.session == "shared")
    assert shared == list(range(1, 4 * 20 + 1))
    assert reader.last_seq() == total and reader.size() == total


# -- durability --------------------------------------------------------------------------


def test_everything_survives_close_and_reopen(engine: Engine) -> None:
    s = engine.open()
    turns = [_turn(n, vector=np.full(3, n, dtype=np.float32)) for n in range(5)]
    s.append(turns)
    s.delete("t1", "u1", memory_ids=[turns[1].memory_id])
    before = (s.last_seq(), s.changes(0, 100))
    s.close()

    s = engine.open()
    assert s.last_seq() == before[0] == 7  # 5 puts, the erasure, a touch of turn 2
    after = s.changes(0, 100)
    assert [(c.seq, type(c), c.memory_id) for c in after] == [
        (c.seq, type(c), c.memory_id) for c in before[1]
    ]
    got = s.get("t1", "u1", [t.memory_id for t in turns])
    assert [g.text for g in got] == ["turn 0", "turn 2", "turn 3", "turn 4"]
    np.testing.assert_array_equal(got[-1].vector, np.full(3, 4, dtype=np.float32))
    assert s.size() == 4
    assert (s.tenant_size("t1"), s.tenant_size("t2")) == (4, 0)  # the stored-turn quota
    # the sequence continues; it never reuses a seq, even one of an erased turn
    ((t, _),) = s.append([_turn(9)])
    assert t.seq == 8


def test_the_sequence_is_not_reused_after_the_newest_turn_is_erased(engine: Engine) -> None:
    s = engine.open()
    s.append([_turn(0)])
    s.delete("t1", "u1")
    s.close()
    s = engine.open()
    assert s.last_seq() == 2
    assert s.append([_turn(1)])[0][0].seq == 3


_CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from pydantic import SecretStr
    from hippo_core.postgres import Database
    from hippo_core.settings import DatabaseSettings
    from hippo_retrieval.adapters import postgres_store
    from hippo_retrieval.adapters.sqlite_store import SqliteTurnStore
    from hippo_retrieval.domain.models import NewTurn, Role

    engine, location = sys.argv[1], sys.argv[2]
    if engine == "sqlite":
        store = SqliteTurnStore(Path(location))
    else:
        db = Database(DatabaseSettings(url=SecretStr(location)), schema=postgres_store.SCHEMA,
                      application="child")
        db.open(postgres_store.MIGRATIONS)
        store = postgres_store.PostgresTurnStore(db)
    turns = [
        NewTurn(f"m{n}", "t1", "u1", "s1", Role.USER, f"acked turn {n}", n, client_id=f"c{n}")
        for n in range(20)
    ]
    store.append(turns[:10])
    store.append(turns[10:])
    print("acked", flush=True)
    time.sleep(120)
    """
)


@pytest.mark.slow
def test_acknowledged_turns_survive_sigkill(engine: Engine) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, engine.name, engine.location],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == "acked", child.stderr.read() if child.stderr else line
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    if engine.name == "sqlite":
        # it really died without closing: the commits live only in the WAL
        wal = Path(engine.location + "-wal")
        assert wal.exists() and wal.stat().st_size > 0

    s = engine.open()
    ids = [f"m{n}" for n in range(20)]
    got = s.get("t1", "u1", ids)
    assert [g.text for g in got] == [f"acked turn {n}" for n in range(20)]
    assert s.count("t1", "u1") == 20
    assert s.last_seq() == 20
    # and exactly once: a retry of the acknowledged batch writes nothing
    retry = [
        NewTurn(f"m{n}", "t1", "u1", "s1", Role.USER, f"acked turn {n}", n, client_id=f"c{n}")
        for n in range(20)
    ]
    assert not any(created for _, created in s.append(retry))
    assert s.last_seq() == 20


# -- erasure -----------------------------------------------------------------------------


def _file_bytes(db: Path) -> dict[str, bytes]:
    out = {}
    for suffix in ("", "-wal", "-journal"):
        f = db.with_name(db.name + suffix)
        if f.exists():
            out[f.name] = f.read_bytes()
    return out


@pytest.mark.parametrize("size", [1, 400])  # short text, and text spilling to overflow pages
def test_erased_text_is_gone_from_the_sqlite_files(tmp_path: Path, size: int) -> None:
    db = tmp_path / "turns.db"
    canary = "CANARY-7f3a91c0-erase-me"
    secret = " ".join([canary] * size)
    s = SqliteTurnStore(db)
    keep = [_turn(n, text=f"keeper {n}") for n in range(50)]
    doomed = _turn(100, text=secret)
    s.append(keep[:25])
    s.append([doomed])
    s.append(keep[25:])
    # the canary is really on disk before the delete, so the check below can fail
    assert any(canary.encode() in b for b in _file_bytes(db).values())

    s.delete("t1", "u1", memory_ids=[doomed.memory_id])
    # gone already while the store is open (the -wal file is truncated, pages zeroed)...
    for name, data in _file_bytes(db).items():
        assert canary.encode() not in data, name
    s.close()
    # ...and after close
    for name, data in _file_bytes(db).items():
        assert canary.encode() not in data, name

    s = SqliteTurnStore(db)
    try:
        assert s.count("t1", "u1") == 50
        assert s.get("t1", "u1", [doomed.memory_id]) == []
        assert all(canary not in getattr(c, "text", "") for c in s.changes(0, 1000))
    finally:
        s.close()


def test_erasing_a_session_removes_its_text_from_the_sqlite_files(tmp_path: Path) -> None:
    db = tmp_path / "turns.db"
    s = SqliteTurnStore(db)
    try:
        s.append([_turn(n, session="gone", text=f"SESSION-CANARY-{n}") for n in range(30)])
        s.append([_turn(n, session="kept") for n in range(30)])
        assert len(s.delete("t1", "u1", session="gone")) == 30
        for name, data in _file_bytes(db).items():
            assert b"SESSION-CANARY" not in data, name
    finally:
        s.close()


def _database_files(server: PostgresServer, url: str) -> list[Path]:
    """The files of the test's database (heap, TOAST and index files), after a checkpoint
    wrote every dirty page. Not the WAL: erased text stays there until the segment is
    recycled, as docs/recall.md says."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        row = conn.execute(
            "SELECT oid FROM pg_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return [p for p in (server.data_dir / "base" / str(row[0])).iterdir() if p.is_file()]


def test_erased_text_is_vacuumed_from_the_postgres_files(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    """A dead tuple keeps a deleted row's bytes until VACUUM: the store vacuums after an
    erasure, so the text is gone from the table, TOAST and index files at once."""
    db = postgres_database(postgres_url)
    s = PostgresTurnStore(db)
    try:
        short = f"PGCANARY-{uuid.uuid4().hex}"
        # Incompressible, so PostgreSQL moves it out of line (TOAST) uncompressed.
        long = f"PGCANARY-LONG-{uuid.uuid4().hex} {os.urandom(6000).hex()}"
        keep = [_turn(n, text=f"keeper {n}") for n in range(50)]
        s.append(keep[:25])
        doomed = [_turn(100, text=short), _turn(101, text=long, session="s2")]
        s.append(doomed)
        s.append(keep[25:])
        marks = [short.encode(), long.split()[0].encode()]

        def found() -> set[bytes]:
            files = _database_files(postgres_server, postgres_url)
            return {m for m in marks for f in files if m in f.read_bytes()}

        assert found() == set(marks)  # on disk before the delete: the check can fail
        erased = s.delete("t1", "u1", memory_ids=[t.memory_id for t in doomed])
        assert len(erased) == 2
        assert found() == set()
        assert s.count("t1", "u1") == 50
    finally:
        s.close()
        db.close()


# -- vectors of other embedding models -----------------------------------------------------


def test_the_model_of_a_vector_is_stored_with_it(store: Store) -> None:
    vector = np.arange(4, dtype=np.float32)
    (named, _), (bare, _) = store.append([_turn(1, vector=vector, vector_model="m1"), _turn(2)])
    assert named.vector_model == "m1" and bare.vector_model == ""
    got = {t.memory_id: t for t in store.get("t1", "u1", [named.memory_id, bare.memory_id])}
    assert got[named.memory_id].vector_model == "m1"
    assert got[bare.memory_id].vector is None and got[bare.memory_id].vector_model == ""
    (change,) = [c for c in store.changes(0, 10) if c.memory_id == named.memory_id]
    assert isinstance(change, StoredTurn) and change.vector_model == "m1"


def test_other_models_vectors_are_kept_per_model_and_erased_with_the_turn(store: Store) -> None:
    (a, _), (b, _) = store.append([_turn(1), _turn(2)])
    va, vb = np.full(3, 0.5, np.float32), np.full(3, -0.25, np.float32)
    kept = store.put_model_vectors("m2", [("t1", a.memory_id, va), ("t1", b.memory_id, vb)])
    assert kept == 2
    assert store.put_model_vectors("m2", [("t1", a.memory_id, vb)]) == 1  # replaced
    keys = [("t1", a.memory_id), ("t1", b.memory_id), ("t1", "missing")]
    found = store.model_vectors("m2", keys)
    assert set(found) == set(keys[:2])
    np.testing.assert_array_equal(found[keys[0]], vb)
    assert store.model_vectors("m3", keys) == {}  # keyed by model
    assert store.model_vectors("m2", [("t2", a.memory_id)]) == {}  # and by tenant
    store.delete("t1", "u1", memory_ids=[a.memory_id])
    assert set(store.model_vectors("m2", keys)) == {keys[1]}
    # A turn erased before its vector arrives gets none (a re-embedding racing Forget).
    assert store.put_model_vectors("m2", [("t1", a.memory_id, va)]) == 0
    assert store.model_vectors("m2", keys[:1]) == {}


# -- listings ----------------------------------------------------------------------------

T0 = 1_700_000_000_000_000


def _timed(n: int, time_us: int, **extra: Any) -> NewTurn:
    return replace(_turn(n, **extra), time_us=time_us)


def _page_through(store: Store, scope: Scope, newest_first: bool, limit: int) -> list[list[str]]:
    """Every page of a listing, each page as its memory ids, following the last row's key."""
    pages: list[list[str]] = []
    after: Cursor | None = None
    while True:
        page = store.list_turns(scope, newest_first=newest_first, after=after, limit=limit)
        if not page:
            return pages
        pages.append([t.memory_id for t in page])
        after = Cursor(page[-1].time_us, page[-1].seq)


def test_listing_orders_by_time_then_arrival_either_way(store: Store) -> None:
    # Stored out of time order; turns 1..3 share one time (one Remember request's turns).
    times = [T0 + 50, T0 + 10, T0 + 10, T0 + 10, T0 + 5, T0 + 90]
    turns = [_timed(n, t) for n, t in enumerate(times)]
    store.append(turns)
    scope = Scope("t1", "u1")
    oldest = store.list_turns(scope, newest_first=False, after=None, limit=100)
    want = [turns[i].memory_id for i in (4, 1, 2, 3, 0, 5)]
    assert [t.memory_id for t in oldest] == want
    newest = store.list_turns(scope, newest_first=True, after=None, limit=100)
    assert [t.memory_id for t in newest] == want[::-1]
    assert oldest[0].text == "turn 4" and oldest[0].vector is None  # whole rows


def test_pages_split_equal_times_without_loss_or_repeat(store: Store) -> None:
    """A page boundary inside a run of equal times (every turn of one request has the
    receive time) continues at the next turn of the run: the key is (time_us, seq)."""
    turns = [_timed(n, T0 + (0 if n < 7 else 1)) for n in range(10)]
    store.append(turns)
    scope = Scope("t1", "u1")
    everything = [t.memory_id for t in turns]
    for newest_first in (False, True):
        want = everything[::-1] if newest_first else everything
        for limit in (1, 2, 3, 5, 7, 10, 11):
            pages = _page_through(store, scope, newest_first, limit)
            assert [i for p in pages for i in p] == want, (newest_first, limit)
            assert all(len(p) == limit for p in pages[:-1])


def test_empty_and_exactly_one_page(store: Store) -> None:
    scope = Scope("t1", "u1")
    assert store.list_turns(scope, newest_first=True, after=None, limit=5) == []
    turns = [_timed(n, T0 + n) for n in range(5)]
    store.append(turns)
    page = store.list_turns(scope, newest_first=False, after=None, limit=5)
    assert len(page) == 5
    last = Cursor(page[-1].time_us, page[-1].seq)
    assert store.list_turns(scope, newest_first=False, after=last, limit=5) == []
    first = Cursor(page[0].time_us, page[0].seq)
    assert store.list_turns(scope, newest_first=True, after=first, limit=5) == []


def test_listing_filters_by_session_time_and_role(store: Store) -> None:
    turns = [
        _timed(n, T0 + n, session="s1" if n < 6 else "s2", client_id=f"c{n}") for n in range(10)
    ]
    store.append(turns)
    by_id = {t.memory_id: t for t in turns}

    def listed(**scope: Any) -> list[str]:
        page = store.list_turns(
            Scope("t1", "u1", **scope), newest_first=False, after=None, limit=50
        )
        return [t.memory_id for t in page]

    assert [by_id[i].client_id for i in listed(session="s2")] == ["c6", "c7", "c8", "c9"]
    assert [by_id[i].client_id for i in listed(start_us=T0 + 3, end_us=T0 + 5)] == ["c3", "c4"]
    assert [by_id[i].client_id for i in listed(start_us=T0 + 8)] == ["c8", "c9"]
    assert [by_id[i].client_id for i in listed(end_us=T0 + 1)] == ["c0"]
    assistant = listed(roles=frozenset({Role.ASSISTANT}))
    assert [by_id[i].client_id for i in assistant] == ["c1", "c3", "c5", "c7", "c9"]
    both = listed(roles=frozenset({Role.ASSISTANT, Role.USER}))
    assert len(both) == 10
    combined = listed(session="s1", start_us=T0 + 2, roles=frozenset({Role.USER}))
    assert [by_id[i].client_id for i in combined] == ["c2", "c4"]
    assert listed(session="s3") == []


def test_listings_never_cross_tenant_or_user(store: Store) -> None:
    for tenant, user in [("t1", "u1"), ("t1", "u2"), ("t2", "u1")]:
        store.append(
            [_timed(n, T0 + n, tenant=tenant, user=user, session=f"s{n % 2}") for n in range(4)]
        )
    for tenant, user in [("t1", "u1"), ("t1", "u2"), ("t2", "u1")]:
        page = store.list_turns(Scope(tenant, user), newest_first=True, after=None, limit=50)
        assert len(page) == 4 and {(t.tenant, t.user) for t in page} == {(tenant, user)}
        assert [s.session for s in store.list_sessions(tenant, user, "", 50)] == ["s0", "s1"]
    assert store.list_turns(Scope("t3", "u1"), newest_first=True, after=None, limit=50) == []
    assert store.list_sessions("t2", "u2", "", 50) == []
    assert [u.user for u in store.list_users("t1", "", 50)] == ["u1", "u2"]
    assert [u.user for u in store.list_users("t2", "", 50)] == ["u1"]
    assert store.list_users("t3", "", 50) == []
    assert store.list_users("t1\x00", "", 50) == []  # NUL matches nothing, on both engines


def test_sessions_and_users_are_counted_and_paged_by_id(store: Store) -> None:
    store.append([_timed(n, T0 + 100 - n, session="b") for n in range(3)])
    store.append([_timed(n, T0 + 7, session="a", client_id=f"a{n}") for n in range(2)])
    store.append([_timed(0, T0 + 1000, session="c")])
    store.append([_timed(0, T0 + 5, user="u0"), _timed(1, T0 + 6, user="u0", session="s2")])
    sessions = store.list_sessions("t1", "u1", "", 50)
    assert [(s.session, s.turns, s.first_time_us, s.last_time_us) for s in sessions] == [
        ("a", 2, T0 + 7, T0 + 7),
        ("b", 3, T0 + 98, T0 + 100),
        ("c", 1, T0 + 1000, T0 + 1000),
    ]
    assert [s.session for s in store.list_sessions("t1", "u1", "a", 1)] == ["b"]
    assert [s.session for s in store.list_sessions("t1", "u1", "b", 5)] == ["c"]
    assert store.list_sessions("t1", "u1", "c", 5) == []
    users = store.list_users("t1", "", 50)
    assert [(u.user, u.turns, u.sessions, u.first_time_us, u.last_time_us) for u in users] == [
        ("u0", 2, 2, T0 + 5, T0 + 6),
        ("u1", 6, 3, T0 + 7, T0 + 1000),
    ]
    assert [u.user for u in store.list_users("t1", "u0", 1)] == ["u1"]
    # Forgotten turns leave the counts; a session left empty leaves the listing.
    store.delete("t1", "u1", session="c")
    store.delete("t1", "u1", session="b", memory_ids=[_turn(0, session="b").memory_id])
    sessions = store.list_sessions("t1", "u1", "", 50)
    assert [(s.session, s.turns, s.last_time_us) for s in sessions] == [
        ("a", 2, T0 + 7),
        ("b", 2, T0 + 99),
    ]
    assert [(u.user, u.turns, u.sessions) for u in store.list_users("t1", "", 50)] == [
        ("u0", 2, 2),
        ("u1", 4, 2),
    ]


def test_listing_filters_by_metadata_equality_inside_the_user(store: Store) -> None:
    meta = [
        {"agent_id": "chef", "speaker": "Maya"},
        {"agent_id": "chef", "speaker": "Bot"},
        {"agent_id": "tutor"},
        {"agent": "chef"},  # another key, same value
        {"agent_id": 'che"f', "note": "quote and = and 1:x in a value"},
    ]
    turns = [_timed(n, T0 + n, metadata=m) for n, m in enumerate(meta)]
    other = _timed(9, T0 + 9, user="u2", metadata={"agent_id": "chef"})
    store.append([*turns, other])

    def listed(*pairs: tuple[str, str]) -> list[str]:
        scope = Scope("t1", "u1", metadata=tuple(sorted(pairs)))
        return [
            t.memory_id for t in store.list_turns(scope, newest_first=False, after=None, limit=50)
        ]

    ids = [t.memory_id for t in turns]
    assert listed(("agent_id", "chef")) == ids[:2]  # not u2's, not the other key's
    assert listed(("agent_id", "chef"), ("speaker", "Bot")) == [ids[1]]  # all must hold
    assert listed(("agent_id", "chef"), ("speaker", "Nobody")) == []
    assert listed(("agent_id", "Chef")) == []  # exact, case-sensitive
    assert listed(("agent_id", 'che"f')) == [ids[4]]
    assert listed(("note", "quote and = and 1:x in a value")) == [ids[4]]
    assert listed(("missing", "x")) == []


def test_update_metadata_changes_one_turn_and_touches_it_in_the_feed(store: Store) -> None:
    first, other = _turn(1, metadata={"speaker": "Ada", "k": "v"}), _turn(2)
    store.append([first, other])
    head = store.last_seq()
    changed = store.update_metadata("t1", "u1", first.memory_id, {"speaker": "Grace"}, ["k"])
    assert changed is not None
    turn, did = changed
    assert did and dict(turn.metadata) == {"speaker": "Grace"} and turn.text == first.text
    assert [t.metadata for t in store.get("t1", "u1", [first.memory_id])] == [{"speaker": "Grace"}]
    feed = store.changes(head, 10)
    assert [(c.seq, c.memory_id) for c in feed] == [(head + 1, first.memory_id)]
    assert isinstance(feed[0], StoredTurn) and dict(feed[0].metadata) == {"speaker": "Grace"}
    # The same change again writes nothing; another user's or tenant's turn is absent.
    again = store.update_metadata("t1", "u1", first.memory_id, {"speaker": "Grace"}, [])
    assert again is not None and not again[1] and store.last_seq() == head + 1
    assert store.update_metadata("t1", "u2", first.memory_id, {"a": "b"}, []) is None
    assert store.update_metadata("t2", "u1", first.memory_id, {"a": "b"}, []) is None
    assert dict(store.get("t1", "u1", [other.memory_id])[0].metadata) == {}


def test_locate_gives_session_position_and_speaker(store: Store) -> None:
    a = _turn(0, metadata={"speaker": "Caroline"})
    b = _turn(1)
    c = _turn(2, metadata={"speaker": "Ünal"})
    store.append([a, b, c])
    where = store.locate("t1", "u1", [c.memory_id, a.memory_id, b.memory_id, "absent"])
    assert set(where) == {a.memory_id, b.memory_id, c.memory_id}
    assert where[a.memory_id].speaker == "Caroline" and where[c.memory_id].speaker == "Ünal"
    assert where[b.memory_id].speaker == ""  # no speaker in its metadata
    positions = [where[t.memory_id].position for t in (a, b, c)]
    assert positions == sorted(positions) and len(set(positions)) == 3
    assert {p.session for p in where.values()} == {"s1"}
    assert store.locate("t1", "u2", [a.memory_id]) == {}  # another user's: absent


def test_locate_counts_each_turns_content_words(store: Store) -> None:
    texts = ["lol", "haha ok!", "I went to the pottery class yesterday.", "Café au lait, 2023"]
    turns = [_turn(n, text=t) for n, t in enumerate(texts)]
    store.append(turns)
    where = store.locate("t1", "u1", [t.memory_id for t in turns])
    # 3+ letters or digits and not a stop word: "lol"; "haha"; "went pottery class
    # yesterday"; "café lait 2023".
    assert [where[t.memory_id].terms for t in turns] == [1, 1, 4, 3]


def test_postgres_migration_3_counts_the_turns_already_stored(postgres_url: str) -> None:
    """A turn written before the column existed is counted by the migration (SQLite's
    migration 4: test_a_file_written_by_the_previous_build_still_opens)."""
    db = postgres_database(postgres_url, f"fresh{next(_schemas)}")
    store = PostgresTurnStore(db)
    try:
        store.append([_turn(n, text=f"pottery class number {n}") for n in range(3)])

        def as_before_then_migrated(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
            conn.execute("ALTER TABLE turns DROP COLUMN terms")
            postgres_store._add_terms(conn)
            return conn.execute("SELECT terms FROM turns ORDER BY seq").fetchall()

        # pottery, class, number (the digit is too short to count)
        assert db.run(as_before_then_migrated) == [(3,), (3,), (3,)]
        assert {p.terms for p in store.locate("t1", "u1", [_turn(0).memory_id]).values()} == {3}
    finally:
        store.close()
        db.close()


def test_locate_follows_a_speaker_changed_or_removed(store: Store) -> None:
    a = _turn(0, metadata={"speaker": "Caroline"})
    b = _turn(1, metadata={"speaker": "Melanie"})
    store.append([a, b])
    store.update_metadata("t1", "u1", a.memory_id, {"speaker": "Caro"}, [])
    store.update_metadata("t1", "u1", b.memory_id, {}, ["speaker"])
    where = store.locate("t1", "u1", [a.memory_id, b.memory_id])
    assert (where[a.memory_id].speaker, where[b.memory_id].speaker) == ("Caro", "")


def test_sqlite_locate_finds_ids_through_the_places_index(tmp_path: Path) -> None:
    """Migration 3's index finds locate's ids (the neighbour, speaker and short-turn steps
    ask for ~200 per hybrid Recall): the planner may not pick the user's own index."""
    store = SqliteTurnStore(tmp_path / "turns.db")
    try:
        store.append([_turn(n, metadata={"speaker": "Caroline"}) for n in range(3)])
        traced: list[str] = []
        store._conn.set_trace_callback(traced.append)
        ids = [_turn(n).memory_id for n in range(3)]
        assert len(store.locate("t1", "u1", ids)) == 3
        store._conn.set_trace_callback(None)
        (sql,) = [q for q in traced if "session_id, position" in q]
        plan = store._conn.execute("EXPLAIN QUERY PLAN " + sql).fetchall()
        assert any("turns_places" in str(row[-1]) for row in plan), plan
    finally:
        store.close()
